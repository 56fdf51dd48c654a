// Quantized matrix-vector products y = x · wᵀ for 2-8 rows of 16-bit x on the matrix units (CUDA
// sm_80 and later: mma.sync m16n8k16), float32 accumulation. qmv (qmv.h) spends one fma a row on
// every code it decodes, so its time grows with the rows; here each decoded weight serves the 8
// columns of the mma's B at once, and 2-8 rows cost what 8 do.
//
// Layout. The product is taken as its transpose, yᵀ = w · xᵀ: the mma's A is 16 rows of w (16
// output columns, a *tile*), its B is xᵀ (its 8 columns the rows of x, zeros past XM), its C is yᵀ.
// A *unit* is 128 consecutive k of the tile's rows: lane 4g + c takes chunk c of the unit (32 codes,
// BITS words) of w's rows g and g + 8 and the same 32 x values of x's row g. Its 32 codes of a row
// serve 8 mma steps, 4 codes a step: step t takes the lane's codes 4t .. 4t + 3, which it holds as
// the mma's k 2c, 2c + 1 (a[0], a[1]) and 2c + 8, 2c + 9 (a[2], a[3]); its b0 and b1 hold x at the
// same codes. The k of a step are thus spread over the unit's four chunks in another order than w's,
// the same for A and B, so the step's sum is over the right products. A unit's codes are read as the
// vector qmv reads a chunk (aligned pieces of LOAD_WORDS words), x as 16-byte pieces.
//
// Weights. Each code is decoded exactly (`decode_part`), scaled once in float32 (`scale_codes`:
// fma(scale, q, bias), or q times the scale), and rounded to x's type: the weights qmm and the
// dequantized route multiply (qmm.h, dequantize.h). PAIRS (4-bit affine codes with scales of x's
// type, mxfp4 with x bfloat, nvfp4) decodes two codes at a time in x's type, each weight rounded once
// (`quant_codes.h`), as the Hopper products and the dequantized route do.
//
// Sums. A SIMD group accumulates its units in increasing order in the mma's float32 C; the K_SPLIT
// SIMD groups of a threadgroup take the units in turn (group s: units s, s + K_SPLIT, ...) and
// their sums meet through threadgroup memory in order 0, 1, .... The matrix units keep C's columns
// apart, so a row's bits depend on the tile's rows of w, its own row of x and K_SPLIT only, which
// comes from K and N (`quant.qmv_mma_plan`), never from XM: a row has the same bits in any product
// of 2-8 rows. (One row runs qmv, whose order differs.)
//
// Bounds: chunks past K are neither read nor multiplied (their A and B are zeros); a K that is not
// a multiple of 32 (nvfp4, K = 16 mod 32) ends in a half chunk whose second half is not read. The
// last tile is moved back to end at N (N >= 16), so nothing past N is read or written; its columns
// that the tile before it also has are computed alike there, and written alike. Rows of B past XM
// are zeros and their C is not written. Buffers start 16-byte aligned and K is a multiple of 16,
// so x's 16-byte pieces are aligned.
//
// Defines: TX (half or bfloat), TS (scales: the dtype, or uchar for the floating-point modes), TY,
// BITS, GROUP, MODE, LOAD_WORDS (`quant_codes.h`), N_TOTAL, K_TOTAL, XM (1-8), K_SPLIT, UNROLL
// (units whose loads a lane issues together), PAIRS (below).

#define WORDS_PER_ROW (K_TOTAL * BITS / 32)
#define GROUPS_PER_ROW (K_TOTAL / GROUP)
#define CHUNKS ((K_TOTAL + 31) / 32)
#define HALF_TAIL (K_TOTAL % 32 != 0)
#define UNITS ((CHUNKS + 3) / 4)

#if PAIRS
// PAIRS (`quant_codes.h`): a step takes a word's codes j and j + 4 (j = 0..3, `code_pair`) as
// its k 2c, 2c + 1, and x's values at those codes come from its words by one byte permute a pair.
#endif

// The mma for x's 16-bit type.
INLINE void mma_x(float* acc, const uint* a, uint b0, uint b1, bfloat) { mma_bf16(acc, a, b0, b1); }
INLINE void mma_x(float* acc, const uint* a, uint b0, uint b1, half) { mma_f16(acc, a, b0, b1); }

