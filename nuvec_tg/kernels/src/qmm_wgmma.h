// The quantized matrix-matrix product for many rows (prefill), y [M, N] = x [M, K] · wᵀ over packed
// weights (`quant_codes.h`), on Hopper's warpgroup matrix products (wgmma, CUDA sm_90a only: Metal
// and other NVIDIA GPUs run qmm.h). gemm_wgmma.h's main loop with w's tile dequantized in
// threadgroup memory instead of copied.
//
// A threadgroup of WARPGROUPS warpgroups computes a BM x BN tile of y (BM = 64 * WARPGROUPS, each
// warpgroup 64 rows by all BN columns in its registers) in steps of BK = 64 along K (two chunks of
// codes a weight row). Each step's x tile (BM x 64, swizzled 128-byte rows as the tensor cores read
// them: the prelude's layout) and the weight rows' packed words (BN x 2 BITS words) are copied
// (cp.async) into one of STAGES stage buffers, STAGES - 2 steps ahead. At step s the threads
// dequantize the step's words (scale · code + bias, or the floating-point modes' code · scale, the
// scales read a step ahead) into w tile s % 2 in x's type (rounded once: `store_tile_part`), in the same swizzled
// layout, while the tensor cores still run step s - 1's products; then each warpgroup issues step
// s's four wgmma of 16 k as one group and waits for step s - 1's. So the buffers refilled at step s
// (stage s - 2, w tile s % 2) are those step s - 2 read, which every warpgroup has waited for before
// step s's first barrier.
//
// Bits. Every element of y sums its K products in steps of 16 along K in increasing order into one
// float32 accumulator, the weights rounded to TX first, whatever BM, BN, STAGES, the grid or M. So a
// row's bits never depend on M or on the tile shape the plan picks.
//
// Bounds. Rows of x past M (or outside the run), weight rows past N (or of a pick outside the
// batches) are zeros and nothing is read for them; K is a multiple of 64 (the route's), so every
// step is whole.
//
// GATHER: row i of x uses weight batch picks[i] of ints[3] batches (w, scales and biases hold the
// batches one after another); a tile's rows run in turn by runs of equal picks (qmm.h's way). The
// tiles are the table `tile_starts` gives (threadgroup t: rows tile_starts[t] .. tile_starts[t + 1],
// at most BM): for sorted picks (a mixture of experts' rows grouped by expert) each run of one batch
// in tiles of its own, so a tile runs once.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x; 16-bit), TS, TY, BITS,
// GROUP, MODE, GATHER, WARPGROUPS, BM, BN (128 or 256), BK (64), STAGES (at least 3), COPY_BYTES
// (the words' copies: 16 for an even BITS, else 8), PAIRS (quant_codes.h), from `kernels/quant.py`, which launches 128 *
// WARPGROUPS threads with STAGES * (BM * 128 + BN * 8 * BITS) + 2 * BN * 128 + 1024 bytes of dynamic
// threadgroup memory over the grid (row tiles, column tiles).

#if BK != 64 || BM != 64 * WARPGROUPS || (BN != 128 && BN != 256) || STAGES < 3
#error "qmm_wgmma.h: BK 64, BM 64 per warpgroup, BN 128 or 256, at least 3 stages"
#endif
#define THREADS (128 * WARPGROUPS)
#define ROW_BYTES 128                              // a tile row: BK 16-bit elements
#define X_BYTES (BM * ROW_BYTES)                   // a stage's x tile ...
#define WORD_ROW_BYTES (8 * BITS)                  // ... a weight row's words of a step (2 chunks) ...
#define STAGE_BYTES (X_BYTES + BN * WORD_ROW_BYTES)  // ... and the stage
#define W_TILE_BYTES (BN * ROW_BYTES)              // a dequantized w tile
#define X_ROWS_A_PASS (THREADS / 8)                // x rows copied at once (8 pieces a row)
#define X_COPIES (BM / X_ROWS_A_PASS)
#define WORD_COPIES_A_ROW (WORD_ROW_BYTES / COPY_BYTES)
#define WORD_COPIES ((BN * WORD_COPIES_A_ROW + THREADS - 1) / THREADS)
#define UNITS (2 * BN / THREADS)                   // (weight row, chunk) pairs a thread dequantizes a step
#if (2 * BN) % THREADS != 0 || BM % X_ROWS_A_PASS != 0 || WORD_ROW_BYTES % COPY_BYTES != 0
#error "qmm_wgmma.h: every thread dequantizes whole chunks and copies whole rows' pieces of x"
#endif
#if COPY_BYTES == 16
#define COPY_WORDS async_copy16
#else
#define COPY_WORDS async_copy8
#endif
#define ACCUMULATORS (BN / 2)

