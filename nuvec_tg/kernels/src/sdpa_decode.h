// Decode attention (at most 8 query rows per sequence): one pass, or the first pass of two.
//
// A threadgroup serves one key head, a group of ROWS query rows of it (rows are `g * LQ + l`
// over the GQA query heads `g` and query positions `l`), one batch item and one block of keys.
// Its NUM_WARPS SIMD groups split the block's keys; in each, TPK lanes share a key (EQ of its
// D features and EV of its DV values per lane), so one SIMD step reads 32 / TPK whole key and
// value lines, once, for every query row. Scores are in base 2 (q pre-scaled by scale·log2 e).
// A key's TPK lanes sum their partial dot products by a reduce-scatter that leaves each lane one
// row's score (ROWS is a power of two, at most TPK), so the online softmax's bookkeeping runs once
// per (row, key) rather than once per lane and row; the rows' weights are then shuffled to every
// lane of the key for the value sums. The softmax rescales lazily (only when a row's maximum grows
// by more than 2^8). Partial results merge across lanes (shuffles), then across SIMD groups
// (threadgroup memory).
//
// Key and value lines are read in the widest aligned pieces (CHUNK_K, CHUNK_V: 16-byte `uint4`
// where the line allows), K_CHUNKS and V_CHUNKS of them per lane.
//
// Defines: T, D, DV, HQ, HKV, GQA, LQ, ROWS, ROW_GROUPS, TPK, EQ, EV, NUM_WARPS, BLOCKS,
// UNROLL, TWO_PASS, CAUSAL, WINDOW_ON, MASK_KIND (0 none, 1 bool, 2 additive), SINKS, PAGED,
// PAGE (the paged block size), SCALE_LOG2E, K_LEN (an expression of the scalars), CHUNK_K,
// K_CHUNKS, CHUNK_V, V_CHUNKS, RUNTIME_INTS (declarations of the runtime integers, read once from
// the `ints` buffer into registers).

#define KPW (32 / TPK)

// Loads lane's pieces of the UNROLL key and value lines of the step starting at key FIRST into
// k_next / v_next (lines past the block's end are not read).
#if PAGED
#define LINE_OFFSETS(key)                                                                      \
  const int page = min(max(block_tables[batch * max_blocks + (key) / PAGE], 0), pool_blocks - 1); \
  const int k_at = ((page * HKV + kv_head) * PAGE + (key) % PAGE) * D;                          \
  const int v_at = ((page * HKV + kv_head) * PAGE + (key) % PAGE) * DV;
#else
#define LINE_OFFSETS(key)                                                                      \
  const int k_at = batch * k_batch_stride + kv_head * k_head_stride + (k_offset + (key)) * D;   \
  const int v_at = batch * v_batch_stride + kv_head * v_head_stride + (v_offset + (key)) * DV;
#endif
#define LOAD_LINES(FIRST)                                                                      \
  _Pragma("unroll") for (int u = 0; u < UNROLL; u++) {                                         \
    const int key = (FIRST) + u * NUM_WARPS * KPW + group;                                     \
    if (key < key_end) {                                                                       \
      LINE_OFFSETS(key)                                                                        \
      const DEVICE CHUNK_K* k_row = (const DEVICE CHUNK_K*)(k + k_at + part * EQ);             \
      const DEVICE CHUNK_V* v_row = (const DEVICE CHUNK_V*)(v + v_at + part * EV);             \
      _Pragma("unroll") for (int c = 0; c < K_CHUNKS; c++) k_next[u][c] = k_row[c];            \
      _Pragma("unroll") for (int c = 0; c < V_CHUNKS; c++) v_next[u][c] = v_row[c];            \
    } else {  /* zeros: a line past the end must not bring NaN or infinity into the sums */    \
      _Pragma("unroll") for (int c = 0; c < K_CHUNKS; c++) k_next[u][c] = CHUNK_K{};            \
      _Pragma("unroll") for (int c = 0; c < V_CHUNKS; c++) v_next[u][c] = CHUNK_V{};            \
    }                                                                                          \
  }

