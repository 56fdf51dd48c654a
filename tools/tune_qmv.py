"""Sweep the qmv kernel's launch shapes on the device (`DEV=CUDA python3 tools/tune_qmv.py [--quick]`):
for M in {1, 4} at (K, N) in {(4096, 4096), (4096, 14336), (14336, 4096)}, affine 4-bit and 8-bit
(groups of 64) and mxfp4 weights (x bfloat16), every plan in `plans` (columns per SIMD group x
SIMD groups per column set x K split x unroll), each timed as the benchmark times (TinyJit replays
of calls over rotated weights, `nuvec_tg.bench.common.rotation` and `time_jit`): device µs per call and
weight bytes per second, best first, with the default plan marked `*` and the largest error
against the composition. `--quick`: affine 4-bit, M = 1; `--rows 1` (or `4`, `1,4`): every
format at those M; `--shape K,N` (repeatable, K a multiple of 64): those shapes instead;
`--column-warps W`: only the default plan and the default with W column SIMD groups a threadgroup
(which changes no bit), timed in turn 3 times (an A/B within one run). The
defaults in `nuvec_tg/kernels/quant.py` are read off this sweep's output (kept in `benchmarks/`).
Every kernel is compiled first, in parallel worker processes, into tinygrad's compile cache."""
import dataclasses
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor


import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.helpers import diskcache_put

from nuvec_tg import quant
from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.bench.quant import FORMATS, time_torch, weight_bytes
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import quant as qmv

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
if "--shape" in sys.argv:  # --shape K,N (repeatable) instead of the benchmark's three
    SHAPES = [tuple(int(v) for v in sys.argv[i + 1].split(",")) for i, a in enumerate(sys.argv) if a == "--shape"]
REPEATS = 5
# Every plan tools/compile_cuda.py --nvcc --grid checks for registers (no spills): one row, four rows.
PLANS = sorted({qmv.QmvPlan(c, 1, s, u) for c in (2, 4, 8) for s in (1, 2, 4, 8) for u in (1, 2)} |
               {qmv.QmvPlan(c, 1, s, 1) for c in (1, 2, 4) for s in (1, 2, 4, 8)} |
               {qmv.QmvPlan(4, 2, 2, 1), qmv.QmvPlan(4, 4, 1, 1), qmv.QmvPlan(2, 4, 2, 1)}, key=str)


COLUMN_WARPS_AB = int(sys.argv[sys.argv.index("--column-warps") + 1]) if "--column-warps" in sys.argv else 0
AB_ROUNDS = 3


def plans(rows: int, k: int) -> list[qmv.QmvPlan]:
    """The plans swept for `rows` rows of x and depth K: K splits up to K's step count; unrolling
    only where a SIMD group has two steps or more; 2-8 columns for one row, 1-4 for four."""
    steps = math.ceil(k / qmv.CODES_PER_STEP)
    chosen = []
    for p in PLANS:
        if p.k_split > steps or (p.unroll > 1 and (rows > 1 or math.ceil(steps / p.k_split) < 2)): continue
        if rows == 1 and p.columns_per_warp < 2 or rows > 1 and (p.columns_per_warp > 4 or p.column_warps > 1): continue
        chosen.append(p)
    return chosen


def _compile(compiler, text: str) -> bytes:
    return compiler.compile(text)


def precompile(texts: list[str]) -> None:
    """Compile every program in worker processes and put it in tinygrad's compile cache (the
    launches then find it there); on any failure, leave it to the launches."""
    compiler = Device[Device.DEFAULT].renderer.compiler
    start = time.perf_counter()
    try:
        with ProcessPoolExecutor(min(16, multiprocessing.cpu_count()), mp_context=multiprocessing.get_context("spawn")) as pool:
            for text, lib in zip(texts, pool.map(_compile, [compiler] * len(texts), texts)):
                diskcache_put(compiler.cachekey, text, lib)
    except Exception as error:  # noqa: BLE001 - an optimisation only
        print(f"(precompiling failed: {error!r}; compiling as the launches come)", flush=True)
        return
    print(f"compiled {len(texts)} kernels in {time.perf_counter() - start:.0f} s", flush=True)


