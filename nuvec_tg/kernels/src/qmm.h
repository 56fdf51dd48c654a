// The quantized matrix-matrix product for many rows (prefill): y [M, N] = x [M, K] · wᵀ over packed
// weights (`quant_codes.h`), on the matrix units.
//
// A threadgroup of 4 SIMD groups computes a BM x BN tile of y in steps of BK = 32 along K (one
// chunk of codes per weight row). A step's packed weight words (BN chunks) and, where the mma reads
// x from threadgroup memory as it is (MMA_DIRECT, CUDA), its x tile (BM x BK) are copied into one
// of STAGES buffers of threadgroup memory STAGES - 1 steps ahead (asynchronous copies on CUDA: a
// step's products wait for no load issued after the step before them). Per step the weights are
// dequantized from their buffer (scale · code + bias, or the floating-point modes' code · scale;
// the scale and bias loaded a step ahead) and rounded into a BN x BK tile of MMA_INPUT(TX) (TX on
// CUDA, as MLX dequantizes into the activations' type; float on Metal, where each thread widens its
// pieces of x straight from device memory into x's float tile: Metal's copies are plain loads, so
// a stage buffer for x would only add a trip through threadgroup memory, and without it the
// threadgroup fits Metal's 32 KB); each SIMD group then multiplies its 32 x 32 quarter as 2 x 4
// tiles of 16 x 8 (`tile_mma`, float32 accumulation; each fragment loaded once a step). Rows of x
// past M, weight rows past N and codes past K (nvfp4: K = 16 mod 32) are zeros in the tiles and
// nothing is read for them.
//
// GATHER: row i of x uses weight batch picks[i] of ints[3] batches (w, scales and biases hold the
// batches one after another); a tile's rows run in turn by runs of equal picks. The row tiles are
// the table `tile_starts` gives (`TILE_ROWS`): for sorted picks (a mixture of experts' rows grouped
// by expert) each run of one batch in tiles of its own, so a tile runs once.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x; 16-bit), TS, TY,
// BITS, GROUP, MODE, LOAD_WORDS (words per copy of packed codes), GATHER, and the tiles' BM, BN,
// BK, TILE_LD (row stride of the tiles: padding against bank conflicts in the fragment loads) and
// STAGES, from `kernels/quant.py` (the grid and the threadgroup's size are computed there too).

#if BM != 64 || BN != 64 || BK != 32
#error "qmm.h: the threads' layout is written for 64 x 64 tiles in steps of 32 (128 threads)"
#endif
#define X_STAGE (BM * TILE_LD)       // x values per stage buffer
#define W_STAGE (BN * BITS)          // packed words per stage buffer (a chunk of 32 codes per weight row)
#define W_COPIES ((W_STAGE + LOAD_WORDS * 128 - 1) / (LOAD_WORDS * 128))  // copies of packed words a thread issues per step
typedef MMA_INPUT(TX) TileT;
#if LOAD_WORDS == 4
#define COPY_WORDS async_copy16
#elif LOAD_WORDS == 2
#define COPY_WORDS async_copy8
#else
#define COPY_WORDS async_copy4
#endif

// The copies of step STEP into its stage buffer: with MMA_DIRECT, x's pieces of 8 values in the
// run's rows (zeros elsewhere; K is a multiple of 8, so a piece is all in or all out), and the
// weight rows' packed words (nothing past N, past K or for a pick outside the batches), as one
// group of copies. The sources are the run's per-thread starts (`x_from`, `w_from`, set up before
// its steps) plus the step's offset.
#if MMA_DIRECT
#define COPY_X(k_first, stage)                                                                       \
  _Pragma("unroll") for (int i = 0; i < 2; i++) {                                                    \
    const bool present = x_row_in[i] && (k_first) + x_column < k_size;                                \
    async_copy16(x_stages + (stage) * X_STAGE + x_piece_row[i] * TILE_LD + x_column,                  \
                 present ? x_from[i] + (k_first) : x, present);                                       \
  }
