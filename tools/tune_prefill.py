"""Sweep the tiled prefill kernel's launch on the device (`DEV=CUDA python3 tools/tune_prefill.py`):
SIMD groups per threadgroup, 16-row tiles per SIMD group, keys per tile and whether Q's fragments
stay in registers, for causal bf16 self-attention of 32 query heads over 8 key heads at 4096 tokens
(head sizes 64, 128, 256), each timed as `bench prefill` times ours (`time_jit`), in µs and TFLOP/s
over the visible pairs, its output checked against the plan's launch; `*` marks the plan's.

`--ceiling` first measures what the matrix units give through `mma.sync` (m16n8k16, bf16 into
float32) with every operand in registers: the rate no kernel built on it can pass. `--shapes
"128:4x1/64r@3,4x1/32r;64:..."` times only those launches (and the plan's) per head size: SIMD
groups x row tiles / keys, `r` or `s`, `@n` an occupancy cap; `8x1/128w2`: the warpgroup kernel
(sdpa_prefill_wgmma.h) of 8 SIMD groups over 128-key tiles in 2 stages. `--wgmma` sweeps the
warpgroup kernel's launches (CUDA sm_90), each checked against the mma.sync kernel's plan.
Results: benchmarks/prefill_h200.md."""
import argparse
import itertools
import sys

import numpy as np
from tinygrad import Device, Tensor, dtypes

from nuvec_tg.bench.common import time_jit
from nuvec_tg.bench.prefill import flops
from nuvec_tg.kernels import kernel_backend, prefill, target
from nuvec_tg.kernels.program import Program, launch, prelude

BACKEND = kernel_backend(Device.DEFAULT)
if BACKEND is None: raise SystemExit(f"tune_prefill: needs a GPU with nuvec_tg's kernels, not {Device.DEFAULT}")
STATIC_LIMIT = 48 * 1024 if BACKEND == "cuda" else 32 * 1024

# Each SIMD group chains ROUNDS rounds of 8 independent mma (8 accumulators), operands in registers.
CEILING_SOURCE = prelude("cuda") + r"""
extern "C" __global__ void nuvec_mma_ceiling(float* out, const int* rounds_in) {
  const int rounds = rounds_in[0];
  uint a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x ^ 5u, 7u}, b0 = threadIdx.x * 11u, b1 = 13u;
  float acc[8][4] = {};
  for (int r = 0; r < rounds; r++) {
#pragma unroll
    for (int i = 0; i < 8; i++) mma_bf16(acc[i], a, b0, b1);
  }
  float sum = 0.0f;
  for (int i = 0; i < 8; i++) sum += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""


def ceiling(repeats: int) -> None:
    program = Program("nuvec_mma_ceiling", CEILING_SOURCE, (), None)
    groups, threads, rounds = 132 * 8, 256, 4096
    out = Tensor.empty(groups * threads, dtype=dtypes.float32)
    count = Tensor([rounds], dtype=dtypes.int32).realize()
    def run(counts):
        return launch(program, Device.DEFAULT, [Tensor.empty(groups * threads, dtype=dtypes.float32)], [counts], (groups, 1, 1),
                      threads)[0]
    seconds = time_jit(run, [(count,)] * 4, repeats)
    work = groups * threads // 32 * rounds * 8 * 16 * 8 * 16 * 2
    print(f"mma.sync m16n8k16 bf16 ceiling: {work / seconds / 1e12:.0f} TFLOP/s ({groups} x {threads} threads, "
          f"{rounds} rounds of 8 independent mma a SIMD group)", flush=True)
    del out


def candidates(head_dim: int):
    """Launches within the threadgroup memory a static array may take (and at most 8 row tiles):
    4 and 8 SIMD groups over 32-128 keys, 2 and 4 over 16 and 32 for heads past 128."""
    warps_keys = ((2, 4), (16, 32)) if head_dim > 128 else ((4, 8), (32, 64, 128))
    for warps, row_tiles, keys, resident, groups in itertools.product(warps_keys[0], (1, 2), warps_keys[1], (True, False),
                                                                      (0, 2, 3)):
        if groups and warps * row_tiles > 4: continue  # a cap only where 2 or 3 threadgroups could fit
        shape = prefill.Tiled(warps, row_tiles, keys, resident, groups)
        if prefill.threadgroup_bytes(head_dim, head_dim, dtypes.bfloat16, shape) > STATIC_LIMIT: continue
        if warps * row_tiles > 8: continue
        yield shape


def wgmma_candidates(head_dim: int):
    """The warpgroup kernel's launches: 1-3 warpgroups over 64- and 128-key tiles in 2-4 stages,
    within an sm_90 threadgroup's dynamic memory (a launch past the registers fails and says so)."""
    for warps, keys, stages in itertools.product((4, 8, 12), (64, 128), (2, 3, 4)):
        shape = prefill.Tiled(warps, 1, keys, False, wgmma_stages=stages)
        if prefill.wgmma_bytes(head_dim, head_dim, shape) <= prefill.WGMMA_MAX_DYNAMIC: yield shape


