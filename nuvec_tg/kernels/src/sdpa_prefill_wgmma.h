// Prefill attention on Hopper's warpgroup matrix products (wgmma, CUDA sm_90a only): the plan's
// `Tiled` route where the target has them and the head sizes are 64, 128 or 256 (elsewhere
// sdpa_prefill.h, whose rows, key tiles, masks and online softmax this kernel shares: sdpa_rows.h).
//
// A threadgroup of WARPGROUPS warpgroups serves BQ = 64 * WARPGROUPS rows of one key head and one
// batch item (the key head's grouped query heads packed with the positions, as sdpa_prefill.h),
// warpgroup w the rows 64 w .. 64 w + 63. Q's tile and STAGES stages of K's and V's tiles of KEYS
// keys sit in dynamic threadgroup memory in the wgmma layout (prelude): blocks of 64 features, each
// its lines of 128 bytes, pieces swizzled by the line. All threads copy (cp.async) tiles STAGES - 1
// ahead: after the barrier that opens tile t (every warpgroup then done with t - 1), the stage t - 1
// used takes t + STAGES - 1.
//
// Per key tile and warpgroup: S = Q · Kᵀ (KEYS / 2 float32 accumulators a thread, D / 16 wgmma from
// threadgroup memory); the scores masked, each row's lazy running maximum and its weights P =
// 2^(S · EXP_SCALE - m · EXP_SCALE) as sdpa_prefill.h computes them; P rounded to T and packed in
// place into the A registers of O += P · V (DV / 2 accumulators a thread; KEYS / 16 wgmma with A
// from registers and V read as its rows of keys: the prelude's wgmma_tile_rs). A thread's
// accumulator i of either product is row lane / 4 + 8 * ((i % 4) / 2) of its SIMD group's 16, column
// 8 * (i / 4) + 2 * (lane % 4) + i % 2: sdpa_prefill.h's fragments, 8 columns to each group of 4.
//
// Bits. A row's arithmetic (its key tiles of KEYS from key 0, their order, its maximum's updates)
// depends on its own position and the sizes only: tiles outside its visible keys add exact zeros.
// So its bits do not depend on which rows share its threadgroup, on WARPGROUPS or on the batch.
//
// Bounds. Lines of keys outside [key_lo, key_hi) and rows past the last are zeros in the tiles and
// read from nowhere; paged table entries are clamped (sdpa_rows.h); nothing is stored for rows past
// the last.
//
// Runtime integers and defines: sdpa_prefill.h's (RUNTIME_INTS; T, D, DV, HQ, HKV, GQA, CAUSAL,
// WINDOW_ON, MASK_KIND, SINKS, PAGED, PAGE, SCALE_LOG2E, SCALE_POSITIVE), and WARPGROUPS, KEYS (64
// or 128), STAGES (at least 2), from `kernels/prefill.py`, which launches 128 * WARPGROUPS threads
// with BQ * D * 2 + STAGES * KEYS * (D + DV) * 2 + 1024 bytes of dynamic threadgroup memory.

#if (D != 64 && D != 128 && D != 256) || (DV != 64 && DV != 128 && DV != 256) || (KEYS != 64 && KEYS != 128) || STAGES < 2
#error "sdpa_prefill_wgmma.h: head sizes 64, 128 or 256, key tiles of 64 or 128, at least 2 stages"
#endif
#define THREADS (128 * WARPGROUPS)
#define BQ (64 * WARPGROUPS)
#define LINE_BYTES 128                         // a line of a 64-feature block
#define Q_BLOCK_BYTES (BQ * LINE_BYTES)        // Q's tile: D / 64 blocks of BQ lines
#define K_BLOCK_BYTES (KEYS * LINE_BYTES)      // K's and V's tiles: D / 64 (DV / 64) blocks of KEYS lines
#define K_BYTES ((D / 64) * K_BLOCK_BYTES)
#define STAGE_BYTES (K_BYTES + (DV / 64) * K_BLOCK_BYTES)
#define LINES_A_PASS (THREADS / 8)             // lines the threadgroup copies at once (8 pieces a line)
#define SCORES (KEYS / 2)                      // a thread's accumulators of S
#define OUTPUTS (DV / 2)                       // a thread's accumulators of O

