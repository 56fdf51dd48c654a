// Packed codes of the quantized formats, for the kernels that read them (qmv.h, qvm.h, qmm.h,
// qmm_wgmma.h, qmm_wgmma_rs.h, dequantize.h): helpers only, placed before a kernel's own helpers. A *chunk* is 32
// consecutive codes of a packed row starting at a multiple of 32: exactly BITS uint32 words, so no
// code crosses into another chunk.
// Defines: TS (scales), BITS, GROUP, MODE (0 affine, 1 mxfp4, 2 mxfp8, 3 nvfp4), LOAD_WORDS.
#define CODE_MASK ((1u << BITS) - 1u)
#define CHUNK_GROUP (GROUP < 32 ? GROUP : 32)   // codes of a chunk under one scale
#define SCALES_PER_CHUNK (32 / CHUNK_GROUP)
#if MODE == 2
#define FP_FACTOR 256.0f                       // e4m3 as a half is its value * 2^-8
#elif MODE != 0
#define FP_FACTOR 16384.0f                     // e2m1 as a half is its value * 2^-14
#endif

INLINE float power_of_two(int exponent) { return bits_to_float((uint)(127 + exponent) << 23); }

INLINE float small_uint_to_float(uint value) {
  // value < 2^23: the float 2^23 + value, minus 2^23 (exact).
  return bits_to_float(value | 0x4B000000u) - 8388608.0f;
}

// Affine code `index` (0..31, a constant after unrolling) of a chunk's BITS words, as a float.
INLINE float affine_code(const THREAD uint* words, int index) {
  const int bit = index * BITS, word = bit / 32, shift = bit % 32;
  if (shift + BITS > 32)
    return small_uint_to_float(((words[word] >> shift) | (words[word + 1] << (32 - shift))) & CODE_MASK);
  const uint source = shift + BITS <= 23 ? words[word] : words[word] >> 16;
  const int at = shift + BITS <= 23 ? shift : shift - 16;
  return fma(bits_to_float(mask_or(source, CODE_MASK << at, 0x4B000000u)), power_of_two(-at), -power_of_two(23 - at));
}

// Codes 8 * part .. 8 * part + 7 of a chunk (`words`: its BITS words) into q, as floats (the
// floating-point modes: their values / FP_FACTOR).
INLINE void decode_part(const THREAD uint* words, int part, THREAD float* q) {
#if MODE == 0
  #pragma unroll
  for (int j = 0; j < 8; j++) q[j] = affine_code(words, 8 * part + j);
#elif MODE == 2
  // e4m3, bytes j and j + 2 of a word: magnitude bits to half bits 7-13, sign to bit 15.
  #pragma unroll
  for (int i = 0; i < 2; i++) {
    #pragma unroll
    for (int j = 0; j < 2; j++) {
      const uint v = words[2 * part + i] >> (8 * j);
      const float2 pair = half2_bits_to_float2(((v << 7) & 0x3F803F80u) | ((v << 8) & 0x80008000u));
      q[4 * i + j] = pair.x;
      q[4 * i + j + 2] = pair.y;
    }
  }
#else
  // e2m1, nibbles j and j + 4 of a word: magnitude bits to half bits 9-11, sign to bit 15.
  #pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint v = words[part] >> (4 * j);
    const float2 pair = half2_bits_to_float2(((v << 9) & 0x0E000E00u) | ((v << 12) & 0x80008000u));
    q[j] = pair.x;
    q[j + 4] = pair.y;
  }
#endif
}