/* kernel */
  RUNTIME_INTS
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
  const int group = lane / TPK, part = lane % TPK;
  const int kv_head = (int)nv_group.x / ROW_GROUPS, first_row = ((int)nv_group.x % ROW_GROUPS) * ROWS;
  const int batch = (int)nv_group.y, block = (int)nv_group.z;
  const int k_len = SEQUENCE_KEYS, range_start = FIRST_VISIBLE_KEY(k_len);
  const int per_block = KEYS_PER_BLOCK(k_len, range_start);
  const int key_begin = range_start + block * per_block;
  const int key_end = min(k_len, key_begin + per_block);

  // This lane's row after the reduce-scatter of the scores, and the lane of its key group that
  // holds each row's score.
  int my_row = 0, row_lane[ROWS];
  for (int count = ROWS, offset = TPK / 2; count > 1; count /= 2, offset /= 2) my_row = my_row * 2 + ((part & offset) != 0);
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    int source = 0;
    for (int count = ROWS, offset = TPK / 2, bit = ROWS / 2; count > 1; count /= 2, offset /= 2, bit /= 2)
      if (r & bit) source += offset;
    row_lane[r] = group * TPK + source;
  }
  const int my_q_head = kv_head * GQA + (first_row + my_row) / LQ, my_position = (first_row + my_row) % LQ;
  float my_max = -INFINITY, my_sum = 0.0f;

  float q_reg[ROWS][EQ], acc[ROWS][EV];
  for (int r = 0; r < ROWS; r++) {
    const int row = first_row + r, q_head = kv_head * GQA + row / LQ, position = row % LQ;
    const DEVICE T* q_row = q + ((batch * HQ + q_head) * LQ + position) * D + part * EQ;
    for (int e = 0; e < EQ; e++) q_reg[r][e] = to_float(q_row[e]) * SCALE_LOG2E;
    for (int e = 0; e < EV; e++) acc[r][e] = 0.0f;
  }

  // The bound is the same for the whole SIMD group (its shuffles need every lane); a slot past
  // the block's end reads nothing and only joins the shuffles. Each step uses UNROLL key lines
  // per lane, loaded (raw) during the step before: a lane always has a step's loads in flight.
  const int step_keys = NUM_WARPS * KPW * UNROLL;
  CHUNK_K k_next[UNROLL][K_CHUNKS];
  CHUNK_V v_next[UNROLL][V_CHUNKS];
  LOAD_LINES(key_begin + warp * KPW);
  for (int first = key_begin + warp * KPW; first < key_end; first += step_keys) {
    CHUNK_K k_raw[UNROLL][K_CHUNKS];
    CHUNK_V v_raw[UNROLL][V_CHUNKS];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
#pragma unroll
      for (int c = 0; c < K_CHUNKS; c++) k_raw[u][c] = k_next[u][c];
#pragma unroll
      for (int c = 0; c < V_CHUNKS; c++) v_raw[u][c] = v_next[u][c];
    }
    if (first + step_keys < key_end) LOAD_LINES(first + step_keys);
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
    const int key = first + u * NUM_WARPS * KPW + group;
    const bool in_block = key < key_end;
    const THREAD T* k_elements = (const THREAD T*)k_raw[u];
    const THREAD T* v_elements = (const THREAD T*)v_raw[u];
    float k_reg[EQ], v_reg[EV];
#pragma unroll
    for (int e = 0; e < EQ; e++) k_reg[e] = to_float(k_elements[e]);
#pragma unroll
    for (int e = 0; e < EV; e++) v_reg[e] = to_float(v_elements[e]);
    // Each row's partial dot products, then summed across the key's TPK lanes by a reduce-scatter:
    // at each of the first log2(ROWS) steps a lane keeps half of its rows and adds the partner's
    // half, so that afterwards it holds the score of one row, `my_row` (the lanes of a row agree).
    float parts[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < EQ; e++) dot += q_reg[r][e] * k_reg[e];
      parts[r] = dot;
    }
#pragma unroll
    for (int count = ROWS, offset = TPK / 2; count > 1; count /= 2, offset /= 2) {
      const bool upper = (part & offset) != 0;
#pragma unroll
      for (int i = 0; i < count / 2; i++) {
        const float sent = upper ? parts[i] : parts[i + count / 2];
        const float kept = upper ? parts[i + count / 2] : parts[i];
        parts[i] = kept + simd_shuffle_xor(sent, offset);
      }
    }
    float score = parts[0];
#pragma unroll
    for (int offset = TPK / (2 * ROWS); offset > 0; offset /= 2) score += simd_shuffle_xor(score, offset);

    // The online softmax of this lane's row (lazily rescaled: only when its maximum grows by
    // more than 2^8), then every row's weight and rescale factor shared within the key's lanes.
    bool visible = in_block;
#if CAUSAL || PAGED
    visible = visible && key <= k_len - LQ + my_position;
