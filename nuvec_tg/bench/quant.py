"""Quantized matrix products (`python -m nuvec_tg.bench quant`): decode products (M = 1 and 4) at
(K, N) in {(4096, 4096), (4096, 14336), (14336, 4096)} for affine 4-bit and 8-bit weights (groups
of 64) and mxfp4, and prefill products (M = 512): nuvec_tg's `quantized_matmul`, tinygrad's
composition (dequantize, then matmul) and PyTorch's bfloat16 matmul of the dense weights, timed on
the device; weight bytes per second and the share of peak bandwidth (decode), TFLOP/s (prefill).
Activations are bfloat16."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from .. import quant
from .common import COPIES, MAX_CALLS, cuda_torch, l2_marker, optional_us, part_of, rate_cells, release_torch, rotation, \
    start_table, time_jit, torch_graph_seconds

FORMATS = {"affine4": ("affine", 64, 4), "affine8": ("affine", 64, 8), "mxfp4": ("mxfp4", 32, 4)}


def weight_bytes(fmt: str, k: int, n: int) -> int:
    """Packed codes plus scales (and biases): what a product must read."""
    mode, group, bits = FORMATS[fmt]
    return n * k * bits // 8 + (n * k // group) * (4 if mode == "affine" else 1)


def dense_bytes(k: int, n: int) -> int:
    """The dense bfloat16 weights PyTorch's product reads."""
    return n * k * 2


def time_torch(m: int, k: int, n: int, repeats: int, max_calls: int = MAX_CALLS) -> float | None:
    """PyTorch's dense bfloat16 `x @ wᵀ` per call, over weights rotated by `rotation`, or None."""
    torch = cuda_torch()
    if torch is None: return None
    turn = rotation(dense_bytes(k, n), max_calls=max_calls)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(turn.sets)]
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(turn.calls)]

    def run():
        for i, x in enumerate(xs): torch.nn.functional.linear(x, weights[i % turn.sets])
    return torch_graph_seconds(run, turn.calls, repeats)


def run(args) -> list[str]:
    shapes = [(4096, 4096), (4096, 14336), (14336, 4096)]
    grid = [(m, k, n, fmt) for fmt in FORMATS for m in (1, 4) for k, n in shapes]
    grid += [(512, k, n, "affine4") for k, n in shapes]
    if args.quick: grid = [(1, 4096, 4096, fmt) for fmt in FORMATS] + [(512, 4096, 4096, "affine4")]
    if args.small: grid = [(1, 256, 128, "affine4"), (2, 256, 128, "mxfp4")]
    grid = part_of(grid, args.part, args.batches)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    torch_seconds = {(m, k, n): time_torch(m, k, n, args.repeats, max_calls) for m, k, n, _ in grid}
    release_torch()
    lines, peak = start_table(
        "Quantized products y = x · wᵀ (x bfloat16)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated weights: TinyJit for ours, a CUDA "
        "graph for PyTorch's dense bfloat16 matmul), weight bytes per second and share of peak; TFLOP/s for M = 512",
        ["M", "K", "N", "format", "nuvec µs", "TB/s", "% peak", "TFLOP/s", "composition µs", "torch bf16 µs", "vs torch"],
        max_calls)
    rng = np.random.default_rng(0)
    for m, k, n, fmt in grid:
        mode, group, bits = FORMATS[fmt]
        moved = weight_bytes(fmt, k, n)
        turn = rotation(moved, max_calls=max_calls)
        weights = []
        for _ in range(turn.sets):
            w = Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16)
            qw = quant.quantize(w, group, bits, mode=mode)
            weights.append(quant.QuantizedWeight(*(None if p is None else p.contiguous().realize()
                                                   for p in (qw.weight, qw.scales, qw.biases)), mode, group, bits))
        xs = [Tensor(rng.standard_normal((m, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
              for _ in range(turn.calls)]
        parts = lambda qw: (qw.weight, qw.scales) + ((qw.biases,) if qw.biases is not None else ())  # noqa: E731
        calls = [(xs[i], *parts(weights[i % turn.sets])) for i in range(turn.calls)]
        rebuild = lambda parts_: quant.QuantizedWeight(parts_[0], parts_[1], parts_[2] if len(parts_) > 2 else None,  # noqa: E731
                                                       mode, group, bits)
        ours = time_jit(lambda x, *p: quant.quantized_matmul(x, rebuild(p)), calls, args.repeats)
        composed = time_jit(lambda x, *p: x @ quant.dequantize(rebuild(p), dtypes.bfloat16).T, calls, max(2, args.repeats // 2))
        torch_s = torch_seconds[(m, k, n)]
        flops = 2 * m * n * k / ours / 1e12
        torch_turn = rotation(dense_bytes(k, n), max_calls=max_calls)  # marks the row when either side stays in L2
        marker = l2_marker(turn, torch_turn) if torch_s else l2_marker(turn)
        row = f"| {m}{marker} | {k} | {n} | {fmt} | " + rate_cells(ours, moved, peak) + f" {flops:.1f} | "
        row += optional_us(composed) + " " + optional_us(torch_s)
        row += f" {torch_s / ours:.2f}x |" if torch_s else " - |"
        print(row, flush=True)
        lines.append(row)
        del weights, xs, calls
    return lines