#else
#define COPY_X(k_first, stage)  // x goes straight into its float tile at its step
#endif
#define COPY_STEP(STEP)                                                                              \
  {                                                                                                  \
    const int k_first = (STEP) * BK, stage = (STEP) % STAGES;                                         \
    COPY_X(k_first, stage)                                                                           \
    const int chunk_words = k_first + BK <= k_size ? BITS : (k_size - k_first) * BITS / BK;           \
    _Pragma("unroll") for (int copy = 0; copy < W_COPIES; copy++) {                                  \
      const int word = LOAD_WORDS * (thread_id + 128 * copy);                                         \
      if (W_STAGE % (LOAD_WORDS * 128) != 0 && word >= W_STAGE) break; /* past the stage buffer */   \
      const bool present = w_row_in[copy] && word % BITS < chunk_words;                               \
      COPY_WORDS(w_stages + stage * W_STAGE + word, present ? w_from[copy] + (STEP) * BITS : w, present); \
    }                                                                                                \
    async_commit();                                                                                  \
  }

// The scale (and bias) of this thread's weight row and 16 codes at step STEP, into scale_raw
// (and bias_raw): a row's groups are consecutive, so most of these loads hit the cache. Nothing
// is read for codes past K (nvfp4's half chunk: its second half has no group).
#if MODE == 0
#define LOAD_BIAS(INDEX) bias_raw = biases[INDEX];
#else
#define LOAD_BIAS(INDEX)
#endif
#define LOAD_SCALE(STEP)                                                                             \
  if (w_present && (STEP) * BK + 16 * half_index < k_size) {                                         \
    const size_t group_index = (first_w_row + w_row) * groups_per_row + ((STEP) * BK + 16 * half_index) / GROUP; \
    scale_raw = scales[group_index];                                                                 \
    LOAD_BIAS(group_index)                                                                           \
  }

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  const int n_first = (int)nv_group.x * BN;
  TILE_ROWS(m_first, tile_end, nv_group.y, m_size)  // gathered: the tile table's
  const int warp_m = (warp / 2) * 32, warp_n = (warp % 2) * 32;
  const int words_per_row = k_size / 32 * BITS + (k_size % 32) * BITS / 32;
  const int groups_per_row = k_size / GROUP;
  const int steps = (k_size + BK - 1) / BK;
  // The stage buffers as 16-byte words (the copies' alignment), seen as x values and packed words.
#if MMA_DIRECT
  THREADGROUP uint4 x_stage_memory[STAGES * X_STAGE * sizeof(TX) / 16];
  THREADGROUP_PTR TX* x_stages = (THREADGROUP_PTR TX*)x_stage_memory;
#endif
  THREADGROUP uint4 w_stage_memory[STAGES * W_STAGE / 4];
  THREADGROUP_PTR uint* w_stages = (THREADGROUP_PTR uint*)w_stage_memory;
  THREADGROUP uint4 w_tile_memory[BN * TILE_LD * sizeof(TileT) / 16];  // 16-byte aligned rows (the fragment loads)
  THREADGROUP_PTR TileT* w_tile = (THREADGROUP_PTR TileT*)w_tile_memory;
#if !MMA_DIRECT
  THREADGROUP TileT x_tile[BM * TILE_LD];
