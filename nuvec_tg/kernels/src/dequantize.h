// Packed quantized weights (`quant_codes.h`) as dense rows: y [R, K] of TY from R packed rows of K
// codes (`quant.dequantize`, and the products of many rows on Hopper: `quant.quantized_matmul`
// dequantizes w once, then runs gemm_wgmma). Each thread takes one piece: 8 codes of a chunk (32
// codes of a row, BITS words), so that neighbouring threads write neighbouring 16- or 32-byte
// pieces; the four threads of a chunk load its words alike (one transaction) and decode their own
// part, with its group's scale (and bias):
//   affine:                 y = TY(fma(scale, q, bias))
//   floating-point modes:   y = TY(q * (scale * FP_FACTOR))   (q the code's value / FP_FACTOR)
// qmm_wgmma.h's dequantization into its w tiles, rounded the same way, so a product over these rows
// on the same warpgroup steps has qmm_wgmma's bits.
//
// Bounds: a thread past the last piece does nothing; a K that is not a multiple of 32 (nvfp4's
// groups of 16) ends each row in a half chunk, whose second half is neither read nor written.
//
// Defines: TS (scales: the dtype, or uchar for the floating-point modes), TY, BITS, GROUP, MODE,
// LOAD_WORDS (`quant_codes.h`), THREADS, CHUNK_Y and Y_CHUNKS (how a piece of 8 values is
// written). Runtime integers (`ints`): R, K.

/* kernel */
  const int rows = ints[0], k = ints[1];
  const int chunks = (k + 31) / 32;  // a row's chunks, the last a half chunk where 32 does not divide K
  const long piece = (long)nv_group.x * THREADS + (long)nv_thread.x;
  if (piece >= (long)rows * chunks * 4) return;
  const long row = piece / (4L * chunks);
  const int chunk = (int)(piece / 4 % chunks), part = (int)(piece % 4);
  const bool half_chunk = k % 32 != 0 && chunk == chunks - 1;
  if (half_chunk && part >= 2) return;
  uint words[BITS];
  load_chunk_words(w + row * (k * BITS / 32) + chunk * BITS, half_chunk, words);
  float q[8];
  decode_part(words, part, q);
  const long group = row * (k / GROUP) + (chunk * 32 + part * 8) / GROUP;  // the piece's group
#if MODE == 0
  scale_codes(q, 8, group_scale(scales[group]), to_float(biases[group]));
#else
  scale_codes(q, 8, group_scale(scales[group]), 0.0f);
#endif
  STORE_PIECE(CHUNK_Y, Y_CHUNKS, TY, q, y + row * k + chunk * 32 + part * 8)
