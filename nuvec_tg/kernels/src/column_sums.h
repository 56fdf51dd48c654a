// The sums of the matrix-vector kernels (qmv.h, gemv.h): helpers only. A SIMD group holds, in each
// lane, a part of every one of its XM x COLUMNS outputs (row i / COLUMNS, column i % COLUMNS), and
// the K_SPLIT SIMD groups of one set of columns each hold a part of K. The lanes' parts meet by
// simd_sum, the SIMD groups' in order 0, 1, ... through threadgroup memory: a fixed order, the
// same whatever XM, COLUMNS and COLUMN_WARPS are. Defines: XM, COLUMNS, COLUMN_WARPS, K_SPLIT.

// This SIMD group's lane sums, each summed over the lanes into `partials` (threadgroup memory of
// K_SPLIT x COLUMN_WARPS x XM x COLUMNS floats), then the threadgroup's barrier.
INLINE void store_partials(const THREAD float* sums, THREADGROUP_PTR float* partials, int lane, int k_warp, int column_warp) {
#pragma unroll
  for (int i = 0; i < XM * COLUMNS; i++) {
    const float total = simd_sum(sums[i]);
    if (lane == 0) partials[(k_warp * COLUMN_WARPS + column_warp) * XM * COLUMNS + i] = total;
  }
  threadgroup_barrier();
}

// Output i of column set `column_warp`: its K_SPLIT partials added in order.
INLINE float column_total(const THREADGROUP_PTR float* partials, int column_warp, int i) {
  float total = partials[column_warp * XM * COLUMNS + i];
  for (int s = 1; s < K_SPLIT; s++) total += partials[(s * COLUMN_WARPS + column_warp) * XM * COLUMNS + i];
  return total;
}