// Piece `piece` of the lines `first_line`, + LINES_A_PASS, ... < LINES of BLOCKS blocks of 64
// features at TO (blocks BLOCK_BYTES apart), from the line of `SOURCE` at element OFFSET(line) (or
// zeros where PRESENT(line) is false), stored at piece `piece ^ (line % 8)` (`swizzled_piece`,
// bytes: every line a thread copies has the same line % 8).
#define COPY_LINES(TO, BLOCK_BYTES, LINES, BLOCKS, SOURCE, PRESENT, OFFSET)                          \
  for (int line = first_line; line < (LINES); line += LINES_A_PASS) {                              \
    const bool present = PRESENT(line);                                                             \
    const DEVICE T* from = present ? (SOURCE) + (OFFSET(line)) + 8 * piece : (SOURCE);               \
    _Pragma("unroll") for (int block = 0; block < (BLOCKS); block++)                                \
      async_copy16((TO) + block * (BLOCK_BYTES) + line * LINE_BYTES + swizzled_piece, present ? from + 64 * block : from, present); \
  }
#define KEY_PRESENT(line) (tile_key0 + (line) >= key_lo && tile_key0 + (line) < key_hi)
#define K_OFFSET(line) K_LINE(tile_key0 + (line))
#define V_OFFSET(line) V_LINE(tile_key0 + (line))
// The copies of the key tile at `tile_key0` into the stage at `stage_at`, as one group.
#define COPY_TILE(stage_at)                                                                         \
  {                                                                                                 \
    COPY_LINES((stage_at), K_BLOCK_BYTES, KEYS, D / 64, k, KEY_PRESENT, K_OFFSET)                   \
    COPY_LINES((stage_at) + K_BYTES, K_BLOCK_BYTES, KEYS, DV / 64, v, KEY_PRESENT, V_OFFSET)        \
  }
#define Q_PRESENT(line) (row0 + (line) < rows_total)
#define Q_OFFSET(line) (((size_t)(batch * HQ + kv_head * GQA + (row0 + (line)) % GQA) * q_len + (row0 + (line)) / GQA) * D)

/* kernel */
  RUNTIME_INTS
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32;
  const int warpgroup = thread_id / 128, warp = (thread_id / 32) % 4;
  const int kv_head = (int)nv_group.y, batch = (int)nv_group.z;
  THREADGROUP_ROWS

  // Q's tile, then the stages, from the first multiple of 1024 bytes of the dynamic threadgroup memory.
  DYNAMIC_THREADGROUP(dynamic_memory, (D / 64) * Q_BLOCK_BYTES + STAGES * STAGE_BYTES + 1024);
  unsigned char* q_tile = (unsigned char*)dynamic_memory + ((1024u - (shared_address(dynamic_memory) & 1023u)) & 1023u);
  unsigned char* stages = q_tile + (D / 64) * Q_BLOCK_BYTES;
  const int piece = thread_id % 8, first_line = thread_id / 8;
  const int swizzled_piece = 16 * (piece ^ (first_line % 8));

  // This thread's rows (lane / 4 and + 8 of its SIMD group's 16): position, query head, whether real.
  int row_pos[2], row_head[2];
  bool row_real[2];
  float row_max[2], row_sum[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = row0 + 64 * warpgroup + 16 * warp + lane / 4 + 8 * h;
    row_pos[h] = row / GQA;
    row_head[h] = kv_head * GQA + row % GQA;
    row_real[h] = row < rows_total;
    row_max[h] = -INFINITY;
    row_sum[h] = 0.0f;
  }
  float out_acc[OUTPUTS];