// A chunk's BITS words from threadgroup memory in the widest loads its place allows: 16 bytes where
// BITS is a multiple of 4, 8 where it is even, else 4.
INLINE void stage_chunk_words(const unsigned char* at, THREAD uint* words) {
#if BITS % 4 == 0
#pragma unroll
  for (int i = 0; i < BITS; i += 4) {
    const uint4 piece = *(const uint4*)(at + 4 * i);
    words[i] = piece.x; words[i + 1] = piece.y; words[i + 2] = piece.z; words[i + 3] = piece.w;
  }
#elif BITS % 2 == 0
#pragma unroll
  for (int i = 0; i < BITS; i += 2) {
    const uint2 piece = *(const uint2*)(at + 4 * i);
    words[i] = piece.x; words[i + 1] = piece.y;
  }
#else
#pragma unroll
  for (int i = 0; i < BITS; i++) words[i] = ((const uint*)at)[i];
#endif
}

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32;
  const int warpgroup = thread_id / 128, warp = (thread_id / 32) % 4;
  TILE_ROWS(m_first, tile_end, nv_group.x, m_size)  // gathered: the tile table's
  const int n_first = (int)nv_group.y * BN;
  const int steps = k_size / BK;
  const size_t words_per_row = (size_t)k_size / 32 * BITS;
  const int groups_per_row = k_size / GROUP;

  // The stages, then the two w tiles, from the first multiple of 1024 bytes of the dynamic memory.
  DYNAMIC_THREADGROUP(dynamic_memory, STAGES * STAGE_BYTES + 2 * W_TILE_BYTES + 1024);
  unsigned char* stages = (unsigned char*)dynamic_memory + ((1024u - (shared_address(dynamic_memory) & 1023u)) & 1023u);
  unsigned char* w_tiles = stages + STAGES * STAGE_BYTES;

  // This thread's x copies: piece `piece` of tile rows thread_id / 8 + X_ROWS_A_PASS * c, stored at
  // piece piece ^ (row % 8) (row % 8 the same for all). Its words' copies: COPY_BYTES pieces
  // thread_id + THREADS * c of the step's BN * WORD_COPIES_A_ROW.
  const int piece = thread_id % 8, first_row = thread_id / 8;
  const int swizzled_piece = 16 * (piece ^ (first_row % 8));
  // This thread's dequantized units: weight row unit_row[u] of the tile, chunk unit_chunk[u] (0, 1) of
  // the step.
  int unit_row[UNITS], unit_chunk[UNITS];
