"""Decode attention (`python -m nuvec_tg.bench attention`): nuvec_tg, tinygrad's
`Tensor.scaled_dot_product_attention` and PyTorch's (when importable), each timed on the device,
with the K/V bytes moved per second and the fraction of peak bandwidth. The timed calls rotate
over enough K/V sets that they read memory, not the L2 cache (`common.rotation`)."""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from .. import fast
from .common import COPIES, MAX_CALLS, cuda_torch, l2_marker, optional_us, part_of, rate_cells, release_torch, \
    rotation, start_table, time_jit, torch_graph_seconds


def kv_bytes(b: int, hkv: int, lk: int, d: int, itemsize: int) -> int:
    """The K and V bytes a decode call reads."""
    return 2 * b * hkv * lk * d * itemsize


def kv_sets(rng, b, hq, hkv, lk, d, dtype, max_calls: int = MAX_CALLS) -> list[tuple[Tensor, Tensor, Tensor]]:
    """The (q, k, v) triples of one timed replay, `rotation(...).calls` of them: distinct queries,
    and as many distinct K/V pairs as `rotation` asks, so that a call reads its K/V from memory, as
    a decode step's layers do, and not from the L2 cache. q `[b, hq, 1, d]`, k and v
    `[b, hkv, lk, d]`, all `dtype`."""
    make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtype).contiguous().realize()  # noqa: E731
    turn = rotation(kv_bytes(b, hkv, lk, d, dtype.itemsize), max_calls=max_calls)
    pairs = [(make(b, hkv, lk, d), make(b, hkv, lk, d)) for _ in range(turn.sets)]
    return [(make(b, hq, 1, d), *pairs[i % turn.sets]) for i in range(turn.calls)]


def time_torch(b, hq, hkv, lk, d, dtype_name, repeats: int, max_calls: int = MAX_CALLS) -> float | None:
    """PyTorch's `scaled_dot_product_attention` per call (rotated as `kv_sets`), or None without
    PyTorch and a GPU."""
    torch = cuda_torch()
    if torch is None: return None
    import torch.nn.functional as F
    dtype = getattr(torch, dtype_name)
    # cuDNN's attention fails on its second shape after a CUDA graph capture (seen with PyTorch
    # 2.11 on the H200): PyTorch picks among its flash, memory-efficient and math kernels instead.
    torch.backends.cuda.enable_cudnn_sdp(False)
    turn = rotation(kv_bytes(b, hkv, lk, d, dtype.itemsize), max_calls=max_calls)
    pairs = [(torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype), torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype))
             for _ in range(turn.sets)]
    q = [torch.randn(b, hq, 1, d, device="cuda", dtype=dtype) for _ in range(turn.calls)]

    def run():
        for i, x in enumerate(q):
            k, v = pairs[i % turn.sets]
            F.scaled_dot_product_attention(x, k, v, enable_gqa=hq != hkv)
    return torch_graph_seconds(run, turn.calls, repeats)


def torch_times(shapes, repeats: int, max_calls: int = MAX_CALLS) -> dict:
    """PyTorch's seconds per call for each `(b, hq, hkv, d, lk, dtype name)`, all measured before
    tinygrad opens the device: tinygrad makes its own CUDA context current, in which PyTorch's
    streams are invalid handles."""
    times = {shape: time_torch(*shape[:3], shape[4], shape[3], shape[5], repeats, max_calls) for shape in shapes}
    release_torch()
    return times


def run(args) -> list[str]:
    """The table's lines (printed as they come)."""
    grid = [(b, hq, hkv, 128, lk, dt) for dt in ("bfloat16", "float16") for b in (1, 8, 32)
            for hq, hkv in ((32, 8), (32, 4), (16, 2), (64, 8)) for lk in (1024, 4096, 16384, 65536)
            if dt == "bfloat16" or (b == 1 and hq == 32)]
    grid += [(1, 32, 8, d, lk, "bfloat16") for d in (64, 256) for lk in (4096, 65536)]
    if args.quick: grid = [g for g in grid if g[0] == 1 and g[1] == 32 and g[2] == 8 and g[5] == "bfloat16"]
    if args.small: grid = [(1, 4, 2, 64, 256, "float32")]
    grid = part_of(grid, args.part, args.batches)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    torch_seconds = torch_times(grid, args.repeats, max_calls)
    lines, peak = start_table(
        "Decode attention (Lq = 1, no mask)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated K/V sets: TinyJit for nuvec_tg and "
        "tinygrad, a CUDA graph for PyTorch), K/V TB/s and share of peak",
        ["B", "Hq/Hkv", "D", "Lk", "dtype", "plan", "nuvec µs", "TB/s", "% peak", "tinygrad µs", "torch µs", "vs torch"],
        max_calls)
    rng = np.random.default_rng(0)
    for b, hq, hkv, d, lk, dt in grid:
        dtype = getattr(dtypes, dt)
        turn = rotation(kv_bytes(b, hkv, lk, d, dtype.itemsize), max_calls=max_calls)  # both sides rotate alike
        sets = kv_sets(rng, b, hq, hkv, lk, d, dtype, max_calls)
        plan = fast.plan_attention(sets[0][0].shape, sets[0][1].shape, sets[0][2].shape, dtype)
        ours = time_jit(lambda q, k, v: fast.scaled_dot_product_attention(q, k, v, d ** -0.5), sets, args.repeats)
        theirs = None
        if b * lk <= 8 * 16384:  # tinygrad's composition materialises every score: only the smaller shapes
            theirs = time_jit(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=hq != hkv), sets,
                              max(2, args.repeats // 2))
        torch_s = torch_seconds[(b, hq, hkv, d, lk, dt)]
        kernel = plan.kernel
        plan_text = f"{type(kernel).__name__}" + (f" {kernel.passes}p/{kernel.blocks}{' mma' if kernel.matrix else ''}" if isinstance(kernel, fast.Vector) else "")
        row = f"| {b}{l2_marker(turn)} | {hq}/{hkv} | {d} | {lk} | {dt} | {plan_text} | " + \
            rate_cells(ours, kv_bytes(b, hkv, lk, d, dtype.itemsize), peak)
        row += " " + optional_us(theirs)
        row += f" {torch_s * 1e6:.1f} | {torch_s / ours:.2f}x |" if torch_s else " - | - |"
        print(row, flush=True)
        lines.append(row)
        del sets
    return lines