#endif
  THREADGROUP float out_tile[4 * 16 * 8];
  const int x_piece_row[2] = {thread_id / 4, (thread_id + 128) / 4}, x_column = (thread_id % 4) * 8;
  // A thread dequantizes 16 codes (half a chunk) of one weight row: SIMD groups 0-1 the first
  // halves, 2-3 the second (a SIMD-group-uniform half: the decoding indexes the words by constants).
  const int w_r = thread_id % BN, half_index = thread_id / BN, w_row = n_first + w_r;

  for (int run_start = m_first; run_start < tile_end;) {
    // The tile's rows in runs of one weight batch (sorted picks: few runs); a pick outside the
    // batches reads no weights and gives zeros.
    QUANT_RUN(run_start, tile_end, n_size)
    const bool w_present = batch_real && w_row < n_size;
    // Where this thread's copies start (step 0), and whether it has them at all.
    const DEVICE TX* x_from[2];
    bool x_row_in[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int row = m_first + x_piece_row[i];
      x_row_in[i] = row >= run_start && row < run_end;
      x_from[i] = x + (size_t)(x_row_in[i] ? row : 0) * k_size + x_column;
    }
    const DEVICE uint* w_from[W_COPIES];
    bool w_row_in[W_COPIES];
#pragma unroll
    for (int copy = 0; copy < W_COPIES; copy++) {
      const int word = LOAD_WORDS * (thread_id + 128 * copy), row = n_first + word / BITS;
      w_row_in[copy] = batch_real && row < n_size;
      w_from[copy] = w + (first_w_row + (w_row_in[copy] ? row : 0)) * words_per_row + word % BITS;
    }
    TileAcc acc[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int ni = 0; ni < 4; ni++) tile_zero(acc[mi][ni]);

    // The first STAGES - 1 steps in flight (an empty group past the last step keeps the count).
#pragma unroll
    for (int step = 0; step < STAGES - 1; step++) {
      if (step < steps) COPY_STEP(step) else async_commit();
    }
    TS scale_raw;
#if MODE == 0
    TS bias_raw;
#endif
    LOAD_SCALE(0)
    for (int step = 0; step < steps; step++) {
      // This step's copies are done (this thread's, then everyone's), and every thread is done
      // with the step before: its stage buffer takes the copies of step + STAGES - 1.
      async_wait(STAGES - 2);
      threadgroup_barrier();
      if (step + STAGES - 1 < steps) COPY_STEP(step + STAGES - 1) else async_commit();
      const int stage = step % STAGES;

      // The weights dequantized (a thread: 16 codes, half a chunk, of one row under one scale).
      float w_values[16];
      if (w_present && step * BK + 16 * half_index < k_size) {
        uint words[BITS];
        const THREADGROUP_PTR uint* chunk = w_stages + stage * W_STAGE + w_r * BITS;
#if BITS % 4 == 0
#pragma unroll
        for (int i = 0; i < BITS; i += 4) {
          const uint4 piece = *(const THREADGROUP_PTR uint4*)(chunk + i);
          words[i] = piece.x; words[i + 1] = piece.y; words[i + 2] = piece.z; words[i + 3] = piece.w;
        }
#else
#pragma unroll
        for (int i = 0; i < BITS; i++) words[i] = chunk[i];
#endif
        if (half_index == 0) {
          decode_part(words, 0, w_values);
          decode_part(words, 1, w_values + 8);
        } else {
          decode_part(words, 2, w_values);
          decode_part(words, 3, w_values + 8);
        }
#if MODE == 0
        scale_codes(w_values, 16, group_scale(scale_raw), to_float(bias_raw));
#else
        scale_codes(w_values, 16, group_scale(scale_raw), 0.0f);
#endif
      } else {
#pragma unroll
        for (int j = 0; j < 16; j++) w_values[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 16; j += 2) to_tile2(w_values[j], w_values[j + 1], &w_tile[w_r * TILE_LD + 16 * half_index + j]);
      if (step + 1 < steps) LOAD_SCALE(step + 1)
#if MMA_DIRECT
      const THREADGROUP_PTR TileT* x_tile = x_stages + stage * X_STAGE;
#else
      // This thread's pieces of x, widened from device memory into x's float tile (zeros past the
      // run's rows or past K). Every SIMD group finished the step before's products at the barrier.
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const bool present = x_row_in[i] && step * BK + x_column < k_size;
#pragma unroll
        for (int j = 0; j < 8; j++)
          x_tile[x_piece_row[i] * TILE_LD + x_column + j] = present ? to_float(x_from[i][step * BK + j]) : 0.0f;
      }
#endif
      threadgroup_barrier();
#pragma unroll
      for (int k_step = 0; k_step < BK; k_step += 16) {
        TileA<TileT> a[2];
        TileB<TileT> b[4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) load_tile_a(a[mi], x_tile + (warp_m + 16 * mi) * TILE_LD + k_step, TILE_LD, lane);
#pragma unroll
        for (int ni = 0; ni < 4; ni++) load_tile_b(b[ni], w_tile + (warp_n + 8 * ni) * TILE_LD + k_step, TILE_LD, lane);
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
          for (int ni = 0; ni < 4; ni++) tile_mma(acc[mi][ni], a[mi], b[ni]);
      }
    }
    async_wait(0);  // only empty groups are left: none outlives the run

    // Each 16 x 8 tile through the SIMD group's scratch, then out (rounded once) for the run's rows.
    THREADGROUP_PTR float* scratch = out_tile + warp * 16 * 8;
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
#pragma unroll
      for (int ni = 0; ni < 4; ni++) {
        tile_store(acc[mi][ni], scratch, 8, lane);
        simd_barrier();
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int index = lane + 32 * i, row = m_first + warp_m + 16 * mi + index / 8, column = n_first + warp_n + 8 * ni + index % 8;
          if (row >= run_start && row < run_end && column < n_size) from_float(scratch[index], &y[(size_t)row * n_size + column]);
        }
        simd_barrier();
      }
    }
    threadgroup_barrier();  // every SIMD group is done with the stage buffers before the next run fills them
    run_start = run_end;
  }