#pragma unroll
  for (int i = 0; i < OUTPUTS; i++) out_acc[i] = 0.0f;

  // Q with the first tile (one group), then the tiles up to STAGES - 2 ahead (an empty group past
  // the last keeps the count).
  const int tile_first = key_lo / KEYS, tile_end = (key_hi + KEYS - 1) / KEYS;
  COPY_LINES(q_tile, Q_BLOCK_BYTES, BQ, D / 64, q, Q_PRESENT, Q_OFFSET)
  for (int ahead = 0; ahead < STAGES - 1; ahead++) {
    const int tile_key0 = (tile_first + ahead) * KEYS;
    if (tile_first + ahead < tile_end) COPY_TILE(stages + ahead * STAGE_BYTES)
    async_commit();
  }

  for (int tile = tile_first; tile < tile_end; tile++) {
    const int k0 = tile * KEYS, index = tile - tile_first;
    // This tile has landed (this thread's copies; after the fence and the barrier everyone's, seen
    // by the tensor cores); every warpgroup is done with the previous tile, whose stage takes the
    // tile STAGES - 1 ahead.
    async_wait(STAGES - 2);
    async_proxy_fence();
    threadgroup_barrier();
    {
      const int tile_key0 = (tile + STAGES - 1) * KEYS;
      if (tile + STAGES - 1 < tile_end) COPY_TILE(stages + ((index + STAGES - 1) % STAGES) * STAGE_BYTES)
      async_commit();
    }
    const unsigned char* k_tile = stages + (index % STAGES) * STAGE_BYTES;
    const unsigned char* v_tile = k_tile + K_BYTES;

    float scores[SCORES];
#pragma unroll
    for (int i = 0; i < SCORES; i++) scores[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int block = 0; block < D / 64; block++)
#pragma unroll
      for (int step = 0; step < 4; step++)
        wgmma_tile<KEYS>(scores, (const T*)(q_tile + block * Q_BLOCK_BYTES + warpgroup * 64 * LINE_BYTES),
                         (const T*)(k_tile + block * K_BLOCK_BYTES), step);
    wgmma_commit();
    wgmma_finish<KEYS>(scores);

    // Scores in base 2, invisible ones -inf (a tile every row sees whole skips the checks).
    const bool whole = WHOLE_TILE(k0, KEYS);
#pragma unroll
    for (int i = 0; i < SCORES; i++) {
      float score = STORED(scores[i]);
      if (!whole) {
        const int h = (i % 4) / 2, key = k0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        MASKED_SCORE(score, key, row_pos[h], row_head[h], row_real[h])
      }
      scores[i] = score;
    }

    // Each row's maximum over the tile (its four lanes'), then the lazy move onto it.
    float tile_max[2];
    bool grows = false;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float best = -INFINITY;
#pragma unroll
      for (int j = 0; j < KEYS / 8; j++) best = max(best, max(scores[4 * j + 2 * h], scores[4 * j + 2 * h + 1]));
      best = max(best, simd_shuffle_xor(best, 1));
      best = max(best, simd_shuffle_xor(best, 2));
      tile_max[h] = best;
      grows = grows || best > row_max[h] + 8.0f / EXP_SCALE;
    }
    if (simd_any(grows)) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if (tile_max[h] > row_max[h] + 8.0f / EXP_SCALE) {
          const float factor = exp2((row_max[h] - tile_max[h]) * EXP_SCALE);  // 0 from -inf: nothing was summed
          row_max[h] = tile_max[h];
          row_sum[h] *= factor;
#pragma unroll
          for (int j = 0; j < DV / 8; j++) {
            out_acc[4 * j + 2 * h] *= factor;
            out_acc[4 * j + 2 * h + 1] *= factor;
          }
        }
      }
    }

    // The weights (a row that has seen nothing keeps a maximum of -inf and 0 weights), summed in
    // float32 and packed, rounded to T, as the A registers of the product with V: key step s's are
    // the accumulators 8 s .. 8 s + 7.
    uint weights[KEYS / 16][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float shift_by = row_max[h] == -INFINITY ? 0.0f : -row_max[h] * EXP_SCALE;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < KEYS / 8; j++) {
        const float low = fast_exp2(fma(scores[4 * j + 2 * h], EXP_SCALE, shift_by));
        const float high = fast_exp2(fma(scores[4 * j + 2 * h + 1], EXP_SCALE, shift_by));
        sum += low;
        sum += high;
        weights[j / 2][h + 2 * (j % 2)] = pack_pair(low, high, T());
      }
      row_sum[h] += sum;
    }

    wgmma_fence();
#pragma unroll
    for (int step = 0; step < KEYS / 16; step++) wgmma_tile_rs<DV>(out_acc, weights[step], (const T*)v_tile, K_BLOCK_BYTES, step);
    wgmma_commit();
    wgmma_finish<DV>(out_acc);
#pragma unroll
    for (int step = 0; step < KEYS / 16; step++)
#pragma unroll
      for (int r = 0; r < 4; r++) wgmma_hold(weights[step][r]);
  }
  async_wait(0);  // only empty groups are left: none outlives the kernel

  // Each row's sum from its four lanes, the sink, then O / l rounded once.
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float sum = row_sum[h];
    sum += simd_shuffle_xor(sum, 1);
    sum += simd_shuffle_xor(sum, 2);
    if (!row_real[h]) continue;
    const float inverse = ROW_INVERSE(sum, row_max[h], row_head[h]);
    DEVICE T* out_row = out + ((size_t)(batch * HQ + row_head[h]) * q_len + row_pos[h]) * DV + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < DV / 8; j++) store_pair(out_acc[4 * j + 2 * h] * inverse, out_acc[4 * j + 2 * h + 1] * inverse, out_row + 8 * j);
  }
