// nuvec_tg's kernel dialect on the CPU, for running the CUDA rendering of a kernel in tests: a
// threadgroup's threads are OS threads, SIMD-group operations and barriers are std::barriers, and
// simd_sum adds in the CUDA prelude's butterfly order (so results have the CUDA build's bits).
// Threadgroup arrays are statics: threadgroups run one at a time.
#include <barrier>
#include <cstring>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef _Float16 half;
typedef __bf16 bfloat;
struct uint2 { uint x, y; };
struct uint3 { uint x, y, z; };
struct uint4 { uint x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
#define DEVICE
#define THREAD
#define CONSTANT
#define THREADGROUP static
#define INLINE inline
#define __global__
#define __restrict__ __restrict
#define INFINITY __builtin_inff()

thread_local uint3 blockIdx, threadIdx;
struct Block {
  std::barrier<>* all;
  std::barrier<>* warps[32];
  float lanes[1024];
};
thread_local Block* block_sync;

inline void threadgroup_barrier() { block_sync->all->arrive_and_wait(); }
inline float simd_shuffle_xor(float x, int mask) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  block_sync->lanes[threadIdx.x] = x;
  block_sync->warps[warp]->arrive_and_wait();
  const float other = block_sync->lanes[warp * 32 + (lane ^ mask)];
  block_sync->warps[warp]->arrive_and_wait();
  return other;
}
inline float simd_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += simd_shuffle_xor(x, offset);
  return x;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float exp2(float x) { return __builtin_exp2f(x); }
inline float to_float(float x) { return x; }
inline float to_float(half x) { return (float)x; }
inline float to_float(bfloat x) {
  ushort top;
  std::memcpy(&top, &x, 2);
  const uint bits = (uint)top << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float to_float(uchar x) { return (float)x; }
inline void from_float(float x, float* out) { *out = x; }
inline void from_float(float x, half* out) { *out = (half)x; }
inline void from_float(float x, bfloat* out) {  // round to nearest even, as __float2bfloat16_rn
  uint bits;
  std::memcpy(&bits, &x, 4);
  bits = (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits + 0x7FFFu + ((bits >> 16) & 1u);
  const ushort top = (ushort)(bits >> 16);
  std::memcpy(out, &top, 2);
}
inline float bits_to_float(uint bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline uint mask_or(uint a, uint mask, uint bits) { return (a & mask) | bits; }
inline float2 half2_bits_to_float2(uint bits) {
  half h[2];
  std::memcpy(h, &bits, 4);
  return float2{(float)h[0], (float)h[1]};
}
