// The kernel emulator's runner (see prelude_emulated.h): the launch of a grid (a threadgroup's
// threads as fibers), the threadgroup's barriers and the SIMD groups' exchanges, and the checks of
// a kernel's accesses. Built once into
// a library loaded before every kernel's library (whose calls and the compiler's load and store
// callbacks it answers); never itself traced.
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "prelude_emulated.h"

__thread EmulatedThread emulated;

// A threadgroup's threads are fibers of the launching OS thread (ucontext), each on a stack of its
// own, switched only where one waits (a barrier, a SIMD group's exchange, a staging barrier): a
// thread runs until it waits, then the next one that can, in thread order or its reverse. The
// scheduler keeps each fiber's `emulated` (the kernel's thread-local view of its place) across
// the switches.
static ucontext_t scheduler_context;
static ucontext_t fiber_contexts[1024];
static EmulatedThread fiber_states[1024];
static int current_fiber = 0;

void emulated_yield() {
  fiber_states[current_fiber] = emulated;
  swapcontext(&fiber_contexts[current_fiber], &scheduler_context);
}

// A barrier of `expected` fibers: the last to arrive completes the phase and goes on; the others
// yield until it has.
struct FiberBarrier {
  int expected = 0, arrived = 0;
  unsigned long phase = 0;
  void arrive_and_wait() {
    const unsigned long mine = phase;
    if (++arrived == expected) {
      arrived = 0;
      phase++;
      return;
    }
    while (phase == mine) emulated_yield();
  }
};

struct Block {
  FiberBarrier* all;
  FiberBarrier* warps[32];
  float lanes[1024];
  uint mma_a[1024][4], mma_b[1024][2];  // the fragments of each lane's last mma
  float metal_a[1024][8], metal_b[1024][4];  // the same for Metal's tiles (METAL_TILES)
  bool votes[1024];
  const char* rows[1024];               // each lane's ldmatrix row address
};
static Block* block() { return (Block*)emulated.sync; }

// Where a kernel may read and write. The launch's buffers (set by `run`; a kernel writes only its
// outputs) and the memory private to the kernel: its thread's stack, the thread's emulator state,
// and its library's own segments (threadgroup arrays are statics there). Where the compiler can
// trace them (clang's -fsanitize-coverage=trace-loads,trace-stores over the kernel only), every
// load and store of the kernel is checked, and the count of those outside is read back after the
// launch; otherwise the reads the emulator sees by address (the asynchronous copies and the L2
// prefetch hints) are.
struct BufferRange { const char* begin; const char* end; };
static BufferRange launch_buffers[32];
static bool launch_writable[32];
static int launch_buffer_count = 0;
static int out_of_bounds_reads = 0, out_of_bounds_writes = 0;
static BufferRange library_segments[16];
static int library_segment_count = 0;
static bool inside(const BufferRange& range, const char* from, int bytes) { return from >= range.begin && from + bytes <= range.end; }
void check_read(const void* at, int bytes) {
  const char* from = (const char*)at;
  for (int i = 0; i < launch_buffer_count; i++)
    if (inside(launch_buffers[i], from, bytes)) return;
  __atomic_fetch_add(&out_of_bounds_reads, 1, __ATOMIC_SEQ_CST);
}
// The loaded segments of the library holding `kernel_address` (its threadgroup arrays are there).
static int find_library_segments(dl_phdr_info* info, size_t, void* kernel_address) {
  const char* self = (const char*)kernel_address;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    const char* begin = (const char*)(info->dlpi_addr + segment.p_vaddr);
    if (segment.p_type == PT_LOAD && self >= begin && self < begin + segment.p_memsz) mine = true;
  }
  if (!mine) return 0;
  for (int i = 0; i < info->dlpi_phnum && library_segment_count < 16; i++) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    const char* begin = (const char*)(info->dlpi_addr + segment.p_vaddr);
    if (segment.p_type == PT_LOAD) library_segments[library_segment_count++] = {begin, begin + segment.p_memsz};
  }
  return 1;
}
static bool private_memory(const char* at, int bytes) {
  const char* frame = (const char*)__builtin_frame_address(0);
  if (at >= frame && at + bytes <= emulated.stack_top) return true;
  if (at >= (const char*)&emulated && at + bytes <= (const char*)(&emulated + 1)) return true;
  for (int i = 0; i < library_segment_count; i++)
    if (inside(library_segments[i], at, bytes)) return true;
  return false;
}
static void check_access(const void* address, int bytes, bool write) {
  const char* at = (const char*)address;
  for (int i = 0; i < launch_buffer_count; i++)
    if (inside(launch_buffers[i], at, bytes)) {
      if (write && !launch_writable[i]) break;
      return;
    }
  if (private_memory(at, bytes)) return;
  __atomic_fetch_add(write ? &out_of_bounds_writes : &out_of_bounds_reads, 1, __ATOMIC_SEQ_CST);
}
// The compiler's callbacks for every load and store of the kernel (not themselves traced).
#define TRACED_ACCESS(BYTES)                                                                       \
  extern "C" void __sanitizer_cov_load##BYTES(void* at) { check_access(at, BYTES, false); }       \
  extern "C" void __sanitizer_cov_store##BYTES(void* at) { check_access(at, BYTES, true); }