def label(shape: prefill.Tiled) -> str:
    """warps x row tiles / keys, r (Q in registers) or s (read each tile), then @groups where capped;
    the warpgroup kernel's: warps x 1 / keys w stages."""
    if shape.wgmma_stages: return f"{shape.warps}x1/{shape.keys}w{shape.wgmma_stages}"
    return (f"{shape.warps}x{shape.row_tiles}/{shape.keys}{'r' if shape.q_resident else 's'}"
            + (f"@{shape.resident_groups}" if shape.resident_groups else ""))


def parse(text: str) -> prefill.Tiled:
    """A `label` back into its launch: `4x1/64r@3`."""
    head, _, groups = text.partition("@")
    sizes, keys = head.split("/")
    warps, row_tiles = sizes.split("x")
    if "w" in keys:
        keys, stages = keys.split("w")
        return prefill.Tiled(int(warps), 1, int(keys), False, wgmma_stages=int(stages))
    return prefill.Tiled(int(warps), int(row_tiles), int(keys[:-1]), keys[-1] == "r", int(groups or 0))


def sweep(head_dim: int, length: int, repeats: int, quick: bool, only: list[prefill.Tiled] | None = None,
          wgmma: bool = False) -> None:
    rng = np.random.default_rng(head_dim)
    make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()  # noqa: E731
    sets = [(make(1, 32, length, head_dim), make(1, 8, length, head_dim), make(1, 8, length, head_dim)) for _ in range(3)]
    planned = prefill.plan(BACKEND, head_dim, head_dim, warpgroups=target(Device.DEFAULT).warpgroups)
    checked_against = prefill.plan(BACKEND, head_dim, head_dim) if wgmma else planned  # the mma.sync kernel's
    work = flops(1, 32, length, length, head_dim, head_dim, None)

    def call(shape):
        return lambda q, k, v: prefill.prefill_attention(q, k, v, head_dim ** -0.5, shape, dtype=dtypes.bfloat16,
                                                         backend=BACKEND, causal=True, window=None, mask=None, sinks=None)
    reference = call(checked_against)(*sets[0]).float().numpy()
    cells = []
    everything = [checked_against] + list(wgmma_candidates(head_dim)) if wgmma else list(candidates(head_dim))
    shapes = [planned] if quick else [planned] + [s for s in only if s != planned] if only else everything
    for shape in shapes:
        try:
            got = call(shape)(*sets[0]).float().numpy()
            error = float(np.abs(got - reference).max())
            seconds = time_jit(call(shape), sets, repeats)
        except Exception as failure:  # noqa: BLE001 - a launch the device refuses: say so and go on
            cells.append(f"{label(shape)}: {type(failure).__name__}")
            continue
        mark = "*" if shape == planned else ""
        flag = "" if error < 0.05 else f" WRONG ({error:.3g})"
        cells.append(f"{mark}{label(shape)}: {seconds * 1e6:.0f} µs {work / seconds / 1e12:.0f}{flag}")
        print(f"D {head_dim} L {length}: {cells[-1]}", flush=True)
    print(f"D {head_dim} L {length} (warps x row tiles / keys, r: Q in registers, s: read each tile, @ threadgroups a "
          "multiprocessor must hold): " + "  ".join(cells),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ceiling", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the plan's launch only")
    parser.add_argument("--heads", default="128,64,256")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wgmma", action="store_true", help="the warpgroup kernel's launches (CUDA sm_90)")
    parser.add_argument("--shapes", help="D:label,label;D:... only these launches (and the plan's) for those head sizes")
    args = parser.parse_args()
    only = {int(d): [parse(x) for x in labels.split(",")] for d, labels in
            (part.split(":") for part in args.shapes.split(";"))} if args.shapes else {}
    if args.ceiling and BACKEND == "cuda": ceiling(args.repeats)
    for head_dim in (int(d) for d in args.heads.split(",")):
        sweep(head_dim, args.length, args.repeats, args.quick, only.get(head_dim), args.wgmma)


if __name__ == "__main__":
    sys.exit(main())
