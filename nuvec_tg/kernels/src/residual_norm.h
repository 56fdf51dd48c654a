// A residual add of a normalised branch, optionally scaled and normalised again (Gemma's sandwich
// norms), in one pass over the rows: x and h read once, s and y written once.
//
//   n = TN(TN(x * r1) * w)        r1 = 1 / sqrt(mean(x²) + EPS)   (rms_norm(x, weight, eps))
//   s = TS(TS(h) + TS(n)), then s = TS(s * TS(scale)) with a scale (SCALE 1: the literal
//       SCALE_VALUE; 2: the tensor `scale`'s one element)
//   y = TO(TO(s * r2) * v)        r2 = 1 / sqrt(mean(s²) + NEXT_EPS)  (NEXT: rms_norm(s, next_weight))
//
// A threadgroup of THREADS threads per row, pieces of VEC elements as in norm.h: held in
// registers from the load to the store with CACHED, else read again for each pass (x for s; s,
// this thread's own store, for y). Sums are float32 in a fixed order (norm.h), so a row's bits
// depend only on the row, its length and the launch (from the length alone).
//
// Defines: TX, TH, TW, TN (x's, h's, the weight's, and the normed branch's types), TS (s's), TC
// (the scale tensor's; SCALE 2), TO, TV (y's and the next weight's; NEXT), SCALE, SCALE_VALUE
// (SCALE 1), NEXT, EPS, NEXT_EPS (NEXT), THREADS, VEC, PER, CACHED; CHUNK_<buffer> and
// <buffer>_CHUNKS for X, H, W, S, O, V (`chunks()` in rows.py).
// Runtime integers (`ints`): the row length, the rows.

/* kernel */
  const int row = (int)nv_group.x, me = (int)nv_thread.x;
  const int lane = me % 32, warp = me / 32;  // not "thread": a Metal keyword
  const int length = ints[0];
  if (row >= ints[1]) return;
  const int pieces = length / VEC;
  const long base = (long)row * length;
  THREADGROUP float partial[THREADS / 32];
  float piece[VEC];
#if SCALE == 1
  const float factor = to_float(TS(SCALE_VALUE));
#elif SCALE == 2
  const float factor = to_float(TS(to_float(scale[0])));
#endif

  // s of piece p from x's values in `piece` (normalised by r1), into `piece`, and stored.
#define MAKE_S(p)                                                                                   \
  {                                                                                                 \
    float weight_[VEC], h_[VEC];                                                                    \
    LOAD_PIECE(CHUNK_W, W_CHUNKS, TW, weight + (long)(p) * VEC, weight_)                            \
    LOAD_PIECE(CHUNK_H, H_CHUNKS, TH, h + base + (long)(p) * VEC, h_)                               \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) {                                               \
      const float normed = to_float(TN(to_float(TN(piece[e] * r1)) * weight_[e]));                 \
      piece[e] = to_float(TS(to_float(TS(h_[e])) + to_float(TS(normed))));                          \
      APPLY_SCALE(piece[e])                                                                         \
    }                                                                                               \
    STORE_PIECE(CHUNK_S, S_CHUNKS, TS, piece, s + base + (long)(p) * VEC)                           \
  }
#if SCALE
#define APPLY_SCALE(value) value = to_float(TS(value * factor));
#else
#define APPLY_SCALE(value)
#endif
  // y of piece p from s's values in `piece`.
#define MAKE_Y(p)                                                                                   \
  {                                                                                                 \
    float weight_[VEC], out_[VEC];                                                                  \
    LOAD_PIECE(CHUNK_V, V_CHUNKS, TV, next_weight + (long)(p) * VEC, weight_)                       \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) out_[e] = to_float(TO(to_float(TO(piece[e] * r2)) * weight_[e])); \
    STORE_PIECE(CHUNK_O, O_CHUNKS, TO, out_, y + base + (long)(p) * VEC)                             \
  }

  float squares = 0.0f, r1;
#if CACHED
  float held[PER][VEC];  // x's pieces, then s's
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = me + k * THREADS;
    if (p < pieces) {
      LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (long)p * VEC, held[k])
#pragma unroll
      for (int e = 0; e < VEC; e++) squares += held[k][e] * held[k][e];
    }
  }
  GROUP_SUM(squares, r1)
  r1 = 1.0f / sqrt(r1 / (float)length + EPS);  // correctly rounded, unlike rsqrt
  squares = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = me + k * THREADS;
    if (p < pieces) {
#pragma unroll
      for (int e = 0; e < VEC; e++) piece[e] = held[k][e];
      MAKE_S(p)
#pragma unroll
      for (int e = 0; e < VEC; e++) { held[k][e] = piece[e]; squares += piece[e] * piece[e]; }
    }
  }
#if NEXT
  float r2;
  GROUP_SUM(squares, r2)
  r2 = 1.0f / sqrt(r2 / (float)length + NEXT_EPS);
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int p = me + k * THREADS;
    if (p < pieces) {
#pragma unroll
      for (int e = 0; e < VEC; e++) piece[e] = held[k][e];
      MAKE_Y(p)
    }
  }
#endif
#else
  for (int p = me; p < pieces; p += THREADS) {
    LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (long)p * VEC, piece)
#pragma unroll
    for (int e = 0; e < VEC; e++) squares += piece[e] * piece[e];
  }
  GROUP_SUM(squares, r1)
  r1 = 1.0f / sqrt(r1 / (float)length + EPS);
  squares = 0.0f;
  for (int p = me; p < pieces; p += THREADS) {
    LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (long)p * VEC, piece)
    MAKE_S(p)
#pragma unroll
    for (int e = 0; e < VEC; e++) squares += piece[e] * piece[e];
  }
#if NEXT
  float r2;
  GROUP_SUM(squares, r2)
  r2 = 1.0f / sqrt(r2 / (float)length + NEXT_EPS);
  for (int p = me; p < pieces; p += THREADS) {
    LOAD_PIECE(CHUNK_S, S_CHUNKS, TS, s + base + (long)p * VEC, piece)  // this thread's own store
    MAKE_Y(p)
  }
#endif
#endif
