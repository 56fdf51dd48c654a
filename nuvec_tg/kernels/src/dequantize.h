// Packed quantized weights (`quant_codes.h`) as dense rows: y [R, K] of TY from R packed rows of K
// codes (`quant.dequantize`, and the products of many rows on Hopper: `quant.qmm_dequantized`
// dequantizes w once, then runs gemm_wgmma). Each thread takes one chunk (32 codes of a row): its
// BITS words, then a piece of 8 values at a time with its group's scale (and bias), written as
// one piece:
//   affine:                 y = TY(fma(scale, q, bias))
//   floating-point modes:   y = TY(q * (scale * FP_FACTOR))   (q the code's value / FP_FACTOR)
// qmm_wgmma.h's dequantization into its w tiles, rounded the same way, so a product over these rows
// on the same warpgroup steps has qmm_wgmma's bits.
//
// Bounds: a thread past the last chunk does nothing; a K that is not a multiple of 32 (nvfp4's
// groups of 16) ends each row in a half chunk, whose second half is neither read nor written.
//
// Defines: TS (scales: the dtype, or uchar for the floating-point modes), TY, BITS, GROUP, MODE,
// LOAD_WORDS (`quant_codes.h`), THREADS, CHUNK_Y and Y_CHUNKS (how a piece of 8 values is
// written). Runtime integers (`ints`): R, K.

/* kernel */
  const int rows = ints[0], k = ints[1];
  const int chunks = (k + 31) / 32;  // a row's chunks, the last a half chunk where 32 does not divide K
  const long unit = (long)nv_group.x * THREADS + (long)nv_thread.x;
  if (unit >= (long)rows * chunks) return;
  const long row = unit / chunks;
  const int chunk = (int)(unit % chunks);
  const bool half_chunk = k % 32 != 0 && chunk == chunks - 1;
  uint words[BITS];
  load_chunk_words(w + row * (k * BITS / 32) + chunk * BITS, half_chunk, words);
  const long first_group = row * (k / GROUP) + chunk * 32 / GROUP;
#pragma unroll
  for (int part = 0; part < 4; part++) {
    if (half_chunk && part == 2) break;
    float q[8];
    decode_part(words, part, q);
    const int h = part * SCALES_PER_CHUNK / 4;  // the part's group of the chunk
    const float scale = group_scale(scales[first_group + h]);
#if MODE == 0
    const float bias = to_float(biases[first_group + h]);
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = fma(scale, q[j], bias);
#else
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = q[j] * (scale * FP_FACTOR);
#endif
    STORE_PIECE(CHUNK_Y, Y_CHUNKS, TY, q, y + row * k + chunk * 32 + part * 8)
  }
