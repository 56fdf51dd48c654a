// Quantized vector-matrix products y = x · w for 1-8 rows of x (decode with untransposed
// weights), float32 accumulation. w `[K, N]` is packed along N: row k is one least-significant-
// bit-first stream of N codes in uint32 words, with per-group scales (and biases for the affine
// mode) along N. The code helpers are `quant_codes.h`'s.
//
// Layout. A threadgroup serves 256 consecutive columns, 8 chunks of 32: lane l of a SIMD group
// takes part l % 4 (8 columns) of chunk l / 4, and the threadgroup's K_SPLIT SIMD groups take the
// rows k in turn (group s: rows s, s + K_SPLIT, ...). Per row a lane reads its chunk's words,
// decodes its 8 codes, forms each weight (scale * q + bias, or scale * q) and adds x[m, k] times
// it to its 8 sums of every row m of x. The groups' sums then meet in threadgroup memory, added
// in the order 0, 1, ... of the SIMD groups.
//
// One row's bits. For row m and column n the arithmetic is one fixed sequence whatever XM is:
// fma(x, weight, sum) over the rows k in increasing order within a SIMD group, then the groups'
// sums in order; K_SPLIT comes from K alone (`quant.qvm_split`). Every multiply-add is an fma.
//
// Bounds: N is a multiple of the group size, so of 16: a chunk past N is not read and a half
// chunk (N = 16 mod 32) reads its first half only; lanes whose columns lie past N read and write
// nothing.
//
// Defines: TX (x), TS (scales), TY (y), BITS, GROUP, MODE, N_TOTAL, K_TOTAL, XM, K_SPLIT,
// LOAD_WORDS (as quant_codes.h wants it: the row's alignment allows it).

#define WORDS_PER_ROW (N_TOTAL * BITS / 32)
#define GROUPS_PER_ROW (N_TOTAL / GROUP)
#define CHUNKS ((N_TOTAL + 31) / 32)
#define HALF_TAIL (N_TOTAL % 32 != 0)
#define COLUMNS_PER_GROUP 256

// Codes 8 * part .. + 7 of a chunk, for a part known only at run time (the helper wants a constant).
INLINE void decode_lane_part(const THREAD uint* words, int part, THREAD float* q) {
  #pragma unroll
  for (int p = 0; p < 4; p++)
    if (p == part) decode_part(words, p, q);
}

/* kernel */
  const int lane = (int)nv_thread.x % 32, k_warp = (int)nv_thread.x / 32;
  const int chunk = (int)nv_group.x * (COLUMNS_PER_GROUP / 32) + lane / 4, part = lane % 4;
  const int first_n = chunk * 32 + part * 8;            // this lane's 8 columns
  const bool live = first_n < N_TOTAL;                   // N is a multiple of 8: all 8 or none
  const bool half_chunk = HALF_TAIL && chunk == CHUNKS - 1;

  float sums[XM * 8];
  #pragma unroll
  for (int i = 0; i < XM * 8; i++) sums[i] = 0.0f;
  if (live) {
    for (int k = k_warp; k < K_TOTAL; k += K_SPLIT) {
      uint words[BITS];
      load_chunk_words(w + k * WORDS_PER_ROW + chunk * BITS, half_chunk, words);
      float q[8];
      decode_lane_part(words, part, q);
      const int group = k * GROUPS_PER_ROW + first_n / GROUP;  // GROUP >= 16: the 8 columns share it
      const float scale = group_scale(scales[group]);
#if MODE == 0
      const float bias = to_float(biases[group]);
#endif
      float weights[8];
      #pragma unroll
      for (int j = 0; j < 8; j++) {
#if MODE == 0
        weights[j] = fma(scale, q[j], bias);
#else
        weights[j] = scale * (q[j] * FP_FACTOR);  // q * FP_FACTOR is exact (a power of two)
#endif
      }
      #pragma unroll
      for (int m = 0; m < XM; m++) {
        const float xv = to_float(x[m * K_TOTAL + k]);
        #pragma unroll
        for (int j = 0; j < 8; j++) sums[m * 8 + j] = fma(xv, weights[j], sums[m * 8 + j]);
      }
    }
  }

  // The SIMD groups' sums, added in order through threadgroup memory: [XM][256 columns].
  THREADGROUP float totals[XM * COLUMNS_PER_GROUP];
  const int column = (lane / 4) * 32 + part * 8;        // this lane's first column within the threadgroup's
  for (int s = 0; s < K_SPLIT; s++) {
    if (k_warp == s) {
      #pragma unroll
      for (int m = 0; m < XM; m++)
        #pragma unroll
        for (int j = 0; j < 8; j++) {
          const int at = m * COLUMNS_PER_GROUP + column + j;
          totals[at] = s == 0 ? sums[m * 8 + j] : totals[at] + sums[m * 8 + j];
        }
    }
    threadgroup_barrier();
  }
  if (k_warp == 0 && live) {
    #pragma unroll
    for (int m = 0; m < XM; m++)
      #pragma unroll
      for (int j = 0; j < 8; j++) from_float(totals[m * COLUMNS_PER_GROUP + column + j], &y[m * N_TOTAL + first_n + j]);
  }
