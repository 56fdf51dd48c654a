// The Metal side of nuvec_tg's kernel dialect. bfloat is named only under NUVEC_BFLOAT (a program
// whose types include it defines that first): the Metal language has bfloat from 3.1 (macOS 14) on,
// so the others compile on Metal 3.0 too.
#include <metal_stdlib>
using namespace metal;
#define DEVICE device
#define THREAD thread
#define CONSTANT constant
#define THREADGROUP threadgroup
#define INLINE inline
#define threadgroup_barrier() threadgroup_barrier(mem_flags::mem_threadgroup)

INLINE float fast_exp2(float x) { return fast::exp2(x); }
// sin and cos of x, the precise forms at any x (not the fast ones, whatever the compiler's math mode).
INLINE void sin_cos(float x, thread float* s, thread float* c) { *s = precise::sincos(x, *c); }
INLINE float to_float(float x) { return x; }
INLINE float to_float(half x) { return float(x); }
INLINE float to_float(uchar x) { return float(x); }
INLINE float bits_to_float(uint bits) { return as_type<float>(bits); }
INLINE uint mask_or(uint a, uint mask, uint bits) { return (a & mask) | bits; }
INLINE float2 half2_bits_to_float2(uint bits) { return float2(as_type<half2>(bits)); }  // low half first
INLINE float2 half2_bits_times(uint bits, float factor) {  // the CUDA prelude's
  const float2 f = half2_bits_to_float2(bits);
  return float2(f.x * factor, f.y * factor);
}
INLINE void from_float(float x, device float* out) { *out = x; }
INLINE void from_float(float x, device half* out) { *out = half(x); }
INLINE float round_half(float x) { return float(half(x)); }
#ifdef NUVEC_BFLOAT
INLINE float to_float(bfloat x) { return float(x); }
INLINE void from_float(float x, device bfloat* out) { *out = bfloat(x); }
INLINE float round_bfloat(float x) { return float(bfloat(x)); }
#endif

