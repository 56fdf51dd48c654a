// Dense matrix-matrix products y [M, N] = x [M, K] · wᵀ (+ bias) on Hopper's warpgroup matrix
// products (wgmma, CUDA sm_90a only: Metal and other NVIDIA GPUs run gemm.h), float32
// accumulation: x and w of one 16-bit type TX, bias [N] of TB (BIAS), y of TY.
//
// A threadgroup of WARPGROUPS warpgroups (128 threads each) computes a BM x BN tile of y, BM = 64 *
// WARPGROUPS: warpgroup g the rows 64 g .. 64 g + 63, all BN columns, its accumulators in registers
// (BN / 2 floats a thread). K is taken in steps of BK = 64: each step's x tile (BM x 64) and w tile
// (BN x 64) are copied (cp.async, 16 bytes a copy) into one of STAGES stage buffers in
// dynamic threadgroup memory, laid out as the tensor cores read them (prelude: 128-byte rows, pieces
// swizzled by the row, tiles at multiples of 1024 bytes), STAGES - 2 steps ahead; each step is four
// wgmma of 16 k, one group, and a warpgroup keeps one step's group running while it issues the
// next. So at step s the buffer refilled is the one step s - 2 read, whose products every
// warpgroup has waited for before the barrier of step s.
//
// Bits. Every element of y sums its K products in steps of 16 along K in increasing order into one
// float32 accumulator, whatever BM, BN, STAGES, the grid or M; the bias is added once in float32 and
// y rounded once. So a row's bits depend on K only, never on M or on the tile shape the plan picks.
//
// Bounds. Rows of x past M (or outside the run), rows of w past N (or of a pick outside the
// batches) and k past K are zeros in the tiles and nothing is read for them: K is a multiple of 8
// (the route's), so each 16-byte copy is all in or all out. Nothing is written past M or N.
//
// GATHER (no BIAS): row i of x uses weight batch picks[i] of ints[3] batches (w holds them one after
// another, [batches, N, K]); a tile's rows run in turn by runs of equal picks, each run the whole
// product over its rows (the others zeros, not stored). The tiles are the table `tile_starts` gives
// (threadgroup t: rows tile_starts[t] .. tile_starts[t + 1], at most BM): for sorted picks (a mixture
// of experts' rows grouped by expert) each run of one batch in tiles of its own, so a tile runs
// once. A pick outside the batches gives zeros and reads no weights. A row's bits are those of its
// row in the product with its batch alone.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x and w: half or bfloat), TB (bias; with
// BIAS), TY, BIAS, GATHER, WARPGROUPS, BM (64 * WARPGROUPS), BN (64, 128, 224 or 256), BK (64), STAGES (at least
// 3), from `kernels/linear.py`, which launches 128 * WARPGROUPS threads with STAGES * (BM + BN) * 128
// + 1024 bytes of dynamic threadgroup memory (the 1024: the stages aligned to 1024 bytes), over the
// grid (row tiles, column tiles): threadgroups that share a tile of w run together, so w is read
// from memory about once.

#if BK != 64 || BM != 64 * WARPGROUPS || (BN != 64 && BN != 128 && BN != 224 && BN != 256) || STAGES < 3
#error "gemm_wgmma.h: BK 64, BM 64 per warpgroup, BN 64, 128, 224 or 256, at least 3 stages"
#endif
#define THREADS (128 * WARPGROUPS)
#define ROW_BYTES 128                             // a tile row: BK 16-bit elements
#define STAGE_BYTES ((BM + BN) * ROW_BYTES)       // a stage: the x tile, then the w tile
#define ROWS_A_PASS (THREADS / 8)                 // tile rows the threadgroup copies at once (8 pieces a row)
#define COPIES ((BM + BN) / ROWS_A_PASS)          // a thread's copies a step
#if (BM + BN) % ROWS_A_PASS != 0 || BM % ROWS_A_PASS != 0
#error "gemm_wgmma.h: every thread copies whole rows' pieces of x and of w"
#endif
#define ACCUMULATORS (BN / 2)

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32;
  const int warpgroup = thread_id / 128, warp = (thread_id / 32) % 4;
  TILE_ROWS(m_first, tile_end, nv_group.x, m_size)  // gathered: the tile table's
  const int n_first = (int)nv_group.y * BN;
  const int steps = (k_size + BK - 1) / BK;

  // The stages, from the first multiple of 1024 bytes of the dynamic threadgroup memory.
  DYNAMIC_THREADGROUP(dynamic_memory, STAGES * STAGE_BYTES + 1024);
  unsigned char* stages = (unsigned char*)dynamic_memory + ((1024u - (shared_address(dynamic_memory) & 1023u)) & 1023u);

  // This thread's copies: piece `piece` (16 bytes, 8 elements at k = 8 * piece) of tile rows
  // thread_id / 8 + ROWS_A_PASS * c (x's rows first, then w's), stored at piece piece ^ (row % 8) of
  // the row: row % 8 is the same for all of them (ROWS_A_PASS is a multiple of 8).
  const int piece = thread_id % 8, first_row = thread_id / 8;
  const int swizzled_piece = 16 * (piece ^ (first_row % 8));
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
    const DEVICE TX* from[COPIES];
    bool row_in[COPIES];