TRACED_ACCESS(1)
TRACED_ACCESS(2)
TRACED_ACCESS(4)
TRACED_ACCESS(8)
TRACED_ACCESS(16)

// A float converted to bfloat by the language (`bfloat(x)`, and what the compiler makes of
// from_float): a call to this, which not every runtime library has; to nearest even.
extern "C" bfloat __truncsfbf2(float x) {
  uint bits;
  std::memcpy(&bits, &x, 4);
  bits = (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits + 0x7FFFu + ((bits >> 16) & 1u);
  ushort top = (ushort)(bits >> 16);
  asm("" : "+r"(top));  // opaque: the compiler would fold the rounding back into a call to this very function
  return __builtin_bit_cast(bfloat, top);
}

void threadgroup_barrier() { block()->all->arrive_and_wait(); }
float simd_shuffle_xor(float x, int mask) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  block()->lanes[threadIdx.x] = x;
  block()->warps[warp]->arrive_and_wait();
  const float other = block()->lanes[warp * 32 + (lane ^ mask)];
  block()->warps[warp]->arrive_and_wait();
  return other;
}
float simd_shuffle(float x, int source) {
  const int warp = threadIdx.x / 32;
  block()->lanes[threadIdx.x] = x;
  block()->warps[warp]->arrive_and_wait();
  const float other = block()->lanes[warp * 32 + source];
  block()->warps[warp]->arrive_and_wait();
  return other;
}
bool simd_any(bool x) {
  const int warp = threadIdx.x / 32;
  block()->votes[threadIdx.x] = x;
  block()->warps[warp]->arrive_and_wait();
  bool any = false;
  for (int l = 0; l < 32; l++) any = any || block()->votes[warp * 32 + l];
  block()->warps[warp]->arrive_and_wait();
  return any;
}
static float half_bits_to_float(ushort bits, bool bf16) {
  if (bf16) return bits_to_float((uint)bits << 16);
  half h;
  std::memcpy(&h, &bits, 2);
  return (float)h;
}
void mma_emulated(float* acc, const uint* a, uint b0, uint b1, bool bf16) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < 4; i++) block()->mma_a[threadIdx.x][i] = a[i];
  block()->mma_b[threadIdx.x][0] = b0;
  block()->mma_b[threadIdx.x][1] = b1;
  block()->warps[warp]->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, c = l % 4, at = warp * 32 + l;
    for (int reg = 0; reg < 4; reg++) {
      const uint word = block()->mma_a[at][reg];
      const int row = g + 8 * (reg % 2), k = 2 * c + 8 * (reg / 2);
      A[row][k] = half_bits_to_float((ushort)(word & 0xFFFFu), bf16);
      A[row][k + 1] = half_bits_to_float((ushort)(word >> 16), bf16);
    }
    for (int reg = 0; reg < 2; reg++) {
      const uint word = block()->mma_b[at][reg];
      B[2 * c + 8 * reg][g] = half_bits_to_float((ushort)(word & 0xFFFFu), bf16);
      B[2 * c + 8 * reg + 1][g] = half_bits_to_float((ushort)(word >> 16), bf16);
    }
  }
  block()->warps[warp]->arrive_and_wait();
  const int g = lane / 4, c = lane % 4;
  for (int e = 0; e < 4; e++) {
    const int row = g + 8 * (e / 2), col = 2 * c + e % 2;
    float sum = acc[e];
    for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
    acc[e] = sum;
  }
}
// ldmatrix (m8n8, 16-bit): `count` 8 x 8 matrices, matrix i's rows at the addresses of lanes 8i to
// 8i + 7; lane 4g + c receives row g, elements 2c and 2c + 1 of each, in registers[i].
void ldmatrix_emulated(uint* registers, int count, const void* row) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  block()->rows[threadIdx.x] = (const char*)row;
  block()->warps[warp]->arrive_and_wait();
  for (int i = 0; i < count; i++) std::memcpy(&registers[i], block()->rows[warp * 32 + 8 * i + lane / 4] + 4 * (lane % 4), 4);
  block()->warps[warp]->arrive_and_wait();
}
// Metal's simdgroup multiply on the lanes' fragments (METAL_TILES): each lane holds, of every 8 x 8
// matrix, row frag_row and columns frag_col, + 1 (the Metal prelude's layout, MLX's).
void mma_emulated_metal(float* acc, const float* a, const float* b) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < 8; i++) block()->metal_a[threadIdx.x][i] = a[i];
  for (int i = 0; i < 4; i++) block()->metal_b[threadIdx.x][i] = b[i];
  block()->warps[warp]->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    const int r = ((l / 4) & 4) + (l / 2) % 4, c = ((l / 4) & 2) * 2 + (l % 2) * 2, at = warp * 32 + l;
    for (int part = 0; part < 4; part++)
      for (int e = 0; e < 2; e++) A[r + 8 * (part % 2)][c + 8 * (part / 2) + e] = block()->metal_a[at][2 * part + e];
    for (int part = 0; part < 2; part++)
      for (int e = 0; e < 2; e++) B[r + 8 * part][c + e] = block()->metal_b[at][2 * part + e];
  }
  block()->warps[warp]->arrive_and_wait();
  const int r = ((lane / 4) & 4) + (lane / 2) % 4, c = ((lane / 4) & 2) * 2 + (lane % 2) * 2;
  for (int e = 0; e < 4; e++) {
    const int row = r + 8 * (e / 2), col = c + e % 2;
    float sum = acc[e];
    for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
    acc[e] = sum;
  }
}
void simd_barrier() { block()->warps[threadIdx.x / 32]->arrive_and_wait(); }

