// Dense matrix-vector products y = x · wᵀ (+ bias) for 1-8 rows of x (decode), float32
// accumulation: w [N, K] of TW, x [XM, K] of TX, bias [N] of TB (BIAS), y [XM, N] of TY. The
// product is memory-bound: w is read once, each of its elements serving every row of x.
//
// Layout. A lane's unit is a piece: VEC consecutive elements of a row of w starting at a multiple
// of VEC (VEC 8 where K allows it: one 16-byte load of a 16-bit w), read as W_CHUNKS loads of
// CHUNK_W (`chunks()`: the widest the rows' alignment allows). A SIMD step is 32 lanes x VEC
// consecutive k of a row. A threadgroup serves COLUMN_WARPS * COLUMNS output columns with
// COLUMN_WARPS * K_SPLIT SIMD groups: each SIMD group serves COLUMNS columns, and the K_SPLIT SIMD
// groups of one set of columns take the steps in turn (group s: steps s, s + K_SPLIT, ...). A lane
// issues the loads of its pieces of its COLUMNS rows for UNROLL steps before it uses any of them
// (COLUMNS * UNROLL loads in flight a lane). x (small, cache-resident) is read a piece at a time;
// each of its values serves every column, each value of w every row of x.
//
// One row's bits. For a row m and column n the arithmetic is one fixed sequence whatever XM,
// COLUMNS, COLUMN_WARPS and UNROLL are: the lane owning a piece accumulates its VEC products in
// order with fma(x, w, sum), taking its pieces in increasing order; the lanes' sums meet by
// simd_sum, the K_SPLIT SIMD groups' sums by adding them in order 0, 1, ... through threadgroup
// memory; then the bias is added (one float32 add) and y rounded once. Every multiply-add is
// written as fma, so the compiler has no contraction to choose. Only VEC (from K) and K_SPLIT
// change the order, and both come from K and N alone (`linear.gemv_plan`), never from XM.
//
// Bounds: pieces past K are not read (a lane with none in a step skips it; VEC divides K, so no
// piece is partial). The last set of columns is moved back to end at N (COLUMNS <= N), so nothing
// past N is read or written.
//
// SwiGLU's product (GLU): x is `[XM, 2 * K]`, a gated MLP's gate then up halves, and the product
// is taken with silu(gate) * up, each value of a piece computed from the gate's piece and the up's
// K further as the composition rounds it (`swiglu_value`), so the MLP's activation is no kernel of
// its own. VEC divides K, so the up half's pieces are aligned as the gate's.
//
// Gathered products (GATHER, a mixture of experts' decode: `gather_mm` below its sorted rule):
// threadgroup row p = nv_group.y computes entry p, x's rows `x[p]` ([XM, K] of x [P, XM, K]) times
// weight batch `picks[p]` of the BATCHES batches (w [BATCHES, N, K]) into y[p]; a pick outside
// 0..BATCHES-1 reads nothing and gives zeros. No bias. Each entry's arithmetic is the plain
// product's, so a row keeps its bits alone against its batch whichever entries share the call.
//
// Defines: TX, TW, TB, TY, BIAS, GLU, GATHER, BATCHES, N_TOTAL and K_TOTAL (w's shape: baked, so
// every offset is a constant), XM, VEC, CHUNK_W / W_CHUNKS and CHUNK_X / X_CHUNKS (`chunks()`),
// COLUMNS, COLUMN_WARPS, K_SPLIT, UNROLL, from `kernels/linear.py`.

#define PIECES (K_TOTAL / VEC)                     // pieces of a row (VEC divides K)
#define X_ROW (GLU ? 2 * K_TOTAL : K_TOTAL)       // elements of a row of x
#define STEPS ((PIECES + 31) / 32)                 // SIMD steps along a row

/* kernel */
  const int lane = (int)nv_thread.x % 32, warp = (int)nv_thread.x / 32;
#if GATHER
  GATHERED_ENTRY(entry, batch, picked)
  const DEVICE TW* w_at = w + batch * N_TOTAL * K_TOTAL;
  const DEVICE TX* x_at = x + (long)entry * XM * X_ROW;
  DEVICE TY* y_at = y + (long)entry * XM * N_TOTAL;
#else
  const bool picked = true;
  const DEVICE TW* w_at = w;
  const DEVICE TX* x_at = x;
  DEVICE TY* y_at = y;
#endif
  const int column_warp = warp % COLUMN_WARPS, k_warp = warp / COLUMN_WARPS;
  // This SIMD group's columns first_n .. first_n + COLUMNS - 1. The last set is moved back to end
  // at N: its columns that another set also has are computed alike there, and written alike.
  const int first_n = min(((int)nv_group.x * COLUMN_WARPS + column_warp) * COLUMNS, N_TOTAL - COLUMNS);

  float sums[XM * COLUMNS];
#pragma unroll
  for (int i = 0; i < XM * COLUMNS; i++) sums[i] = 0.0f;
  for (int step = k_warp; picked && step < STEPS; step += K_SPLIT * UNROLL) {  // uniform: an unpicked entry sums nothing
    // The w loads of UNROLL steps (step + u * K_SPLIT), all issued before any is used.
    CHUNK_W raw[UNROLL * COLUMNS * W_CHUNKS];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const int piece = (step + u * K_SPLIT) * 32 + lane;
      if (piece >= PIECES) continue;
#pragma unroll
      for (int c = 0; c < COLUMNS; c++)
#pragma unroll
        for (int i = 0; i < W_CHUNKS; i++)
          raw[(u * COLUMNS + c) * W_CHUNKS + i] =
              ((const DEVICE CHUNK_W*)(w_at + (long)(first_n + c) * K_TOTAL + piece * VEC))[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const int piece = (step + u * K_SPLIT) * 32 + lane;
      if (piece >= PIECES) continue;
      float w_values[COLUMNS][VEC];
#pragma unroll
      for (int c = 0; c < COLUMNS; c++) {
        const THREAD TW* values = (const THREAD TW*)(raw + (u * COLUMNS + c) * W_CHUNKS);
#pragma unroll
        for (int j = 0; j < VEC; j++) w_values[c][j] = to_float(values[j]);
      }
#pragma unroll
      for (int m = 0; m < XM; m++) {
        float xs[VEC];
        LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x_at + (long)m * X_ROW + piece * VEC, xs)
#if GLU
        float ups[VEC];
        LOAD_PIECE(CHUNK_X, X_CHUNKS, TX, x_at + (long)m * X_ROW + K_TOTAL + piece * VEC, ups)
#pragma unroll
        for (int j = 0; j < VEC; j++) xs[j] = swiglu_value<TX>(xs[j], ups[j]);
#endif
#pragma unroll
        for (int c = 0; c < COLUMNS; c++)
#pragma unroll
          for (int j = 0; j < VEC; j++) sums[m * COLUMNS + c] = fma(xs[j], w_values[c][j], sums[m * COLUMNS + c]);
      }
    }
  }

  // Lanes by simd_sum, then the K_SPLIT SIMD groups of a column set in order (`column_sums.h`); the
  // bias added once, y rounded once.
  THREADGROUP float partials[K_SPLIT * COLUMN_WARPS * XM * COLUMNS];
  store_partials(sums, partials, lane, k_warp, column_warp);
  if (k_warp == 0) {
    for (int i = lane; i < XM * COLUMNS; i += 32) {
      float total = column_total(partials, column_warp, i);
      const int n = first_n + i % COLUMNS;
#if BIAS
      total += to_float(bias[n]);
#endif
      from_float(total, &y_at[(i / COLUMNS) * N_TOTAL + n]);
    }
  }
