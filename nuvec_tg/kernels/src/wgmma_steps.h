// Helpers of the kernels on Hopper's warpgroup products (gemm_wgmma.h, qmm_wgmma.h, qmm_wgmma_rs.h, qmm_wgmma_ws.h), over the
// prelude's wgmma vocabulary: a warpgroup's steps of 64 k, and its accumulators written out.

// The head of a pipelined step: this thread's copies of the step are done (at most PENDING later
// groups still in flight), then, after the fence and the barrier, everyone's, visible to the tensor
// cores; and every warpgroup has waited for the products of the step before last (`wgmma_step`),
// whose stage may now be refilled.
template <int PENDING> INLINE void wgmma_stage_ready() {
  async_wait(PENDING);
  async_proxy_fence();
  threadgroup_barrier();
}

// Where a thread's x copies of a run come from (qmm_wgmma.h, qmm_wgmma_ws.h): tile rows first_row +
// rows_a_pass * c of the tile starting at m_first, piece `piece` (8 elements) of each, `in[c]`
// where the row is in the run (else row 0, read by nothing: its copies write zeros).
template <int COPIES, typename T>
INLINE void x_copy_sources(const DEVICE T* x, int m_first, int first_row, int rows_a_pass, int piece, int run_start, int run_end,
                           int k_size, const DEVICE T** from, bool* in) {
#pragma unroll
  for (int c = 0; c < COPIES; c++) {
    const int row = m_first + first_row + rows_a_pass * c;
    in[c] = row >= run_start && row < run_end;
    from[c] = x + (size_t)(in[c] ? row : 0) * k_size + 8 * piece;
  }
}

// One step: A (the warpgroup's 64 rows of 64 k at `a_tile`) times B (N rows of 64 k at `b_tile`,
// both in the prelude's swizzled layout) added to `acc` as four wgmma of 16 k, one group; then wait
// for the group before it (whose tiles may then be refilled). The accumulators are held against
// the compiler moving their reads or writes across the running products.
template <int N, typename T> INLINE void wgmma_step(float* acc, const T* a_tile, const T* b_tile) {
  wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < 4; k16++) wgmma_tile<N>(acc, a_tile, b_tile, k16);
  wgmma_commit();
  wgmma_wait<1>();
#pragma unroll
  for (int i = 0; i < N / 2; i++) wgmma_hold(acc[i]);
}

// The last group done: the accumulators are final.
template <int N> INLINE void wgmma_finish(float* acc) {
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < N / 2; i++) wgmma_hold(acc[i]);
}

// A thread's accumulators of its warpgroup's 64 x N tile into y [M, n_size], rounded once, for the
// rows row_begin <= row < row_end: `row_first` is its SIMD group's first row plus lane / 4 (its
// rows: that and 8 more), `column_first` the tile's first column plus 2 * (lane % 4) (its columns:
// 8 j and + 1 from there, j < N / 8).
template <int N, typename T> INLINE void store_accumulators(const float* acc, DEVICE T* y, int row_first, int column_first,
                                                            int row_begin, int row_end, int n_size) {
#pragma unroll
  for (int j = 0; j < N / 8; j++) {
    const int column = column_first + 8 * j;
#pragma unroll
    for (int half_tile = 0; half_tile < 2; half_tile++) {
      const int row = row_first + 8 * half_tile;
      if (row < row_begin || row >= row_end) continue;
      store_row_pair(acc[4 * j + 2 * half_tile], acc[4 * j + 2 * half_tile + 1], y + (size_t)row * n_size + column, column, n_size);
    }
  }
}
