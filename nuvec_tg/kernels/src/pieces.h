// Helpers of the row kernels that read a row as pieces of VEC consecutive elements (norm.h,
// residual_norm.h). Defines they need: VEC, THREADS; the kernel's scope has `lane`, `warp` and a
// THREADGROUP float `partial[THREADS / 32]`.

// VEC elements of `from` (a piece, aligned to its whole size) as floats into `into`.
#define LOAD_PIECE(CHUNK, COUNT, T, from, into)                                                      \
  {                                                                                                 \
    CHUNK raw_[COUNT];                                                                              \
    _Pragma("unroll") for (int c = 0; c < COUNT; c++) raw_[c] = ((const DEVICE CHUNK*)(from))[c];   \
    const THREAD T* values_ = (const THREAD T*)raw_;                                                \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) (into)[e] = to_float(values_[e]);               \
  }
// VEC floats of `from` rounded to T (to nearest) and stored as a piece at `to`.
#define STORE_PIECE(CHUNK, COUNT, T, from, to)                                                       \
  {                                                                                                 \
    CHUNK raw_[COUNT];                                                                              \
    THREAD T* values_ = (THREAD T*)raw_;                                                            \
    _Pragma("unroll") for (int e = 0; e < VEC; e++) values_[e] = T((from)[e]);                      \
    _Pragma("unroll") for (int c = 0; c < COUNT; c++) ((DEVICE CHUNK*)(to))[c] = raw_[c];           \
  }
// The threadgroup's total of each thread's `value` into `into` (the same in every thread): a
// SIMD sum, then the SIMD groups' sums added in order. The first barrier lets every thread read
// the last call's partials before they are written again.
#define GROUP_SUM(value, into)                                                                      \
  {                                                                                                 \
    const float simd_total_ = simd_sum(value);                                                      \
    threadgroup_barrier();                                                                          \
    if (lane == 0) partial[warp] = simd_total_;                                                     \
    threadgroup_barrier();                                                                          \
    into = 0.0f;                                                                                    \
    _Pragma("unroll") for (int w = 0; w < THREADS / 32; w++) into += partial[w];                    \
  }
