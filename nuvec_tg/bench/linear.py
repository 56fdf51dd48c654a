"""Dense products (`python -m nuvec_tg.bench linear`): `fast.linear(x, w)` in bfloat16 at M = 1, 16,
64, 512 and 2048 rows against w of (K, N) in {(4096, 14336), (4096, 4096), (14336, 4096)} (a
model's MLP up, attention and MLP down projections), beside tinygrad's matmul (the same call
inside `compositions_only()`: tinygrad's matmul accumulating in float32) and PyTorch's
`torch.nn.functional.linear` (cuBLAS), each timed on the device: TFLOP/s and the share of the
matrix units' peak for every row, and for M <= 8 (the gemv kernel's, memory-bound) the bytes moved
(w, x and y each once) per second and the share of peak bandwidth."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from tinygrad import Device

from .. import fast, kernels
from ..kernels import compositions_only
from ..kernels import linear as linear_kernels
from ..kernels.linear import MAX_ROWS
from .common import (COPIES, MAX_CALLS, PEAK_FLOPS, cuda_torch, device_name, l2_marker, optional_us, part_of, release_torch,
                     rotation, start_table, time_jit, torch_graph_seconds)

ROWS = (1, 16, 64, 512, 2048)
SHAPES = ((4096, 14336), (4096, 4096), (14336, 4096))
SMALL = [(1, 256, 128), (16, 256, 128)]


def moved_bytes(m: int, k: int, n: int) -> int:
    """The bytes a product must move in bfloat16: w, x and y, each once."""
    return 2 * (n * k + m * k + m * n)


def time_torch(m: int, k: int, n: int, repeats: int, max_calls: int = MAX_CALLS) -> float | None:
    """PyTorch's bfloat16 `F.linear(x, w)` per call, over inputs rotated as ours, or None without
    PyTorch and a CUDA GPU."""
    torch = cuda_torch()
    if torch is None: return None
    turn = rotation(moved_bytes(m, k, n), max_calls=max_calls)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(turn.sets)]
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(turn.calls)]

    def run():
        for i, x in enumerate(xs): torch.nn.functional.linear(x, weights[i % turn.sets])
    seconds = torch_graph_seconds(run, turn.calls, repeats)
    del weights, xs
    return seconds


def grid_of(args) -> list[tuple[int, int, int]]:
    """The rows `(M, K, N)` the options ask for (`--batches`: these M)."""
    grid = [(m, k, n) for k, n in SHAPES for m in ROWS]
    if args.quick: grid = [(1, 4096, 4096), (512, 4096, 14336)]
    if args.small: grid = SMALL
    return part_of(grid, args.part, args.batches)


def kernel_cell(m: int, k: int, n: int) -> str:
    """Which kernel `fast.linear` runs for M rows of bfloat16 against w `[N, K]` here, and its launch."""
    target = kernels.target(Device.DEFAULT)
    kernel, reason = linear_kernels.route(dtypes.bfloat16, dtypes.bfloat16, None, dtypes.bfloat16, m, k, n, target)
    if reason is not None or target.backend is None: return "composition"
    if kernel == "gemv": return f"gemv {linear_kernels.gemv_plan(m, k, n)}"
    if kernel == "gemm_wgmma": return str(linear_kernels.wgmma_plan(m, n, target.multiprocessors))
    return f"gemm {linear_kernels.gemm_plan(m, target.backend)}"


def rate_cells(m: int, k: int, n: int, seconds: float, peak_bandwidth: float | None, peak_flops: float | None) -> str:
    """`µs | TFLOP/s | % peak | TB/s | % peak |` cells: FLOPs for every row, bytes for M <= MAX_ROWS."""
    flops = 2 * m * k * n / seconds
    cells = f"{seconds * 1e6:.1f} | {flops / 1e12:.1f} | " + (f"{100 * flops / peak_flops:.0f}% |" if peak_flops else "- |")
    if m > MAX_ROWS: return cells + " - | - |"
    rate = moved_bytes(m, k, n) / seconds
    return cells + f" {rate / 1e12:.2f} | " + (f"{100 * rate / peak_bandwidth:.0f}% |" if peak_bandwidth else "- |")


def run(args) -> list[str]:
    """The table's lines (printed as they come)."""
    grid = grid_of(args)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    torch_seconds = {(m, k, n): time_torch(m, k, n, args.repeats, max_calls) for m, k, n in grid}
    release_torch()
    peak_flops = PEAK_FLOPS.get(device_name())
    lines, peak = start_table(
        "Dense products y = x · wᵀ (x and w bfloat16, float32 accumulation, no bias): gemv up to 8 rows, gemm beyond "
        "(on Hopper gemm_wgmma, the warpgroup products)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated inputs: TinyJit for ours and tinygrad's "
        "matmul, a CUDA graph of PyTorch's F.linear), TFLOP/s and share of the dense bfloat16 peak "
        f"({'%.0f TFLOP/s' % (peak_flops / 1e12) if peak_flops else 'unknown'}), for M <= {MAX_ROWS} bytes (w, x, y once) "
        "per second and share of peak bandwidth",
        ["M", "K", "N", "kernel", "nuvec µs", "TFLOP/s", "% peak", "TB/s", "% peak", "tinygrad µs", "torch µs", "TFLOP/s",
         "vs torch"], max_calls)
    rng = np.random.default_rng(0)
    for m, k, n in grid:
        turn = rotation(moved_bytes(m, k, n), max_calls=max_calls)  # PyTorch's calls rotate alike
        weights = [Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16).contiguous().realize()
                   for _ in range(turn.sets)]
        xs = [Tensor(rng.standard_normal((m, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
              for _ in range(turn.calls)]
        calls = [(xs[i], weights[i % turn.sets]) for i in range(turn.calls)]
        ours = time_jit(fast.linear, calls, args.repeats)
        with compositions_only():
            composed = time_jit(fast.linear, calls, max(2, args.repeats // 2))
        torch_s = torch_seconds[(m, k, n)]
        row = f"| {m}{l2_marker(turn)} | {k} | {n} | {kernel_cell(m, k, n)} | " + rate_cells(m, k, n, ours, peak, peak_flops) + " " + optional_us(composed)
        row += f" {optional_us(torch_s)} {2 * m * k * n / torch_s / 1e12:.1f} | {torch_s / ours:.2f}x |" if torch_s else " - | - | - |"
        print(row, flush=True)
        lines.append(row)
        del weights, xs, calls
    return lines
