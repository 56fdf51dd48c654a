// Quantized matrix-vector products y = x · wᵀ for 1-8 rows of x (decode), float32 accumulation.
// w `[N, K]` is packed codes, one least-significant-bit-first stream per row in uint32 words
// (K * BITS / 32 words a row), with per-group scales (and biases for the affine mode).
//
// Layout. A lane's unit of work is a *chunk*: 32 consecutive codes of one row starting at a
// multiple of 32, exactly BITS words (4 * BITS bytes), read in aligned pieces of LOAD_WORDS words
// (a 16-byte uint4 for 4 and 8 bits, uint2 for 2 and 6); no code crosses into another chunk, and
// a chunk lies inside one group (two for nvfp4's groups of 16). A SIMD *step* is 32 lanes x 32
// codes = 1024 consecutive k of a row. A threadgroup serves COLUMN_WARPS * COLUMNS output columns
// with COLUMN_WARPS * K_SPLIT SIMD groups: each SIMD group serves COLUMNS columns, and the K_SPLIT
// SIMD groups of one set of columns take the steps in turn (group s: steps s, s + K_SPLIT, ...).
// A lane issues the loads of its chunks of its COLUMNS rows for UNROLL steps, with their scales
// (and biases), before it uses any of them. x (small, cache-resident) is read 8 values at a time
// in vector loads; each value serves every column, and each decoded code every row of x.
//
// Decoding is exact in float32. An affine code in bits [s, s + BITS) of a word with s + BITS <= 23
// lies inside a float's mantissa: (word & mask << s) | 0x4B000000 is the float 2^23 + q·2^s, and
// one fma with 2^-s and -2^(23-s) gives q (no shift, no int-to-float conversion); codes higher up
// are read the same way from word >> 16, and codes that straddle two words (3, 5, 6 bits) are
// joined first. e2m1 and e4m3 codes are placed two at a time into the bits of a half2 (value·2^-14,
// value·2^-8, exact halves, subnormals included) and widened to float; the group's dot is
// multiplied back by FP_FACTOR (a power of two) before its scale.
//
// Per group: scale * Σ x·q + bias * Σ x (affine) or scale * Σ x·q, folded into the lane's sum.
//
// One row's bits. For a row m and column n, the arithmetic is one fixed sequence whatever XM,
// COLUMNS, COLUMN_WARPS and UNROLL are: the lane owning a chunk accumulates its 32 codes in order
// k = 0..31 with fma(x, q, dot), folds the group with fma(scale, dot, sum) then fma(bias, Σ x, sum)
// (Σ x summed in the same order), takes its chunks in increasing order; the lanes' sums meet by
// simd_sum, the K_SPLIT SIMD groups' sums by adding them in order 0, 1, ... through threadgroup
// memory. Every multiply-add is written as fma and every other operation is a lone add or an exact
// power-of-two multiply, so the compiler has no contraction to choose. Rows never mix. Only
// K_SPLIT changes the order, and it is chosen from K and N alone (`quant.plan`), never from XM.
//
// Bounds: chunks past K are not read (a lane with none skips the step); a K that is not a
// multiple of 32 (nvfp4, K = 16 mod 32) ends in a half chunk (HALF_TAIL) whose second half is not
// read. The last set of columns is moved back to end at N (COLUMNS <= N), so nothing past N is
// read or written. Buffers start 16-byte aligned (tinygrad's allocations and JIT arena offsets are
// 256-byte aligned; offset views are copied before a custom kernel runs).
//
// Defines: TX (x), TS (scales: the dtype, or uchar for the floating-point modes), TY (y), BITS,
// GROUP, MODE (0 affine, 1 mxfp4, 2 mxfp8, 3 nvfp4), N_TOTAL and K_TOTAL (w's shape: weights do
// not change from step to step, and baked sizes make every offset a constant), XM, COLUMNS,
// COLUMN_WARPS, K_SPLIT, UNROLL, LOAD_WORDS (1, 2 or 4: the row's alignment allows it), GATHER,
// BATCHES (the weight batches of a gathered product), GLU.
//
// SwiGLU's product (GLU): x is `[XM, 2 * K]`, a gated MLP's gate then up halves, and the product
// is taken with silu(gate) * up, each of its 8 values a load computed as the composition does:
// silu(g) = g / (1 + e^-g) rounded to TX, times up, rounded to TX (so the MLP's activation is no
// kernel of its own). K a multiple of 8 keeps the up half's loads aligned.
//
// Gathered products (GATHER, mixture-of-experts layers): threadgroup row p = nv_group.y computes
// entry p, x's rows `x[p]` ([XM, K] of x [P, XM, K]) times weight batch `picks[p]` of the BATCHES
// batches (w, scales, biases [BATCHES, N, ...]) into y[p]; a pick outside 0..BATCHES-1 reads
// nothing and gives zeros. Each entry's arithmetic is the plain product's, so a row keeps the bits
// of a one-row product whichever entries share the call.

