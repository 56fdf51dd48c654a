"""Sweep the dense product kernels' launch shapes on the device (`DEV=CUDA python3 tools/tune_linear.py
[--gemv] [--gemm] [--rows M,...] [--shape K,N ...]`), bfloat16 x and w, no bias, at the benchmark's
(K, N) in {(4096, 14336), (4096, 4096), (14336, 4096)}:

- gemv (M in {1, 4, 8}): every plan in `gemv_plans` (columns per SIMD group x column SIMD groups a
  threadgroup x K split x unroll); the K split changes a row's bits, so `linear.gemv_plan` may take
  it from K and N only: read the best split per shape across the row counts.
- gemm (M in {16, 64, 512, 2048}): every tile shape in `linear.TILE_SHAPES` (rows x columns, SIMD
  groups, stages); any tile shape gives the same bits, so `linear.gemm_plan` may follow M.
- `--wgmma`: gemm_wgmma's tile shapes (`linear.WGMMA_SHAPES`: rows x columns / stages) at the gemm
  rows instead (CUDA sm_90), for `linear.wgmma_plan`; each line ends saying whether every shape
  gave the same bits (the plan may follow M only if so).

Each cell is timed as the benchmark times (TinyJit replays of calls over rotated inputs,
`bench.common.rotation` and `time_jit`): device µs per call and TFLOP/s (gemv: also TB/s of w, x and
y), best first, the default marked `*`, with the largest error against the composition and
PyTorch's F.linear beside. `--quick`: M 1 and 512 at (4096, 14336) only. Every kernel is compiled
first in worker processes (`tune_qmv.precompile`). About a second a cell: gemv's 370 cells want
two device calls (`--rows 1`, then `--rows 4,8`), gemm's 144 two (`--rows 16,64`, then `--rows
512,2048`). `bash scripts/device_check.sh tune` with TUNE=linear (and TUNE_ARGS) runs it; the
plan's constants in `nuvec_tg/kernels/linear.py` are read off its output (kept in
`benchmarks/linear_h200.md`)."""
import math
import sys

import numpy as np
from tinygrad import Device, Tensor, dtypes

from nuvec_tg import fast, kernels
from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.bench.linear import SHAPES, moved_bytes, time_torch
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import linear
from nuvec_tg.kernels.quant import QmvPlan
from tune_qmv import precompile

REPEATS = 5
GEMV_ROWS, GEMM_ROWS = (1, 4, 8), (16, 64, 512, 2048)