#pragma unroll
  for (int u = 0; u < UNITS; u++) {
    unit_row[u] = (thread_id + THREADS * u) % BN;
    unit_chunk[u] = (thread_id + THREADS * u) / BN;
  }

  for (int run_start = m_first; run_start < tile_end;) {
    QUANT_RUN(run_start, tile_end, n_size)  // the tile's rows in runs of one weight batch
    const DEVICE TX* x_from[X_COPIES];
    bool x_in[X_COPIES];
    x_copy_sources<X_COPIES>(x, m_first, first_row, X_ROWS_A_PASS, piece, run_start, run_end, k_size, x_from, x_in);
    const DEVICE uint* w_from[WORD_COPIES];
    bool w_in[WORD_COPIES];
    int w_to[WORD_COPIES];
#pragma unroll
    for (int c = 0; c < WORD_COPIES; c++) {
      const int copy = thread_id + THREADS * c, row = copy / WORD_COPIES_A_ROW;
      w_in[c] = batch_real && copy < BN * WORD_COPIES_A_ROW && n_first + row < n_size;
      w_to[c] = X_BYTES + copy * COPY_BYTES;
      w_from[c] = w + (first_w_row + (w_in[c] ? n_first + row : 0)) * words_per_row + (copy % WORD_COPIES_A_ROW) * (COPY_BYTES / 4);
    }
    bool unit_in[UNITS];
    size_t unit_groups[UNITS];  // the unit's row's first group
#pragma unroll
    for (int u = 0; u < UNITS; u++) {
      unit_in[u] = batch_real && n_first + unit_row[u] < n_size;
      unit_groups[u] = (first_w_row + (unit_in[u] ? n_first + unit_row[u] : 0)) * groups_per_row;
    }
// The copies of step STEP into its stage buffer, as one group (zeros for rows that are out).
#define COPY_STEP(STEP)                                                                               \
  {                                                                                                   \
    unsigned char* stage = stages + ((STEP) % STAGES) * STAGE_BYTES;                                  \
    _Pragma("unroll") for (int c = 0; c < X_COPIES; c++)                                              \
      async_copy16(stage + swizzled_piece + (first_row + X_ROWS_A_PASS * c) * ROW_BYTES,              \
                   x_in[c] ? x_from[c] + (STEP) * BK : x_from[c], x_in[c]);                           \
    _Pragma("unroll") for (int c = 0; c < WORD_COPIES; c++) {                                         \
      if ((BN * WORD_COPIES_A_ROW) % THREADS != 0 && thread_id + THREADS * c >= BN * WORD_COPIES_A_ROW) break; \
      COPY_WORDS(stage + w_to[c], w_in[c] ? w_from[c] + (size_t)(STEP) * 2 * BITS : w_from[c], w_in[c]); \
    }                                                                                                 \
    async_commit();                                                                                   \
  }
// The scales (and biases) of this thread's units at step STEP (a chunk's SCALES_PER_CHUNK groups).
#if MODE == 0
#define LOAD_BIAS(U, H, INDEX) bias_raw[U][H] = biases[INDEX];
#else
#define LOAD_BIAS(U, H, INDEX)
#endif
#define LOAD_SCALES(STEP)                                                                             \
  _Pragma("unroll") for (int u = 0; u < UNITS; u++)                                                   \
    _Pragma("unroll") for (int h = 0; h < SCALES_PER_CHUNK; h++) {                                    \
      if (unit_in[u]) {                                                                               \
        const size_t index = unit_groups[u] + ((STEP) * BK + 32 * unit_chunk[u] + CHUNK_GROUP * h) / GROUP; \
        scale_raw[u][h] = scales[index];                                                              \
        LOAD_BIAS(u, h, index)                                                                        \
      }                                                                                               \
    }

    float acc[ACCUMULATORS];
#pragma unroll
    for (int i = 0; i < ACCUMULATORS; i++) acc[i] = 0.0f;
    TS scale_raw[UNITS][SCALES_PER_CHUNK];
#if MODE == 0
    TS bias_raw[UNITS][SCALES_PER_CHUNK];
#endif
#pragma unroll
    for (int step = 0; step < STAGES - 2; step++) {
      if (step < steps) COPY_STEP(step) else async_commit();
    }
    LOAD_SCALES(0)
    for (int step = 0; step < steps; step++) {
      wgmma_stage_ready<STAGES - 3>();  // step's copies everyone's; stage step - 2 free
      if (step + STAGES - 2 < steps) COPY_STEP(step + STAGES - 2) else async_commit();
      const unsigned char* stage = stages + (step % STAGES) * STAGE_BYTES;
      unsigned char* w_tile = w_tiles + (step % 2) * W_TILE_BYTES;

      // The step's weights dequantized into w tile step % 2: unit u's 32 codes as four 16-byte
      // pieces of its row (zeros for a row that is out).
#pragma unroll
      for (int u = 0; u < UNITS; u++) {
        uint words[BITS];
        stage_chunk_words(stage + X_BYTES + unit_row[u] * WORD_ROW_BYTES + unit_chunk[u] * 4 * BITS, words);
#pragma unroll
        for (int part = 0; part < 4; part++) {
          const int h = part * SCALES_PER_CHUNK / 4;  // the part's group of the chunk
#if MODE == 0
          const float bias = unit_in[u] ? to_float(bias_raw[u][h]) : 0.0f;
#else
          const float bias = 0.0f;
#endif
          store_tile_part<TX>(words, part, unit_in[u] ? group_scale(scale_raw[u][h]) : 0.0f, bias, w_tile, unit_row[u],
                              4 * unit_chunk[u] + part);
        }
      }
      if (step + 1 < steps) LOAD_SCALES(step + 1)
      // The dequantized tile visible to the tensor cores, from every thread.
      async_proxy_fence();
      threadgroup_barrier();
      wgmma_step<BN>(acc, (const TX*)(stage + warpgroup * 64 * ROW_BYTES), (const TX*)w_tile);
    }
    wgmma_finish<BN>(acc);
    async_wait(0);  // only empty groups are left: none outlives the run

    // Each thread's elements of y for the run's rows, rounded once.
    store_accumulators<BN>(acc, y, m_first + 64 * warpgroup + 16 * warp + lane / 4, n_first + 2 * (lane % 4), run_start, run_end,
                           n_size);
    threadgroup_barrier();  // every thread is done with the stages and tiles before the next run fills them
    run_start = run_end;
  }
