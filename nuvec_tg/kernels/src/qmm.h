// The quantized matrix-matrix product for many rows (prefill): y [M, N] = x [M, K] · wᵀ over packed
// weights (`quant_codes.h`), on the matrix units.
//
// A threadgroup of 4 SIMD groups computes a BM x BN tile of y. Per step of BK = 32 along K (one
// chunk of codes per weight row) it stages x's BM x BK tile and the weights' BN x BK tile,
// dequantized (scale · code + bias, or the floating-point modes' code · scale) and rounded to the
// tile type (MMA_INPUT(TX): TX on CUDA, as MLX dequantizes into the activations' type; float on
// Metal), in threadgroup memory; each SIMD group then multiplies its 32 x 32 quarter as 2 x 4
// tiles of 16 x 8 (`tile_mma`, float32 accumulation). A thread issues its loads for the next
// step (raw x pieces, packed words, scale and bias) before this step's products, so they are in
// flight meanwhile, and stages them (decoding the weights) after. Rows of x past M, weight rows
// past N and codes past K (nvfp4: K = 16 mod 32) are zeros in the tiles and nothing is read for
// them.
//
// GATHER: row i of x uses weight batch picks[i] of ints[3] batches (w, scales and biases hold the
// batches one after another); a tile's rows run in turn by runs of equal picks, so sorted picks
// (a mixture of experts' rows grouped by expert) cost little more than one batch.
//
// Runtime sizes (the `ints` buffer): M, N, K (, the batches). Defines: TX (x; 16-bit), TS, TY,
// BITS, GROUP, MODE, LOAD_WORDS, GATHER.

#define BM 64
#define BN 64
#define BK 32
#define TILE_LD (BK + 8)  // row stride of the staged tiles (padding: no bank conflicts in the fragment loads)
typedef MMA_INPUT(TX) TileT;

// The loads of the step at K_FIRST into x_raw, words, scale_raw (and bias_raw), w_present: x's
// pieces in the run's rows (zeros elsewhere), the weight row's chunk (nothing past N, past K or
// for a pick outside the batches). K is a multiple of 8: a piece of x is all in or all out.
#if MODE == 0
#define LOAD_BIAS(INDEX) bias_raw = biases[INDEX];
#else
#define LOAD_BIAS(INDEX)
#endif
#define LOAD_STEP(K_FIRST)                                                                         \
  {                                                                                                \
    _Pragma("unroll") for (int i = 0; i < 2; i++) {                                                \
      const int row = m_first + x_piece_row[i], k = (K_FIRST) + x_column;                           \
      x_raw[i] = uint4{0u, 0u, 0u, 0u};                                                             \
      if (row >= run_start && row < run_end && k < k_size) x_raw[i] = *(const DEVICE uint4*)(x + (size_t)row * k_size + k); \
    }                                                                                              \
    const int k = (K_FIRST) + 16 * half_index;                                                      \
    w_present = batch_real && w_row < n_size && k < k_size;                                         \
    if (w_present) {                                                                               \
      const size_t row_index = first_w_row + w_row;                                                 \
      load_chunk_words(w + row_index * words_per_row + (K_FIRST) / 32 * BITS, (K_FIRST) + 32 > k_size, words); \
      const size_t group_index = row_index * groups_per_row + k / GROUP;                            \
      scale_raw = scales[group_index];                                                              \
      LOAD_BIAS(group_index)                                                                        \
    }                                                                                              \
  }

/* kernel */
  const int m_size = ints[0], n_size = ints[1], k_size = ints[2];
  const int thread_id = (int)nv_thread.x, lane = thread_id % 32, warp = thread_id / 32;
  const int n_first = (int)nv_group.x * BN, m_first = (int)nv_group.y * BM;
  const int warp_m = (warp / 2) * 32, warp_n = (warp % 2) * 32;
  const int words_per_row = k_size / 32 * BITS + (k_size % 32) * BITS / 32;
  const int groups_per_row = k_size / GROUP;
  THREADGROUP TileT x_tile[BM * TILE_LD];
  THREADGROUP TileT w_tile[BN * TILE_LD];
  THREADGROUP float out_tile[4 * 16 * 8];

  const int tile_end = min(m_first + BM, m_size);
  for (int run_start = m_first; run_start < tile_end;) {
#if GATHER
    // The tile's rows in runs of one weight batch (sorted picks: few runs); a pick outside the
    // batches reads no weights and gives zeros.
    const int batch = picks[run_start];
    int run_end = run_start + 1;
    while (run_end < tile_end && picks[run_end] == batch) run_end++;
    const bool batch_real = batch >= 0 && batch < ints[3];
    const size_t first_w_row = (size_t)(batch_real ? batch : 0) * n_size;
#else
    const int run_end = tile_end;
    const bool batch_real = true;
    const size_t first_w_row = 0;
#endif
    TileAcc acc[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int ni = 0; ni < 4; ni++) tile_zero(acc[mi][ni]);

    // A step's loads (two 8-value pieces of x, the weight row's chunk words, its scale and bias)
    // are issued a step ahead, so they are in flight while the step before multiplies.
    const int x_piece_row[2] = {thread_id / 4, (thread_id + 128) / 4}, x_column = (thread_id % 4) * 8;
    const int w_r = thread_id / 2, half_index = thread_id % 2, w_row = n_first + w_r;
    uint4 x_raw[2];
    uint words[BITS];
    TS scale_raw;
#if MODE == 0
    TS bias_raw;
#endif
    bool w_present;
    LOAD_STEP(0)
    for (int k_first = 0; k_first < k_size; k_first += BK) {
      // Stage x as it is (8 values from each piece) and the weights dequantized (a thread: 16
      // codes, half a chunk, of one row under one scale).
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const THREAD TX* values = (const THREAD TX*)&x_raw[i];
#pragma unroll
        for (int j = 0; j < 8; j++) x_tile[x_piece_row[i] * TILE_LD + x_column + j] = (TileT)values[j];
      }
      float w_values[16];
      if (w_present) {
        decode_part(words, 2 * half_index, w_values);
        decode_part(words, 2 * half_index + 1, w_values + 8);
        const float scale = group_scale(scale_raw);
#if MODE == 0
        const float bias = to_float(bias_raw);
#pragma unroll
        for (int j = 0; j < 16; j++) w_values[j] = fma(scale, w_values[j], bias);
#else
#pragma unroll
        for (int j = 0; j < 16; j++) w_values[j] = w_values[j] * (scale * FP_FACTOR);
#endif
      } else {
#pragma unroll
        for (int j = 0; j < 16; j++) w_values[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 16; j++) to_tile(w_values[j], &w_tile[w_r * TILE_LD + 16 * half_index + j]);
      threadgroup_barrier();
      if (k_first + BK < k_size) LOAD_STEP(k_first + BK)
#pragma unroll
      for (int k_step = 0; k_step < BK; k_step += 16)
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
          for (int ni = 0; ni < 4; ni++)
            tile_mma(acc[mi][ni], x_tile + (warp_m + 16 * mi) * TILE_LD + k_step, TILE_LD,
                     w_tile + (warp_n + 8 * ni) * TILE_LD + k_step, TILE_LD, lane);
      threadgroup_barrier();
    }

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
    run_start = run_end;
  }
