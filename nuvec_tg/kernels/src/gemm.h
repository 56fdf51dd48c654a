// Dense matrix-matrix products y [M, N] = x [M, K] · wᵀ (+ bias) for more rows than gemv takes
// (prefill), on the matrix units, float32 accumulation: x and w of one 16-bit type TX, bias [N]
// of TB (BIAS), y of TY.
//
// A threadgroup of WARPS_M x WARPS_N SIMD groups computes a BM x BN tile of y in steps of BK = 32
// along K, each SIMD group a WM x WN part of it as MI x NI tiles of 16 x 8 (`tile_mma`), each
// fragment loaded once a half step.
//
// CUDA (MMA_DIRECT): each step's x tile (BM x BK) and w tile (BN x BK) are copied (cp.async)
// STAGES - 1 steps ahead into one of STAGES stage buffers, so a step's products wait for no copy
// issued after the step before them. A stage tile's rows are 64 bytes, their four 16-byte pieces
// stored in an order swizzled by the row (`swizzled`): the eight rows one ldmatrix reads at a
// piece, and the pieces that eight consecutive threads copy, fall in distinct banks without
// padding (3 stages of 128 x 128 tiles are 48 KB, the most a kernel may declare statically).
// Each lane gives ldmatrix its own row's address (`load_tile_a_at`, `load_tile_b2_at`).
// Metal (no MMA_DIRECT): copies are plain loads, so staging buys nothing: every thread widens its
// pieces of x and w from device memory into float tiles (TILE_LD floats a row: padding against
// bank conflicts), and simdgroup matrices multiply them.
// Both write each lane's accumulator elements (`frag_row`, `frag_col`) straight to y, in pairs
// where N is even.
//
// Bits. Every element of y sums its K products in one order, the matrix units' steps of 16 along
// K in increasing order into one float32 accumulator, whatever the tile shape, the grid or M; the
// bias is added once in float32 and y rounded once. So a row's bits depend on K and the backend
// only, never on M or on which tile shape the plan picks.
//
// Bounds. Rows of x past M (or outside the run), rows of w past N (or of a pick outside the
// batches) and k past K are zeros in the tiles, and nothing is read for them: on CUDA K is a multiple of COPY_BYTES / 2, so each copy is all in or all out;
// on Metal each element is checked. Nothing is written past M or N.
//
// GATHER (no BIAS): row i of x uses weight batch picks[i] of ints[3] batches (w holds them one
// after another, [batches, N, K]); a tile's rows run in turn by runs of equal picks, each run the
// whole product over its rows (the others zeros, not stored). The row tiles are the table
// `tile_starts` gives (`TILE_ROWS`): for sorted picks (a mixture of experts' rows grouped by
// expert) each run of one batch in tiles of its own, so a tile runs once. A pick outside the
// batches gives zeros and reads no weights. A row's bits are those of its row in the product with
// its batch alone.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x and w: half or
// bfloat), TB (bias; with BIAS), TY, BIAS, GATHER, BM, BN, BK (32), WARPS_M, WARPS_N, STAGES, COPY_BYTES (16, 8 or 4),
// TILE_LD (Metal's float tiles' row stride), from `kernels/linear.py`. The grid is (row tiles,
// column tiles): threadgroups that share a tile of w run together, so w is read from memory
// about once; 32 * WARPS_M * WARPS_N threads.

#if BK != 32
#error "gemm.h: the swizzle and the copies are written for steps of 32 along K"
#endif
#define THREADS (32 * WARPS_M * WARPS_N)
#define WM (BM / WARPS_M)                    // a SIMD group's rows of the tile ...
#define WN (BN / WARPS_N)                    // ... and columns
#define MI (WM / 16)
#define NI (WN / 8)
#define PIECES_PER_ROW (BK / 8)              // 8-element (16-byte) pieces of a tile row
#define X_PIECES (BM * PIECES_PER_ROW / THREADS)  // pieces of the x tile a thread copies a step
#define W_PIECES (BN * PIECES_PER_ROW / THREADS)
#if WM % 16 != 0 || NI % 2 != 0 || (BM * PIECES_PER_ROW) % THREADS != 0 || (BN * PIECES_PER_ROW) % THREADS != 0
#error "gemm.h: SIMD groups take 16-row and 16-column multiples, and every thread copies whole pieces"
#endif
typedef MMA_INPUT(TX) TileT;

