// CUDA's cuda_bf16.h as far as nuvec_tg's kernels reach (tests/cuda_shim/nvrtc_builtins.h says why):
// __nv_bfloat16 with CUDA's constructors and conversions, __nv_bfloat162, the conversion functions.
#pragma once
#include "cuda_fp16.h"
struct __nv_bfloat16_raw { unsigned short x; };
struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __host__ __device__ constexpr __nv_bfloat16(const __nv_bfloat16_raw& raw) : __x(raw.x) {}
  __device__ __nv_bfloat16(const float f) : __x(__builtin_bit_cast(unsigned short, (__bf16)f)) {}
  __device__ __nv_bfloat16(const double f) : __x(__builtin_bit_cast(unsigned short, (__bf16)f)) {}
  __device__ explicit __nv_bfloat16(const __half h) : __nv_bfloat16((float)h) {}
  __device__ __nv_bfloat16(const short v) : __nv_bfloat16((float)v) {}
  __device__ __nv_bfloat16(const unsigned short v) : __nv_bfloat16((float)v) {}
  __device__ __nv_bfloat16(const int v) : __nv_bfloat16((float)v) {}
  __device__ __nv_bfloat16(const unsigned int v) : __nv_bfloat16((float)v) {}
  __device__ __nv_bfloat16(const long long v) : __nv_bfloat16((float)v) {}
  __device__ __nv_bfloat16(const unsigned long long v) : __nv_bfloat16((float)v) {}
  __device__ operator float() const { return (float)__builtin_bit_cast(__bf16, __x); }
  __device__ operator short() const { return (short)(float)*this; }
  __device__ operator unsigned short() const { return (unsigned short)(float)*this; }
  __device__ operator int() const { return (int)(float)*this; }
  __device__ operator unsigned int() const { return (unsigned int)(float)*this; }
  __device__ operator long long() const { return (long long)(float)*this; }
  __device__ operator unsigned long long() const { return (unsigned long long)(float)*this; }
  __device__ operator bool() const { return (__x & 0x7fffu) != 0; }
  __host__ __device__ operator __nv_bfloat16_raw() const { return {__x}; }
  __device__ __nv_bfloat16& operator=(const float f) { return *this = __nv_bfloat16(f); }
  __device__ __nv_bfloat16& operator=(const double f) { return *this = __nv_bfloat16(f); }
};
struct __align__(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  __host__ __device__ constexpr __nv_bfloat162(const __nv_bfloat16& a, const __nv_bfloat16& b) : x(a), y(b) {}
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
__SHIM_HALF_ARITHMETIC(__nv_bfloat16)

__SHIM_FN float __bfloat162float(const __nv_bfloat16 b) { return (float)b; }
__SHIM_FN __nv_bfloat16 __float2bfloat16(const float f) { return __nv_bfloat16(f); }
__SHIM_FN __nv_bfloat16 __float2bfloat16_rn(const float f) { return __nv_bfloat16(f); }
__SHIM_FN __nv_bfloat16 __ushort_as_bfloat16(const unsigned short bits) { return __nv_bfloat16_raw{bits}; }
__SHIM_FN unsigned short __bfloat16_as_ushort(const __nv_bfloat16 b) { return b.__x; }
__SHIM_FN __nv_bfloat162 __floats2bfloat162_rn(const float a, const float b) {
  return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b));
}
__SHIM_FN float2 __bfloat1622float2(const __nv_bfloat162 b) { return make_float2((float)b.x, (float)b.y); }
