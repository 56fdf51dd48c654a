// Softmax, log-sum-exp and cross-entropy over rows: a threadgroup of THREADS threads per row, each
// thread taking pieces of VEC consecutive elements (16 bytes of 16-bit rows: one load), its pieces
// THREADS pieces apart (VEC 8 where the length is a multiple of 8; else single elements, any length).
//
//     m = max(x);  s = sum(e^(x - m));  e^(x - m) computed as exp2((x - m) * log2 e), as tinygrad's exp
//     MODE 0, softmax:        y = TO(e^(x - m) * (1 / s))        (NaN where m is infinite)
//     MODE 1, logsumexp:      y = TO(log2(s) * ln 2 + m)         (m itself where m is infinite)
//     MODE 2, cross_entropy:  y = logsumexp - x[t] in float32    (t < 0 counts from the end; a t
//                             outside -length..length-1 hits no class and subtracts nothing)
//
// The infinite rows are the compositions': a row of -inf or one holding +inf has an infinite
// maximum; its softmax is NaN and its log-sum-exp that maximum. A -inf element adds nothing to s.
//
// Short rows (LOOPED 0: at most ITEMS elements a thread) are read once into registers: the
// maximum, then each exponential kept for the output. Long rows (LOOPED 1) take two passes: an
// online maximum and sum, ITEMS elements of a thread at a time (its sum moved onto a larger
// maximum once per block), then for softmax a second read of the row. Everything is float32: a
// thread's partial in element order, a SIMD reduction, then the SIMD groups' partials in order,
// so a row's bits depend only on the row and the launch (the plan picks it from the length alone).
//
// Defines: MODE, TX and TO (x's and y's types), THREADS (a multiple of 32, at most 1024), ITEMS,
// VEC (dividing ITEMS and the length), LOOPED, and the pieces' chunks (pieces.h: CHUNK_X, X_CHUNKS,
// CHUNK_Y, Y_CHUNKS). Runtime integers (`ints`): the row length, the rows.

// e^(v - top) as the composition computes it; an element of -inf adds nothing, also beside a
// maximum of -inf (where the difference would be NaN).
INLINE float shifted_exp(float v, float top) { return v == -INFINITY ? 0.0f : exp2((v - top) * LOG2E); }

#define LN2 0.6931471805599453f
#define PIECES (ITEMS / VEC)                  // a thread's pieces a block
#define PIECE_STRIDE (THREADS * VEC)          // elements between a thread's pieces
// The piece at element `i` of the row as floats into `into`, -inf past the row's end (a piece is
// all in or all out: VEC divides the length).
#define READ_PIECE(i, into)                                                                         \
  if ((i) < length) LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + (i), into)                         \
  else { _Pragma("unroll") for (int e = 0; e < VEC; e++) (into)[e] = -INFINITY; }

/* kernel */
  const int row = (int)nv_group.x, me = (int)nv_thread.x;
  const int lane = me % 32, warp = me / 32;  // not "thread": a Metal keyword
  const int length = ints[0];
  if (row >= ints[1]) return;
  const long base = (long)row * length;
  THREADGROUP float maxima[THREADS / 32];
  THREADGROUP float sums[THREADS / 32];
  float top = -INFINITY, sum = 0.0f;
#if LOOPED
  for (int start = me * VEC; start < length; start += THREADS * ITEMS) {
    float v[ITEMS];
    float block_top = -INFINITY;
#pragma unroll
    for (int p = 0; p < PIECES; p++) READ_PIECE(start + p * PIECE_STRIDE, v + p * VEC)
#pragma unroll
    for (int k = 0; k < ITEMS; k++) block_top = max(block_top, v[k]);
    const float grown = max(top, block_top);
    // the sum so far moved onto the grown maximum (a factor 1 where it stayed), then the block's
    sum = fma(sum, shifted_exp(top, grown), shifted_exp(v[0], grown));
#pragma unroll
    for (int k = 1; k < ITEMS; k++) sum += shifted_exp(v[k], grown);
    top = grown;
  }
#else
  float v[ITEMS];
#pragma unroll
  for (int p = 0; p < PIECES; p++) READ_PIECE(me * VEC + p * PIECE_STRIDE, v + p * VEC)
#pragma unroll
  for (int k = 0; k < ITEMS; k++) top = max(top, v[k]);
#endif
  // The row's maximum (exact in any order).
  const float group_max = simd_max(top);
  if (lane == 0) maxima[warp] = group_max;
  threadgroup_barrier();
  float row_max = maxima[0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; w++) row_max = max(row_max, maxima[w]);
#if LOOPED
  sum *= shifted_exp(top, row_max);  // the thread's sum moved onto the row's maximum
#else
#pragma unroll
  for (int k = 0; k < ITEMS; k++) {
    v[k] = shifted_exp(v[k], row_max);  // kept for the output
    sum += v[k];
  }
#endif
  sum = simd_sum(sum);
  if (lane == 0) sums[warp] = sum;
  threadgroup_barrier();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; w++) total += sums[w];
  const bool infinite = row_max == INFINITY || row_max == -INFINITY;
#if MODE == 0
  const float scale = infinite ? bits_to_float(0x7FC00000u) : 1.0f / total;  // NaN, as the composition
#if LOOPED
  for (int i = me * VEC; i < length; i += PIECE_STRIDE) {
    float w[VEC];
    LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x + base + i, w)
#pragma unroll
    for (int e = 0; e < VEC; e++) w[e] = shifted_exp(w[e], row_max) * scale;
    STORE_PIECE(CHUNK_Y, Y_CHUNKS, TO, w, y + base + i)
  }
#else
#pragma unroll
  for (int p = 0; p < PIECES; p++) {
    const int i = me * VEC + p * PIECE_STRIDE;
    if (i >= length) continue;
    float w[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) w[e] = v[p * VEC + e] * scale;
    STORE_PIECE(CHUNK_Y, Y_CHUNKS, TO, w, y + base + i)
  }
#endif
#else
  if (me == 0) {
    const float lse = infinite ? row_max : fma(log2(total), LN2, row_max);
#if MODE == 1
    y[row] = TO(lse);
#else
    int target = targets[row];
    if (target < 0) target += length;  // no overflow: length >= 1
    y[row] = lse - (target >= 0 && target < length ? to_float(x[base + target]) : 0.0f);
#endif
  }
#endif
