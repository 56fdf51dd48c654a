// The gated delta rule's chunked prefill, first pass: each chunk's own forms, every chunk at once.
//
// A threadgroup serves one chunk of CHUNK steps of one value head `head` (key head head / (HV / HK))
// of batch item `batch`. With the chunk's cumulative decay in base 2, c_i = sum_{l <= i} log2 g_l
// (serially, from the chunk's start), the decay between steps L[i][j] = 2^(c_i - c_j) (j <= i), and
// A = strictly_lower(beta_i (k_i . k_j) L[i][j]), the delta rule's updates within the chunk are
// those of X = (I + A)^-1 (the WY form of FLA's chunked kernels):
//
//     w = X diag(beta 2^c) K    [CHUNK, DK]   what the chunk's start state is read through
//     u = X diag(beta) V        [CHUNK, DV]   the corrections it would make from a zero state
//     within[i][j] = (q_i . k_j) L[i][j], j <= i (zeros above)
//
// The second pass (gated_delta_pass.h) carries the state from chunk to chunk with them. K K^T, Q K^T
// and the two products with X run on the matrix units (X diag(...) rounded to T where T is 16-bit);
// X itself is solved in float32 in 16 x 16 blocks: the diagonal ones by forward substitution (a
// thread per column), then each block below from those before it. Steps past the last
// are zeros with decay 1 and rate 0 (their w, u rows are zeros). A log decay below -LOG2_FLOOR
// counts as -LOG2_FLOOR (2^-126: a zero gate, and keeps c finite, so that differences never meet
// -inf - -inf).
//
// Outputs (per batch item and value head, chunk after chunk): w [NCH * CHUNK, DK] and u transposed
// [NCH, DV, CHUNK] in T, within [NCH, CHUNK, CHUNK] in T, c [NCH * CHUNK] float32.
// Defines: T (q, k and v's type), TG, TB (g's and beta's), DK, DV, HK, HV, CHUNK, WARPS,
// DECAY_LOG (g holds the natural log of the decay). Runtime integers (`ints`): the steps.

#define THREADS (WARPS * 32)
#define LDK (DK + 8)          // row strides in threadgroup memory: 16 bytes past each line (fragment loads
#define LDV (DV + 8)          // of 8 lines then start in 8 different groups of 4 banks)
#define LDX (CHUNK + 1)
#define LDQV (LDK > LDV ? LDK : LDV)
#define ROW_TILES (CHUNK / 16)
#define LOG2_FLOOR 126.0f

#if CHUNK % 32 != 0 || DK % 16 != 0 || DV % 16 != 0 || WARPS % ROW_TILES != 0
#error "gated_delta_chunks.h: CHUNK must be a multiple of 32, DK and DV of 16, WARPS of CHUNK / 16"
#endif

// The chunk's rows of a [.., HEADS, WIDTH] input (head HEAD's lines) into TO (row stride LD); steps
// past the last are zeros. Unrolled: a thread's pieces are known at compile time but for its index.
#define COPY_ROWS(TO, LD, SOURCE, WIDTH, HEADS, HEAD)                                                 \
  {                                                                                                 \
    const DEVICE T* first_line = (SOURCE) + ((size_t)(batch * steps + first_step) * (HEADS) + (HEAD)) * (WIDTH); \
    _Pragma("unroll") for (int pass = 0; pass < (CHUNK * ((WIDTH) / 8) + THREADS - 1) / THREADS; pass++) { \
      const int i = thread_id + pass * THREADS, r = i / ((WIDTH) / 8), piece = i % ((WIDTH) / 8);     \
      if (CHUNK * ((WIDTH) / 8) % THREADS == 0 || i < CHUNK * ((WIDTH) / 8)) {                      \
        const bool present = first_step + r < steps;                                                \
        async_copy16((TO) + r * (LD) + piece * 8, present ? first_line + (size_t)r * (HEADS) * (WIDTH) + piece * 8 : (SOURCE), present); \
      }                                                                                             \
    }                                                                                               \
    async_commit();                                                                                 \
  }

// X diag(scale)'s rows row0.. row0 + 15 as A operands, one per 16 columns: built from threadgroup
// memory in the accumulator's layout, then turned into A's (tile_a_from_acc: rounded to T). Built
// once for all of a product's column tiles.
INLINE void x_fragments(THREADGROUP_PTR const float* x, THREADGROUP_PTR const float* scale, int row0, int lane,
                        THREAD TileA<T>* a) {
#pragma unroll
  for (int kk = 0; kk < CHUNK / 16; kk++) {
    TileAcc left, right;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int row = row0 + frag_row(lane) + 8 * (e / 2), col = kk * 16 + frag_col(lane) + e % 2;
      left.v[e] = x[row * LDX + col] * scale[col];
      right.v[e] = x[row * LDX + col + 8] * scale[col + 8];
    }
    tile_a_from_acc(a[kk], left, right);
  }
}