def gemv_plans(rows: int, k: int) -> list[QmvPlan]:
    """The gemv plans swept for `rows` rows and depth K: 2, 4 and 8 columns (8 for up to 4 rows), 4
    columns also with 2 column sets a threadgroup, K splits up to K's step count, 1, 2 and 4 steps
    unrolled up to a SIMD group's."""
    steps = math.ceil(k // linear.piece_width(k) / 32)
    chosen = []
    for columns in (2, 4, 8):
        if columns == 8 and rows > 4: continue
        for column_warps in ((1, 2) if columns == 4 else (1,)):
            for split in (1, 2, 4, 8):
                for unroll in (1, 2, 4):
                    if split > steps or unroll > math.ceil(steps / split): continue
                    chosen.append(QmvPlan(columns, column_warps, split, unroll))
    return chosen


def main() -> int:
    backend = kernel_backend(Device.DEFAULT)
    if backend is None:
        print(f"tune_linear: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
        return 2
    shapes = SHAPES
    if "--shape" in sys.argv: shapes = [tuple(int(v) for v in sys.argv[i + 1].split(",")) for i, a in enumerate(sys.argv)
                                        if a == "--shape"]
    both = "--gemv" not in sys.argv and "--gemm" not in sys.argv
    rows = GEMV_ROWS * (both or "--gemv" in sys.argv) + GEMM_ROWS * (both or "--gemm" in sys.argv)
    if "--rows" in sys.argv: rows = tuple(int(r) for r in sys.argv[sys.argv.index("--rows") + 1].split(","))
    if "--quick" in sys.argv: shapes, rows = [(4096, 14336)], (1, 512)
    cases = [(m, k, n) for k, n in shapes for m in rows]

    wgmma = "--wgmma" in sys.argv

    def shapes_of(m: int, k: int, n: int) -> list:
        if m <= linear.MAX_ROWS: return gemv_plans(m, k)
        if wgmma: return list(linear.WGMMA_SHAPES)
        return [t for t in linear.TILE_SHAPES if backend == "cuda" or t == linear.GEMM_METAL]

    def program(m: int, k: int, n: int, shape):
        if m <= linear.MAX_ROWS:
            return linear.gemv_program(backend, dtypes.bfloat16, dtypes.bfloat16, None, dtypes.bfloat16, rows=m, k=k, n=n, plan=shape)
        return linear.gemm_program(backend, dtypes.bfloat16, None, dtypes.bfloat16, k=k, tiles=shape)
    if not wgmma: precompile(sorted({program(*case, shape).source for case in cases for shape in shapes_of(*case)}))
    torch_seconds = {case: time_torch(*case, REPEATS) for case in cases}
    print(f"device {Device.DEFAULT}; gemv cells: columns x column SIMD groups x K split x unroll: µs / TFLOP/s / TB/s; "
          "gemm cells: tile rows x columns, SIMD groups, stages: µs / TFLOP/s (* the default)", flush=True)
    rng = np.random.default_rng(0)
    for m, k, n in cases:
        turn = rotation(moved_bytes(m, k, n))
        weights = [Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16).contiguous().realize()
                   for _ in range(turn.sets)]
        xs = [Tensor(rng.standard_normal((m, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
              for _ in range(turn.calls)]
        calls = [(xs[i], weights[i % turn.sets]) for i in range(turn.calls)]
        with compositions_only():
            want = fast.linear(*calls[0]).float().numpy()
        vector = m <= linear.MAX_ROWS
        default = linear.gemv_plan(m, k, n) if vector else linear.wgmma_plan(m, n, kernels.target(Device.DEFAULT).multiprocessors) if wgmma else linear.gemm_plan(m, backend)
        cells, bits = [], []
        for shape in shapes_of(m, k, n):
            def product(x, w, shape=shape):
                if vector: return linear.gemv(x, w, None, out_dtype=dtypes.bfloat16, backend=backend, plan=shape)
                if wgmma: return linear.gemm_wgmma(x, w, None, out_dtype=dtypes.bfloat16, tiles=shape)
                return linear.gemm(x, w, None, out_dtype=dtypes.bfloat16, backend=backend, tiles=shape)
            first = product(*calls[0]).realize()
            bits.append(first.bitcast(dtypes.uint16).numpy())
            error = float(np.abs(first.float().numpy() - want).max() / max(np.abs(want).max(), 1e-30))
            seconds = time_jit(product, calls, REPEATS)
            mark = "*" if shape == default else ""
            label = (f"{shape.columns_per_warp}x{shape.column_warps}x{shape.k_split}x{shape.unroll}" if vector else
                     f"{shape.rows}x{shape.columns}/{shape.stages}s" if wgmma else
                     f"{shape.rows}x{shape.columns}/{shape.warps_m * shape.warps_n}w/{shape.stages}s")
            rate = f"/{moved_bytes(m, k, n) / seconds / 1e12:.2f}" if vector else ""
            cells.append((seconds, f"{mark}{label}: {seconds * 1e6:.1f}/{2 * m * k * n / seconds / 1e12:.1f}{rate}", error))
        cells.sort()
        torch_s = torch_seconds[(m, k, n)]
        torch_text = f"{torch_s * 1e6:.1f} µs" if torch_s else "-"
        print(f"M{m} K{k} N{n}: " + "  ".join(c for _, c, _ in cells) +
              f"  | torch {torch_text} | max rel. error {max(e for _, _, e in cells):.1e}" +
              ("" if vector else f" | same bits in every shape: {all(np.array_equal(b, bits[0]) for b in bits)}"), flush=True)
        del weights, xs, calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