#if MMA_DIRECT
#define X_STAGE (BM * BK)                    // elements of a stage's x tile
#define W_STAGE (BN * BK)
// The element offset of (row, column) in a stage tile: 64-byte rows whose 16-byte piece p is stored
// at (p ^ row / 2) % 4. Adding a multiple of 8 to the row adds that many rows and nothing else.
INLINE int swizzled(int row, int column) { return row * BK + ((((column >> 3) ^ (row >> 1)) & 3) << 3) + (column & 7); }
#define COPY_ELEMENTS (COPY_BYTES / 2)
#if COPY_BYTES == 16
#define COPY async_copy16
#elif COPY_BYTES == 8
#define COPY async_copy8
#else
#define COPY async_copy4
#endif
// A piece of 8 elements from `from` (its row's element `k`; `row_in`: the row exists) into a
// stage tile at `to`, as copies of COPY_BYTES: zeros for a row that does not exist or k past K,
// and then nothing is read (`any`: a valid address for the copies that read nothing).
INLINE void copy_piece(THREADGROUP_PTR TX* to, const DEVICE TX* from, const DEVICE TX* any, bool row_in, int k, int k_size) {
#pragma unroll
  for (int c = 0; c < 8 / COPY_ELEMENTS; c++) {
    const bool present = row_in && k + c * COPY_ELEMENTS < k_size;
    COPY(to + c * COPY_ELEMENTS, present ? from + c * COPY_ELEMENTS : any, present);
  }
}
#endif

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  TILE_ROWS(m_first, tile_end, nv_group.x, m_size)  // gathered: the tile table's
  const int n_first = (int)nv_group.y * BN;
  const int warp_m = (warp / WARPS_N) * WM, warp_n = (warp % WARPS_N) * WN;
  const int steps = (k_size + BK - 1) / BK;
  // This thread's pieces of each tile: pieces thread_id + THREADS * i, row piece / PIECES_PER_ROW,
  // at k = piece_k (the same for all of them: THREADS is a multiple of PIECES_PER_ROW).
  const int piece_k = (thread_id % PIECES_PER_ROW) * 8;
  int x_row[X_PIECES], w_row[W_PIECES];
#pragma unroll
  for (int i = 0; i < X_PIECES; i++) x_row[i] = (thread_id + THREADS * i) / PIECES_PER_ROW;
#pragma unroll
  for (int i = 0; i < W_PIECES; i++) w_row[i] = (thread_id + THREADS * i) / PIECES_PER_ROW;

#if MMA_DIRECT
  // The stage buffers as 16-byte words (the copies' alignment), seen as x's and w's tiles.
  THREADGROUP uint4 stage_memory[STAGES * (X_STAGE + W_STAGE) * sizeof(TX) / 16];
  THREADGROUP_PTR TX* x_stages = (THREADGROUP_PTR TX*)stage_memory;
  THREADGROUP_PTR TX* w_stages = x_stages + STAGES * X_STAGE;
  int x_to[X_PIECES], w_to[W_PIECES];
#pragma unroll
  for (int i = 0; i < X_PIECES; i++) x_to[i] = swizzled(x_row[i], piece_k);
#pragma unroll
  for (int i = 0; i < W_PIECES; i++) w_to[i] = swizzled(w_row[i], piece_k);
  // This lane's ldmatrix row in each half step (16 columns), from its SIMD group's first row (a
  // multiple of 16 for x, of 8 for each pair of w's tiles: the swizzle repeats every 8 rows).
  int a_lane[2], b_lane[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    a_lane[h] = swizzled(lane % 16, 16 * h + (lane / 16) * 8);
    b_lane[h] = swizzled((lane / 16) * 8 + lane % 8, 16 * h + ((lane / 8) % 2) * 8);
  }
// The copies of step STEP into its stage buffer, as one group.
#define COPY_STEP(STEP)                                                                              \
  {                                                                                                  \
    const int k_first = (STEP) * BK, stage = (STEP) % STAGES;                                         \
    _Pragma("unroll") for (int i = 0; i < X_PIECES; i++)                                             \
      copy_piece(x_stages + stage * X_STAGE + x_to[i], x_from[i] + k_first, x, x_in[i], k_first + piece_k, k_size); \
    _Pragma("unroll") for (int i = 0; i < W_PIECES; i++)                                             \
      copy_piece(w_stages + stage * W_STAGE + w_to[i], w_from[i] + k_first, w, w_in[i], k_first + piece_k, k_size); \
    async_commit();                                                                                  \
  }
#else
  THREADGROUP TileT x_tile[BM * TILE_LD];
  THREADGROUP TileT w_tile[BN * TILE_LD];
