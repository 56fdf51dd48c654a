// CUDA's cuda_fp16.h as far as nuvec_tg's kernels reach (tests/cuda_shim/nvrtc_builtins.h says why):
// __half with CUDA's constructors and conversions (from and to float, double and the integers;
// arithmetic and comparisons between halves), __half2 (and __hmul2), and the conversion functions.
#pragma once
struct __half_raw { unsigned short x; };
struct __align__(2) __half {
  unsigned short __x;
  __half() = default;
  __host__ __device__ constexpr __half(const __half_raw& raw) : __x(raw.x) {}
  __device__ __half(const float f) : __x(__builtin_bit_cast(unsigned short, (_Float16)f)) {}
  __device__ __half(const double f) : __x(__builtin_bit_cast(unsigned short, (_Float16)f)) {}
  __device__ __half(const short v) : __half((float)v) {}
  __device__ __half(const unsigned short v) : __half((float)v) {}
  __device__ __half(const int v) : __half((float)v) {}
  __device__ __half(const unsigned int v) : __half((float)v) {}
  __device__ __half(const long long v) : __half((float)v) {}
  __device__ __half(const unsigned long long v) : __half((float)v) {}
  __device__ operator float() const { return (float)__builtin_bit_cast(_Float16, __x); }
  __device__ operator short() const { return (short)(float)*this; }
  __device__ operator unsigned short() const { return (unsigned short)(float)*this; }
  __device__ operator int() const { return (int)(float)*this; }
  __device__ operator unsigned int() const { return (unsigned int)(float)*this; }
  __device__ operator long long() const { return (long long)(float)*this; }
  __device__ operator unsigned long long() const { return (unsigned long long)(float)*this; }
  __device__ operator bool() const { return (__x & 0x7fffu) != 0; }
  __host__ __device__ operator __half_raw() const { return {__x}; }
  __device__ __half& operator=(const float f) { return *this = __half(f); }
  __device__ __half& operator=(const double f) { return *this = __half(f); }
};
struct __align__(4) __half2 {
  __half x, y;
  __half2() = default;
  __host__ __device__ constexpr __half2(const __half& a, const __half& b) : x(a), y(b) {}
};
typedef __half half;
typedef __half2 half2;
#define __SHIM_HALF_ARITHMETIC(T)                                                                    \
  __device__ __forceinline__ T operator+(const T& a, const T& b) { return T((float)a + (float)b); }  \
  __device__ __forceinline__ T operator-(const T& a, const T& b) { return T((float)a - (float)b); }  \
  __device__ __forceinline__ T operator*(const T& a, const T& b) { return T((float)a * (float)b); }  \
  __device__ __forceinline__ T operator/(const T& a, const T& b) { return T((float)a / (float)b); }  \
  __device__ __forceinline__ T operator-(const T& a) { return T(-(float)a); }                        \
  __device__ __forceinline__ T& operator+=(T& a, const T& b) { return a = a + b; }                   \
  __device__ __forceinline__ T& operator-=(T& a, const T& b) { return a = a - b; }                   \
  __device__ __forceinline__ T& operator*=(T& a, const T& b) { return a = a * b; }                   \
  __device__ __forceinline__ T& operator/=(T& a, const T& b) { return a = a / b; }                   \
  __device__ __forceinline__ bool operator==(const T& a, const T& b) { return (float)a == (float)b; } \
  __device__ __forceinline__ bool operator!=(const T& a, const T& b) { return (float)a != (float)b; } \
  __device__ __forceinline__ bool operator<(const T& a, const T& b) { return (float)a < (float)b; }   \
  __device__ __forceinline__ bool operator>(const T& a, const T& b) { return (float)a > (float)b; }   \
  __device__ __forceinline__ bool operator<=(const T& a, const T& b) { return (float)a <= (float)b; } \
  __device__ __forceinline__ bool operator>=(const T& a, const T& b) { return (float)a >= (float)b; }
__SHIM_HALF_ARITHMETIC(__half)

__SHIM_FN float __half2float(const __half h) { return (float)h; }
__SHIM_FN __half __float2half(const float f) { return __half(f); }
__SHIM_FN __half __float2half_rn(const float f) { return __half(f); }
__SHIM_FN __half __ushort_as_half(const unsigned short bits) { return __half_raw{bits}; }
__SHIM_FN unsigned short __half_as_ushort(const __half h) { return h.__x; }
__SHIM_FN __half2 __floats2half2_rn(const float a, const float b) { return __half2(__half(a), __half(b)); }
__SHIM_FN __half2 __float2half2_rn(const float a) { return __half2(__half(a), __half(a)); }
__SHIM_FN float2 __half22float2(const __half2 h) { return make_float2((float)h.x, (float)h.y); }
__SHIM_FN __half2 __hmul2(const __half2 a, const __half2 b) { return __half2(a.x * b.x, a.y * b.y); }
__SHIM_FN float __low2float(const __half2 h) { return (float)h.x; }
__SHIM_FN float __high2float(const __half2 h) { return (float)h.y; }
