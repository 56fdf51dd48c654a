// What the prefill kernels (sdpa_prefill.h on mma.sync and simdgroup matrices, sdpa_prefill_wgmma.h
// on Hopper's warpgroup products) agree on: the scores' scale, where a key's line of K and V sits,
// a threadgroup's rows and the keys they see, which scores are visible, and a finished row's
// divisor. Expanded in a kernel body where RUNTIME_INTS, `batch`, `kv_head` and the buffers are
// defined; BQ is the threadgroup's rows.

#if SCALE_POSITIVE  // the maximum of the products is the maximum of the scaled scores: scale in the exponent's fma
#define EXP_SCALE SCALE_LOG2E
#define MASK_SCALE (LOG2E / SCALE_LOG2E)
#define STORED(product) (product)
#else
#define EXP_SCALE 1.0f
#define MASK_SCALE LOG2E
#define STORED(product) ((product) * SCALE_LOG2E)
#endif

// Where key `key`'s line of K (V) starts in k (v).
#if PAGED
INLINE size_t paged_line(const DEVICE int* block_tables, int batch, int max_blocks, int pool_blocks, int kv_head, int key, int width) {
  const int page = min(max(block_tables[batch * max_blocks + key / PAGE], 0), pool_blocks - 1);
  return ((size_t)(page * HKV + kv_head) * PAGE + key % PAGE) * width;
}
#define K_LINE(key) paged_line(block_tables, batch, max_blocks, pool_blocks, kv_head, key, D)
#define V_LINE(key) paged_line(block_tables, batch, max_blocks, pool_blocks, kv_head, key, DV)
#else
#define K_LINE(key) ((size_t)batch * k_batch_stride + (size_t)kv_head * k_head_stride + (size_t)(k_offset + (key)) * D)
#define V_LINE(key) ((size_t)batch * v_batch_stride + (size_t)kv_head * v_head_stride + (size_t)(v_offset + (key)) * DV)
#endif

// The threadgroup's rows (row R of a key head is position R / GQA of query head kv_head * GQA +
// R % GQA; the heaviest tiles, the last rows under a causal mask, first) and the keys
// [key_lo, key_hi) any of them sees; query l is at key position l + shift.
#if PAGED
#define SEQUENCE_LENGTH min(max(lengths[batch], 0), max_blocks * PAGE)
#else
#define SEQUENCE_LENGTH k_len
#endif
#if CAUSAL
#define KEY_HI min(max(last_pos + shift + 1, 0), seq_len)
#else
#define KEY_HI seq_len
#endif
#if WINDOW_ON
#define KEY_LO min(max(first_pos + shift - window + 1, 0), key_hi)
#else
#define KEY_LO 0
#endif
#define THREADGROUP_ROWS                                                                            \
  const int rows_total = q_len * GQA;                                                               \
  const int row0 = ((rows_total + BQ - 1) / BQ - 1 - (int)nv_group.x) * BQ;                         \
  const int seq_len = SEQUENCE_LENGTH;                                                              \
  const int shift = seq_len - q_len;                                                                \
  const int first_pos = row0 / GQA, last_pos = (min(row0 + BQ, rows_total) - 1) / GQA;              \
  const int key_hi = KEY_HI;                                                                        \
  const int key_lo = KEY_LO;

// Whether every row of the threadgroup sees every key of the tile at k0 (its scores then skip the
// checks): inside the keys, below every row's causal limit, above every row's window start, no mask.
INLINE bool whole_tile(int k0, int keys, int key_lo, int key_hi, int first_pos, int last_pos, int shift, int window) {
  bool whole = k0 >= key_lo && k0 + keys <= key_hi && MASK_KIND == 0;
#if CAUSAL
  whole = whole && k0 + keys - 1 <= first_pos + shift;
#endif
#if WINDOW_ON
  whole = whole && k0 > last_pos + shift - window;
#endif
  return whole;
}
#if WINDOW_ON
#define WHOLE_TILE(k0, keys) whole_tile(k0, keys, key_lo, key_hi, first_pos, last_pos, shift, window)
#else
#define WHOLE_TILE(k0, keys) whole_tile(k0, keys, key_lo, key_hi, first_pos, last_pos, shift, 0)
#endif

// A stored score (`score`, STORED's) of key `key` for the row at position `pos` of query head
// `head` (`real`: a row of the call) after the masks: -inf where the row does not see the key, an
// additive mask added.
#if MASK_KIND
#define MASK_AT(head, pos, key) ((size_t)batch * mask_batch_stride + (size_t)(head) * mask_head_stride + \
                                 (size_t)(pos) * mask_query_stride + (size_t)(key) * mask_key_stride)
#endif
#define MASKED_SCORE(score, key, pos, head, real)                                                   \
  {                                                                                                 \
    bool visible = (real) && (key) >= key_lo && (key) < key_hi;                                     \
    if (CAUSAL) visible = visible && (key) <= (pos) + shift;                                        \
    WINDOW_CHECK(visible, key, pos)                                                                 \
    MASK_CHECK(score, visible, key, pos, head)                                                      \
    if (!visible) score = -INFINITY;                                                                \
  }
#if WINDOW_ON
#define WINDOW_CHECK(visible, key, pos) visible = visible && (key) > (pos) + shift - window;
#else
#define WINDOW_CHECK(visible, key, pos)
#endif
#if MASK_KIND == 1
#define MASK_CHECK(score, visible, key, pos, head) if (visible) visible = mask[MASK_AT(head, pos, key)] != 0;
#elif MASK_KIND == 2
#define MASK_CHECK(score, visible, key, pos, head) if (visible) score = fma(to_float(mask[MASK_AT(head, pos, key)]), MASK_SCALE, score);
#else
#define MASK_CHECK(score, visible, key, pos, head)
#endif

// A finished row's factor on its output: its sum (`sum`, of weights on the maximum `row_max`,
// STORED's) joined by the sink of query head `head`, inverted; 0 where nothing was summed.
INLINE float row_inverse(float sum, float row_max, int head, const DEVICE T* sinks) {
  float factor = 1.0f;
#if SINKS
  const float seen = row_max * EXP_SCALE, sink = to_float(sinks[head]) * LOG2E, top = max(seen, sink);
  factor = exp2(seen - top);  // 0 where the row saw no key
  sum = sum * factor + exp2(sink - top);
#endif
  return sum > 0.0f ? factor / sum : 0.0f;
}
#if SINKS
#define ROW_INVERSE(sum, row_max, head) row_inverse(sum, row_max, head, sinks)
#else
#define ROW_INVERSE(sum, row_max, head) row_inverse(sum, row_max, head, (const DEVICE T*)0)
#endif
