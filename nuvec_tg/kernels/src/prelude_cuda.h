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
// sin and cos of x to within 2 ulp at any x (sincosf, full precision: tinygrad's nvrtc does not pass
// --use_fast_math), in one call: sinf and cosf apart put their large-argument reduction in local memory.
INLINE void sin_cos(float x, float* s, float* c) { sincosf(x, s, c); }
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
// The two halves of a word times `factor`, widened: one half-precision multiply of both here, a
// float multiply elsewhere; the same values where the half products are exact (the callers'
// powers of two over small codes).
INLINE float2 half2_bits_times(uint bits, float factor) {
  return __half22float2(__hmul2(*(const __half2*)&bits, __float2half2_rn(factor)));
}
INLINE void from_float(float x, float* out) { *out = x; }
INLINE void from_float(float x, half* out) { *out = __float2half_rn(x); }
INLINE void from_float(float x, bfloat* out) { *out = __float2bfloat16_rn(x); }
// A value's bits in the low bits of a word, and back (the high bits ignored).
INLINE uint to_bits(float x) { return __float_as_uint(x); }
INLINE uint to_bits(half x) { return __half_as_ushort(x); }
INLINE uint to_bits(bfloat x) { return __bfloat16_as_ushort(x); }
INLINE uint to_bits(unsigned char x) { return x; }
INLINE void from_bits(uint bits, float* out) { *out = __uint_as_float(bits); }
INLINE void from_bits(uint bits, half* out) { *out = __ushort_as_half((ushort)bits); }
INLINE void from_bits(uint bits, bfloat* out) { *out = __ushort_as_bfloat16((ushort)bits); }
INLINE void from_bits(uint bits, unsigned char* out) { *out = (unsigned char)bits; }
INLINE float round_half(float x) { return __half2float(__float2half_rn(x)); }
INLINE float round_bfloat(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// The matrix units (sm_80 and later): D = A · B + C for a 16 x 16 A and a 16 x 8 B of 16-bit
// floats, float32 C, in the mma.sync m16n8k16 fragments (a lane 4g + c holds A's rows g, g + 8 at
// k 2c, 2c + 1, 2c + 8, 2c + 9 in a[0..3] as (g, k), (g + 8, k), (g, k + 8), (g + 8, k + 8); B's
// column g at k 2c, 2c + 1 (b0) and 2c + 8, 2c + 9 (b1); C's rows g, g + 8 at columns 2c, 2c + 1).
INLINE void mma_bf16(float* acc, const uint* a, uint b0, uint b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
INLINE void mma_f16(float* acc, const uint* a, uint b0, uint b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats rounded to the 16-bit type of the third argument, in one word (low first).
INLINE uint pack_pair(float lo, float hi, bfloat) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *(const uint*)&pair;
}
INLINE uint pack_pair(float lo, float hi, half) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *(const uint*)&pair;
}
// Staging barriers (CUDA-only kernels: Metal orders threadgroup memory between SIMD groups only at
// barriers): a hardware barrier object (`mbarrier`, sm_80+) in threadgroup memory that `threads`
// threads arrive at once per phase. `stage_arrive` releases the thread's earlier threadgroup-memory
// writes without waiting for anyone; `stage_wait(bar, parity)` returns once the phase of that parity
// has completed, its writes visible. Unlike a counter and a spin, compute-sanitizer's racecheck
// sees this ordering.
INLINE unsigned shared_address(const void* at) { return (unsigned)__cvta_generic_to_shared(at); }
INLINE void stage_barrier_init(unsigned long long* bar, int threads) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(shared_address(bar)), "r"(threads) : "memory");
}
INLINE void stage_arrive(unsigned long long* bar) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [%0]; }" :: "r"(shared_address(bar)) : "memory");
}
INLINE void stage_wait(unsigned long long* bar, int parity) {
  unsigned done;
  do {
#if __CUDA_ARCH__ >= 900  // try_wait: the hardware suspends the thread a while rather than it spinning
    asm volatile("{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [%1], %2; selp.u32 %0, 1, 0, done; }"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(parity) : "memory");
#else
    asm volatile("{ .reg .pred done; mbarrier.test_wait.parity.shared.b64 done, [%1], %2; selp.u32 %0, 1, 0, done; }"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(parity) : "memory");
#endif
  } while (!done);
  __syncwarp();  // the SIMD group converged again for the mma that follow
}
// Clusters (CUDA-only kernels launched with `__cluster_dims__`, sm_90): `cluster_barrier` waits for
// every thread of the cluster's threadgroups, each one's earlier threadgroup-memory writes then
// visible to all; `cluster_barrier_relaxed` waits for them without ordering any memory (so without
// waiting for this thread's stores to device memory): for a threadgroup not to leave while another
// reads its memory, where the reads' values were used before the barrier. `cluster_load4` reads
// the 16 bytes at `at` (16-byte aligned) of the threadgroup of rank `rank` in the cluster, where
// its array has the place this threadgroup's has here.
INLINE void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
INLINE void cluster_barrier_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
INLINE float4 cluster_load4(const float* at, int rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(at)), "r"(rank));
  float4 value;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(value.x), "=f"(value.y), "=f"(value.z), "=f"(value.w) : "r"(remote) : "memory");
  return value;
}
// A hint (CUDA-only kernels): start bringing `bytes` of device memory at `at` into L2, one 128-byte
// line per prefetch, with no register or threadgroup memory to hold them, so that a later load
// finds them there. The range lies inside one buffer. (The bulk prefetch, cp.async.bulk.prefetch,
// one instruction per range, was slower in the decode pass: benchmarks/attention_h200.md.)
INLINE void prefetch_l2(const void* at, int bytes) {
  for (int line = 0; line < bytes; line += 128) asm volatile("prefetch.global.L2 [%0];" :: "l"((const char*)at + line));
}
// a · b + c on two 16-bit values a word (low halves together, high together) of the type of the
// fourth argument, each rounded once (sm_80 and later).
INLINE uint fma_pairs(uint a, uint b, uint c, bfloat) {
  uint out;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
  return out;
}
INLINE uint fma_pairs(uint a, uint b, uint c, half) {
  uint out;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
  return out;
}
// Byte n of the result: byte (selector >> 4 n) & 7 of a (0-3) and b (4-7), n = 0..3 (PRMT).
INLINE uint byte_perm(uint a, uint b, uint selector) { return __byte_perm(a, b, selector); }
// The low (high) 16-bit halves of two words, a's in the low half.
INLINE uint low_halves(uint a, uint b) { return __byte_perm(a, b, 0x5410); }
INLINE uint high_halves(uint a, uint b) { return __byte_perm(a, b, 0x7632); }

