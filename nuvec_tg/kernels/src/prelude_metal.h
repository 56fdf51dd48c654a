// The Metal side of nuvec_tg's kernel dialect.
#include <metal_stdlib>
using namespace metal;
#define DEVICE device
#define THREAD thread
#define CONSTANT constant
#define THREADGROUP threadgroup
#define INLINE inline
#define threadgroup_barrier() threadgroup_barrier(mem_flags::mem_threadgroup)

INLINE float fast_exp2(float x) { return fast::exp2(x); }
INLINE float to_float(float x) { return x; }
INLINE float to_float(half x) { return float(x); }
INLINE float to_float(bfloat x) { return float(x); }
INLINE float to_float(uchar x) { return float(x); }
INLINE float bits_to_float(uint bits) { return as_type<float>(bits); }
INLINE uint mask_or(uint a, uint mask, uint bits) { return (a & mask) | bits; }
INLINE float2 half2_bits_to_float2(uint bits) { return float2(as_type<half2>(bits)); }  // low half first
INLINE void from_float(float x, device float* out) { *out = x; }
INLINE void from_float(float x, device half* out) { *out = half(x); }
INLINE void from_float(float x, device bfloat* out) { *out = bfloat(x); }
INLINE float round_half(float x) { return float(half(x)); }
INLINE float round_bfloat(float x) { return float(bfloat(x)); }