#define WORDS_PER_ROW (K_TOTAL * BITS / 32)
#define X_ROW (GLU ? 2 * K_TOTAL : K_TOTAL)       // elements of a row of x
#define GROUPS_PER_ROW (K_TOTAL / GROUP)
#define CHUNKS ((K_TOTAL + 31) / 32)               // chunks of a row; the last is a half chunk if HALF_TAIL
#define HALF_TAIL (K_TOTAL % 32 != 0)
#define STEPS ((CHUNKS + 31) / 32)                 // SIMD steps along a row

// 8 consecutive x values (16-byte aligned) as floats.
INLINE void load_x8(const DEVICE float* at, THREAD float* xs) {
  const float4 low = *(const DEVICE float4*)at, high = *(const DEVICE float4*)(at + 4);
  xs[0] = low.x; xs[1] = low.y; xs[2] = low.z; xs[3] = low.w;
  xs[4] = high.x; xs[5] = high.y; xs[6] = high.z; xs[7] = high.w;
}
INLINE void load_x8(const DEVICE half* at, THREAD float* xs) {
  const uint4 raw = *(const DEVICE uint4*)at;
  const uint words[4] = {raw.x, raw.y, raw.z, raw.w};
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 pair = half2_bits_to_float2(words[i]);
    xs[2 * i] = pair.x;
    xs[2 * i + 1] = pair.y;
  }
}
#ifdef NUVEC_BFLOAT  // only where the dialect has bfloat (program.py)
INLINE void load_x8(const DEVICE bfloat* at, THREAD float* xs) {
  const uint4 raw = *(const DEVICE uint4*)at;
  const uint words[4] = {raw.x, raw.y, raw.z, raw.w};
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    xs[2 * i] = bits_to_float(words[i] << 16);
    xs[2 * i + 1] = bits_to_float(words[i] & 0xFFFF0000u);
  }
}
#endif

#if GLU
// silu(g) * up as the composition rounds it (two roundings to TX), from 8 gates at `at` and the 8
// ups K_TOTAL further.
INLINE void load_x8_glu(const DEVICE TX* at, THREAD float* xs) {
  float ups[8];
  load_x8(at, xs);
  load_x8(at + K_TOTAL, ups);
  #pragma unroll
  for (int j = 0; j < 8; j++) xs[j] = swiglu_value<TX>(xs[j], ups[j]);
}
#define LOAD_X8(at, xs) load_x8_glu(at, xs)
#else
#define LOAD_X8(at, xs) load_x8(at, xs)
#endif

// One chunk of every column and row of x into `sums` [XM][COLUMNS]: `x_chunk` (x's first row at
// the chunk's first k), `words`
// [COLUMNS][BITS], `scales_raw` [COLUMNS][SCALES_PER_CHUNK], `biases_raw` [COLUMNS].
INLINE void accumulate_chunk(const DEVICE TX* x_chunk, bool half_chunk, const THREAD uint* words,
                             const THREAD TS* scales_raw, const THREAD TS* biases_raw, THREAD float* sums) {
  float dots[XM * COLUMNS];
#if MODE == 0
  float x_sums[XM];
  #pragma unroll
  for (int m = 0; m < XM; m++) x_sums[m] = 0.0f;
#endif
  #pragma unroll
  for (int i = 0; i < XM * COLUMNS; i++) dots[i] = 0.0f;
  #pragma unroll
  for (int part = 0; part < 4; part++) {
    if (HALF_TAIL && half_chunk && part == 2) break;
    float q[COLUMNS * 8];
    #pragma unroll
    for (int c = 0; c < COLUMNS; c++) decode_part(words + c * BITS, part, q + c * 8);
    #pragma unroll
    for (int m = 0; m < XM; m++) {
      float xs[8];
      LOAD_X8(x_chunk + m * X_ROW + 8 * part, xs);
#if MODE == 0
      #pragma unroll
      for (int j = 0; j < 8; j++) x_sums[m] += xs[j];
#endif
      #pragma unroll
      for (int c = 0; c < COLUMNS; c++)
        #pragma unroll
        for (int j = 0; j < 8; j++) dots[m * COLUMNS + c] = fma(xs[j], q[c * 8 + j], dots[m * COLUMNS + c]);
    }
    if ((8 * part + 8) % CHUNK_GROUP == 0) {  // a group ends here: fold it with its scale (and bias)
      const int group = (8 * part) / CHUNK_GROUP;
      #pragma unroll
      for (int c = 0; c < COLUMNS; c++) {
        const float scale = group_scale(scales_raw[c * SCALES_PER_CHUNK + group]);
#if MODE == 0
        const float bias = to_float(biases_raw[c]);
#endif
        #pragma unroll
        for (int m = 0; m < XM; m++) {
#if MODE == 0
          sums[m * COLUMNS + c] = fma(bias, x_sums[m], fma(scale, dots[m * COLUMNS + c], sums[m * COLUMNS + c]));
#else
          sums[m * COLUMNS + c] = fma(scale, dots[m * COLUMNS + c] * FP_FACTOR, sums[m * COLUMNS + c]);
#endif
          dots[m * COLUMNS + c] = 0.0f;
        }
      }
#if MODE == 0
      #pragma unroll
      for (int m = 0; m < XM; m++) x_sums[m] = 0.0f;
#endif
    }
  }
}

