// The CUDA side of nuvec_tg's kernel dialect: Metal's vocabulary on NVIDIA GPUs.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __nv_bfloat16 bfloat;
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
#define DEVICE
#define THREAD
#define CONSTANT
#define THREADGROUP __shared__
#define INLINE __device__ __forceinline__
#define threadgroup_barrier() __syncthreads()
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

INLINE float simd_shuffle_xor(float x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
INLINE float simd_shuffle(float x, int lane) { return __shfl_sync(0xffffffffu, x, lane); }
INLINE bool simd_any(bool x) { return __any_sync(0xffffffffu, x); }
INLINE float simd_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
INLINE float simd_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
// 2^x to about 2 ulp, denormal results flushed to zero (softmax weights: plenty).
INLINE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
INLINE float to_float(float x) { return x; }
INLINE float to_float(half x) { return __half2float(x); }
INLINE float to_float(bfloat x) { return __bfloat162float(x); }
INLINE float to_float(unsigned char x) { return (float)x; }
INLINE float bits_to_float(uint bits) { return __uint_as_float(bits); }
INLINE uint mask_or(uint a, uint mask, uint bits) {  // (a & mask) | bits in one LOP3 (nvcc splits it in two)
  uint out;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(out) : "r"(a), "r"(mask), "r"(bits));
  return out;
}
INLINE float2 half2_bits_to_float2(uint bits) {  // the two halves of a word (low first), widened
  return make_float2(__half2float(__ushort_as_half((ushort)(bits & 0xFFFFu))), __half2float(__ushort_as_half((ushort)(bits >> 16))));
}
INLINE void from_float(float x, float* out) { *out = x; }
INLINE void from_float(float x, half* out) { *out = __float2half_rn(x); }
INLINE void from_float(float x, bfloat* out) { *out = __float2bfloat16_rn(x); }
INLINE float round_half(float x) { return __half2float(__float2half_rn(x)); }
INLINE float round_bfloat(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