// Matrix tiles in threadgroup memory, for the kernels that multiply them (qmm.h, gemm.h); Metal's prelude
// has the same vocabulary on simdgroup matrices. THREADGROUP_PTR qualifies a pointer into
// threadgroup memory; MMA_INPUT(T) is a tile's element type for activations of type T; a TileAcc
// is a 16 x 8 float32 accumulator of one SIMD group (here: the mma's C fragment).
#define THREADGROUP_PTR
#define MMA_INPUT(T) T
#define MMA_DIRECT 1  // the mma reads 16-bit inputs straight from threadgroup memory
// Copies of 4, 8 or 16 bytes from device into threadgroup memory, in flight until async_wait
// (cp.async, sm_80): async_commit closes a group of them, async_wait(n) returns once at most the
// n latest groups are still in flight (this thread's; a barrier then shows them to the others).
// `present` false writes zeros and reads nothing.
#define ASYNC_COPY(BYTES, CACHE)                                                                       \
  INLINE void async_copy##BYTES(void* to, const void* from, bool present) {                           \
    asm volatile("cp.async." CACHE ".shared.global [%0], [%1], " #BYTES ", %2;"                         \
                 :: "r"((unsigned)__cvta_generic_to_shared(to)), "l"(from), "r"(present ? BYTES : 0) : "memory"); \
  }