#endif
#if WINDOW_ON
    visible = visible && key > k_len - LQ + my_position - window;
#endif
#if MASK_KIND
    if (in_block) {
      const int mask_index = batch * mask_batch_stride + my_q_head * mask_head_stride + my_position * mask_query_stride +
                             key * mask_key_stride;
#if MASK_KIND == 1
      visible = visible && mask[mask_index] != 0;
#else
      score += to_float(mask[mask_index]) * LOG2E;
#endif
    }
#endif
    float weight = 0.0f, correction = 1.0f;
    if (visible && score != -INFINITY) {
      if (score > my_max + 8.0f) {
        correction = fast_exp2(my_max - score);
        my_sum *= correction;
        my_max = score;
      }
      weight = fast_exp2(score - my_max);
      my_sum += weight;
    }
    if (simd_any(correction != 1.0f)) {  // rare: a row's maximum grew; the whole SIMD group branches
#pragma unroll
      for (int r = 0; r < ROWS; r++) {
        const float row_correction = simd_shuffle(correction, row_lane[r]);
#pragma unroll
        for (int e = 0; e < EV; e++) acc[r][e] *= row_correction;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      const float row_weight = simd_shuffle(weight, row_lane[r]);
#pragma unroll
      for (int e = 0; e < EV; e++) acc[r][e] += row_weight * v_reg[e];
    }
    }
  }

  // Every row's maximum and weight sum into every lane of the key's group.
  float row_max[ROWS], row_sum[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    row_max[r] = simd_shuffle(my_max, row_lane[r]);
    row_sum[r] = simd_shuffle(my_sum, row_lane[r]);
  }

  // The SIMD group's key slots into slot 0.
  for (int offset = TPK; offset < 32; offset *= 2) {
    for (int r = 0; r < ROWS; r++) {
      const float other_max = simd_shuffle_xor(row_max[r], offset);
      const float merged = max(row_max[r], other_max);
      const float mine = merge_factor(row_max[r], merged), theirs = merge_factor(other_max, merged);
      row_sum[r] = row_sum[r] * mine + simd_shuffle_xor(row_sum[r], offset) * theirs;
      for (int e = 0; e < EV; e++) acc[r][e] = acc[r][e] * mine + simd_shuffle_xor(acc[r][e], offset) * theirs;
      row_max[r] = merged;
    }
  }

  // The SIMD groups through threadgroup memory.
  THREADGROUP float shared_acc[NUM_WARPS * ROWS * DV];
  THREADGROUP float shared_max[NUM_WARPS * ROWS], shared_sum[NUM_WARPS * ROWS];
  if (group == 0) {
    for (int r = 0; r < ROWS; r++) {
      for (int e = 0; e < EV; e++) shared_acc[(warp * ROWS + r) * DV + part * EV + e] = acc[r][e];
      if (part == 0) {
        shared_max[warp * ROWS + r] = row_max[r];
        shared_sum[warp * ROWS + r] = row_sum[r];
      }
    }
  }
  threadgroup_barrier();
  for (int index = (int)nv_thread.x; index < ROWS * DV; index += NUM_WARPS * 32) {
    const int r = index / DV, e = index % DV;
    const int row = first_row + r, q_head = kv_head * GQA + row / LQ, position = row % LQ;
    const int out_row = (batch * HQ + q_head) * LQ + position;
    float merged = -INFINITY;
    for (int w = 0; w < NUM_WARPS; w++) merged = max(merged, shared_max[w * ROWS + r]);
    float total = 0.0f, value = 0.0f;
    for (int w = 0; w < NUM_WARPS; w++) {
      const float factor = merge_factor(shared_max[w * ROWS + r], merged);
      total += shared_sum[w * ROWS + r] * factor;
      value += shared_acc[(w * ROWS + r) * DV + e] * factor;
    }
#if TWO_PASS
    part_acc[(out_row * BLOCKS + block) * DV + e] = value;
    if (e == 0) {
      part_max[out_row * BLOCKS + block] = merged;
      part_sum[out_row * BLOCKS + block] = total;
    }
#else
#if SINKS
    const float sink = to_float(sinks[q_head]) * LOG2E;
    const float with_sink = max(merged, sink);
    const float kept = merge_factor(merged, with_sink);
    total = total * kept + exp2(sink - with_sink);
    value *= kept;
#endif
    from_float(total > 0.0f ? value / total : 0.0f, &out[out_row * DV + e]);
#endif
  }
