// What nvrtc gives a CUDA program without an #include, for clang's CUDA device compilation without
// the CUDA SDK (`-nocudainc -nocudalib`; tests/test_cuda_check.py force-includes this file): the
// execution-space keywords, the built-in variables and vector types, and the device functions and
// overloads that nuvec_tg's kernels call, declared with CUDA's signatures so that a call nvrtc would
// reject (a missing overload, an ambiguous one) fails here too. Bodies are clang's NVPTX builtins or
// the PTX instruction CUDA's own implementation uses; what they compute is not under test.
#pragma once
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
// clang 19 has no cluster_dims attribute: the dimensions are not checked here (nvrtc's build, tools/compile_cuda.py, does).
#define __cluster_dims__(x, y, z)
#define __SHIM_FN static __device__ __forceinline__

typedef unsigned long size_t;

// Vector types (CUDA's vector_types.h: members and alignment).
struct __align__(2) uchar2 { unsigned char x, y; };
struct __align__(4) uchar4 { unsigned char x, y, z, w; };
struct __align__(4) ushort2 { unsigned short x, y; };
struct __align__(8) int2 { int x, y; };
struct __align__(8) uint2 { unsigned int x, y; };
struct uint3 { unsigned int x, y, z; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct dim3 {
  unsigned int x, y, z;
  __host__ __device__ constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  __host__ __device__ constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
__SHIM_FN int2 make_int2(int x, int y) { return {x, y}; }
__SHIM_FN uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
__SHIM_FN uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return {x, y, z}; }
__SHIM_FN int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
__SHIM_FN uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
__SHIM_FN float2 make_float2(float x, float y) { return {x, y}; }
__SHIM_FN float3 make_float3(float x, float y, float z) { return {x, y, z}; }
__SHIM_FN float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// threadIdx, blockIdx, blockDim, gridDim: clang's own declarations (read-only, as in CUDA).
#include "__clang_cuda_builtin_vars.h"
#define __SHIM_BUILTIN_VAR(type)                                                                     \
  __device__ inline type::operator uint3() const { return {x, y, z}; }                              \
  __device__ inline type::operator dim3() const { return dim3(x, y, z); }
__SHIM_BUILTIN_VAR(__cuda_builtin_threadIdx_t)
__SHIM_BUILTIN_VAR(__cuda_builtin_blockIdx_t)
__SHIM_BUILTIN_VAR(__cuda_builtin_blockDim_t)
__SHIM_BUILTIN_VAR(__cuda_builtin_gridDim_t)
#undef __SHIM_BUILTIN_VAR

// Synchronisation, warp shuffles and votes (CUDA's T of the shuffles: int, unsigned, float here).
__SHIM_FN void __syncwarp(unsigned mask = 0xffffffffu) { __nvvm_bar_warp_sync(mask); }
__SHIM_FN void __threadfence() { __nvvm_membar_gl(); }
__SHIM_FN void __threadfence_block() { __nvvm_membar_cta(); }
__SHIM_FN int __any_sync(unsigned mask, int predicate) { return __nvvm_vote_any_sync(mask, predicate); }
__SHIM_FN int __all_sync(unsigned mask, int predicate) { return __nvvm_vote_all_sync(mask, predicate); }
__SHIM_FN unsigned __ballot_sync(unsigned mask, int predicate) { return __nvvm_vote_ballot_sync(mask, predicate); }
#define __SHIM_SHUFFLES(T, SUFFIX)                                                                   \
  __SHIM_FN T __shfl_sync(unsigned mask, T var, int lane, int width = warpSize) {                    \
    return __nvvm_shfl_sync_idx_##SUFFIX(mask, var, lane, ((warpSize - width) << 8) | 0x1f);          \
  }                                                                                                  \
  __SHIM_FN T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {           \
    return __nvvm_shfl_sync_bfly_##SUFFIX(mask, var, lane_mask, ((warpSize - width) << 8) | 0x1f);    \
  }                                                                                                  \
  __SHIM_FN T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {         \
    return __nvvm_shfl_sync_down_##SUFFIX(mask, var, delta, ((warpSize - width) << 8) | 0x1f);        \
  }                                                                                                  \
  __SHIM_FN T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {           \
    return __nvvm_shfl_sync_up_##SUFFIX(mask, var, delta, (warpSize - width) << 8);                   \
  }
__SHIM_SHUFFLES(int, i32)
__SHIM_SHUFFLES(float, f32)
#undef __SHIM_SHUFFLES
#define __SHIM_UNSIGNED_SHUFFLE(NAME, LANE)                                                          \
  __SHIM_FN unsigned NAME(unsigned mask, unsigned var, LANE lane, int width = warpSize) {             \
    return (unsigned)NAME(mask, (int)var, lane, width);                                              \
  }
__SHIM_UNSIGNED_SHUFFLE(__shfl_sync, int)
__SHIM_UNSIGNED_SHUFFLE(__shfl_xor_sync, int)
__SHIM_UNSIGNED_SHUFFLE(__shfl_down_sync, unsigned)
__SHIM_UNSIGNED_SHUFFLE(__shfl_up_sync, unsigned)
#undef __SHIM_UNSIGNED_SHUFFLE

// Bits and addresses.
__SHIM_FN float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
__SHIM_FN float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
__SHIM_FN int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
__SHIM_FN unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
__SHIM_FN unsigned __byte_perm(unsigned x, unsigned y, unsigned s) { return __nvvm_prmt(x, y, s); }
__SHIM_FN size_t __cvta_generic_to_shared(const void* at) {
  size_t out;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(out) : "l"(at));
  return out;
}