ASYNC_COPY(16, "cg")
ASYNC_COPY(8, "ca")
ASYNC_COPY(4, "ca")
INLINE void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define async_wait(n) asm volatile("cp.async.wait_group %0;" :: "n"(n) : "memory")
#define simd_barrier() __syncwarp()
struct TileAcc { float v[4]; };
INLINE void tile_zero(TileAcc& acc) { acc.v[0] = acc.v[1] = acc.v[2] = acc.v[3] = 0.0f; }
// A SIMD group's fragments of a 16 x 16 tile A (row-major at `a`, row stride lda) and of a 16 x 8
// tile B given as its transpose (8 rows of 16 at `b`, row stride ldb), loaded from threadgroup
// memory (ldmatrix: rows 16-byte aligned); tile_mma: acc += A · B.
template <typename T> struct TileA { uint r[4]; };
template <typename T> struct TileB { uint r[2]; };
template <typename T> INLINE void load_tile_a(TileA<T>& tile, const T* a, int lda, int lane) {
  // Lanes 0-15 give rows 0-15 at column 0, lanes 16-31 the same rows at column 8: the four 8 x 8
  // matrices land in the mma's A registers in order.
  const unsigned at = (unsigned)__cvta_generic_to_shared(a + (lane % 16) * lda + (lane / 16) * 8);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(tile.r[0]), "=r"(tile.r[1]), "=r"(tile.r[2]), "=r"(tile.r[3]) : "r"(at));
}
template <typename T> INLINE void load_tile_b(TileB<T>& tile, const T* b, int ldb, int lane) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(b + (lane % 8) * ldb + ((lane / 8) % 2) * 8);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(tile.r[0]), "=r"(tile.r[1]) : "r"(at));
}
// Two 16 x 8 tiles B at once (ldmatrix.x4): B0 from the 8 rows at `b`, B1 from the 8 after them.
template <typename T> INLINE void load_tile_b2(TileB<T>& b0, TileB<T>& b1, const T* b, int ldb, int lane) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(b + ((lane % 8) + 8 * (lane / 16)) * ldb + ((lane / 8) % 2) * 8);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(b0.r[0]), "=r"(b0.r[1]), "=r"(b1.r[0]), "=r"(b1.r[1]) : "r"(at));
}
// B's fragments from B itself rather than its transpose: 16 rows (k) of 8 columns (n) at `b`, row
// stride ldb (ldmatrix's transpose hands each lane B's column g at k 2c, 2c + 1 and 2c + 8, 2c + 9);
// load_tile_b2_rows: two such tiles side by side, B0 at columns 0-7 and B1 at 8-15.
template <typename T> INLINE void load_tile_b_rows(TileB<T>& tile, const T* b, int ldb, int lane) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(b + (lane % 16) * ldb);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(tile.r[0]), "=r"(tile.r[1]) : "r"(at));
}
template <typename T> INLINE void load_tile_b2_rows(TileB<T>& b0, TileB<T>& b1, const T* b, int ldb, int lane) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(b + (lane % 16) * ldb + (lane / 16) * 8);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(b0.r[0]), "=r"(b0.r[1]), "=r"(b1.r[0]), "=r"(b1.r[1]) : "r"(at));
}
// The same fragments where the tile's layout is not a row stride (swizzled stage buffers, gemm.h):
// each lane gives the address of the 16-byte row it supplies to ldmatrix. A (16 x 16): lanes 0-15
// rows 0-15 at column 0, lanes 16-31 the same rows at column 8. Two B tiles (16 rows of B's
// transpose, B0's 8 then B1's, 16 columns of k): lanes 0-7 rows 0-7 at column 0, lanes 8-15 the
// same rows at column 8, lanes 16-31 rows 8-15 likewise.
template <typename T> INLINE void load_tile_a_at(TileA<T>& tile, const T* row) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(tile.r[0]), "=r"(tile.r[1]), "=r"(tile.r[2]), "=r"(tile.r[3]) : "r"(at));
}
template <typename T> INLINE void load_tile_b2_at(TileB<T>& b0, TileB<T>& b1, const T* row) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(b0.r[0]), "=r"(b0.r[1]), "=r"(b1.r[0]), "=r"(b1.r[1]) : "r"(at));
}
INLINE void tile_mma(TileAcc& acc, const TileA<bfloat>& a, const TileB<bfloat>& b) { mma_bf16(acc.v, a.r, b.r[0], b.r[1]); }
INLINE void tile_mma(TileAcc& acc, const TileA<half>& a, const TileB<half>& b) { mma_f16(acc.v, a.r, b.r[0], b.r[1]); }
// A float into a tile element (rounded to nearest).
INLINE void to_tile(float value, bfloat* at) { *at = __float2bfloat16_rn(value); }
INLINE void to_tile(float value, half* at) { *at = __float2half_rn(value); }
// Two floats into consecutive tile elements (4-byte aligned), each rounded to nearest.
INLINE void to_tile2(float low, float high, bfloat* at) { *(__nv_bfloat162*)at = __floats2bfloat162_rn(low, high); }
INLINE void to_tile2(float low, float high, half* at) { *(__half2*)at = __floats2half2_rn(low, high); }
// A lane's elements of an accumulator (the kernels that read them: sdpa_prefill.h): acc.v[e] is
// row frag_row(lane) + 8 * (e / 2), column frag_col(lane) + e % 2 of the 16 x 8 tile; the four
// lanes holding one row are those `lane ^ ROW_PEER_A`, `lane ^ ROW_PEER_B` and both apart.
INLINE int frag_row(int lane) { return lane / 4; }
INLINE int frag_col(int lane) { return 2 * (lane % 4); }
#define ROW_PEER_A 1
#define ROW_PEER_B 2
// A's fragment of the 16 x 16 tile whose columns 0-7 are accumulator `left` and 8-15 `right`,
// rounded to T (the C fragments of mma are its A fragments' halves: no exchange between lanes).
template <typename T> INLINE void tile_a_from_acc(TileA<T>& tile, const TileAcc& left, const TileAcc& right) {
  tile.r[0] = pack_pair(left.v[0], left.v[1], T());
  tile.r[1] = pack_pair(left.v[2], left.v[3], T());
  tile.r[2] = pack_pair(right.v[0], right.v[1], T());
  tile.r[3] = pack_pair(right.v[2], right.v[3], T());
}
// Two floats rounded into consecutive elements of device memory (aligned to the pair), one store.
INLINE void store_pair(float low, float high, bfloat* at) { *(__nv_bfloat162*)at = __floats2bfloat162_rn(low, high); }
INLINE void store_pair(float low, float high, half* at) { *(__half2*)at = __floats2half2_rn(low, high); }
INLINE void store_pair(float low, float high, float* at) { *(float2*)at = make_float2(low, high); }
// The accumulator into 16 x 8 floats of threadgroup memory at `out` (row stride ld).
INLINE void tile_store(const TileAcc& acc, float* out, int ld, int lane) {
  const int g = lane / 4, c = lane % 4;
  out[g * ld + 2 * c] = acc.v[0];
  out[g * ld + 2 * c + 1] = acc.v[1];
  out[(g + 8) * ld + 2 * c] = acc.v[2];
  out[(g + 8) * ld + 2 * c + 1] = acc.v[3];
}

