// Quantized matrix-vector products y = x · wᵀ for a few rows of x (decode): w `[N, K]` as packed
// codes (one least-significant-bit-first stream per row in uint32 words) with per-group scales
// (and biases for the affine mode).
//
// A threadgroup of WARPS SIMD groups serves WARPS * ROWS_PER_WARP output columns n; in a SIMD
// group each lane takes VALUES consecutive k at a time (inside one group of GROUP), holds those of
// every row m of x in registers (XM of them) and reuses them for each of its ROWS_PER_WARP
// columns; a SIMD step covers 32 * VALUES of K. Per (m, n) the lane sums scale * Σ x·q (+ bias *
// Σ x); the lanes' sums meet by simd_sum. Every row of x is computed alone and alike, so a product
// of several rows gives each row the bits of that row alone. Tails of K and N are guarded.
//
// Defines: TX (x), TS (scales: the dtype, or uchar for the floating-point modes), TY (y), BITS,
// GROUP, VALUES, XM, WARPS, ROWS_PER_WARP, MODE (0 affine, 1 mxfp4, 2 mxfp8, 3 nvfp4).
// Runtime integers (`ints`): N, K, and the words per row of w.

INLINE uint code_at(const DEVICE uint* row, int index) {
  // Code `index` of a row's bit stream (it may straddle two words for 3, 5 and 6 bits).
  const int bit = index * BITS, word = bit >> 5, shift = bit & 31;
  uint value = row[word] >> shift;
  if (shift + BITS > 32) value |= row[word + 1] << (32 - shift);
  return value & ((1u << BITS) - 1u);
}

INLINE float decode_e4m3(uint code) {
  // e4m3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (2^-9 steps).
  const int field = (int)((code >> 3) & 15u);
  const float mantissa = (float)(code & 7u);
  const float magnitude = field > 0 ? (1.0f + mantissa / 8.0f) * exp2((float)(field - 7)) : mantissa * 0.001953125f;
  return (code & 128u) ? -magnitude : magnitude;
}

INLINE float decode_e2m1(uint code) {
  // e2m1: sign bit 8, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const uint m = code & 7u;
  const float magnitude = m < 4u ? 0.5f * (float)m : (m == 4u ? 2.0f : m == 5u ? 3.0f : m == 6u ? 4.0f : 6.0f);
  return (code & 8u) ? -magnitude : magnitude;
}

INLINE float decode_code(uint code) {
#if MODE == 0
  return (float)code;
#elif MODE == 2
  return decode_e4m3(code);
#else
  return decode_e2m1(code);
#endif
}

INLINE float group_scale(const DEVICE TS* scales, int index) {
#if MODE == 0
  return to_float(scales[index]);
#elif MODE == 3
  return decode_e4m3((uint)scales[index]);
#else
  return exp2((float)scales[index] - 127.0f);  // e8m0: 2^(code - 127), code 0 is 2^-127
#endif
}

/* kernel */
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
  const int n_count = ints[0], k_count = ints[1], words_per_row = ints[2];
  const int first_n = ((int)nv_group.x * WARPS + warp) * ROWS_PER_WARP;
  float sums[XM][ROWS_PER_WARP];
  #pragma unroll
  for (int m = 0; m < XM; m++)
    #pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) sums[m][r] = 0.0f;
  for (int k0 = lane * VALUES; k0 < k_count; k0 += 32 * VALUES) {
    float xs[XM][VALUES], x_sum[XM];
    #pragma unroll
    for (int m = 0; m < XM; m++) {
      x_sum[m] = 0.0f;
      #pragma unroll
      for (int j = 0; j < VALUES; j++) {
        xs[m][j] = to_float(x[m * k_count + k0 + j]);
        x_sum[m] += xs[m][j];
      }
    }
    const int group = k0 / GROUP;
    #pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
      const int n = first_n + r;
      if (n >= n_count) break;
      const DEVICE uint* row = w + n * words_per_row;
      const int groups_per_row = k_count / GROUP;
      const float scale = group_scale(scales, n * groups_per_row + group);
#if MODE == 0
      const float bias = to_float(biases[n * groups_per_row + group]);
#endif
      float codes[VALUES];
      #pragma unroll
      for (int j = 0; j < VALUES; j++) codes[j] = decode_code(code_at(row, k0 + j));
      #pragma unroll
      for (int m = 0; m < XM; m++) {
        float dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < VALUES; j++) dot = fma(xs[m][j], codes[j], dot);
        // Explicit fmas: the compiler may not contract a row's arithmetic differently per XM.
#if MODE == 0
        sums[m][r] = fma(scale, dot, fma(bias, x_sum[m], sums[m][r]));
#else
        sums[m][r] = fma(scale, dot, sums[m][r]);
#endif
      }
    }
  }
  #pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; r++) {
    const int n = first_n + r;
    #pragma unroll
    for (int m = 0; m < XM; m++) {
      const float total = simd_sum(sums[m][r]);
      if (lane == 0 && n < n_count) from_float(total, &y[m * n_count + n]);
    }
  }
