"""Sweep the decode kernels' launch shapes on the device (`DEV=CUDA python3 scripts/tune_decode.py`):
for each shape, one pass and two passes over a range of key blocks (and SIMD groups per
threadgroup), each timed as the benchmark times (TinyJit replays of calls over rotated K/V sets,
`nuvec_tg.bench.common.time_jit`), with the K/V bytes per second. The CUDA plan's rules in
`fast/plan.py` are read off this sweep's output (kept in `benchmarks/`).

`--matrix`: the matrix-unit first pass instead (cells: key blocks x SIMD groups x tiles in flight,
the SIMD groups merged in the threadgroup), over the grouped-query shapes; `--quick` fewer shapes;
`--shape B,HQ,HKV,LK` (repeatable), `--launch WARPS,UNROLL` (repeatable) and `--blocks A,B,...`
pick them instead;
`--grouped` runs the matrix cells' blocks in about one wave of threadgroups, each taking its share
in turn, as the plan's `block_groups` does for a large batch. Each shape's last
cell, "plan", is what `fast.plan_attention` picks, timed through `fast.scaled_dot_product_attention`;
`--variant U,L,R` (repeatable) adds the plan's launch with U tiles in flight in registers (1 or
2), L2 prefetch L rounds ahead (`l2_ahead`) and at least R threadgroups resident per
multiprocessor (`__launch_bounds__`: registers capped to fit; 0: no bound), none of which changes
a bit; `--l2 A,B,...` is `--variant 2,A,0 --variant 2,B,0 ...`; `--plan-only` skips the other
cells. `--probe stores,merge,staging` (any of them) renders every matrix pass without that part of
the block epilogue for all but a threadgroup's last block (its partial's global stores, the merge
of the SIMD groups' partials, their staging in threadgroup memory): wrong results (the error column
says so), a measurement of what a block boundary costs; `writes` drops only the partials' global
stores (the merge still computed). Probes that change no bit: `stream` (K/V loaded evict-first),
`keep` and `discard` (the partials stored evict-last, their L2 lines dropped after the merge pass),
`release` and `mbarrier` (the arrival counts without a sequentially consistent fence, or hardware
barrier objects instead). `benchmarks/attention_h200.md` has what each measured."""
import contextlib
import io
import sys

import numpy as np
from tinygrad import Device, dtypes
from tinygrad.helpers import Context

from nuvec_tg.bench.attention import kv_sets, torch_times
from nuvec_tg.bench.common import time_jit, warm_up
from nuvec_tg import fast
from nuvec_tg.fast.plan import matrix_block_groups
from nuvec_tg.kernels import compositions_only
from nuvec_tg.kernels import attention as attention_kernels
from nuvec_tg.kernels.attention import MATRIX_ROWS, decode_attention

SHAPES = [(1, 32, 8, 4096), (1, 32, 8, 16384), (1, 32, 8, 65536), (1, 32, 4, 16384), (1, 16, 2, 65536), (1, 64, 8, 16384),
          (8, 32, 8, 4096), (8, 32, 8, 16384), (32, 32, 8, 16384), (32, 16, 2, 65536), (1, 32, 8, 1024)]
BLOCKS = [1, 16, 32, 64, 128, 256]
LAUNCH = [(4, 2), (4, 4), (8, 2)]  # (SIMD groups per threadgroup, key lines in flight per lane)

QUICK = [(1, 32, 8, 1024), (1, 32, 8, 16384), (1, 32, 8, 65536), (32, 32, 8, 16384)]
MATRIX_SHAPES = [(1, 32, 4, 16384), (1, 64, 8, 65536), (8, 16, 2, 16384), (8, 32, 4, 16384), (8, 32, 8, 4096),
                 (8, 32, 8, 65536), (32, 32, 4, 4096), (32, 64, 8, 16384), (8, 32, 8, 1024), (1, 32, 8, 1024),
                 (1, 32, 8, 16384), (32, 32, 8, 16384)]