// Hopper's warpgroup matrix products (wgmma, sm_90a; the CUDA-only kernels that use them compile
// for sm_90a, `Program.arch`): a warpgroup of 4 consecutive SIMD groups (128 threads, starting at a
// thread index divisible by 128) multiplies a 64 x 16 tile of A by a 16 x N tile of B, both read by
// the tensor cores from threadgroup memory, into float32 accumulators spread over its registers.
// The tiles' layout ("K-major, 128-byte swizzle"): a tile's rows are 64 16-bit elements (128 bytes)
// of k, consecutive; the 16-byte piece p of row r sits at piece p ^ (r % 8) of that row; the tile
// starts at a multiple of 1024 bytes. `wgmma_tile(d, a, b, step)` adds A · Bᵀ for rows 0-63 of the
// tile at `a` and rows 0-N-1 of the tile at `b` (B given by its rows, as w is: [N, k]), at k
// 16 * step .. 16 * step + 15 (step 0-3). A thread's d[i] is the accumulator's row 16 * (SIMD group
// of the warpgroup) + lane / 4 + 8 * ((i % 4) / 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
// The product runs asynchronously: `wgmma_fence()` before the first product of a group (its
// accumulators are then the registers' values), `wgmma_commit()` closes a group, and
// `wgmma_wait<n>()` returns once at most the n latest groups are running (their tiles may then be
// overwritten and their accumulators read). Threadgroup memory that ordinary stores or cp.async
// copies wrote is visible to the tensor cores after `async_proxy_fence()` in each writing thread
// and a barrier after it.
INLINE unsigned long long wgmma_descriptor(const void* tile, int step) {
  // start address / 16 (bits 0-13: threadgroup addresses are below 2^18, and a tile's steps stay
  // inside it, so the step's add never carries out of them); leading byte offset 16 (unused for this
  // layout); 1024 bytes between groups of 8 rows; the 128-byte swizzle (bit 62). Each step of 16 k
  // is 32 bytes further into the rows: one 32-bit add a step onto the tile's descriptor.
  const unsigned low = ((shared_address(tile) >> 4) | (1u << 16)) + 2u * (unsigned)step;
  return (unsigned long long)low | (64ull << 32) | (1ull << 62);
}
INLINE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
INLINE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> INLINE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
INLINE void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// A warpgroup's registers a thread set to N (a multiple of 8, 24-256), released to the
// multiprocessor's pool or taken from it (warp-specialised kernels: the warpgroups that only copy
// and decode give theirs to those that hold the accumulators). The kernel's launch bound fixes the
// count at entry; ptxas compiles the code after each call within its N.
template <int N> INLINE void warpgroup_registers_fewer() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> INLINE void warpgroup_registers_more() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous products.
INLINE void wgmma_hold(float& d) { asm volatile("" : "+f"(d) :: "memory"); }
INLINE void wgmma_m64n64k16(float* d, unsigned long long a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n64k16(float* d, unsigned long long a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n128k16(float* d, unsigned long long a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n128k16(float* d, unsigned long long a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n256k16(float* d, unsigned long long a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n256k16(float* d, unsigned long long a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n224k16(float* d, unsigned long long a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111}, %112, %113, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
               : "l"(a), "l"(b));
}
INLINE void wgmma_m64n224k16(float* d, unsigned long long a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n224k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111}, %112, %113, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
               : "l"(a), "l"(b));
}
template <int N, typename T> INLINE void wgmma_tile(float* d, const T* a, const T* b, int step) {
  const unsigned long long da = wgmma_descriptor(a, step), db = wgmma_descriptor(b, step);
  if constexpr (N == 64) wgmma_m64n64k16(d, da, db, T());
  else if constexpr (N == 128) wgmma_m64n128k16(d, da, db, T());
  else if constexpr (N == 224) wgmma_m64n224k16(d, da, db, T());
  else {
    static_assert(N == 256, "wgmma_tile: N is 64, 128, 224 or 256");
    wgmma_m64n256k16(d, da, db, T());
  }
}
// The other form (sdpa_prefill_wgmma.h): A from registers, B "N-major" (given as its k rows, each
// of N elements: V's keys, each of DV values). A's registers are those of mma.sync's 16 x 16 A
// fragment for the SIMD group's 16 rows (a[0..3]: rows g, g + 8 at k 2c, 2c + 1, then at k 2c + 8,
// 2c + 9): an accumulator's 16 columns 16 j .. 16 j + 15 packed in pairs (d[8 j + 0..7]) are the A
// of a k step, no exchange between lanes. B is N / 64 blocks of 64 columns, `block_bytes` apart,
// each block its k rows of 128 bytes in the same 128-byte swizzle (piece p of row r at p ^ (r % 8),
// starting at a multiple of 1024 bytes): groups of 8 rows 1024 bytes apart (the descriptor's
// stride offset), blocks `block_bytes` apart (its leading offset, for this major-ness the step
// between 64-column blocks). `wgmma_tile_rs(d, a, b, block_bytes, step)` adds A · B for B's rows
// 16 * step .. 16 * step + 15 (2048 bytes a step).
INLINE unsigned long long wgmma_descriptor_rows(const void* tile, int step, int block_bytes) {
  const unsigned low = ((shared_address(tile) >> 4) | ((unsigned)(block_bytes & 0x3FFFF) >> 4 << 16)) + 128u * (unsigned)step;
  return (unsigned long long)low | (64ull << 32) | (1ull << 62);
}
// Narrow B (qmm_wgmma_rs.h's tiles of 16 or 32 rows of x, for few rows).
template <int TRANSPOSE_B> INLINE void wgmma_m64n16k16_rs(float* d, const uint* a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, %13;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n16k16_rs(float* d, const uint* a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, %13;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n32k16_rs(float* d, const uint* a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, %21;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n32k16_rs(float* d, const uint* a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, %21;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n64k16_rs(float* d, const uint* a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, %37;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n64k16_rs(float* d, const uint* a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, %37;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n128k16_rs(float* d, const uint* a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, %69;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n128k16_rs(float* d, const uint* a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, %69;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n256k16_rs(float* d, const uint* a, unsigned long long b, bfloat) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, 1, 1, 1, %133;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int TRANSPOSE_B> INLINE void wgmma_m64n256k16_rs(float* d, const uint* a, unsigned long long b, half) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, 1, 1, 1, %133;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B));
}
template <int N, typename T> INLINE void wgmma_tile_rs(float* d, const uint* a, const T* b, int block_bytes, int step) {
  const unsigned long long db = wgmma_descriptor_rows(b, step, block_bytes);
  if constexpr (N == 64) wgmma_m64n64k16_rs<1>(d, a, db, T());
  else if constexpr (N == 128) wgmma_m64n128k16_rs<1>(d, a, db, T());
  else wgmma_m64n256k16_rs<1>(d, a, db, T());
}
// A from registers, B given by its rows as in `wgmma_tile` (K-major, [N, k]: qmm_wgmma_rs.h's x
// tile): `wgmma_tile_rs_rows(d, a, b, step)` adds A · Bᵀ for B's k 16 * step .. 16 * step + 15.
template <int N, typename T> INLINE void wgmma_tile_rs_rows(float* d, const uint* a, const T* b, int step) {
  const unsigned long long db = wgmma_descriptor(b, step);
  if constexpr (N == 16) wgmma_m64n16k16_rs<0>(d, a, db, T());
  else if constexpr (N == 32) wgmma_m64n32k16_rs<0>(d, a, db, T());
  else if constexpr (N == 64) wgmma_m64n64k16_rs<0>(d, a, db, T());
  else if constexpr (N == 128) wgmma_m64n128k16_rs<0>(d, a, db, T());
  else {
    static_assert(N == 256, "wgmma_tile_rs_rows: N is 16, 32, 64, 128 or 256");
    wgmma_m64n256k16_rs<0>(d, a, db, T());
  }
}
// Keeps the compiler from moving writes of an A register past the products that read it.
INLINE void wgmma_hold(uint& a) { asm volatile("" : "+r"(a) :: "memory"); }
// Dynamic threadgroup memory (a CUDA launch's third size; more than the 48 KB a kernel declares
// statically): `bytes` as 16-byte words, named `name`.
#define DYNAMIC_THREADGROUP(name, bytes) extern __shared__ uint4 name[]
