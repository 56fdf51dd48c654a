"""Quantized matrix products (`python -m nuvec_tg.bench quant`), two tables.

Products: decode products (M = 1 and 4) at (K, N) in {(4096, 4096), (4096, 14336), (14336, 4096)}
for affine 4-bit and 8-bit weights (groups of 64) and mxfp4, and products of more rows (M = 16,
64, 512 and 2048, affine 4-bit and mxfp4):
nuvec_tg's `quantized_matmul`, tinygrad's composition (dequantize, then matmul) and PyTorch's
bfloat16 matmul of the dense weights, timed on the device; weight bytes per second and the share
of peak bandwidth (decode), TFLOP/s (prefill).

MoE prefill: a 512-token prompt's expert products at real MoE sizes (Qwen3-30B-A3B: 128 experts,
top 8, hidden 2048, expert MLP 768, affine 4-bit in groups of 64; gpt-oss-20b: 32 experts, top 4,
hidden and expert MLP 2880, mxfp4), the fused gate/up projection and the down projection: the
tokens' rows sorted by expert (random routing, distinct experts a token) through
`quant.gather_qmm(..., sorted_indices=True)`, one launch over all experts (and Qwen3-30B-A3B's
bfloat16 experts through `quant.gather_mm`, the gathered dense kernel), beside PyTorch's dense
bfloat16 experts looped as transformers' eager MoE layers do (an expert's rows at a time, a CUDA
graph of the loop) and `torch._grouped_mm` over the same sorted rows where PyTorch has it; TFLOP/s
over the rows' products. Activations are bfloat16."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from .. import quant
from .common import COPIES, MAX_CALLS, cuda_torch, l2_marker, optional_us, part_of, rate_cells, release_torch, rotation, \
    start_table, time_jit, torch_graph_seconds

FORMATS = {"affine4": ("affine", 64, 4), "affine8": ("affine", 64, 8), "mxfp4": ("mxfp4", 32, 4)}
# model: (experts, top k, hidden, expert MLP width, format)
MOE_MODELS = {"qwen3_30b_a3b": (128, 8, 2048, 768, "affine4"), "gpt_oss_20b": (32, 4, 2880, 2880, "mxfp4")}
DENSE = "bfloat16"   # the MoE rows' dense experts (Qwen3-30B-A3B's checkpoint), through gather_mm
MOE_TOKENS = 512
PREFILL_ROWS = (16, 64, 512, 2048)          # qmm's rows (issue 23's table): few-row products to a long prompt's
PREFILL_FORMATS = ("affine4", "mxfp4")


def weight_bytes(fmt: str, k: int, n: int) -> int:
    """Packed codes plus scales (and biases), or a dense bfloat16 weight: what a product must read."""
    if fmt == DENSE: return 2 * n * k
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


def moe_grid(small: bool) -> list[tuple[str, str, int, int, int, int, int, str]]:
    """The MoE rows: (model, projection, experts, top k, tokens, K, N, format); gate_up's N is twice
    the expert MLP (gate and up fused), down's K the expert MLP."""
    models = {"tiny": (4, 2, 64, 64, "affine4")} if small else MOE_MODELS
    tokens = 8 if small else MOE_TOKENS
    rows = [row for name, (e, k, hidden, width, fmt) in models.items()
            for row in ((name, "gate_up", e, k, tokens, hidden, 2 * width, fmt), (name, "down", e, k, tokens, width, hidden, fmt))]
    first = next(iter(models))  # its dense checkpoint's experts too
    return rows + [row[:-1] + (DENSE,) for row in rows if row[0] == first]


def routing(rng, experts: int, top_k: int, tokens: int) -> np.ndarray:
    """Random routing: `top_k` distinct experts for each token, `[tokens, top_k]`."""
    return np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]


