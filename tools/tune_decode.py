"""Sweep the decode kernels' launch shapes on the device (`DEV=CUDA python3 tools/tune_decode.py`):
for each shape, one pass and two passes over a range of key blocks (and SIMD groups per
threadgroup), each timed as the benchmark times (TinyJit replays of calls over rotated K/V sets,
`nuvec_tg.bench.common.time_jit`), with the K/V bytes per second. The CUDA launch rules
(`kernels/attention.py`, `decode_plan`) are read off this sweep's output (kept in `benchmarks/`).

`--matrix`: the matrix-unit first pass instead (cells: key blocks x SIMD groups x tiles in flight,
the SIMD groups merged in the threadgroup), over the grouped-query shapes; `--quick` fewer shapes;
`--shape B,HQ,HKV,LK` (repeatable), `--launch WARPS,UNROLL` (repeatable) and `--blocks A,B,...`
pick them instead;
`--grouped` runs the matrix cells' blocks in about one wave of threadgroups, each taking its share
in turn, as the plan's `block_groups` does for a large batch. Each shape's last
cell, "plan", is what `fast.plan_attention` picks, timed through `fast.scaled_dot_product_attention`;
`--variant U,L` (repeatable) adds the plan's launch with U tiles in flight in registers (1 or 2) and
L2 prefetch L rounds ahead (`l2_ahead`), neither of which changes a bit; `--l2 A,B,...` is
`--variant 2,A --variant 2,B ...`; `--plan-only` skips the other cells. Every launch goes through
`kernels.attention.decode_attention` with an explicit `Vector` and `Launch`. (What a block
boundary costs, measured by rendering the matrix pass without parts of its epilogue, is recorded
in `benchmarks/attention_h200.md`; those probes are retired.)"""
import contextlib
import io
import sys

import numpy as np
from tinygrad import Device, dtypes
from tinygrad.helpers import Context

from nuvec_tg.bench.attention import kv_sets, torch_times
from nuvec_tg.bench.common import time_jit
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only
from nuvec_tg.kernels.attention import CUDA_MATRIX_WARPS, MATRIX_ROWS, Launch, Vector, decode_attention, matrix_block_groups

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
# The plan's launch with other load scheduling: (tiles in registers, L2 rounds ahead).
variants = [(2, l2) for l2 in (_given("--l2")[0] if _given("--l2") else ())] + _given("--variant")


def block_groups(b: int, hq: int, hkv: int, blocks: int, warps: int) -> int:
    """The plan's threadgroups per (item, key head, row group) for a large batch (`--grouped`), in
    threadgroups of the cell's `warps`."""
    if not (matrix and grouped): return 0
    return matrix_block_groups(hkv * -(-(hq // hkv) // MATRIX_ROWS), b, blocks, warps=warps)


print(f"device {Device.DEFAULT}; cells: blocks (1 = one pass) x warps x unroll: device µs per call / K/V TB/s", flush=True)
shapes = QUICK if quick else SHAPES
torch_seconds = torch_times([(b, hq, hkv, 128, lk, "bfloat16") for b, hq, hkv, lk in shapes], 5)
for b, hq, hkv, lk in shapes:
    d, dtype = 128, dtypes.bfloat16
    sets = kv_sets(np.random.default_rng(0), b, hq, hkv, lk, d, dtype)
    kv_bytes = 2 * b * hkv * lk * d * dtype.itemsize
    cells = []
    with compositions_only():
        reference = fast.scaled_dot_product_attention(*sets[0], d ** -0.5).float().numpy()
    worst = 0.0

    def measure(label: str, attend) -> None:
        """Time one cell (and track its largest error against the composition)."""
        global worst
        got = attend(*sets[0]).float().numpy()
        worst = max(worst, float(np.abs(got - reference).max() / np.abs(reference).max()))
        seconds = time_jit(attend, sets, 5)
        cells.append((seconds, f"{label}: {seconds * 1e6:.1f}/{kv_bytes / seconds / 1e12:.2f}", attend))

    for warps, unroll in [] if plan_only else LAUNCH:
        for blocks in BLOCKS:
            if matrix:
                if lk // (blocks * warps) < 64: continue
            elif (blocks > 1 and lk // blocks < 64) or (blocks == 1 and b * hkv < 64 and lk > 1024): continue
            passes = 1 if blocks == 1 and not matrix else 2
            vector = Vector(passes, blocks, passes, matrix, block_groups(b, hq, hkv, blocks, warps))
            def attend(q, k, v, vector=vector, shape=Launch(warps, unroll)):
                return decode_attention(q, k, v, d ** -0.5, vector, dtype=dtype, backend="cuda", causal=False, window=None,
                                        mask=None, sinks=None, shape=shape)
            measure(f"{blocks}x{warps}x{unroll}", attend)
    plan = fast.plan_attention(sets[0][0].shape, sets[0][1].shape, sets[0][2].shape, dtype).kernel
    plan_name = f"{plan.blocks}/{plan.block_groups or plan.blocks}g" if isinstance(plan, fast.Vector) else type(plan).__name__
    if isinstance(plan, fast.Vector) and plan.matrix:
        plan_name += f" l2 {plan.l2_ahead}"
    for unroll, l2 in variants:  # the plan's launch, loads scheduled otherwise
        def attend(q, k, v, vector=Vector(2, plan.blocks, 2, True, plan.block_groups, l2), shape=Launch(CUDA_MATRIX_WARPS, unroll)):
            return decode_attention(q, k, v, d ** -0.5, vector, dtype=dtype, backend="cuda", causal=False, window=None,
                                    mask=None, sinks=None, shape=shape)
        measure(f"u{unroll} l2 {l2}", attend)
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