def main() -> int:
    quick = "--quick" in sys.argv
    backend = kernel_backend(Device.DEFAULT)
    if backend is None:
        print(f"tune_qmv: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
        return 2
    formats = ["affine4"] if quick else list(FORMATS)
    row_counts = (1,) if quick else (1, 4)
    if "--rows" in sys.argv: row_counts = tuple(int(r) for r in sys.argv[sys.argv.index("--rows") + 1].split(","))
    cases = [(fmt, rows, k, n) for fmt in formats for k, n in SHAPES for rows in row_counts]

    def kernel_source(fmt, rows, k, n, p):
        mode, group, bits = FORMATS[fmt]
        scales_dtype = dtypes.bfloat16 if mode == "affine" else dtypes.uint8
        return qmv.qmv_program(backend, dtypes.bfloat16, scales_dtype, dtypes.bfloat16, mode=mode, group_size=group, bits=bits,
                               rows=rows, k=k, n=n, qmv_plan=p).source
    def case_plans(rows, k, n):
        if not COLUMN_WARPS_AB: return plans(rows, k)
        default = qmv.plan(rows, k, n)
        return [default, dataclasses.replace(default, column_warps=COLUMN_WARPS_AB)] * AB_ROUNDS
    precompile(sorted({kernel_source(*case, p) for case in cases for p in case_plans(case[1], case[2], case[3])}))
    torch_seconds = {(rows, k, n): time_torch(rows, k, n, REPEATS) for _, rows, k, n in cases}
    print(f"device {Device.DEFAULT}; cells: columns x column SIMD groups x K split x unroll: device µs per call / weight "
          "TB/s (* the default plan)", flush=True)
    rng = np.random.default_rng(0)
    for fmt in formats:
        mode, group, bits = FORMATS[fmt]
        for k, n in SHAPES:
            moved = weight_bytes(fmt, k, n)
            turn = rotation(moved)
            weights = []
            for _ in range(turn.sets):
                w = Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16)
                qw = quant.quantize(w, group, bits, mode=mode)
                weights.append(tuple(p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases) if p is not None))
            for rows in row_counts:
                xs = [Tensor(rng.standard_normal((rows, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
                      for _ in range(turn.calls)]
                calls = [(xs[i], *weights[i % turn.sets]) for i in range(turn.calls)]
                first = quant.QuantizedWeight(*weights[0], *([None] if mode != "affine" else []), mode, group, bits)
                with compositions_only():
                    want = quant.quantized_matmul(xs[0], first).float().numpy()
                default = qmv.plan(rows, k, n)
                cells = []
                for p in case_plans(rows, k, n):
                    def product(x, weight, scales, biases=None, p=p):
                        return qmv.qmv(x, weight, scales, biases, mode=mode, group_size=group, bits=bits,
                                       out_dtype=dtypes.bfloat16, backend=backend, qmv_plan=p)
                    error = float(np.abs(product(*calls[0]).float().numpy() - want).max() / max(np.abs(want).max(), 1e-30))
                    seconds = time_jit(product, calls, REPEATS)
                    mark = "*" if p == default else ""
                    label = f"{mark}{p.columns_per_warp}x{p.column_warps}x{p.k_split}x{p.unroll}"
                    cells.append((seconds, f"{label}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f}", error))
                if not COLUMN_WARPS_AB: cells.sort()
                torch_s = torch_seconds[(rows, k, n)]
                torch_text = f"{torch_s * 1e6:.1f} µs" if torch_s else "-"
                print(f"{fmt} M{rows} K{k} N{n} ({moved / 1e6:.1f} MB): " + "  ".join(c for _, c, _ in cells) +
                      f"  | torch bf16 {torch_text} | max rel. error {max(e for _, _, e in cells):.1e}", flush=True)
            del weights
    return 0


if __name__ == "__main__":
    sys.exit(main())