// The two codes at bits 0 .. BITS - 1 and BITS .. 2 BITS - 1 of `v` (a pair of consecutive codes,
// BITS 2, 4 or 8) into q[0], q[1]: for the kernels whose lanes take pairs of codes at their own
// shifts (qmm_wgmma_rs.h). Affine as `decode_part` gives them; the floating-point modes as their
// values (`decode_part`'s times FP_FACTOR, exact: a power of two over the codes' few bits), which
// `scale_code_values` scales.
INLINE void decode_pair(uint v, THREAD float* q) {
#if MODE == 0
  // Each code where it is: 2^23 + q[0], and 2^(23 - BITS) + q[1] (whose mantissa's bit BITS is
  // worth 1), less their powers of two: exact, one LOP3 and one add a code.
  q[0] = bits_to_float(mask_or(v, CODE_MASK, 0x4B000000u)) - 8388608.0f;
  q[1] = bits_to_float(mask_or(v, CODE_MASK << BITS, (uint)(127 + 23 - BITS) << 23)) - power_of_two(23 - BITS);
#else
  #if MODE == 2
  const uint both = (v & 0xFFu) | ((v << 8) & 0xFF0000u);  // the second code into the high half's byte
  const float2 pair = half2_bits_times(((both << 7) & 0x3F803F80u) | ((both << 8) & 0x80008000u), FP_FACTOR);
  #else
  const uint both = (v & 0xFu) | ((v << 12) & 0xF0000u);   // the second code into the high half's nibble
  const float2 pair = half2_bits_times(((both << 9) & 0x0E000E00u) | ((both << 12) & 0x80008000u), FP_FACTOR);
  #endif
  q[0] = pair.x;
  q[1] = pair.y;
#endif
}

#if PAIRS
// PAIRS (on CUDA, 4-bit codes decoded two at a time in the weights' 16-bit type T):
// - affine, scales and biases of T: a half's code q with the exponent bits of 2^7 (bfloat) or 2^10
//   (half) is 2^7 + q, less 2^7 (an exact fma) is q, and fma(q, scale, bias) on the pair is each
//   weight rounded once from the exact q · scale + bias. The general path (a float32 fma, then the
//   rounding to T) gives the same bits except where the bias is below about 2^-19 of q · scale and
//   q · scale lies on a rounding tie of T; the kernels that decode into T for the warpgroup
//   products (qmm_wgmma, qmm_wgmma_rs, qmm_wgmma_ws, the dequantized route) and qmv_mma all take
//   this path where it applies, so a row's bits still never depend on which of them runs.
// - mxfp4 (T bfloat) and nvfp4 (T bfloat or half): an e2m1 code's bits placed in T are its value
//   · 2^-126 (bfloat) or · 2^-14 (half), the subnormal 0.5 too; times 2^126 or 2^14 is its value
//   (exact), times the scale (the e8m0 or e4m3 value, one of T exactly; e8m0's 2^-127 a bfloat
//   subnormal) is the weight rounded once from the exact product (nvfp4's is exact): the general
//   path's bits always (its float32 product is exact too), so this needs no rule.
INLINE uint pair_magic(bfloat) { return 0x43004300u; }      // 2^7, both halves
INLINE uint pair_magic(half) { return 0x64006400u; }        // 2^10
INLINE uint pair_one(bfloat) { return 0x3F803F80u; }
INLINE uint pair_one(half) { return 0x3C003C00u; }
INLINE uint pair_minus_magic(bfloat) { return 0xC300C300u; }
INLINE uint pair_minus_magic(half) { return 0xE400E400u; }
#define PAIR_NEGATIVE_ZERO 0x80008000u   // an fma's addend that leaves a product (and its sign) as it is
INLINE uint fp4_lift(bfloat) { return 0x7E807E80u; }  // 2^126, both halves
INLINE uint fp4_lift(half) { return 0x74007400u; }    // 2^14

