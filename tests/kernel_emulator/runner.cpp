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

// The launch a fiber runs (`run` sets it): each thread takes the grid's threadgroups in turn.
static struct {
  void (*kernel)(void**);
  void** buffers;
  int groups, groups_y, total;
  Block* sync;
  bool finished[1024];
} launch;

static void fiber_main(int t) {
  emulated.sync = launch.sync;
  emulated.thread = uint3{(uint)t, 0, 0};
  emulated.stack_top = (const char*)__builtin_frame_address(0);
  for (int g = 0; g < launch.total; g++) {
    emulated.block = uint3{(uint)(g % launch.groups), (uint)(g / launch.groups % launch.groups_y),
                           (uint)(g / (launch.groups * launch.groups_y))};
    launch.kernel(launch.buffers);
    launch.sync->all->arrive_and_wait();
  }
  launch.finished[t] = true;
}  // returns to the scheduler (uc_link)

// Runs `kernel` (a kernel library's entry, which passes `buffers` to the kernel as its parameters)
// over a grid of groups x groups_y x groups_z threadgroups of `threads` threads (at most 1024, whole
// SIMD groups of 32): one fiber per thread of a threadgroup, taking the grid's threadgroups one at a
// time (all of them finish one before any starts the next: threadgroup arrays are statics).
// `outside` gets the counts of reads outside the buffers and writes outside the writable ones.
extern "C" void run(void (*kernel)(void**), void** buffers, long* sizes, const int* writable, int count, int groups,
                    int groups_y, int groups_z, int threads, int* outside) {
  launch_buffer_count = count;
  for (int i = 0; i < count; i++) {
    launch_buffers[i] = {(const char*)buffers[i], (const char*)buffers[i] + sizes[i]};
    launch_writable[i] = writable[i] != 0;
  }
  library_segment_count = 0;
  dl_iterate_phdr(find_library_segments, (void*)kernel);
  out_of_bounds_reads = out_of_bounds_writes = 0;
  FiberBarrier all{threads};
  std::vector<FiberBarrier> warps((threads + 31) / 32);
  Block sync{&all, {}, {}};
  for (int w = 0; w < (int)warps.size(); w++) {
    warps[w].expected = std::min(32, threads - 32 * w);
    sync.warps[w] = &warps[w];
  }
  launch.kernel = kernel;
  launch.buffers = buffers;
  launch.groups = groups;
  launch.groups_y = groups_y;
  launch.total = groups * groups_y * groups_z;
  launch.sync = &sync;
  // Each fiber's stack: 1 MB of address space, committed only where touched.
  const size_t stack_bytes = 1 << 20;
  char* stacks = (char*)mmap(nullptr, stack_bytes * threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) abort();
  for (int t = 0; t < threads; t++) {
    getcontext(&fiber_contexts[t]);
    fiber_contexts[t].uc_stack.ss_sp = stacks + stack_bytes * t;
    fiber_contexts[t].uc_stack.ss_size = stack_bytes;
    fiber_contexts[t].uc_link = &scheduler_context;
    makecontext(&fiber_contexts[t], (void (*)())fiber_main, 1, t);
    launch.finished[t] = false;
  }
  // Sweeps over the fibers alternate in direction, so that a kernel missing a barrier meets
  // both orders: one thread's read before and after another's write.
  for (int running = threads, sweep = 0; running > 0; sweep++)
    for (int i = 0; i < threads; i++) {
      const int t = sweep % 2 == 0 ? i : threads - 1 - i;
      if (launch.finished[t]) continue;
      current_fiber = t;
      emulated = fiber_states[t];
      swapcontext(&scheduler_context, &fiber_contexts[t]);
      if (launch.finished[t]) running--;
    }
  munmap(stacks, stack_bytes * threads);
  outside[0] = out_of_bounds_reads;
  outside[1] = out_of_bounds_writes;
}