MATRIX_QUICK = [(1, 32, 4, 16384), (8, 16, 2, 16384), (8, 32, 8, 4096), (32, 64, 8, 16384)]
MATRIX_BLOCKS = [1, 2, 4, 8, 16, 32, 64]
quick = "--quick" in sys.argv
matrix = "--matrix" in sys.argv
if matrix:
    SHAPES, QUICK, BLOCKS, LAUNCH = MATRIX_SHAPES, MATRIX_QUICK, MATRIX_BLOCKS, [(2, 1), (4, 1), (2, 2), (4, 2)]


def _given(flag: str) -> list[tuple[int, ...]]:
    return [tuple(int(n) for n in sys.argv[i + 1].split(",")) for i, a in enumerate(sys.argv) if a == flag]


if _given("--shape"): SHAPES = QUICK = _given("--shape")
if _given("--launch"): LAUNCH = _given("--launch")
if _given("--blocks"): BLOCKS = list(_given("--blocks")[0])
grouped = "--grouped" in sys.argv
plan_only = "--plan-only" in sys.argv
# The plan's launch with other load scheduling: (tiles in registers, L2 rounds, resident threadgroups).
variants = [(2, l2, 0) for l2 in (_given("--l2")[0] if _given("--l2") else ())] + _given("--variant")
resident = {"groups": 0}  # the launch bound the matrix pass is rendered with (0: none)
_specialise = attention_kernels.specialise


# `--probe`: edits to the matrix pass's text, as (text, replacement). The first four drop a part of
# the block epilogue for all but a threadgroup's last block (wrong results); the rest change no bit.
PROBES = {
    "stores": [("        part_acc[(out_row * BLOCKS + block) * DV + e] = value;",
                "        if (block == block_stop - 1) part_acc[(out_row * BLOCKS + block) * DV + e] = value;"),
               ("        part_max[out_row * BLOCKS + block] = merged;\n        part_sum[out_row * BLOCKS + block] = total;",
                "        if (block == block_stop - 1) { part_max[out_row * BLOCKS + block] = merged; "
                "part_sum[out_row * BLOCKS + block] = total; }")],
    "merge": [("      merge_block(block - 1, 1 - buffer);", "      if (false) merge_block(block - 1, 1 - buffer);"),
              ("    merge_block(block, 0);\n", "    if (block == block_stop - 1) merge_block(block, 0);\n")],
    "staging": [("      if (!row_real[r]) continue;", "      if (!row_real[r] || block != block_stop - 1) continue;")],
    # the stores alone: the merge still computes every value (a store under a condition that never
    # holds, which the compiler cannot drop), only the writes are gone
    "writes": [("        part_acc[(out_row * BLOCKS + block) * DV + e] = value;",
                "        if (block == block_stop - 1 || value == 1.2345e-30f) part_acc[(out_row * BLOCKS + block) * DV + e] = value;"),
               ("        part_max[out_row * BLOCKS + block] = merged;\n        part_sum[out_row * BLOCKS + block] = total;",
                "        if (block == block_stop - 1 || total == 1.2345e-30f) { part_max[out_row * BLOCKS + block] = merged; "
                "part_sum[out_row * BLOCKS + block] = total; }")],
    # cache policy: K/V loaded evict-first (ld.global.cs); the partials stored evict-last
    "stream": [("K_PIECE[h][j] = k_line[4 * j + c];", "K_PIECE[h][j] = __ldcs(k_line + 4 * j + c);"),
               ("V_PIECE[l][i] = v_line[8 * i + g];", "V_PIECE[l][i] = __ldcs(v_line + 8 * i + g);")],
    "keep": [("        part_acc[(out_row * BLOCKS + block) * DV + e] = value;",
              "        store_keep(&part_acc[(out_row * BLOCKS + block) * DV + e], value);")],
    # synchronisation: arrivals counted by a release reduction and awaited by acquire loads (the
    # arrival's MEMBAR.SC.CTA becomes MEMBAR.ALL.CTA), or a hardware barrier object per staging
    # buffer (every thread arrives, release; waits by phase parity, acquire): no fence at all
    "release": [("simd_arrive(&", "simd_arrive_release(&"), ("wait_count(&", "wait_count_acquire(&")],
    "mbarrier": [("THREADGROUP int staged_count[2];\n  if ((int)nv_thread.x < 2) staged_count[nv_thread.x] = 0;",
                  "THREADGROUP unsigned long long staged_bar[2];\n  if ((int)nv_thread.x < 2) asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: "
                  "\"r\"((unsigned)__cvta_generic_to_shared(&staged_bar[nv_thread.x])), \"r\"(32 * NUM_WARPS) : \"memory\");"),
                 ("wait_count(&staged_count[1 - buffer], NUM_WARPS * ((position - 1) / 2 + 1));",
                  "mbar_wait(&staged_bar[1 - buffer], ((position - 1) / 2) & 1);"),
                 ("simd_arrive(&staged_count[buffer]);", "mbar_arrive(&staged_bar[buffer]);"),
                 ("wait_count(&staged_count[last % 2], NUM_WARPS * (last / 2 + 1));", "mbar_wait(&staged_bar[last % 2], (last / 2) & 1);")],
}
# ... and to the merge pass's: `discard` drops the partials' L2 lines once read (discard.global.L2:
# never written back to DRAM).
MERGE_PROBES = {"discard": [("  threadgroup_barrier();\n  float merged = -INFINITY;",
                             "  threadgroup_barrier();\n  discard_lines(part_acc + row * BLOCKS * DV, BLOCKS * DV * 4, local_id, THREADS);\n"
                             "  float merged = -INFINITY;")]}
