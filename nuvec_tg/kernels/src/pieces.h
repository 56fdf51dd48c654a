// Pieces of a row: consecutive elements read and written as COUNT chunks of type CHUNK
// (`chunks()` in program.py: the widest that divides the piece, so every chunk of an aligned
// piece is aligned), converted to and from float32; a piece of T holds PIECE_ELEMENTS of them
// (a kernel's VEC, or rope's unit in norm_rope.h, which has both). And the threadgroup's sum.
// For the row kernels (norm.h, residual_norm.h, rope.h, norm_rope.h). GROUP_SUM needs THREADS,
// and `lane`, `warp` and a THREADGROUP float `partial[THREADS / 32]` in the kernel's scope.

#define PIECE_ELEMENTS(CHUNK, COUNT, T) ((int)((COUNT) * sizeof(CHUNK) / sizeof(T)))

// The elements of a piece of T at `from` (aligned to its whole size) as floats into `into`.
#define LOAD_PIECE(CHUNK, COUNT, T, from, into)                                                      \
  {                                                                                                 \
    CHUNK raw_[COUNT];                                                                              \
    _Pragma("unroll") for (int c = 0; c < COUNT; c++) raw_[c] = ((const DEVICE CHUNK*)(from))[c];   \
    const THREAD T* values_ = (const THREAD T*)raw_;                                                \
    _Pragma("unroll") for (int e = 0; e < PIECE_ELEMENTS(CHUNK, COUNT, T); e++) (into)[e] = to_float(values_[e]); \
  }
// A piece's floats at `from` rounded to T (to nearest) and stored as a piece at `to`.
#define STORE_PIECE(CHUNK, COUNT, T, from, to)                                                       \
  {                                                                                                 \
    CHUNK raw_[COUNT];                                                                              \
    THREAD T* values_ = (THREAD T*)raw_;                                                            \
    _Pragma("unroll") for (int e = 0; e < PIECE_ELEMENTS(CHUNK, COUNT, T); e++) values_[e] = T((from)[e]); \
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