// A threadgroup's barriers and exchange slots (a cluster's threadgroups each have their own).
struct Threadgroup {
  FiberBarrier all;
  std::vector<FiberBarrier> warps;
  Block sync;
};

// The launch the fibers run (`run` sets it): fiber f is thread f % threads of threadgroup
// f / threads of each cluster (x fastest in the cluster, as CUDA ranks them), the clusters taken in
// turn (x fastest in the grid). Threadgroup arrays (the kernel library's section
// nuvec_threadgroup) hold the running threadgroup's: where a fiber of another one runs next, the
// arrays are saved to the one's copy and the other's copy put in place.
static struct {
  void (*kernel)(void**);
  void** buffers;
  int threads, groups, groups_y;
  int cluster[3], clusters[3], cluster_size;
  Threadgroup* threadgroups;
  FiberBarrier* cluster_all;
  char* memory;           // the threadgroup arrays' section
  long memory_bytes;
  std::vector<char>* copies;  // each threadgroup of the cluster's arrays while not in place
  int in_place;           // whose arrays are in the section
  int cluster_index;      // the cluster running
  int returned[8];        // each threadgroup of the cluster: its threads' returns from the kernel, over the launch
  bool finished[1024];
} launch;

static void put_in_place(int threadgroup) {
  if (threadgroup == launch.in_place) return;
  std::memcpy(launch.copies[launch.in_place].data(), launch.memory, launch.memory_bytes);
  std::memcpy(launch.memory, launch.copies[threadgroup].data(), launch.memory_bytes);
  launch.in_place = threadgroup;
}

void cluster_barrier() { launch.cluster_all->arrive_and_wait(); }
// A read of threadgroup `rank`'s memory: outside its arrays, or after all its threads left the
// kernel (on the GPU its memory is then gone), it counts as a read outside the buffers.
float4 cluster_load4(const float* at, int rank) {
  const char* from = (const char*)at;
  float4 value{};
  if (rank < 0 || rank >= launch.cluster_size || from < launch.memory || from + 16 > launch.memory + launch.memory_bytes ||
      launch.returned[rank] == launch.threads * (launch.cluster_index + 1)) {
    __atomic_fetch_add(&out_of_bounds_reads, 1, __ATOMIC_SEQ_CST);
    return value;
  }
  if (rank != launch.in_place) from = launch.copies[rank].data() + (from - launch.memory);
  std::memcpy(&value, from, 16);
  return value;
}

static void fiber_main(int f) {
  const int rank = f / launch.threads;
  emulated.sync = &launch.threadgroups[rank].sync;
  emulated.thread = uint3{(uint)(f % launch.threads), 0, 0};
  emulated.stack_top = (const char*)__builtin_frame_address(0);
  const int* cluster = launch.cluster;
  const uint3 in_cluster{(uint)(rank % cluster[0]), (uint)(rank / cluster[0] % cluster[1]), (uint)(rank / (cluster[0] * cluster[1]))};
  const int total = launch.clusters[0] * launch.clusters[1] * launch.clusters[2];
  for (int c = 0; c < total; c++) {
    const int cx = c % launch.clusters[0], cy = c / launch.clusters[0] % launch.clusters[1], cz = c / (launch.clusters[0] * launch.clusters[1]);
    emulated.block = uint3{cx * cluster[0] + in_cluster.x, cy * cluster[1] + in_cluster.y, cz * cluster[2] + in_cluster.z};
    launch.cluster_index = c;
    launch.kernel(launch.buffers);
    launch.returned[rank]++;
    launch.cluster_all->arrive_and_wait();  // the cluster's threadgroups all done before the next cluster's start
  }
  launch.finished[f] = true;
}  // returns to the scheduler (uc_link)

