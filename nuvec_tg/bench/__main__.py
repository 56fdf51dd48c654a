"""`python -m nuvec_tg.bench attention [--quick] [--markdown FILE]`: decode attention on the default
device: nuvec_tg, tinygrad's `Tensor.scaled_dot_product_attention` and PyTorch's (when importable),
each timed on the device, with the K/V bytes moved per second and the fraction of peak bandwidth.
The timed calls rotate over enough K/V sets that they read memory, not the L2 cache."""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import time

import numpy as np
from tinygrad import Device, GlobalCounters, Tensor, TinyJit, dtypes
from tinygrad.helpers import Context

from .. import fast

PEAK_BANDWIDTH = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}
COPIES = 16  # independent calls per timed replay, so that launches, not Python, set the pace
KV_ROTATION_BYTES = 256 << 20


def device_name() -> str:
    try:
        import torch
        if torch.cuda.is_available(): return torch.cuda.get_device_name()
    except ImportError:
        pass
    return Device.DEFAULT


def kv_sets(rng, b, hq, hkv, lk, d, dtype) -> list[tuple[Tensor, Tensor, Tensor]]:
    """`COPIES` (q, k, v) triples for the timed calls: distinct queries, and as many distinct K/V
    pairs as keep the calls' K/V bytes at least 4x the largest GPU L2 caches (256 MB), so that a
    call reads its K/V from memory, as a decode step's layers do, and not from the cache."""
    make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtype).contiguous().realize()  # noqa: E731
    kv_bytes = 2 * b * hkv * lk * d * dtype.itemsize
    pairs = [(make(b, hkv, lk, d), make(b, hkv, lk, d)) for _ in range(min(COPIES, -(-KV_ROTATION_BYTES // kv_bytes)))]
    return [(make(b, hq, 1, d), *pairs[i % len(pairs)]) for i in range(COPIES)]


def warm_up(seconds: float = 0.5) -> None:
    """Keep the device busy for a moment so that its clocks are up before anything is timed (an
    idle GPU runs its first microseconds of work at a fraction of its clock)."""
    a = Tensor.rand(4096, 4096, dtype=dtypes.float16).realize()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end: (a @ a).realize()
    Device[Device.DEFAULT].synchronize()


def device_seconds(run) -> float:
    """The device time of `run()`'s launches, as tinygrad measures it at DEBUG=2 (events around
    each launch; a TinyJit replay is one graph launch), without its printing: the host's own
    replay overhead is left out, as it is from the CUDA-event times of PyTorch's graph replays."""
    before = GlobalCounters.time_sum_s
    with Context(DEBUG=2), contextlib.redirect_stdout(io.StringIO()): run()
    return GlobalCounters.time_sum_s - before


def time_tinygrad(attend, sets, repeats: int) -> float:
    """Device seconds per call: the calls of `sets` in one TinyJit replay, the best of `repeats`."""
    unique = list({id(t): t for triple in sets for t in triple}.values())  # TinyJit takes each buffer once
    position = {id(t): i for i, t in enumerate(unique)}
    calls = [tuple(position[id(t)] for t in triple) for triple in sets]

    @TinyJit
    def step(*tensors):
        outs = [attend(*(tensors[i] for i in call)) for call in calls]
        Tensor.realize(*outs)
        return outs[0]
    for _ in range(3): step(*unique)
    Device[Device.DEFAULT].synchronize()
    return min(device_seconds(lambda: step(*unique)) for _ in range(repeats)) / len(sets)


def time_torch(b, hq, hkv, lk, d, dtype_name, repeats: int) -> float | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available(): return None
    dtype = getattr(torch, dtype_name)
    # cuDNN's attention fails on its second shape after a CUDA graph capture (seen with PyTorch
    # 2.11 on the H200): PyTorch picks among its flash, memory-efficient and math kernels instead.
    torch.backends.cuda.enable_cudnn_sdp(False)
    kv_bytes = 2 * b * hkv * lk * d * dtype.itemsize
    pairs = [(torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype), torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype))
             for _ in range(min(COPIES, -(-KV_ROTATION_BYTES // kv_bytes)))]
    q = [torch.randn(b, hq, 1, d, device="cuda", dtype=dtype) for _ in range(COPIES)]
    def run():
        for i, x in enumerate(q):
            k, v = pairs[i % len(pairs)]
            F.scaled_dot_product_attention(x, k, v, enable_gqa=hq != hkv)
    side = torch.cuda.Stream()  # warm up off the default stream before capturing, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3): run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    # Replayed as a CUDA graph, as our calls are by TinyJit: kernel time, not Python's launches.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): run()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); graph.replay(); end.record(); torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best / COPIES


def torch_times(shapes, repeats: int) -> dict:
    """PyTorch's seconds per call for each `(b, hq, hkv, d, lk, dtype name)`, all measured before
    tinygrad opens the device: tinygrad makes its own CUDA context current, in which PyTorch's
    streams are invalid handles."""
    times = {shape: time_torch(*shape[:3], shape[4], shape[3], shape[5], repeats) for shape in shapes}
    try:
        import torch
        torch.cuda.empty_cache()
    except ImportError:
        pass
    return times


def attention(args) -> list[str]:
    grid = [(b, hq, hkv, 128, lk, dt) for dt in ("bfloat16", "float16") for b in (1, 8, 32)
            for hq, hkv in ((32, 8), (32, 4), (16, 2), (64, 8)) for lk in (1024, 4096, 16384, 65536)
            if dt == "bfloat16" or (b == 1 and hq == 32)]
    grid += [(1, 32, 8, d, lk, "bfloat16") for d in (64, 256) for lk in (4096, 65536)]
    if args.quick: grid = [g for g in grid if g[0] == 1 and g[1] == 32 and g[2] == 8 and g[5] == "bfloat16"]
    torch_seconds = torch_times(grid, args.repeats)
    name = device_name()
    peak = PEAK_BANDWIDTH.get(name)
    commit = os.environ.get("NUVEC_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                               text=True).stdout.strip()
    lines = [f"Decode attention (Lq = 1, no mask) on {name} ({Device.DEFAULT}), commit {commit or 'unknown'}; "
             f"µs per call (best of {args.repeats} replays of {COPIES} calls over rotated K/V sets: TinyJit for "
             f"nuvec_tg and tinygrad, a CUDA graph for PyTorch), K/V TB/s and share of peak "
             f"{'%.1f TB/s' % (peak / 1e12) if peak else '(unknown)'}.", "",
             "| B | Hq/Hkv | D | Lk | dtype | plan | nuvec µs | TB/s | % peak | tinygrad µs | torch µs | vs torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    warm_up()
    rng = np.random.default_rng(0)
    for b, hq, hkv, d, lk, dt in grid:
        dtype = getattr(dtypes, dt)
        sets = kv_sets(rng, b, hq, hkv, lk, d, dtype)
        plan = fast.plan_attention(sets[0][0].shape, sets[0][1].shape, sets[0][2].shape, dtype)
        ours = time_tinygrad(lambda q, k, v: fast.scaled_dot_product_attention(q, k, v, d ** -0.5), sets, args.repeats)
        theirs = None
        if b * lk <= 8 * 16384:  # tinygrad's composition materialises every score: only the smaller shapes
            theirs = time_tinygrad(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=hq != hkv), sets,
                                   max(2, args.repeats // 2))
        torch_s = torch_seconds[(b, hq, hkv, d, lk, dt)]
        kv_bytes = 2 * b * hkv * lk * d * dtype.itemsize
        rate = kv_bytes / ours
        kernel = plan.kernel
        plan_text = f"{type(kernel).__name__}" + (f" {kernel.passes}p/{kernel.blocks}" if isinstance(kernel, fast.Vector) else "")
        row = (f"| {b} | {hq}/{hkv} | {d} | {lk} | {dt} | {plan_text} | {ours * 1e6:.1f} | {rate / 1e12:.2f} | "
               f"{100 * rate / peak:.0f}% | " if peak else f"| {b} | {hq}/{hkv} | {d} | {lk} | {dt} | {plan_text} | "
               f"{ours * 1e6:.1f} | {rate / 1e12:.2f} | - | ")
        row += f"{theirs * 1e6:.1f} | " if theirs else "- | "
        row += f"{torch_s * 1e6:.1f} | {torch_s / ours:.2f}x |" if torch_s else "- | - |"
        print(row, flush=True)
        lines.append(row)
        del sets
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m nuvec_tg.bench", description=__doc__)
    parser.add_argument("what", choices=["attention"])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    lines = attention(args)
    if args.markdown:
        with open(args.markdown, "w") as f: f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
