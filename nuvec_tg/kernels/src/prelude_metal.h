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
INLINE void from_float(float x, device float* out) { *out = x; }
INLINE void from_float(float x, device half* out) { *out = half(x); }
INLINE float round_half(float x) { return float(half(x)); }
#ifdef NUVEC_BFLOAT
INLINE float to_float(bfloat x) { return float(x); }
INLINE void from_float(float x, device bfloat* out) { *out = bfloat(x); }
INLINE float round_bfloat(float x) { return float(bfloat(x)); }
#endif

// Matrix tiles in threadgroup memory (qmm.h, gemm.h), on simdgroup matrices: the CUDA prelude's
// vocabulary. Tiles hold floats here (simdgroup_float8x8).
// Simdgroup matrices need an Apple7 GPU (A14, M1) or later: the routes keep qmm and gemm off older ones.
#define THREADGROUP_PTR threadgroup
#define MMA_INPUT(T) float
// 16-bit inputs are widened into float tiles first; the CUDA prelude's loads from each lane's row
// address and its accumulator pairs (`load_tile_a_rows`, `tile_pair_value`) serve MMA_DIRECT only.
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
struct TileAcc { simdgroup_float8x8 m[2]; };
INLINE void tile_zero(thread TileAcc& acc) {
  acc.m[0] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  acc.m[1] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
}
// A SIMD group's fragments of a 16 x 16 tile A (row-major at `a`, row stride lda) and of a 16 x 8
// tile B given as its transpose (8 rows of 16 at `b`, row stride ldb), from threadgroup memory;
// tile_mma: acc += A · B.
template <typename T> struct TileA { simdgroup_float8x8 m[4]; };
template <typename T> struct TileB { simdgroup_float8x8 m[2]; };
INLINE void load_tile_a(thread TileA<float>& tile, const threadgroup float* a, int lda, int lane) {
  simdgroup_load(tile.m[0], a, lda);
  simdgroup_load(tile.m[1], a + 8, lda);
  simdgroup_load(tile.m[2], a + 8 * lda, lda);
  simdgroup_load(tile.m[3], a + 8 * lda + 8, lda);
}
INLINE void load_tile_b(thread TileB<float>& tile, const threadgroup float* b, int ldb, int lane) {
  simdgroup_load(tile.m[0], b, ldb, ulong2(0, 0), true);
  simdgroup_load(tile.m[1], b + 8, ldb, ulong2(0, 0), true);
}
INLINE void tile_mma(thread TileAcc& acc, const thread TileA<float>& a, const thread TileB<float>& b) {
  simdgroup_multiply_accumulate(acc.m[0], a.m[0], b.m[0], acc.m[0]);
  simdgroup_multiply_accumulate(acc.m[0], a.m[1], b.m[1], acc.m[0]);
  simdgroup_multiply_accumulate(acc.m[1], a.m[2], b.m[0], acc.m[1]);
  simdgroup_multiply_accumulate(acc.m[1], a.m[3], b.m[1], acc.m[1]);
}
// A float into a tile element.
INLINE void to_tile(float value, threadgroup float* at) { *at = value; }
INLINE void to_tile2(float low, float high, threadgroup float* at) { at[0] = low; at[1] = high; }
// The accumulator into 16 x 8 floats of threadgroup memory at `out` (row stride ld).
INLINE void tile_store(const thread TileAcc& acc, threadgroup float* out, int ld, int lane) {
  simdgroup_store(acc.m[0], out, ld);
  simdgroup_store(acc.m[1], out + 8 * ld, ld);
}