// acc = X diag(scale) B for X's fragments `a` (x_fragments), B given as its rows at `b` (row stride
// ldb), columns col0..col0 + 7.
INLINE void x_times(const THREAD TileA<T>* a, int lane, THREADGROUP_PTR const T* b, int ldb, int col0, THREAD TileAcc& acc) {
  tile_zero(acc);
#pragma unroll
  for (int kk = 0; kk < CHUNK / 16; kk++) {
    TileB<T> bt;
    load_tile_b_rows(bt, b + kk * 16 * ldb + col0, ldb, lane);
    tile_mma(acc, a[kk], bt);
  }
}

/* kernel */
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  const int chunk = (int)nv_group.x, head = (int)nv_group.y, batch = (int)nv_group.z;
  const int key_head = head / (HV / HK), steps = ints[0], chunks = (steps + CHUNK - 1) / CHUNK;
  const int first_step = chunk * CHUNK;
  const size_t chunk_at = ((size_t)batch * HV + head) * chunks + chunk;  // this chunk's place among the outputs'

  THREADGROUP uint4 k_memory[CHUNK * LDK * sizeof(T) / 16];  // uint4: the copies' 16-byte alignment
  THREADGROUP uint4 qv_memory[CHUNK * LDQV * sizeof(T) / 16];  // Q's rows, then V's
  THREADGROUP_PTR T* k_tile = (THREADGROUP_PTR T*)k_memory;
  THREADGROUP_PTR T* qv_tile = (THREADGROUP_PTR T*)qv_memory;
  THREADGROUP float a_mat[CHUNK * LDX];  // A
  THREADGROUP float x_mat[CHUNK * LDX];  // X = (I + A)^-1
  THREADGROUP float cum[CHUNK], rate[CHUNK], w_scale[CHUNK];
  THREADGROUP float block_sum[16 * 16];  // a block of X's, before X_II multiplies it

  COPY_ROWS(k_tile, LDK, k, DK, HK, key_head)
  COPY_ROWS(qv_tile, LDK, q, DK, HK, key_head)
  // Each step's rate and log2 decay (a thread each), then their running sum (one thread, in order).
  if (thread_id < CHUNK) {
    const int step = first_step + thread_id;
    float log_decay = 0.0f;
    rate[thread_id] = 0.0f;
    if (step < steps) {
      rate[thread_id] = to_float(beta[(size_t)(batch * steps + step) * HV + head]);
      const float gate = to_float(g[(size_t)(batch * steps + step) * HV + head]);
#if DECAY_LOG
      log_decay = max(gate * LOG2E, -LOG2_FLOOR);
#else
      log_decay = max(log2(gate), -LOG2_FLOOR);
#endif
    }
    cum[thread_id] = log_decay;
  }
  threadgroup_barrier();
  if (warp == 0) {  // the running sum: 32 steps at a time by the SIMD group (Hillis and Steele's scan)
    float carry = 0.0f;
    for (int base = 0; base < CHUNK; base += 32) {
      float x = cum[base + lane];
      for (int offset = 1; offset < 32; offset *= 2) {
        const float before = simd_shuffle(x, max(lane - offset, 0));
        if (lane >= offset) x += before;
      }
      x += carry;
      cum[base + lane] = x;
      carry = simd_shuffle(x, 31);
    }
  }
  async_wait(0);
  threadgroup_barrier();
  if (thread_id < CHUNK) w_scale[thread_id] = rate[thread_id] * exp2(cum[thread_id]);

  // K K^T into A, Q K^T into within: 16 x 8 tiles, the SIMD groups taking them in turn.
  for (int tile = warp; tile < 2 * ROW_TILES * (CHUNK / 8); tile += WARPS) {
    const bool keys = tile < ROW_TILES * (CHUNK / 8);
    const int rt = (tile % (ROW_TILES * (CHUNK / 8))) / (CHUNK / 8), ct = tile % (CHUNK / 8);
    const THREADGROUP_PTR T* rows = keys ? k_tile : qv_tile;
    TileAcc acc;
    tile_zero(acc);
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
      TileA<T> a;
      TileB<T> b;
      load_tile_a(a, rows + rt * 16 * LDK + ks * 16, LDK, lane);
      load_tile_b(b, k_tile + ct * 8 * LDK + ks * 16, LDK, lane);
      tile_mma(acc, a, b);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int i = rt * 16 + frag_row(lane) + 8 * h, j = ct * 8 + frag_col(lane);
      const float d0 = j <= i ? exp2(cum[i] - cum[j]) : 0.0f, d1 = j + 1 <= i ? exp2(cum[i] - cum[j + 1]) : 0.0f;
      if (keys) {
        a_mat[i * LDX + j] = j < i ? rate[i] * acc.v[2 * h] * d0 : 0.0f;
        a_mat[i * LDX + j + 1] = j + 1 < i ? rate[i] * acc.v[2 * h + 1] * d1 : 0.0f;
      } else {
        store_pair(acc.v[2 * h] * d0, acc.v[2 * h + 1] * d1, within + (chunk_at * CHUNK + i) * CHUNK + j);
      }
    }
  }
  threadgroup_barrier();  // A is whole; Q's rows are read: V's take their place
  COPY_ROWS(qv_tile, LDV, v, DV, HV, head)

  // X = (I + A)^-1 in 16 x 16 blocks. The diagonal blocks by forward substitution, a thread per
  // column: X[i][j] = -A[i][j] - sum_{j < m < i} A[i][m] X[m][j] within the block (zeros above it).
  for (int t = thread_id; t < CHUNK * 16; t += THREADS) {  // the blocks above the diagonal: zeros
    const int i = t / 16, block_col = t % 16;
#pragma unroll
    for (int jb = 0; jb < ROW_TILES; jb++)
      if (jb > i / 16) x_mat[i * LDX + jb * 16 + block_col] = 0.0f;
  }
  if (thread_id < CHUNK) {  // the column in registers: x[m] is X[first + m][j], zeros above the diagonal
    const int j = thread_id, first = j / 16 * 16, jj = j - first;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
      // -A[i][j] - sum_{j < m < i} A[i][m] X[m][j], in that order: the terms before m = j are zeros
      float sum = 0.0f;
#pragma unroll
      for (int m = 0; m < i; m++) sum -= a_mat[(first + i) * LDX + first + m] * x[m];
      x[i] = i < jj ? 0.0f : i == jj ? 1.0f : sum;
      x_mat[(first + i) * LDX + j] = x[i];
    }
  }
  threadgroup_barrier();
  // The blocks below it, block row after block row: X_IJ = -X_II (sum_{J <= K < I} A_IK X_KJ).
  for (int bi = 1; bi < ROW_TILES; bi++) {
    for (int bj = 0; bj < bi; bj++) {
      for (int t = thread_id; t < 256; t += THREADS) {
        const int r = bi * 16 + t / 16, c = bj * 16 + t % 16;
        float sum = 0.0f;
        for (int m = bj * 16; m < bi * 16; m++) sum += a_mat[r * LDX + m] * x_mat[m * LDX + c];
        block_sum[t] = sum;
      }
      threadgroup_barrier();
      for (int t = thread_id; t < 256; t += THREADS) {
        const int r = t / 16, c = t % 16;
        float x = -block_sum[t];
        for (int m = 0; m < r; m++) x -= x_mat[(bi * 16 + r) * LDX + bi * 16 + m] * block_sum[m * 16 + c];
        x_mat[(bi * 16 + r) * LDX + bj * 16 + c] = x;
      }
      threadgroup_barrier();
    }
  }
  async_wait(0);
  threadgroup_barrier();

  // w = X diag(beta 2^c) K and u = X diag(beta) V: a SIMD group per row tile and every
  // WARPS / ROW_TILES-th column tile of each.
  const int rt = warp % ROW_TILES, row0 = rt * 16;
  TileA<T> x_a[CHUNK / 16];
  x_fragments(x_mat, w_scale, row0, lane, x_a);
  for (int ct = warp / ROW_TILES; ct < DK / 8; ct += WARPS / ROW_TILES) {
    TileAcc acc;
    x_times(x_a, lane, k_tile, LDK, ct * 8, acc);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int i = row0 + frag_row(lane) + 8 * h;
      store_pair(acc.v[2 * h], acc.v[2 * h + 1], w + (chunk_at * CHUNK + i) * DK + ct * 8 + frag_col(lane));
    }
  }
  x_fragments(x_mat, rate, row0, lane, x_a);
  for (int ct = warp / ROW_TILES; ct < DV / 8; ct += WARPS / ROW_TILES) {
    TileAcc acc;
    x_times(x_a, lane, qv_tile, LDV, ct * 8, acc);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = row0 + frag_row(lane) + 8 * (e / 2), col = ct * 8 + frag_col(lane) + e % 2;
      from_float(acc.v[e], u + (chunk_at * DV + col) * CHUNK + i);
    }
  }
  if (thread_id < CHUNK) c_out[chunk_at * CHUNK + thread_id] = cum[thread_id];
