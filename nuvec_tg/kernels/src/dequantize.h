// Packed quantized weights (`quant_codes.h`) as dense rows: y [R, K] of TY from R packed rows of K
// codes (`quant.dequantize`, and the products of many rows on Hopper: `quant.quantized_matmul`
// dequantizes w once, then runs gemm_wgmma). A threadgroup takes a row (grid: R threadgroups) and
// its threads the row's pieces in turn: a piece is 8 codes of a chunk (32 codes of a row, BITS
// words), so that neighbouring threads write neighbouring 16- or 32-byte pieces; the four threads
// of a chunk load its words alike (one transaction) and decode their own part, with its group's
// scale (and bias):
//   affine:                 y = TY(fma(scale, q, bias))
//   floating-point modes:   y = TY(q * (scale * FP_FACTOR))   (q the code's value / FP_FACTOR)
// qmm_wgmma.h's dequantization into its w tiles, rounded the same way, so a product over these rows
// on the same warpgroup steps has qmm_wgmma's bits. A row a threadgroup keeps the index arithmetic
// in 32 bits: a flat 64-bit piece index cost two 64-bit divisions a piece.
//
// Bounds: a K that is not a multiple of 32 (nvfp4's groups of 16) ends each row in a half chunk,
// whose second half is neither read nor written.
//
// Defines: TS (scales: the dtype, or uchar for the floating-point modes), TY, BITS, GROUP, MODE,
// LOAD_WORDS (`quant_codes.h`), THREADS, CHUNK_Y and Y_CHUNKS (how a piece of 8 values is
// written). Runtime integers (`ints`): R, K.

/* kernel */
  const int k = ints[1];
  const int chunks = (k + 31) / 32;  // a row's chunks, the last a half chunk where 32 does not divide K
  const int pieces = 4 * chunks - (k % 32 != 0 ? 2 : 0);
  const long row = (long)nv_group.x;
  const DEVICE uint* const row_words = w + row * (k * BITS / 32);
  const long row_groups = row * (k / GROUP);
  DEVICE TY* const row_y = y + row * k;
  for (int piece = (int)nv_thread.x; piece < pieces; piece += THREADS) {
    const int chunk = piece / 4, part = piece % 4;
    uint words[BITS];
    load_chunk_words(row_words + chunk * BITS, k % 32 != 0 && chunk == chunks - 1, words);
    float q[8];
    decode_part(words, part, q);
    const long group = row_groups + (chunk * 32 + part * 8) / GROUP;  // the piece's group
#if MODE == 0
    scale_codes(q, 8, group_scale(scales[group]), to_float(biases[group]));
#else
    scale_codes(q, 8, group_scale(scales[group]), 0.0f);
#endif
    STORE_PIECE(CHUNK_Y, Y_CHUNKS, TY, q, row_y + chunk * 32 + part * 8)
  }