// Matrix tiles (qmm.h, sdpa_prefill.h, gemm.h) on simdgroup matrices: the CUDA prelude's vocabulary. A
// tile is kept as this lane's elements of its 8 x 8 simdgroup matrices (MLX's fragments: a lane
// holds row frag_row(lane), columns frag_col(lane) and + 1 of each), moved into simdgroup_float8x8
// values for the multiply, so that kernels read and write a tile's elements as CUDA's do: acc.v[e]
// is row frag_row + 8 * (e / 2), column frag_col + e % 2 of a 16 x 8 accumulator. Elements are
// float; loads from threadgroup memory of any element type widen them.
// Simdgroup matrices need an Apple7 GPU (A14, M1) or later: the routes keep the matrix kernels off older ones.
#define THREADGROUP_PTR threadgroup
#define MMA_INPUT(T) float
// qmm, gemm: 16-bit inputs are widened into float tiles first (the CUDA prelude's loads from each
// lane's row address, `load_tile_a_at` and `load_tile_b2_at`, serve MMA_DIRECT only).
#define MMA_DIRECT 0
// The CUDA prelude's asynchronous copies into threadgroup memory, as plain copies (done when the
// call returns; async_commit and async_wait do nothing). `present` false writes zeros.
INLINE void async_copy16(threadgroup void* to, const device void* from, bool present) {
  *(threadgroup uint4*)to = present ? *(const device uint4*)from : uint4{0u, 0u, 0u, 0u};
}
INLINE void async_copy8(threadgroup void* to, const device void* from, bool present) {
  *(threadgroup uint2*)to = present ? *(const device uint2*)from : uint2{0u, 0u};
}
INLINE void async_copy4(threadgroup void* to, const device void* from, bool present) {
  *(threadgroup uint*)to = present ? *(const device uint*)from : 0u;
}
#define async_commit()
#define async_wait(n)
#define simd_barrier() simdgroup_barrier(mem_flags::mem_threadgroup)
INLINE int frag_row(int lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
INLINE int frag_col(int lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }
#define ROW_PEER_A 1
#define ROW_PEER_B 8
// A 16 x 8 accumulator: the 8 x 8 matrices of rows 0-7 (v[0], v[1]) and 8-15 (v[2], v[3]).
struct TileAcc { float v[4]; };
// A 16 x 16 A: rows 0-7 at k 0-7 (v[0], v[1]), rows 8-15 at k 0-7 (v[2], v[3]), rows 0-7 at
// k 8-15 (v[4], v[5]), rows 8-15 at k 8-15 (v[6], v[7]); a 16 x 8 B: k 0-7 (v[0], v[1]), k 8-15.
template <typename T> struct TileA { float v[8]; };
template <typename T> struct TileB { float v[4]; };
INLINE void tile_zero(thread TileAcc& acc) { acc.v[0] = acc.v[1] = acc.v[2] = acc.v[3] = 0.0f; }
// A's fragments of a 16 x 16 tile (row-major at `a`, row stride lda) and B's of a 16 x 8 tile given
// as its transpose (8 rows of 16 at `b`, row stride ldb), from threadgroup memory.
template <typename U, typename T> INLINE void load_tile_a(thread TileA<T>& tile, const threadgroup U* a, int lda, int lane) {
  const int r = frag_row(lane), c = frag_col(lane);
  for (int part = 0; part < 4; part++) {
    const threadgroup U* at = a + (r + 8 * (part % 2)) * lda + c + 8 * (part / 2);
    tile.v[2 * part] = float(at[0]);
    tile.v[2 * part + 1] = float(at[1]);
  }
}
template <typename U, typename T> INLINE void load_tile_b(thread TileB<T>& tile, const threadgroup U* b, int ldb, int lane) {
  const int k = frag_row(lane), n = frag_col(lane);
  for (int part = 0; part < 2; part++) {
    tile.v[2 * part] = float(b[n * ldb + k + 8 * part]);
    tile.v[2 * part + 1] = float(b[(n + 1) * ldb + k + 8 * part]);
  }
}
template <typename U, typename T> INLINE void load_tile_b2(thread TileB<T>& b0, thread TileB<T>& b1, const threadgroup U* b, int ldb, int lane) {
  load_tile_b(b0, b, ldb, lane);
  load_tile_b(b1, b + 8 * ldb, ldb, lane);
}
// B's fragments from B itself: 16 rows (k) of 8 columns (n) at `b`; two such tiles side by side.
template <typename U, typename T> INLINE void load_tile_b_rows(thread TileB<T>& tile, const threadgroup U* b, int ldb, int lane) {
  const int k = frag_row(lane), n = frag_col(lane);
  for (int part = 0; part < 2; part++) {
    tile.v[2 * part] = float(b[(k + 8 * part) * ldb + n]);
    tile.v[2 * part + 1] = float(b[(k + 8 * part) * ldb + n + 1]);
  }
}
template <typename U, typename T> INLINE void load_tile_b2_rows(thread TileB<T>& b0, thread TileB<T>& b1, const threadgroup U* b, int ldb, int lane) {
  load_tile_b_rows(b0, b, ldb, lane);
  load_tile_b_rows(b1, b + 8, ldb, lane);
}
INLINE simdgroup_float8x8 frag_matrix(float first, float second) {
  simdgroup_float8x8 m;
  m.thread_elements()[0] = first;
  m.thread_elements()[1] = second;
  return m;
}
// acc += A · B.
template <typename T> INLINE void tile_mma(thread TileAcc& acc, const thread TileA<T>& a, const thread TileB<T>& b) {
  const simdgroup_float8x8 b0 = frag_matrix(b.v[0], b.v[1]), b1 = frag_matrix(b.v[2], b.v[3]);
  simdgroup_float8x8 top = frag_matrix(acc.v[0], acc.v[1]), bottom = frag_matrix(acc.v[2], acc.v[3]);
  simdgroup_multiply_accumulate(top, frag_matrix(a.v[0], a.v[1]), b0, top);
  simdgroup_multiply_accumulate(top, frag_matrix(a.v[4], a.v[5]), b1, top);
  simdgroup_multiply_accumulate(bottom, frag_matrix(a.v[2], a.v[3]), b0, bottom);
  simdgroup_multiply_accumulate(bottom, frag_matrix(a.v[6], a.v[7]), b1, bottom);
  acc.v[0] = top.thread_elements()[0];
  acc.v[1] = top.thread_elements()[1];
  acc.v[2] = bottom.thread_elements()[0];
  acc.v[3] = bottom.thread_elements()[1];
}
// A's fragment of the 16 x 16 tile whose columns 0-7 are accumulator `left` and 8-15 `right`.
template <typename T> INLINE void tile_a_from_acc(thread TileA<T>& tile, const thread TileAcc& left, const thread TileAcc& right) {
  for (int e = 0; e < 4; e++) {
    tile.v[e] = left.v[e];
    tile.v[4 + e] = right.v[e];
  }
}
// A float into a tile element.
INLINE void to_tile(float value, threadgroup float* at) { *at = value; }
INLINE void to_tile2(float low, float high, threadgroup float* at) { at[0] = low; at[1] = high; }
// Two floats rounded into consecutive elements of device memory.
template <typename T> INLINE void store_pair(float low, float high, device T* at) {
  at[0] = T(low);
  at[1] = T(high);
}
// The accumulator into 16 x 8 floats of threadgroup memory at `out` (row stride ld).
INLINE void tile_store(const thread TileAcc& acc, threadgroup float* out, int ld, int lane) {
  const int r = frag_row(lane), c = frag_col(lane);
  out[r * ld + c] = acc.v[0];
  out[r * ld + c + 1] = acc.v[1];
  out[(r + 8) * ld + c] = acc.v[2];
  out[(r + 8) * ld + c + 1] = acc.v[3];
}