# The functions the probes call, put before a probed kernel's text.
PROBE_HELPERS = """
INLINE void store_keep(float* at, float value) {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" :: "l"(at), "f"(value), "l"(policy) : "memory");
}
INLINE void discard_lines(const void* at, int bytes, int first, int step) {
  if (((unsigned long long)at & 127) != 0) return;
  for (int line = first; line < bytes / 128; line += step) asm volatile("discard.global.L2 [%0], 128;" :: "l"((const char*)at + 128 * line) : "memory");
}
INLINE void simd_arrive_release(int* count) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) asm volatile("red.release.cta.shared::cta.add.u32 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(count)) : "memory");
}
INLINE void wait_count_acquire(int* count, int target) {
  int seen;
  do { asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(seen) : "r"((unsigned)__cvta_generic_to_shared(count)) : "memory"); } while (seen < target);
  __syncwarp();
}
INLINE void mbar_arrive(unsigned long long* bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.release.cta.shared::cta.b64 st, [%0]; }" :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
}
INLINE void mbar_wait(unsigned long long* bar, int parity) {
  unsigned done;
  do { asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory"); } while (!done);
}
"""
probes = sys.argv[sys.argv.index("--probe") + 1].split(",") if "--probe" in sys.argv else []


def tuned_specialise(backend, name, source, defines, params):
    """The decode kernels' text with the `--probe` edits, and the matrix pass's with
    `__launch_bounds__(threads, resident["groups"])` when asked."""
    text = _specialise(backend, name, source, defines, params)
    edits = {"nuvec_sdpa_decode_mma": PROBES, "nuvec_sdpa_merge": MERGE_PROBES}.get(name)
    if edits is None: return text
    for probe in probes:
        for before, after in edits.get(probe, []):
            assert before in text, f"--probe {probe}: {name}'s text has changed"
            text = text.replace(before, after)
    if probes: text = PROBE_HELPERS + text
    if name != "nuvec_sdpa_decode_mma" or not resident["groups"]: return text
    bound = f"__launch_bounds__({32 * defines['NUM_WARPS']}, {resident['groups']}) "
    return text.replace("__global__ void ", "__global__ void " + bound, 1)


attention_kernels.specialise = tuned_specialise