// The e2m1 codes at bits 0-3 and 16-19 of `codes` as values of T times 2^-126 (bfloat: magnitude
// to bits 6-8, mantissa bit 6 and exponent bits 7-8) or 2^-14 (half: bits 9-11), the sign to bit 15.
INLINE uint fp4_scaled_down(uint codes, bfloat) {
  // the two codes times 2^6 + 2^12: copies at shifts 6 and 12 that cannot overlap, the wanted bits kept
  return ((codes & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
}
INLINE uint fp4_scaled_down(uint codes, half) {
  return mask_or(codes << 9, 0x0E000E00u, (codes << 12) & 0x80008000u);
}

// The codes at bits 0-3 and 16-19 of `codes` (its other bits ignored) as weights of T, the low half
// first; scale2: the group's `pair_scale`, bias2 its bias in both halves (affine; unused otherwise).
template <typename T> INLINE uint code_pair(uint codes, uint scale2, uint bias2) {
#if MODE == 0
  const uint q2 = fma_pairs(mask_or(codes, 0x000F000Fu, pair_magic(T())), pair_one(T()), pair_minus_magic(T()), T());
  return fma_pairs(q2, scale2, bias2, T());
#else
  const uint values = fma_pairs(fp4_scaled_down(codes, T()), fp4_lift(T()), PAIR_NEGATIVE_ZERO, T());
  return fma_pairs(values, scale2, PAIR_NEGATIVE_ZERO, T());
#endif
}

// A 16-bit value in both halves of a word.
template <typename T> INLINE uint both_halves(T value) { return to_bits(value) | to_bits(value) << 16; }

// Codes 0..7 of a 4-bit word as weights of T in k order, two a word (a 16-byte piece): codes j and
// j + 4 decoded together, then their halves paired by byte permutes. scale and bias (0 in the
// floating-point modes): values of T as floats (TS is T, or an e8m0 or e4m3 value), so exact in T.
template <typename T> INLINE uint4 part_pairs(uint word, float scale, float bias) {
  T scale_t, bias_t;
  from_float(scale, &scale_t);
  from_float(bias, &bias_t);
  const uint scale2 = both_halves(scale_t), bias2 = both_halves(bias_t);
  uint pairs[4];
#pragma unroll
  for (int j = 0; j < 4; j++) pairs[j] = code_pair<T>(word >> (4 * j), scale2, bias2);
  uint4 piece;
  piece.x = low_halves(pairs[0], pairs[1]);
  piece.y = low_halves(pairs[2], pairs[3]);
  piece.z = high_halves(pairs[0], pairs[1]);
  piece.w = high_halves(pairs[2], pairs[3]);
  return piece;
}
#endif

INLINE float group_scale(TS raw) {
#if MODE == 0
  return to_float(raw);
#elif MODE == 3
  // e4m3 as a half (value * 2^-8), widened, times 2^8.
  const uint code = (uint)raw;
  return half2_bits_to_float2(((code & 0x7Fu) << 7) | ((code & 0x80u) << 8)).x * 256.0f;
#else
  // e8m0: 2^(code - 127); code 0 is 2^-127.
  const uint code = (uint)raw;
  return code == 0u ? bits_to_float(0x00400000u) : bits_to_float(code << 23);
#endif
}

#if PAIRS
// An e4m3 code's bits placed in T: its value times 2^-120 (bfloat: exponent to bits 7-10, mantissa
// to 4-6) or 2^-8 (half: bits 10-13 and 7-9), its subnormals too, the sign to bit 15.
INLINE uint e4m3_scaled_down(uint code, bfloat) { return ((code & 0x7Fu) << 4) | ((code & 0x80u) << 8); }
INLINE uint e4m3_scaled_down(uint code, half) { return ((code & 0x7Fu) << 7) | ((code & 0x80u) << 8); }
INLINE uint e4m3_lift(bfloat) { return 0x7B807B80u; }  // 2^120, both halves
INLINE uint e4m3_lift(half) { return 0x5C005C00u; }    // 2^8

// A group's scale as `code_pair` takes it, from its stored form TS: the value of T in both halves
// (affine: TS is T; mxfp4: the e8m0 code as a bfloat, 2^(code - 127), code 0 the subnormal 2^-127;
// nvfp4: the e4m3 value, which T holds exactly, by an exact fma of its bits placed in T).
template <typename T> INLINE uint pair_scale(TS raw) {
#if MODE == 0
  return both_halves(raw);
#elif MODE == 1
  const uint code = (uint)raw;
  return code == 0u ? 0x00400040u : (code << 7) | (code << 23);
#else
  const uint scaled_down = e4m3_scaled_down((uint)raw, T());
  return fma_pairs(scaled_down | scaled_down << 16, e4m3_lift(T()), PAIR_NEGATIVE_ZERO, T());
#endif
}
#endif

// `count` decoded codes `q` (`decode_part`'s) as weights, in place: fma(scale, q, bias) (affine)
// or (q * FP_FACTOR) * scale (the floating-point modes; `bias` unused): the code's value (exact)
// times the scale, each weight rounded once to float32. The one dequantization of the kernels that
// write weights for the matrix units (qmm.h, qmm_wgmma.h, qmm_wgmma_ws.h, qmv_mma.h, dequantize.h),
// so that they round every weight alike. (q * (scale * FP_FACTOR), one multiply a code, is the
// same product where scale * FP_FACTOR is finite, but overflows from e8m0 scales of 2^114; the
// select between the two forms cost three multiplies a code where the lanes' scales differ.)
INLINE void scale_codes(THREAD float* q, int count, float scale, float bias) {
#if MODE == 0
#pragma unroll
  for (int j = 0; j < count; j++) q[j] = fma(scale, q[j], bias);
#else
#pragma unroll
  for (int j = 0; j < count; j++) q[j] = (q[j] * FP_FACTOR) * scale;
#endif
}

// The floating-point modes' code values (`decode_pair`'s, already times FP_FACTOR) as weights:
// value * scale, rounded once to float32: `scale_codes`' bits.
INLINE void scale_code_values(THREAD float* q, int count, float scale) {
#pragma unroll
  for (int j = 0; j < count; j++) q[j] = q[j] * scale;
}

// Codes 8 * part .. 8 * part + 7 of a chunk (`words`: its BITS words) as weights of type T
// (`scale_codes`' single rounding, then to T), stored as the 16-byte piece `at` of row `row` of a
// tile of 128-byte rows swizzled as Hopper's tensor cores read them (piece at ^ row % 8): the
// kernels that dequantize into a threadgroup tile for the warpgroup products (qmm_wgmma.h,
// qmm_wgmma_ws.h). A scale of 0 (and bias 0) writes zeros, for a weight row that is out.
// PAIRS: the codes two at a time in T (`part_pairs`).
template <typename T>
INLINE void store_tile_part(const THREAD uint* words, int part, float scale, float bias, THREADGROUP_PTR uchar* tile, int row, int at) {
#if PAIRS
  const uint4 packed = part_pairs<T>(words[part], scale, bias);
#else
  float q[8];
  decode_part(words, part, q);
  scale_codes(q, 8, scale, bias);
  uint4 packed;
  packed.x = pack_pair(q[0], q[1], T());
  packed.y = pack_pair(q[2], q[3], T());
  packed.z = pack_pair(q[4], q[5], T());
  packed.w = pack_pair(q[6], q[7], T());
#endif
  *(THREADGROUP_PTR uint4*)(tile + row * 128 + 16 * (at ^ (row % 8))) = packed;
}

// A chunk's BITS words from `at` (LOAD_WORDS-aligned); a half chunk reads only its first half.
INLINE void load_chunk_words(const DEVICE uint* at, bool half_chunk, THREAD uint* words) {
  #pragma unroll
  for (int i = 0; i < BITS; i += LOAD_WORDS) {
    if (half_chunk && i >= BITS / 2) break;
#if LOAD_WORDS == 4
    const uint4 piece = *(const DEVICE uint4*)(at + i);
    words[i] = piece.x; words[i + 1] = piece.y; words[i + 2] = piece.z; words[i + 3] = piece.w;
#elif LOAD_WORDS == 2
    const uint2 piece = *(const DEVICE uint2*)(at + i);
    words[i] = piece.x; words[i + 1] = piece.y;
#else
    words[i] = at[i];
#endif
  }
}