/* kernel */
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
#if GATHER
  GATHERED_ENTRY(entry, batch, picked)
  const DEVICE uint* w_at = w + batch * N_TOTAL * WORDS_PER_ROW;
  const DEVICE TS* scales_at = scales + batch * N_TOTAL * GROUPS_PER_ROW;
#if MODE == 0
  const DEVICE TS* biases_at = biases + batch * N_TOTAL * GROUPS_PER_ROW;
#endif
  const DEVICE TX* x_at = x + (long)entry * XM * X_ROW;
  DEVICE TY* y_at = y + (long)entry * XM * N_TOTAL;
#else
  const bool picked = true;
  const DEVICE uint* w_at = w;
  const DEVICE TS* scales_at = scales;
#if MODE == 0
  const DEVICE TS* biases_at = biases;
#endif
  const DEVICE TX* x_at = x;
  DEVICE TY* y_at = y;
#endif
  const int column_warp = warp % COLUMN_WARPS, k_warp = warp / COLUMN_WARPS;
  // This SIMD group's columns first_n .. first_n + COLUMNS - 1. The last set is moved back to end
  // at N: its columns that another set also has are computed alike there, and written alike.
  const int first_n = min(((int)nv_group.x * COLUMN_WARPS + column_warp) * COLUMNS, N_TOTAL - COLUMNS);

  float sums[XM * COLUMNS];
  #pragma unroll
  for (int i = 0; i < XM * COLUMNS; i++) sums[i] = 0.0f;
  for (int step = k_warp; picked && step < STEPS; step += K_SPLIT * UNROLL) {  // uniform: an unpicked entry sums nothing
    // The loads of UNROLL steps (step + u * K_SPLIT), all issued before any is used.
    uint words[UNROLL * COLUMNS * BITS];
    TS scales_raw[UNROLL * COLUMNS * SCALES_PER_CHUNK], biases_raw[UNROLL * COLUMNS];
    #pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const int chunk = (step + u * K_SPLIT) * 32 + lane;
      if (chunk >= CHUNKS) continue;
      const bool half_chunk = HALF_TAIL && chunk == CHUNKS - 1;
      #pragma unroll
      for (int c = 0; c < COLUMNS; c++) {
        load_chunk_words(w_at + (first_n + c) * WORDS_PER_ROW + chunk * BITS, half_chunk, words + (u * COLUMNS + c) * BITS);
        const int group = (first_n + c) * GROUPS_PER_ROW + chunk * 32 / GROUP;
        #pragma unroll
        for (int g = 0; g < SCALES_PER_CHUNK; g++)
          if (g == 0 || !half_chunk) scales_raw[(u * COLUMNS + c) * SCALES_PER_CHUNK + g] = scales_at[group + g];
#if MODE == 0
        biases_raw[u * COLUMNS + c] = biases_at[group];
#endif
      }
    }
    #pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const int chunk = (step + u * K_SPLIT) * 32 + lane;
      if (chunk < CHUNKS)
        accumulate_chunk(x_at + chunk * 32, HALF_TAIL && chunk == CHUNKS - 1, words + u * COLUMNS * BITS,
                         scales_raw + u * COLUMNS * SCALES_PER_CHUNK, biases_raw + u * COLUMNS, sums);
    }
  }

  // Lanes by simd_sum, then the K_SPLIT SIMD groups of a column set in order (`column_sums.h`).
  THREADGROUP float partials[K_SPLIT * COLUMN_WARPS * XM * COLUMNS];
  store_partials(sums, partials, lane, k_warp, column_warp);
  if (k_warp == 0) {
    for (int i = lane; i < XM * COLUMNS; i += 32)
      from_float(column_total(partials, column_warp, i), &y_at[(i / COLUMNS) * N_TOTAL + first_n + i % COLUMNS]);
  }