// One round of the main loop: the UNROLL units unit, unit + K_SPLIT, ... of lane (g, c) into acc.
// TAIL: some of their chunks lie past K (or are nvfp4's half chunk), so each is checked and what
// lies past K is zeros; otherwise every chunk is whole and nothing is checked.
template <bool TAIL>
INLINE void unit_round(int unit, int g, int c, const int* columns, const DEVICE TX* x, const DEVICE uint* w,
                       const DEVICE TS* scales, const DEVICE TS* biases, THREAD float* acc) {
  const bool x_row = g < XM;  // the lane's row of x: B's column g
  // The loads of UNROLL units (unit + u * K_SPLIT), all issued before any is used.
  uint words[UNROLL][2][BITS];
  TS scales_raw[UNROLL][2][SCALES_PER_CHUNK];
  TS biases_raw[UNROLL][2];
  uint xs[UNROLL][16];  // x's 32 values at the lane's chunk, two a word
  #pragma unroll
  for (int u = 0; u < UNROLL; u++) {
    const int chunk = (unit + u * K_SPLIT) * 4 + c;
    const bool live = !TAIL || chunk < CHUNKS, half_chunk = TAIL && HALF_TAIL && chunk == CHUNKS - 1;
    if (TAIL || !x_row) {
      #pragma unroll
      for (int i = 0; i < 16; i++) xs[u][i] = 0u;
    }
    if (!live) continue;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      load_chunk_words(w + (long)columns[r] * WORDS_PER_ROW + chunk * BITS, half_chunk, words[u][r]);
      const int group = columns[r] * GROUPS_PER_ROW + chunk * 32 / GROUP;
      #pragma unroll
      for (int s = 0; s < SCALES_PER_CHUNK; s++)
        if (s == 0 || !half_chunk) scales_raw[u][r][s] = scales[group + s];
#if MODE == 0
      biases_raw[u][r] = biases[group];
#endif
    }
    if (x_row) {
      const DEVICE uint4* x_at = (const DEVICE uint4*)(x + g * K_TOTAL + chunk * 32);
      #pragma unroll
      for (int p = 0; p < 4; p++) {
        if (half_chunk && p >= 2) break;
        const uint4 piece = x_at[p];
        xs[u][4 * p] = piece.x; xs[u][4 * p + 1] = piece.y; xs[u][4 * p + 2] = piece.z; xs[u][4 * p + 3] = piece.w;
      }
    }
  }
  #pragma unroll
  for (int u = 0; u < UNROLL; u++) {
    const int chunk = (unit + u * K_SPLIT) * 4 + c;
    if (TAIL && (unit + u * K_SPLIT) * 4 >= CHUNKS) break;  // uniform: no lane of the SIMD group has a chunk left
    const bool live = !TAIL || chunk < CHUNKS, half_chunk = TAIL && HALF_TAIL && chunk == CHUNKS - 1;
    #pragma unroll
    for (int part = 0; part < 4; part++) {  // codes 8 part .. 8 part + 7: steps 2 part and 2 part + 1
      uint a[2][4] = {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}};
      if (live && !(half_chunk && part >= 2)) {
#if PAIRS
        #pragma unroll
        for (int r = 0; r < 2; r++) {
          const uint word = words[u][r][part];
          const uint scale2 = pair_scale<TX>(scales_raw[u][r][(8 * part) / CHUNK_GROUP]);
#if MODE == 0
          const uint bias2 = both_halves(biases_raw[u][r]);
#else
          const uint bias2 = PAIR_NEGATIVE_ZERO;  // unused
#endif
          uint w2[4];
          #pragma unroll
          for (int j = 0; j < 4; j++) w2[j] = code_pair<TX>(word >> (4 * j), scale2, bias2);
          a[0][r] = w2[0]; a[0][r + 2] = w2[1]; a[1][r] = w2[2]; a[1][r + 2] = w2[3];
        }
#else
        #pragma unroll
        for (int r = 0; r < 2; r++) {
          float q[8];
          decode_part(words[u][r], part, q);
          const int group = (8 * part) / CHUNK_GROUP;
#if MODE == 0
          scale_codes(q, 8, group_scale(scales_raw[u][r][group]), to_float(biases_raw[u][r]));
#else
          scale_codes(q, 8, group_scale(scales_raw[u][r][group]), 0.0f);
#endif
          // A's rows g (r 0) and g + 8 (r 1): registers r and r + 2 of each step
          a[0][r] = pack_pair(q[0], q[1], TX());
          a[0][r + 2] = pack_pair(q[2], q[3], TX());
          a[1][r] = pack_pair(q[4], q[5], TX());
          a[1][r + 2] = pack_pair(q[6], q[7], TX());
        }
#endif
      }
      const THREAD uint* x4 = xs[u] + 4 * part;
#if PAIRS
      mma_x(acc, a[0], low_halves(x4[0], x4[2]), high_halves(x4[0], x4[2]), TX());
      mma_x(acc, a[1], low_halves(x4[1], x4[3]), high_halves(x4[1], x4[3]), TX());
#else
      mma_x(acc, a[0], x4[0], x4[1], TX());
      mma_x(acc, a[1], x4[2], x4[3], TX());
#endif
    }
  }
}

/* kernel */
  const int lane = (int)nv_thread.x % 32, k_warp = (int)nv_thread.x / 32;
  const int g = lane / 4, c = lane % 4;
  const int first_n = min((int)nv_group.x * 16, N_TOTAL - 16);
  const int columns[2] = {first_n + g, first_n + g + 8};  // the lane's rows of w: A's rows g and g + 8
#if MODE == 0
  const DEVICE TS* bias_rows = biases;
#else
  const DEVICE TS* bias_rows = scales;  // unread
#endif

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int unit = k_warp; unit < UNITS; unit += K_SPLIT * UNROLL) {
    // Uniform: the round's last unit (and so every unit of it) whole, or not.
    if ((unit + (UNROLL - 1) * K_SPLIT) * 4 + 4 <= CHUNKS - HALF_TAIL) unit_round<false>(unit, g, c, columns, x, w, scales, bias_rows, acc);
    else unit_round<true>(unit, g, c, columns, x, w, scales, bias_rows, acc);
  }

  // acc: yᵀ at (column g, rows 2c, 2c + 1) and (column g + 8, rows 2c, 2c + 1). The SIMD groups'
  // sums in order through threadgroup memory.
#if K_SPLIT > 1
  THREADGROUP float partials[K_SPLIT * 128];
  #pragma unroll
  for (int i = 0; i < 4; i++) partials[k_warp * 128 + 4 * lane + i] = acc[i];
  threadgroup_barrier();
  if (k_warp != 0) return;
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    float total = partials[4 * lane + i];
    for (int s = 1; s < K_SPLIT; s++) total += partials[s * 128 + 4 * lane + i];
    acc[i] = total;
  }
#endif
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    const int row = 2 * c + i % 2, column = columns[i / 2];
    if (row < XM) from_float(acc[i], &y[row * N_TOTAL + column]);
  }