#pragma unroll
    for (int c = 0; c < COPIES; c++) {
      const int row = first_row + ROWS_A_PASS * c;
      if (row < BM) {
        row_in[c] = m_first + row >= run_start && m_first + row < run_end;
        from[c] = row_in[c] ? x + (size_t)(m_first + row) * k_size + 8 * piece : x;
      } else {
        row_in[c] = batch_real && n_first + row - BM < n_size;
        from[c] = row_in[c] ? w_batch + (size_t)(n_first + row - BM) * k_size + 8 * piece : w;
      }
    }
    // The copies of step STEP into its stage buffer, as one group (zeros where the row or k is out).
#define COPY_STEP(STEP)                                                                               \
    {                                                                                                   \
      const int k_first = (STEP) * BK;                                                                  \
      const bool k_in = k_first + 8 * piece < k_size;                                                   \
      unsigned char* stage = stages + ((STEP) % STAGES) * STAGE_BYTES + swizzled_piece;                 \
      _Pragma("unroll") for (int c = 0; c < COPIES; c++) {                                              \
        const bool present = row_in[c] && k_in;                                                         \
        async_copy16(stage + (first_row + ROWS_A_PASS * c) * ROW_BYTES, present ? from[c] + k_first : from[c], present); \
      }                                                                                                 \
      async_commit();                                                                                   \
    }

    float acc[ACCUMULATORS];
#pragma unroll
    for (int i = 0; i < ACCUMULATORS; i++) acc[i] = 0.0f;

    // The first STAGES - 2 steps in flight (an empty group past the last step keeps the count).
#pragma unroll
    for (int step = 0; step < STAGES - 2; step++) {
      if (step < steps) COPY_STEP(step) else async_commit();
    }
    for (int step = 0; step < steps; step++) {
      wgmma_stage_ready<STAGES - 3>();  // step's copies everyone's; stage step - 2 free
      if (step + STAGES - 2 < steps) COPY_STEP(step + STAGES - 2) else async_commit();
      const unsigned char* stage = stages + (step % STAGES) * STAGE_BYTES;
      wgmma_step<BN>(acc, (const TX*)(stage + warpgroup * 64 * ROW_BYTES), (const TX*)(stage + BM * ROW_BYTES));
    }
    wgmma_finish<BN>(acc);
    async_wait(0);  // only empty groups are left: none outlives the run

    // The bias added in float32 to each thread's columns (8 j + 2 (lane % 4) and + 1), then its
    // elements of y rounded once.
    const int column_first = n_first + 2 * (lane % 4);
#if BIAS
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      const int column = column_first + 8 * j;
      const float low = column < n_size ? to_float(bias[column]) : 0.0f, high = column + 1 < n_size ? to_float(bias[column + 1]) : 0.0f;
      acc[4 * j] += low;
      acc[4 * j + 1] += high;
      acc[4 * j + 2] += low;
      acc[4 * j + 3] += high;
    }
#endif
    store_accumulators<BN>(acc, y, m_first + 64 * warpgroup + 16 * warp + lane / 4, column_first, run_start, run_end, n_size);
    threadgroup_barrier();  // every thread is done with the stages before the next run fills them
    run_start = run_end;
  }
