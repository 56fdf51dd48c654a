// Pieces of a row: VEC consecutive elements (a define of the kernel), read and written as
// COUNT chunks of type CHUNK (`chunks()` in program.py: the widest that divides the piece, so
// every chunk of an aligned piece is aligned), converted to and from float32. For the row
// kernels (norm.h, rope.h).

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