def sorted_rows(picks: np.ndarray, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a routing sorted by expert: each row's expert (int32) and each expert's row count."""
    ordered = np.sort(picks.reshape(-1)).astype(np.int32)
    return ordered, np.bincount(ordered, minlength=experts)


def time_torch_moe(experts: int, counts: np.ndarray, k: int, n: int, repeats: int) -> tuple[float | None, float | None]:
    """PyTorch's dense bfloat16 experts over rows sorted by expert: the looped form (one
    `F.linear` an expert, on its rows) and `torch._grouped_mm` (None where PyTorch lacks it or it
    fails); seconds per call, or (None, None) without PyTorch on a GPU."""
    torch = cuda_torch()
    if torch is None: return None, None
    rows = int(counts.sum())
    w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()

    def looped():
        for e in range(experts):
            if bounds[e + 1] > bounds[e]: y[bounds[e]:bounds[e + 1]] = torch.nn.functional.linear(x[bounds[e]:bounds[e + 1]], w[e])
    seconds = torch_graph_seconds(looped, 1, repeats)
    grouped = None
    if hasattr(torch, "_grouped_mm"):
        offsets = torch.tensor(bounds[1:], device="cuda", dtype=torch.int32)
        w_t = w.transpose(-2, -1)
        try:
            grouped = torch_graph_seconds(lambda: torch._grouped_mm(x, w_t, offs=offsets), 1, repeats)
        except Exception as error:  # noqa: BLE001 - a PyTorch or GPU without it
            print(f"torch._grouped_mm failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
    del w, x, y
    return seconds, grouped


def moe_torch(args) -> tuple[dict, dict]:
    """The MoE rows' routings (rows sorted by expert) and PyTorch's timings of them, taken before
    tinygrad opens the GPU: PyTorch's CUDA graphs fail in a process where tinygrad already has
    ("invalid resource handle")."""
    grid = moe_grid(args.small)
    if args.quick: grid = grid[:2]
    rng = np.random.default_rng(1)
    routes = {row: sorted_rows(routing(rng, row[2], row[3], row[4]), row[2]) for row in grid}
    torch_seconds = {row: time_torch_moe(row[2], routes[row][1], row[5], row[6], args.repeats) for row in grid}
    return routes, torch_seconds


def moe_table(args, rng, routes: dict, torch_seconds: dict) -> list[str]:
    """The MoE prefill table (see the module's docstring) over `moe_torch`'s routings and timings."""
    grid = list(routes)
    lines, _ = start_table(
        f"MoE prefill: {grid[0][4]} tokens' expert products, rows sorted by expert (x bfloat16)",
        f"µs per call (best of {args.repeats} replays: TinyJit for ours, `quant.gather_qmm` with sorted indices over "
        "every expert at once, `quant.gather_mm` for the bfloat16 rows (the bank read as its rows); a CUDA graph for PyTorch's dense bfloat16 experts, looped an expert at a time as "
        "transformers' eager MoE layers do, and `torch._grouped_mm`); TFLOP/s over the rows' products",
        ["model", "projection", "rows (experts / top k)", "format", "nuvec µs", "TFLOP/s", "torch looped µs",
         "torch grouped µs", "vs looped", "vs grouped"], COPIES if args.small else MAX_CALLS)
    for row in grid:
        name, projection, experts, top_k, tokens, k, n, fmt = row
        ordered, _ = routes[row]
        w = Tensor(rng.standard_normal((experts, n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16)
        if fmt == DENSE: mode, group, bits, qw = None, 0, 16, None
        else:
            mode, group, bits = FORMATS[fmt]
            qw = quant.quantize(w, group, bits, mode=mode)
        parts = (w.contiguous().realize(),) if qw is None else \
            tuple(p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases) if p is not None)
        moved = weight_bytes(fmt, k, n) * experts
        turn = rotation(moved, max_calls=COPIES)  # the weights are one set: the experts together pass the L2 at real sizes
        xs = [Tensor(rng.standard_normal((len(ordered), 1, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
              for _ in range(turn.sets)]
        picks = Tensor(ordered).realize()
        calls = [(xs[i % turn.sets], picks, *parts) for i in range(turn.calls)]

        def product(x, picks, *p):
            if mode is None: return quant.gather_mm(x, p[0].transpose(-1, -2), rhs_indices=picks, sorted_indices=True)
            weight = quant.QuantizedWeight(p[0], p[1], p[2] if len(p) > 2 else None, mode, group, bits)
            return quant.gather_qmm(x, weight, rhs_indices=picks, sorted_indices=True)
        ours = time_jit(product, calls, args.repeats)
        looped, grouped = torch_seconds[row]
        flops = 2 * len(ordered) * n * k
        cells = [f"{name}{l2_marker(turn)}", projection, f"{len(ordered)} ({experts} / {top_k})", fmt]
        line = "| " + " | ".join(cells) + f" | {optional_us(ours)} {flops / ours / 1e12:.1f} | {optional_us(looped)} " \
            + optional_us(grouped) + (f" {looped / ours:.2f}x |" if looped else " - |") + (f" {grouped / ours:.2f}x |" if grouped else " - |")
        print(line, flush=True)
        lines.append(line)
        del w, qw, parts, xs, calls
    return lines


def run(args) -> list[str]:
    shapes = [(4096, 4096), (4096, 14336), (14336, 4096)]
    grid = [(m, k, n, fmt) for fmt in FORMATS for m in (1, 4) for k, n in shapes]
    grid += [(m, k, n, fmt) for fmt in PREFILL_FORMATS for m in PREFILL_ROWS for k, n in shapes]
    if args.quick: grid = [(1, 4096, 4096, fmt) for fmt in FORMATS] + [(512, 4096, 4096, "affine4")]
    if args.small: grid = [(1, 256, 128, "affine4"), (2, 256, 128, "mxfp4"), (16, 256, 128, "mxfp4")]
    grid = part_of(grid, args.part, args.batches)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    torch_seconds = {(m, k, n): time_torch(m, k, n, args.repeats, max_calls) for m, k, n, _ in grid}
    moe_routes, moe_seconds = ({}, {}) if getattr(args, "no_moe", False) else moe_torch(args)
    release_torch()
    lines, peak = start_table(
        "Quantized products y = x · wᵀ (x bfloat16)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated weights: TinyJit for ours, a CUDA "
        "graph for PyTorch's dense bfloat16 matmul), weight bytes per second and share of peak, and TFLOP/s",
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
    print(flush=True)
    return lines + ([""] + moe_table(args, rng, moe_routes, moe_seconds) if moe_routes else [])