#endif

  for (int run_start = m_first; run_start < tile_end;) {
#if GATHER
    // The tile's rows in runs of one weight batch; a pick outside the batches reads no weights.
    const int batch = picks[run_start], run_end = pick_run_end(picks, run_start, tile_end);
    const bool batch_real = batch >= 0 && batch < ints[3];
    const DEVICE TX* const w_batch = w + (size_t)(batch_real ? batch : 0) * n_size * k_size;
#else
    const int run_end = tile_end;
    const bool batch_real = true;
    const DEVICE TX* const w_batch = w;
#endif
    const DEVICE TX* x_from[X_PIECES];
    const DEVICE TX* w_from[W_PIECES];
    bool x_in[X_PIECES], w_in[W_PIECES];
#pragma unroll
    for (int i = 0; i < X_PIECES; i++) {
      x_in[i] = m_first + x_row[i] >= run_start && m_first + x_row[i] < run_end;
      x_from[i] = x + (size_t)(x_in[i] ? m_first + x_row[i] : 0) * k_size + piece_k;
    }
#pragma unroll
    for (int i = 0; i < W_PIECES; i++) {
      w_in[i] = batch_real && n_first + w_row[i] < n_size;
      w_from[i] = w_batch + (size_t)(w_in[i] ? n_first + w_row[i] : 0) * k_size + piece_k;
    }
    TileAcc acc[MI][NI];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int ni = 0; ni < NI; ni++) tile_zero(acc[mi][ni]);

#if MMA_DIRECT
    // The first STAGES - 1 steps in flight (an empty group past the last step keeps the count).
#pragma unroll
    for (int step = 0; step < STAGES - 1; step++) {
      if (step < steps) COPY_STEP(step) else async_commit();
    }
    for (int step = 0; step < steps; step++) {
      // This step's copies are done (this thread's, then everyone's), and every thread is done with
      // the step before: its stage buffer takes the copies of step + STAGES - 1.
      async_wait(STAGES - 2);
      threadgroup_barrier();
      if (step + STAGES - 1 < steps) COPY_STEP(step + STAGES - 1) else async_commit();
      const THREADGROUP_PTR TX* x_tile = x_stages + (step % STAGES) * X_STAGE;
      const THREADGROUP_PTR TX* w_tile = w_stages + (step % STAGES) * W_STAGE;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        TileA<TileT> a[MI];
        TileB<TileT> b[NI];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) load_tile_a_at(a[mi], x_tile + (warp_m + 16 * mi) * BK + a_lane[h]);
#pragma unroll
        for (int ni = 0; ni < NI; ni += 2) load_tile_b2_at(b[ni], b[ni + 1], w_tile + (warp_n + 8 * ni) * BK + b_lane[h]);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
          for (int ni = 0; ni < NI; ni++) tile_mma(acc[mi][ni], a[mi], b[ni]);
      }
    }
    async_wait(0);  // only empty groups are left: none outlives the run
#else
    for (int step = 0; step < steps; step++) {
      // Every SIMD group is done with the step before's tiles; this thread's pieces of x and w are
      // widened into them (zeros past M, N or K, and outside the run).
      threadgroup_barrier();
      const int k = step * BK + piece_k;
#pragma unroll
      for (int i = 0; i < X_PIECES; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
          x_tile[x_row[i] * TILE_LD + piece_k + j] = x_in[i] && k + j < k_size ? to_float(x_from[i][step * BK + j]) : 0.0f;
#pragma unroll
      for (int i = 0; i < W_PIECES; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
          w_tile[w_row[i] * TILE_LD + piece_k + j] = w_in[i] && k + j < k_size ? to_float(w_from[i][step * BK + j]) : 0.0f;
      threadgroup_barrier();
#pragma unroll
      for (int h = 0; h < 2; h++) {
        TileA<TileT> a[MI];
        TileB<TileT> b[NI];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) load_tile_a(a[mi], x_tile + (warp_m + 16 * mi) * TILE_LD + 16 * h, TILE_LD, lane);
#pragma unroll
        for (int ni = 0; ni < NI; ni++) load_tile_b(b[ni], w_tile + (warp_n + 8 * ni) * TILE_LD + 16 * h, TILE_LD, lane);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
          for (int ni = 0; ni < NI; ni++) tile_mma(acc[mi][ni], a[mi], b[ni]);
      }
    }
#endif

    // Each lane's elements of y for the run's rows (rows frag_row and + 8, columns frag_col and + 1
    // of each 16 x 8 tile), the bias added in float32, rounded once; a pair in one store where N is
    // even (then aligned).
    const int lane_row = frag_row(lane), lane_column = frag_col(lane);
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      const int column = n_first + warp_n + 8 * ni + lane_column;
#if BIAS
      const float bias_pair[2] = {column < n_size ? to_float(bias[column]) : 0.0f,
                                  column + 1 < n_size ? to_float(bias[column + 1]) : 0.0f};
#endif
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int half_tile = 0; half_tile < 2; half_tile++) {
          const int row = m_first + warp_m + 16 * mi + lane_row + 8 * half_tile;
          if (row < run_start || row >= run_end) continue;
          float low = acc[mi][ni].v[2 * half_tile], high = acc[mi][ni].v[2 * half_tile + 1];
#if BIAS
          low += bias_pair[0];
          high += bias_pair[1];
#endif
          store_row_pair(low, high, y + (size_t)row * n_size + column, column, n_size);
        }
    }
    threadgroup_barrier();  // every thread is done with the tiles before the next run fills them
    run_start = run_end;
  }
