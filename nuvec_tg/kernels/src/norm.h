// Row norms over the last axis: the RMS norm (optionally fused with the residual add) and the
// layer norm. A threadgroup of THREADS threads per row; a row is read as pieces of VEC consecutive
// elements (VEC 8 when the row length is a multiple of 8: 16-byte loads of 16-bit types; else 1),
// thread `me` taking pieces me, me + THREADS, ... . With CACHED a thread's PER pieces stay in
// registers from the load to the store (the row is read once); without, it is read again for each
// pass (from L1/L2: rows longer than THREADS * PER * VEC).
//
//   RMS (LAYER 0): h = x + residual (ADD: rounded to TH and stored); r = 1 / sqrt(mean(h²) + EPS);
//                  y = TO(h * r)
//   LAYER 1:       c = x - mean(x); r = 1 / sqrt(mean(c²) + EPS); y = TO(c * r)
//   then y = TO(y * w) with a weight and y = TO(y + b) with a bias (MLX's order: normalise, round,
//   then scale and shift in the result type).
//
// Sums are float32: each thread's partial over its pieces in order, a SIMD sum, then the SIMD
// groups' sums added in order, so a row's bits depend only on the row, its length and the launch
// (the plan picks the launch from the length alone, never from the row count).
//
// Defines: TX, TO (x's and y's types), TR, TH (residual's and h's; ADD), TW, TB (weight's and
// bias's; WEIGHT, BIAS), LAYER, ADD, WEIGHT, BIAS, THREADS (a multiple of 32, at most 1024), VEC,
// PER, CACHED, EPS (a float literal); CHUNK_<buffer> and <buffer>_CHUNKS: how a piece of each
// buffer is read or written (X, O, R, H, W, B), `chunks()` in rows.py.
// Runtime integers (`ints`): the row length, the rows.

#define PIECES_OF(length) ((length) / VEC)

/* kernel */
  const int row = (int)nv_group.x, me = (int)nv_thread.x;
  const int lane = me % 32, warp = me / 32;  // not "thread": a Metal keyword
  const int length = ints[0];
  if (row >= ints[1]) return;
  const int pieces = PIECES_OF(length);
  const long base = (long)row * length;
  THREADGROUP float partial[THREADS / 32];
  float piece[VEC];

  // The row's value (h with ADD) of piece p into `piece`; with ADD the first read stores h.
#if ADD
#define READ_ROW(p, first)                                                                          \
  {                                                                                                 \
    if (first) {                                                                                    \
      float residual_[VEC];                                                                         \
      LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (long)(p) * VEC, piece)                          \
      LOAD_PIECE(CHUNK_R, R_CHUNKS, TR, residual + base + (long)(p) * VEC, residual_)               \
      _Pragma("unroll") for (int e = 0; e < VEC; e++) piece[e] = to_float(TH(piece[e] + residual_[e])); \
      STORE_PIECE(CHUNK_H, H_CHUNKS, TH, piece, h + base + (long)(p) * VEC)                          \
    } else {                                                                                        \
      LOAD_PIECE(CHUNK_H, H_CHUNKS, TH, h + base + (long)(p) * VEC, piece)  /* this thread's store */ \
    }                                                                                               \
  }
#else
#define READ_ROW(p, first) LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (long)(p) * VEC, piece)
#endif

#if CACHED
  float held[PER][VEC];  // this thread's pieces, zero past the row
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = me + k * THREADS;
    if (p < pieces) {
      READ_ROW(p, true)
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e++) piece[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) held[k][e] = piece[e];
  }
#endif

  // The row's sum of `TERM(value)` over every element, the same in every thread of the group.
  // (The barrier before the partials are written again lets every thread read the last ones.)
#if CACHED
#define ROW_SUM(TERM, into)                                                                         \
  {                                                                                                 \
    float sum_ = 0.0f;                                                                              \
    _Pragma("unroll") for (int k = 0; k < PER; k++)                                                 \
      if (me + k * THREADS < pieces) {                                                              \
        _Pragma("unroll") for (int e = 0; e < VEC; e++) { const float value = held[k][e]; sum_ += TERM; } \
      }                                                                                             \
    sum_ = simd_sum(sum_);                                                                          \
    threadgroup_barrier();                                                                          \
    if (lane == 0) partial[warp] = sum_;                                                            \
    threadgroup_barrier();                                                                          \
    into = 0.0f;                                                                                    \
    _Pragma("unroll") for (int w = 0; w < THREADS / 32; w++) into += partial[w];                    \
  }
#else
#define ROW_SUM(TERM, into)                                                                         \
  {                                                                                                 \
    float sum_ = 0.0f;                                                                              \
    for (int p = me; p < pieces; p += THREADS) {                                                    \
      READ_ROW(p, first_pass)                                                                       \
      _Pragma("unroll") for (int e = 0; e < VEC; e++) { const float value = piece[e]; sum_ += TERM; } \
    }                                                                                               \
    first_pass = false;                                                                             \
    sum_ = simd_sum(sum_);                                                                          \
    threadgroup_barrier();                                                                          \
    if (lane == 0) partial[warp] = sum_;                                                            \
    threadgroup_barrier();                                                                          \
    into = 0.0f;                                                                                    \
    _Pragma("unroll") for (int w = 0; w < THREADS / 32; w++) into += partial[w];                    \
  }
  bool first_pass = true;
#endif

#if LAYER
  float total;
  ROW_SUM(value, total)
  const float mean = total / (float)length;
  float squares;
  ROW_SUM((value - mean) * (value - mean), squares)
#else
  const float mean = 0.0f;
  float squares;
  ROW_SUM(value * value, squares)
#endif
  const float scale = 1.0f / sqrt(squares / (float)length + EPS);  // correctly rounded, unlike rsqrt

  // y of piece p from its values in `piece`: normalised and rounded, then scaled and shifted.
#if WEIGHT
#define SCALE_PIECE(p)                                                                              \
  {                                                                                                 \
    float weight_[VEC];                                                                             \
    LOAD_PIECE(CHUNK_W, W_CHUNKS, TW, weight + (long)(p) * VEC, weight_)                            \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) out[e] = to_float(TO(out[e] * weight_[e]));     \
  }
#else
#define SCALE_PIECE(p)
#endif
#if BIAS
#define SHIFT_PIECE(p)                                                                              \
  {                                                                                                 \
    float bias_[VEC];                                                                               \
    LOAD_PIECE(CHUNK_B, B_CHUNKS, TB, bias + (long)(p) * VEC, bias_)                                \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) out[e] = to_float(TO(out[e] + bias_[e]));       \
  }
#else
#define SHIFT_PIECE(p)
#endif
  float out[VEC];
#define WRITE_PIECE(p)                                                                              \
  {                                                                                                 \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) out[e] = to_float(TO((piece[e] - mean) * scale)); \
    SCALE_PIECE(p)                                                                                  \
    SHIFT_PIECE(p)                                                                                  \
    STORE_PIECE(CHUNK_O, O_CHUNKS, TO, out, y + base + (long)(p) * VEC)                              \
  }
#if CACHED
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = me + k * THREADS;
    if (p < pieces) {
#pragma unroll
      for (int e = 0; e < VEC; e++) piece[e] = held[k][e];
      WRITE_PIECE(p)
    }
  }
#else
  for (int p = me; p < pieces; p += THREADS) {
    READ_ROW(p, false)
    WRITE_PIECE(p)
  }
#endif
