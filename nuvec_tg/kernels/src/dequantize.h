// Packed quantized weights (`quant_codes.h`) as dense rows: y [R, K] of TY from R packed rows of K
// codes (`quant.dequantize`, and the products of many rows on Hopper: `quant.quantized_matmul`
// dequantizes w once, then runs gemm_wgmma). A piece is 8 codes of a chunk (32 codes of a row,
// BITS words); each thread takes PIECES pieces, SPAN apart (SPAN: the grid's threads), so that in
// each of them neighbouring threads write neighbouring 16- or 32-byte pieces. It loads the words
// and the scales (and biases) of all its pieces before it decodes and writes any: a store between
// them would keep the compiler from issuing the later loads early (y could alias w), and the
// loads in flight are what a pass over memory waits on. The four threads of a chunk load its words
// alike (one transaction) and decode their own part, with its group's scale (and bias):
//   affine:                 y = TY(fma(scale, q, bias))
//   floating-point modes:   y = TY((q * FP_FACTOR) * scale)   (q the code's value / FP_FACTOR,
//                           so the code's value times the scale, rounded once: `scale_codes`)
// PAIRS (CUDA; 4-bit affine codes with TS = TY of 16 bits, mxfp4 into bfloat, nvfp4): two codes at a
// time in TY, each weight rounded once (`quant_codes.h`). qmm_wgmma.h's dequantization into its w tiles, rounded the same way, so a
// product over these rows on the same warpgroup steps has qmm_wgmma's bits.
//
// Bounds: a piece past the last does nothing; a K that is not a multiple of 32 (nvfp4's groups of
// 16) ends each row in a half chunk, whose second half is neither read nor written.
//
// Defines: TS (scales: the dtype, or uchar for the floating-point modes), TY, BITS, GROUP, MODE,
// LOAD_WORDS (`quant_codes.h`), THREADS, PIECES, CHUNK_Y and Y_CHUNKS (how a piece of 8 values is
// written), PAIRS. Runtime integers (`ints`): R, K, SPAN (the grid's threadgroups times THREADS).

/* kernel */
  const int rows = ints[0], k = ints[1];
  const long span = (long)ints[2];
  const int chunks = (k + 31) / 32;  // a row's chunks, the last a half chunk where 32 does not divide K
  const long first = (long)nv_group.x * THREADS + (long)nv_thread.x;
  long row[PIECES];
  int chunk[PIECES], part[PIECES];
  bool live[PIECES];
  uint words[PIECES][BITS];
  float scale[PIECES], bias[PIECES];
#pragma unroll
  for (int i = 0; i < PIECES; i++) {
    const long piece = first + span * i;
    row[i] = piece / (4L * chunks);
    chunk[i] = (int)(piece / 4 % chunks);
    part[i] = (int)(piece % 4);
    const bool half_chunk = k % 32 != 0 && chunk[i] == chunks - 1;
    live[i] = row[i] < rows && !(half_chunk && part[i] >= 2);
    if (!live[i]) continue;
    load_chunk_words(w + row[i] * (k * BITS / 32) + chunk[i] * BITS, half_chunk, words[i]);
    const long group = row[i] * (k / GROUP) + (chunk[i] * 32 + part[i] * 8) / GROUP;  // the piece's group
    scale[i] = group_scale(scales[group]);
#if MODE == 0
    bias[i] = to_float(biases[group]);
#else
    bias[i] = 0.0f;
#endif
  }
#pragma unroll
  for (int i = 0; i < PIECES; i++) {
    if (!live[i]) continue;
#if PAIRS
    *(DEVICE uint4*)(y + row[i] * k + chunk[i] * 32 + part[i] * 8) = part_pairs<TY>(words[i][part[i]], scale[i], bias[i]);
#else
    float q[8];
    decode_part(words[i], part[i], q);
    scale_codes(q, 8, scale[i], bias[i]);
    STORE_PIECE(CHUNK_Y, Y_CHUNKS, TY, q, y + row[i] * k + chunk[i] * 32 + part[i] * 8)
#endif
  }
