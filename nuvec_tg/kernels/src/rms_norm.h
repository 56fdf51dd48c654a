// RMS norm over rows, optionally fused with the residual add: a threadgroup of THREADS threads
// per row, each thread striding over the row (any length; the row is read twice, the second time
// from L1/L2).
//
//     h = x + residual (ADD: rounded to TH and stored);  r = rsqrt(mean(h²) + EPS)
//     y = TO(h * r), then y = TO(y * w) with a weight (MLX's order: normalise, round, then scale)
//
// The sum of squares is in float32: each thread's strided partial, then a SIMD sum, then the
// SIMD groups' sums added in order by the first one, so a row's bits depend only on the row,
// its length and THREADS (the plan picks THREADS from the length alone, never from the row count).
//
// Defines: TH (h's type; ADD), TO (y's), THREADS (a multiple of 32, at most 1024), ADD, WEIGHT,
// EPS (a float literal). The buffers' types are the parameters'.
// Runtime integers (`ints`): the row length, the rows.

/* kernel */
  const int row = (int)nv_group.x, me = (int)nv_thread.x;
  const int lane = me % 32, warp = me / 32;  // not "thread": a Metal keyword
  const int length = ints[0];
  if (row >= ints[1]) return;
  const long base = (long)row * length;
  THREADGROUP float partial[THREADS / 32];
  float squares = 0.0f;
  for (int i = me; i < length; i += THREADS) {
#if ADD
    const float value = to_float(TH(to_float(x[base + i]) + to_float(residual[base + i])));  // to nearest
    h[base + i] = TH(value);
#else
    const float value = to_float(x[base + i]);
#endif
    squares = fma(value, value, squares);
  }
  squares = simd_sum(squares);
  if (lane == 0) partial[warp] = squares;
  threadgroup_barrier();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; w++) total += partial[w];
  const float scale = 1.0f / sqrt(total / (float)length + EPS);  // correctly rounded, unlike rsqrt
  for (int i = me; i < length; i += THREADS) {
#if ADD
    const float value = to_float(h[base + i]);  // this thread's own store above
#else
    const float value = to_float(x[base + i]);
#endif
#if WEIGHT
    y[base + i] = TO(to_float(TO(value * scale)) * to_float(weight[i]));
#else
    y[base + i] = TO(value * scale);
#endif
  }
