// nuvec_tg's kernel dialect on the CPU, for running the CUDA rendering of a kernel in tests: a
// threadgroup's threads are fibers of one OS thread, switched where one waits (barriers, SIMD-group
// operations, staging barriers), and
// simd_sum adds in the CUDA prelude's butterfly order (so results have the CUDA build's bits).
// Threadgroup arrays are statics: threadgroups run one at a time (a cluster's together, each
// one's arrays swapped in while its threads run). What touches the emulator's own
// state (the launch, barriers, lane slots, the access checks) lives in `runner.cpp`, one library
// built once, which every kernel's library calls.
#include <cstring>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef _Float16 half;
typedef __bf16 bfloat;
#if defined(__clang__)
// Vectors, as CUDA's are to its compiler: a copy of one is one 8- or 16-byte load and store, which
// the access checks see (a struct's copy becomes a memcpy, which they do not).
typedef uint uint2 __attribute__((ext_vector_type(2)));
typedef uint uint4 __attribute__((ext_vector_type(4)));
#else
struct uint2 { uint x, y; };
struct uint4 { uint x, y, z, w; };
#endif
struct uint3 { uint x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
#define DEVICE
#define THREAD
#define CONSTANT
// Threadgroup arrays: statics in a section of their own, which the runner swaps for each
// threadgroup of a cluster running together (`run`).
#define THREADGROUP static __attribute__((section("nuvec_threadgroup")))
#define INLINE inline __attribute__((always_inline))  // as CUDA's __forceinline__: a helper's accesses are the kernel's
#define __global__ __attribute__((noinline))          // the kernel keeps its own frame, below the thread's stack top
#define __launch_bounds__(threads, groups)           // a register cap: nothing to the emulator
#define __cluster_dims__(x, y, z)                    // the launch's (`run`)
#define __restrict__ __restrict
#define INFINITY __builtin_inff()

// A thread's place in the grid, its threadgroup, and the top of the stack its kernel runs on.
struct EmulatedThread {
  uint3 block, thread;
  void* sync;
  const char* stack_top;
};
extern __thread EmulatedThread emulated;
#define blockIdx (emulated.block)
#define threadIdx (emulated.thread)

// The runner's: a read the emulator sees by address (an asynchronous copy, an L2 prefetch hint),
// checked against the launch's buffers; the threadgroup's and SIMD group's barriers and exchanges.
void check_read(const void* at, int bytes);
void threadgroup_barrier();
float simd_shuffle_xor(float x, int mask);
float simd_shuffle(float x, int source);
bool simd_any(bool x);
void mma_emulated(float* acc, const uint* a, uint b0, uint b1, bool bf16);
void simd_barrier();
void emulated_yield();  // the running thread waits: the next one that can runs
void cluster_barrier();  // every thread of the cluster's threadgroups (`run`)
inline void cluster_barrier_relaxed() { cluster_barrier(); }  // the emulator orders everything
float4 cluster_load4(const float* at, int rank);  // threadgroup `rank` of the cluster's 16 bytes at `at`

inline float simd_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += simd_shuffle_xor(x, offset);
  return x;
}
inline float simd_max(float x) {  // as CUDA's fmaxf: a NaN gives way to the other value
  for (int offset = 16; offset > 0; offset /= 2) x = __builtin_fmaxf(x, simd_shuffle_xor(x, offset));
  return x;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float exp2(float x) { return __builtin_exp2f(x); }
inline float log2(float x) { return __builtin_log2f(x); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline void sin_cos(float x, float* s, float* c) { *s = __builtin_sinf(x); *c = __builtin_cosf(x); }  // the C library's
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
// A value's bits in the low bits of a word, and back (the CUDA prelude's).
template <typename T> inline uint to_bits(T x) { uint bits = 0u; std::memcpy(&bits, &x, sizeof(T)); return bits; }
template <typename T> inline void from_bits(uint bits, T* out) { std::memcpy(out, &bits, sizeof(T)); }
inline float round_half(float x) { return (float)(half)x; }
inline float round_bfloat(float x) { bfloat b; from_float(x, &b); return to_float(b); }
inline float bits_to_float(uint bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline uint mask_or(uint a, uint mask, uint bits) { return (a & mask) | bits; }
inline float2 half2_bits_to_float2(uint bits) {
  half h[2];
  std::memcpy(h, &bits, 4);
  return float2{(float)h[0], (float)h[1]};
}
inline float2 half2_bits_times(uint bits, float factor) {  // the CUDA prelude's (exact products: float's are too)
  const float2 f = half2_bits_to_float2(bits);
  return float2{f.x * factor, f.y * factor};
}
inline float max(float a, float b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }
inline float fast_exp2(float x) { return __builtin_exp2f(x); }


// mma.sync m16n8k16 (float32 accumulation) over the SIMD group's fragments: mma_emulated, the runner's.
inline void mma_bf16(float* acc, const uint* a, uint b0, uint b1) { mma_emulated(acc, a, b0, b1, true); }
inline void mma_f16(float* acc, const uint* a, uint b0, uint b1) { mma_emulated(acc, a, b0, b1, false); }
inline uint pack_pair(float lo, float hi, bfloat) {
  bfloat pair[2];
  from_float(lo, &pair[0]);
  from_float(hi, &pair[1]);
  uint word;
  std::memcpy(&word, pair, 4);
  return word;
}
inline uint pack_pair(float lo, float hi, half) {
  half pair[2] = {(half)lo, (half)hi};
  uint word;
  std::memcpy(&word, pair, 4);
  return word;
}
// Staging barriers (the CUDA prelude's mbarrier): bits 0-15 the threads a phase waits for, bits
// 16-31 those arrived, bits 32 and up the completed phases. The last thread to arrive clears the
// arrivals and completes the phase (no thread arrives again before its phase has completed).
inline void stage_barrier_init(unsigned long long* bar, int threads) { __atomic_store_n(bar, (unsigned long long)threads, __ATOMIC_SEQ_CST); }
inline void stage_arrive(unsigned long long* bar) {
  const unsigned long long before = __atomic_fetch_add(bar, 1ull << 16, __ATOMIC_SEQ_CST);
  const unsigned long long expected = before & 0xFFFF, arrived = (before >> 16 & 0xFFFF) + 1;
  if (arrived == expected) __atomic_fetch_add(bar, (1ull << 32) - (arrived << 16), __ATOMIC_SEQ_CST);
}
inline void stage_wait(unsigned long long* bar, int parity) {
  while ((__atomic_load_n(bar, __ATOMIC_SEQ_CST) >> 32 & 1) == (unsigned long long)parity) emulated_yield();
}
// fma.rn.bf16x2 / f16x2: each half's a · b + c exactly (in double: a product of two 16-bit values
// and a 16-bit addend fit unless their exponents are far apart), then rounded once to T. A bfloat
// goes through float: where that rounding lands on a bfloat tie that the exact value is not, the
// tie is moved a float ulp towards the exact value first, so the second rounding goes its way.
template <typename T> inline uint fma_pairs_emulated(uint a, uint b, uint c) {
  T in[3][2], out[2];
  std::memcpy(in[0], &a, 4); std::memcpy(in[1], &b, 4); std::memcpy(in[2], &c, 4);
  for (int i = 0; i < 2; i++) {
    const double exact = (double)to_float(in[0][i]) * (double)to_float(in[1][i]) + (double)to_float(in[2][i]);
    if constexpr (__is_same(T, half)) {
      out[i] = (half)exact;
    } else {
      float rounded = (float)exact;
      uint bits;
      std::memcpy(&bits, &rounded, 4);
      if ((bits & 0xFFFFu) == 0x8000u && (double)rounded != exact) {
        bits += __builtin_fabs(exact) > __builtin_fabs((double)rounded) ? 1 : -1;  // away from or towards zero
        std::memcpy(&rounded, &bits, 4);
      }
      from_float(rounded, &out[i]);
    }
  }
  uint word;
  std::memcpy(&word, out, 4);
  return word;
}
inline uint fma_pairs(uint a, uint b, uint c, bfloat) { return fma_pairs_emulated<bfloat>(a, b, c); }
inline uint fma_pairs(uint a, uint b, uint c, half) { return fma_pairs_emulated<half>(a, b, c); }
inline uint byte_perm(uint a, uint b, uint selector) {
  const unsigned long long bytes = (unsigned long long)a | (unsigned long long)b << 32;
  uint out = 0u;
  for (int n = 0; n < 4; n++) out |= (uint)(bytes >> (8 * ((selector >> (4 * n)) & 7u)) & 0xFFu) << (8 * n);
  return out;
}
inline uint low_halves(uint a, uint b) { return (a & 0xFFFFu) | (b << 16); }
inline uint high_halves(uint a, uint b) { return (a >> 16) | (b & 0xFFFF0000u); }

// Matrix tiles in threadgroup memory (qmm.h, gemm.h), as the CUDA prelude has them, or under METAL_TILES
// as the Metal prelude's simdgroup matrices do: float tiles, x widened into its own (not staged).
#define THREADGROUP_PTR
#ifdef METAL_TILES
#define MMA_INPUT(T) float
#define MMA_DIRECT 0
#else
#define MMA_INPUT(T) T
#define MMA_DIRECT 1
#endif
// The asynchronous copies, done at once (a kernel missing a barrier after async_wait reads a stage
// before or after another thread wrote it, by the threads' order: each runs until it waits).
inline void async_copy(void* to, const void* from, bool present, int bytes) {
  if (present) check_read(from, bytes);
  if (present) std::memcpy(to, from, bytes); else std::memset(to, 0, bytes);
}
inline void async_copy16(void* to, const void* from, bool present) { async_copy(to, from, present, 16); }
inline void async_copy8(void* to, const void* from, bool present) { async_copy(to, from, present, 8); }
inline void async_copy4(void* to, const void* from, bool present) { async_copy(to, from, present, 4); }
inline void async_commit() {}
inline void prefetch_l2(const void* at, int bytes) { check_read(at, bytes); }  // a hint: only its range is checked
#define async_wait(n)
#ifdef METAL_TILES
// The Metal prelude's tiles: a lane's elements of each 8 x 8 simdgroup matrix (row frag_row,
// columns frag_col and + 1), the multiply gathering every lane's (mma_emulated_metal, the runner's).
void mma_emulated_metal(float* acc, const float* a, const float* b);
inline int frag_row(int lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
inline int frag_col(int lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }
#define ROW_PEER_A 1
#define ROW_PEER_B 8
struct TileAcc { float v[4]; };
template <typename T> struct TileA { float v[8]; };
template <typename T> struct TileB { float v[4]; };
inline void tile_zero(TileAcc& acc) { acc.v[0] = acc.v[1] = acc.v[2] = acc.v[3] = 0.0f; }
template <typename U, typename T> inline void load_tile_a(TileA<T>& tile, const U* a, int lda, int lane) {
  const int r = frag_row(lane), c = frag_col(lane);
  for (int part = 0; part < 4; part++) {
    const U* at = a + (r + 8 * (part % 2)) * lda + c + 8 * (part / 2);
    tile.v[2 * part] = to_float(at[0]);
    tile.v[2 * part + 1] = to_float(at[1]);
  }
}
template <typename U, typename T> inline void load_tile_b(TileB<T>& tile, const U* b, int ldb, int lane) {
  const int k = frag_row(lane), n = frag_col(lane);
  for (int part = 0; part < 2; part++) {
    tile.v[2 * part] = to_float(b[n * ldb + k + 8 * part]);
    tile.v[2 * part + 1] = to_float(b[(n + 1) * ldb + k + 8 * part]);
  }
}
template <typename U, typename T> inline void load_tile_b2(TileB<T>& b0, TileB<T>& b1, const U* b, int ldb, int lane) {
  load_tile_b(b0, b, ldb, lane);
  load_tile_b(b1, b + 8 * ldb, ldb, lane);
}
template <typename U, typename T> inline void load_tile_b_rows(TileB<T>& tile, const U* b, int ldb, int lane) {
  const int k = frag_row(lane), n = frag_col(lane);
  for (int part = 0; part < 2; part++) {
    tile.v[2 * part] = to_float(b[(k + 8 * part) * ldb + n]);
    tile.v[2 * part + 1] = to_float(b[(k + 8 * part) * ldb + n + 1]);
  }
}
template <typename U, typename T> inline void load_tile_b2_rows(TileB<T>& b0, TileB<T>& b1, const U* b, int ldb, int lane) {
  load_tile_b_rows(b0, b, ldb, lane);
  load_tile_b_rows(b1, b + 8, ldb, lane);
}
template <typename T> inline void tile_mma(TileAcc& acc, const TileA<T>& a, const TileB<T>& b) { mma_emulated_metal(acc.v, a.v, b.v); }
template <typename T> inline void tile_a_from_acc(TileA<T>& tile, const TileAcc& left, const TileAcc& right) {
  for (int e = 0; e < 4; e++) {
    tile.v[e] = left.v[e];
    tile.v[4 + e] = right.v[e];
  }
}
inline void to_tile(float value, float* at) { *at = value; }
template <typename T> inline void to_tile2(float low, float high, T* at) { to_tile(low, at); to_tile(high, at + 1); }
template <typename T> inline void store_pair(float low, float high, T* at) { from_float(low, at); from_float(high, at + 1); }
inline void tile_store(const TileAcc& acc, float* out, int ld, int lane) {
  const int r = frag_row(lane), c = frag_col(lane);
  out[r * ld + c] = acc.v[0];
  out[r * ld + c + 1] = acc.v[1];
  out[(r + 8) * ld + c] = acc.v[2];
  out[(r + 8) * ld + c + 1] = acc.v[3];
}
#else
inline int frag_row(int lane) { return lane / 4; }
inline int frag_col(int lane) { return 2 * (lane % 4); }
#define ROW_PEER_A 1
#define ROW_PEER_B 2
struct TileAcc { float v[4]; };
inline void tile_zero(TileAcc& acc) { acc.v[0] = acc.v[1] = acc.v[2] = acc.v[3] = 0.0f; }
template <typename T> struct TileA { uint r[4]; };
template <typename T> struct TileB { uint r[2]; };
template <typename T> inline void load_tile_a(TileA<T>& tile, const T* a, int lda, int lane) {
  const int g = lane / 4, c = lane % 4;
  std::memcpy(&tile.r[0], a + g * lda + 2 * c, 4);
  std::memcpy(&tile.r[1], a + (g + 8) * lda + 2 * c, 4);
  std::memcpy(&tile.r[2], a + g * lda + 2 * c + 8, 4);
  std::memcpy(&tile.r[3], a + (g + 8) * lda + 2 * c + 8, 4);
}
template <typename T> inline void load_tile_b(TileB<T>& tile, const T* b, int ldb, int lane) {
  const int g = lane / 4, c = lane % 4;
  std::memcpy(&tile.r[0], b + g * ldb + 2 * c, 4);
  std::memcpy(&tile.r[1], b + g * ldb + 2 * c + 8, 4);
}
template <typename T> inline void load_tile_b2(TileB<T>& b0, TileB<T>& b1, const T* b, int ldb, int lane) {
  load_tile_b(b0, b, ldb, lane);
  load_tile_b(b1, b + 8 * ldb, ldb, lane);
}
// ldmatrix's transpose: a lane's word holds B[2c][g] (low half) and B[2c + 1][g].
template <typename T> inline uint column_pair(const T* b, int ldb, int k, int n) {
  T pair[2] = {b[k * ldb + n], b[(k + 1) * ldb + n]};
  uint word;
  std::memcpy(&word, pair, 4);
  return word;
}
template <typename T> inline void load_tile_b_rows(TileB<T>& tile, const T* b, int ldb, int lane) {
  const int g = lane / 4, c = lane % 4;
  tile.r[0] = column_pair(b, ldb, 2 * c, g);
  tile.r[1] = column_pair(b, ldb, 2 * c + 8, g);
}
template <typename T> inline void load_tile_b2_rows(TileB<T>& b0, TileB<T>& b1, const T* b, int ldb, int lane) {
  load_tile_b_rows(b0, b, ldb, lane);
  load_tile_b_rows(b1, b + 8, ldb, lane);
}
// ldmatrix from each lane's row address (the CUDA prelude's `_at` loads): the SIMD group's
// addresses exchanged, as the hardware gathers them (`ldmatrix_emulated`, the runner's).
void ldmatrix_emulated(uint* registers, int count, const void* row);
template <typename T> inline void load_tile_a_at(TileA<T>& tile, const T* row) { ldmatrix_emulated(tile.r, 4, row); }
template <typename T> inline void load_tile_b2_at(TileB<T>& b0, TileB<T>& b1, const T* row) {
  uint r[4];
  ldmatrix_emulated(r, 4, row);
  b0.r[0] = r[0]; b0.r[1] = r[1]; b1.r[0] = r[2]; b1.r[1] = r[3];
}
template <typename T> inline void tile_mma(TileAcc& acc, const TileA<T>& a, const TileB<T>& b) {
  mma_emulated(acc.v, a.r, b.r[0], b.r[1], !__is_same(T, half));
}
template <typename T> inline void tile_a_from_acc(TileA<T>& tile, const TileAcc& left, const TileAcc& right) {
  tile.r[0] = pack_pair(left.v[0], left.v[1], T());
  tile.r[1] = pack_pair(left.v[2], left.v[3], T());
  tile.r[2] = pack_pair(right.v[0], right.v[1], T());
  tile.r[3] = pack_pair(right.v[2], right.v[3], T());
}
inline void to_tile(float value, bfloat* at) { from_float(value, at); }
inline void to_tile(float value, half* at) { from_float(value, at); }
template <typename T> inline void to_tile2(float low, float high, T* at) { to_tile(low, at); to_tile(high, at + 1); }
template <typename T> inline void store_pair(float low, float high, T* at) { from_float(low, at); from_float(high, at + 1); }
inline void tile_store(const TileAcc& acc, float* out, int ld, int lane) {
  const int g = lane / 4, c = lane % 4;
  out[g * ld + 2 * c] = acc.v[0];
  out[g * ld + 2 * c + 1] = acc.v[1];
  out[(g + 8) * ld + 2 * c] = acc.v[2];
  out[(g + 8) * ld + 2 * c + 1] = acc.v[3];
}
#endif

// Hopper's warpgroup products (the CUDA prelude's wgmma_*, gemm_wgmma.h). Both operands are tiles
// in threadgroup memory, so each thread computes its own accumulator elements from them at once, in
// the CUDA prelude's register layout, and the group's fence, commit and wait have nothing to do. A
// tile is read through the 128-byte swizzle the tensor cores read it through (piece p of row r at
// piece p ^ (r % 8)); one that does not start at a multiple of 1024 bytes (where the hardware's
// swizzle, made from the address's bits, would differ) stops the emulator.
inline unsigned shared_address(const void* at) { return (unsigned)(unsigned long)at; }
#define DYNAMIC_THREADGROUP(name, bytes) alignas(1024) THREADGROUP uint4 name[(bytes) / 16]
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N> inline void wgmma_wait() {}
inline void async_proxy_fence() {}
template <int N> inline void warpgroup_registers_fewer() {}
template <int N> inline void warpgroup_registers_more() {}
inline void wgmma_hold(float&) {}
template <typename T> inline float swizzled_element(const T* tile, int row, int k) {
  const char* at = (const char*)tile + row * 128 + (((k / 8) ^ (row % 8)) * 16) + (k % 8) * 2;
  T value;
  std::memcpy(&value, at, 2);
  return to_float(value);
}
template <int N, typename T> inline void wgmma_tile(float* d, const T* a, const T* b, int step) {
  if (((unsigned long)a | (unsigned long)b) % 1024) __builtin_trap();
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32;
  for (int i = 0; i < N / 2; i++) {
    const int row = 16 * warp + lane / 4 + 8 * ((i % 4) / 2), column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    float sum = d[i];
    for (int k = 16 * step; k < 16 * step + 16; k++) sum += swizzled_element(a, row, k) * swizzled_element(b, column, k);
    d[i] = sum;
  }
}
// The other form (sdpa_prefill_wgmma.h): A from the SIMD group's registers (mma.sync's A fragment
// for its 16 rows: each thread gathers its two rows' 16 k from the four lanes that hold them), B
// as its rows of N elements in blocks of 64 columns `block_bytes` apart, rows 16 * step and on.
inline uint shuffle_word(uint word, int source) {
  float value;
  std::memcpy(&value, &word, 4);
  value = simd_shuffle(value, source);
  std::memcpy(&word, &value, 4);
  return word;
}
template <typename T> inline float word_half(uint word, int which) {
  T pair[2];
  std::memcpy(pair, &word, 4);
  return to_float(pair[which]);
}
// This thread's rows g and g + 8 of A at k 0-15, gathered from the four lanes of its quad that
// hold them (a[r]: row g (r even) or g + 8, k 2c (r < 2) or 2c + 8, in lane quad + c).
template <typename T> inline void gather_a_rows(const uint* a, float rows[2][16]) {
  const int lane = threadIdx.x % 32, quad = lane / 4 * 4;
  for (int c = 0; c < 4; c++) {
    for (int r = 0; r < 4; r++) {
      const uint word = shuffle_word(a[r], quad + c);
      const int h = r % 2, k = 2 * c + 8 * (r / 2);
      rows[h][k] = word_half<T>(word, 0);
      rows[h][k + 1] = word_half<T>(word, 1);
    }
  }
}
template <int N, typename T> inline void wgmma_tile_rs(float* d, const uint* a, const T* b, int block_bytes, int step) {
  if (((unsigned long)b | (unsigned long)block_bytes) % 1024) __builtin_trap();
  const int lane = threadIdx.x % 32;
  float rows[2][16];
  gather_a_rows<T>(a, rows);
  for (int i = 0; i < N / 2; i++) {
    const int h = (i % 4) / 2, column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    const T* block = (const T*)((const char*)b + (column / 64) * block_bytes);
    float sum = d[i];
    for (int k = 0; k < 16; k++) sum += rows[h][k] * swizzled_element(block, 16 * step + k, column % 64);
    d[i] = sum;
  }
}
// A from registers, B given by its rows as wgmma_tile reads it (qmm_wgmma_rs.h's x tile).
template <int N, typename T> inline void wgmma_tile_rs_rows(float* d, const uint* a, const T* b, int step) {
  if ((unsigned long)b % 1024) __builtin_trap();
  const int lane = threadIdx.x % 32;
  float rows[2][16];
  gather_a_rows<T>(a, rows);
  for (int i = 0; i < N / 2; i++) {
    const int h = (i % 4) / 2, column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; k++) sum += rows[h][k] * swizzled_element(b, column, 16 * step + k);
    d[i] = sum;
  }
}
inline void wgmma_hold(uint&) {}