// Runs `kernel` (a kernel library's entry, which passes `buffers` to the kernel as its parameters)
// over a grid of groups x groups_y x groups_z threadgroups of `threads` threads in clusters of
// cluster[0] x cluster[1] x cluster[2] (dividing the grid; at most 8 threadgroups and 1024 threads a cluster, whole
// SIMD groups of 32): one fiber per thread of a cluster, taking the grid's clusters one at a time
// (all of them finish one before any starts the next). `memory` .. `memory_end`: the kernel
// library's threadgroup arrays. `outside` gets the counts of reads outside the buffers and writes
// outside the writable ones.
extern "C" void run(void (*kernel)(void**), void** buffers, long* sizes, const int* writable, int count, int groups,
                    int groups_y, int groups_z, int threads, const int* cluster, char* memory, char* memory_end, int* outside) {
  launch_buffer_count = count;
  for (int i = 0; i < count; i++) {
    launch_buffers[i] = {(const char*)buffers[i], (const char*)buffers[i] + sizes[i]};
    launch_writable[i] = writable[i] != 0;
  }
  library_segment_count = 0;
  dl_iterate_phdr(find_library_segments, (void*)kernel);
  out_of_bounds_reads = out_of_bounds_writes = 0;
  const int size = cluster[0] * cluster[1] * cluster[2], fibers = threads * size;
  if (size < 1 || size > 8 || fibers > 1024 || groups % cluster[0] || groups_y % cluster[1] || groups_z % cluster[2]) abort();
  for (int r = 0; r < size; r++) launch.returned[r] = 0;
  std::vector<Threadgroup> threadgroups(size);
  for (Threadgroup& group : threadgroups) {
    group.all.expected = threads;
    group.warps = std::vector<FiberBarrier>((threads + 31) / 32);
    group.sync.all = &group.all;
    for (int w = 0; w < (int)group.warps.size(); w++) {
      group.warps[w].expected = std::min(32, threads - 32 * w);
      group.sync.warps[w] = &group.warps[w];
    }
  }
  FiberBarrier cluster_all{fibers};
  const long memory_bytes = memory ? memory_end - memory : 0;
  std::vector<std::vector<char>> copies(size, std::vector<char>(memory, memory + memory_bytes));
  launch.kernel = kernel;
  launch.buffers = buffers;
  launch.threads = threads;
  for (int d = 0; d < 3; d++) launch.cluster[d] = cluster[d];
  launch.clusters[0] = groups / cluster[0];
  launch.clusters[1] = groups_y / cluster[1];
  launch.clusters[2] = groups_z / cluster[2];
  launch.cluster_size = size;
  launch.threadgroups = threadgroups.data();
  launch.cluster_all = &cluster_all;
  launch.memory = memory;
  launch.memory_bytes = memory_bytes;
  launch.copies = copies.data();
  launch.in_place = 0;
  // Each fiber's stack: 1 MB of address space, committed only where touched.
  const size_t stack_bytes = 1 << 20;
  char* stacks = (char*)mmap(nullptr, stack_bytes * fibers, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) abort();
  for (int f = 0; f < fibers; f++) {
    getcontext(&fiber_contexts[f]);
    fiber_contexts[f].uc_stack.ss_sp = stacks + stack_bytes * f;
    fiber_contexts[f].uc_stack.ss_size = stack_bytes;
    fiber_contexts[f].uc_link = &scheduler_context;
    makecontext(&fiber_contexts[f], (void (*)())fiber_main, 1, f);
    launch.finished[f] = false;
  }
  // Sweeps over the fibers alternate in direction, so that a kernel missing a barrier meets
  // both orders: one thread's read before and after another's write.
  for (int running = fibers, sweep = 0; running > 0; sweep++)
    for (int i = 0; i < fibers; i++) {
      const int f = sweep % 2 == 0 ? i : fibers - 1 - i;
      if (launch.finished[f]) continue;
      if (size > 1) put_in_place(f / threads);
      current_fiber = f;
      emulated = fiber_states[f];
      swapcontext(&scheduler_context, &fiber_contexts[f]);
      if (launch.finished[f]) running--;
    }
  munmap(stacks, stack_bytes * fibers);
  outside[0] = out_of_bounds_reads;
  outside[1] = out_of_bounds_writes;
}