// Math: the overloads of CUDA's math_functions.hpp for min and max (so that a mixed call resolves,
// or is ambiguous, as under nvrtc), and the float and double forms of what the kernels call.
#define __SHIM_MIN_MAX(R, A, B)                                                                      \
  __SHIM_FN R min(const A a, const B b) { return (R)a < (R)b ? (R)a : (R)b; }                         \
  __SHIM_FN R max(const A a, const B b) { return (R)a > (R)b ? (R)a : (R)b; }
__SHIM_MIN_MAX(int, int, int)
__SHIM_MIN_MAX(unsigned int, unsigned int, unsigned int)
__SHIM_MIN_MAX(unsigned int, int, unsigned int)
__SHIM_MIN_MAX(unsigned int, unsigned int, int)
__SHIM_MIN_MAX(long int, long int, long int)
__SHIM_MIN_MAX(unsigned long int, unsigned long int, unsigned long int)
__SHIM_MIN_MAX(unsigned long int, long int, unsigned long int)
__SHIM_MIN_MAX(unsigned long int, unsigned long int, long int)
__SHIM_MIN_MAX(long long int, long long int, long long int)
__SHIM_MIN_MAX(unsigned long long int, unsigned long long int, unsigned long long int)
__SHIM_MIN_MAX(unsigned long long int, long long int, unsigned long long int)
__SHIM_MIN_MAX(unsigned long long int, unsigned long long int, long long int)
__SHIM_MIN_MAX(float, float, float)
__SHIM_MIN_MAX(double, double, double)
__SHIM_MIN_MAX(double, float, double)
__SHIM_MIN_MAX(double, double, float)
#undef __SHIM_MIN_MAX
__SHIM_FN float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
__SHIM_FN float fminf(float a, float b) { return __builtin_fminf(a, b); }
__SHIM_FN float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
__SHIM_FN float fabsf(float x) { return __builtin_fabsf(x); }
__SHIM_FN float exp2f(float x) { float y; asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__SHIM_FN float log2f(float x) { float y; asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__SHIM_FN float sqrtf(float x) { return __builtin_sqrtf(x); }
// (the approximate instructions stand in for CUDA's library sincosf, which has no PTX of its own here)
__SHIM_FN void sincosf(float x, float* s, float* c) {
  asm("sin.approx.f32 %0, %1;" : "=f"(*s) : "f"(x));
  asm("cos.approx.f32 %0, %1;" : "=f"(*c) : "f"(x));
}
__SHIM_FN float rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
__SHIM_FN float fmax(float a, float b) { return fmaxf(a, b); }
__SHIM_FN float fmin(float a, float b) { return fminf(a, b); }
__SHIM_FN float fma(float a, float b, float c) { return fmaf(a, b, c); }
__SHIM_FN float fabs(float x) { return fabsf(x); }
__SHIM_FN float exp2(float x) { return exp2f(x); }
__SHIM_FN float log2(float x) { return log2f(x); }
__SHIM_FN float sqrt(float x) { return sqrtf(x); }
__SHIM_FN double fmax(double a, double b) { return __builtin_fmax(a, b); }
__SHIM_FN double fmin(double a, double b) { return __builtin_fmin(a, b); }
__SHIM_FN double fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
__SHIM_FN double fabs(double x) { return __builtin_fabs(x); }
__SHIM_FN double exp2(double x) { return exp2f((float)x); }
__SHIM_FN double log2(double x) { return log2f((float)x); }
__SHIM_FN double sqrt(double x) { return __builtin_sqrt(x); }