def block_groups(b: int, hq: int, hkv: int, blocks: int, warps: int) -> int:
    """The plan's threadgroups per (item, key head, row group) for a large batch (`--grouped`), in
    threadgroups of the cell's `warps`."""
    if not (matrix and grouped): return 0
    return matrix_block_groups(hkv * -(-(hq // hkv) // MATRIX_ROWS), b, blocks, warps=warps)
print(f"device {Device.DEFAULT}; cells: blocks (1 = one pass) x warps x unroll: device µs per call / K/V TB/s", flush=True)
shapes = QUICK if quick else SHAPES
torch_seconds = torch_times([(b, hq, hkv, 128, lk, "bfloat16") for b, hq, hkv, lk in shapes], 5)
warm_up()
for b, hq, hkv, lk in shapes:
    d, dtype = 128, dtypes.bfloat16
    sets = kv_sets(np.random.default_rng(0), b, hq, hkv, lk, d, dtype)
    kv_bytes = 2 * b * hkv * lk * d * dtype.itemsize
    cells = []
    with compositions_only():
        reference = fast.scaled_dot_product_attention(*sets[0], d ** -0.5).float().numpy()
    worst = 0.0
    for warps, unroll in [] if plan_only else LAUNCH:
        for blocks in BLOCKS:
            if matrix:
                if lk // (blocks * warps) < 64: continue
            elif (blocks > 1 and lk // blocks < 64) or (blocks == 1 and b * hkv < 64 and lk > 1024): continue
            passes = 1 if blocks == 1 and not matrix else 2
            def attend(q, k, v, passes=passes, blocks=blocks, warps=warps, unroll=unroll):
                return decode_attention(q, k, v, d ** -0.5, dtype=dtype, backend="cuda", passes=passes, blocks=blocks,
                                        causal=False, window=None, mask=None, sinks=None, warps=warps, unroll=unroll,
                                        matrix=matrix, block_groups=block_groups(b, hq, hkv, blocks, warps))
            got = attend(*sets[0]).float().numpy()
            worst = max(worst, float(np.abs(got - reference).max() / np.abs(reference).max()))
            seconds = time_jit(attend, sets, 5)
            cells.append((seconds, f"{blocks}x{warps}x{unroll}: {seconds * 1e6:.1f}/{kv_bytes / seconds / 1e12:.2f}", attend))
    plan = fast.plan_attention(sets[0][0].shape, sets[0][1].shape, sets[0][2].shape, dtype).kernel
    plan_name = f"{plan.blocks}/{plan.block_groups or plan.blocks}g" if isinstance(plan, fast.Vector) else type(plan).__name__
    if isinstance(plan, fast.Vector) and plan.matrix:
        plan_name += f" l2 {plan.l2_ahead}"
    for unroll, l2, groups in variants:  # the plan's launch, loads scheduled otherwise
        def attend(q, k, v, unroll=unroll, l2=l2, groups=groups):
            resident["groups"] = groups
            try:
                return decode_attention(q, k, v, d ** -0.5, dtype=dtype, backend="cuda", passes=2, blocks=plan.blocks,
                                        causal=False, window=None, mask=None, sinks=None, matrix=True, unroll=unroll,
                                        block_groups=plan.block_groups, l2_ahead=l2)
            finally:
                resident["groups"] = 0
        got = attend(*sets[0]).float().numpy()
        worst = max(worst, float(np.abs(got - reference).max() / np.abs(reference).max()))
        seconds = time_jit(attend, sets, 5)
        cells.append((seconds, f"u{unroll} l2 {l2} r{groups}: {seconds * 1e6:.1f}/{kv_bytes / seconds / 1e12:.2f}", attend))
    def plan_attend(q, k, v): return fast.scaled_dot_product_attention(q, k, v, d ** -0.5)
    plan_seconds = time_jit(plan_attend, sets, 5)
    cells.append((plan_seconds, f"plan {plan_name}: {plan_seconds * 1e6:.1f}/{kv_bytes / plan_seconds / 1e12:.2f}", plan_attend))
    _, best, best_attend = min(cells, key=lambda cell: cell[0])
    torch_s = torch_seconds[(b, hq, hkv, 128, lk, "bfloat16")]
    torch_text = f"{torch_s * 1e6:.1f}/{kv_bytes / torch_s / 1e12:.2f}" if torch_s else "-"
    print(f"B {b} {hq}/{hkv} Lk {lk}: " + "  ".join(c for _, c, _ in cells) + f"  | best {best} | torch {torch_text} | max rel. error {worst:.1e}", flush=True)
    # The best launch's kernels one by one (eager launches, events around each).
    with Context(DEBUG=2), contextlib.redirect_stdout(io.StringIO()) as log:
        for _ in range(3): best_attend(*sets[0]).realize()
    print("   kernels:", " ".join(f"{line.split()[3][:16]} {line.split(' tm ')[1].split('/')[0].strip()}"
                                 for line in log.getvalue().splitlines() if "nuvec_sdpa" in line), flush=True)
    del sets
