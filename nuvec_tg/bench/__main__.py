"""`python -m nuvec_tg.bench attention [--quick] [--markdown FILE]`: decode attention on the default
device: nuvec_tg, tinygrad's `Tensor.scaled_dot_product_attention` and PyTorch's (when importable),
each timed on the device, with the K/V bytes moved per second and the fraction of peak bandwidth."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes

from .. import fast

PEAK_BANDWIDTH = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}
COPIES = 16  # independent calls per timed replay, so that launches, not Python, set the pace


def device_name() -> str:
    try:
        import torch
        if torch.cuda.is_available(): return torch.cuda.get_device_name()
    except ImportError:
        pass
    return Device.DEFAULT


def time_tinygrad(attend, q_list, k, v, repeats: int) -> float:
    """Seconds per call: `COPIES` calls on distinct queries per TinyJit replay."""
    @TinyJit
    def step(*queries):
        outs = [attend(q, k, v) for q in queries]
        Tensor.realize(*outs)
        return outs[0]
    for _ in range(3): step(*q_list)
    Device[Device.DEFAULT].synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step(*q_list)
        Device[Device.DEFAULT].synchronize()
        best = min(best, time.perf_counter() - start)
    return best / len(q_list)


def time_torch(b, hq, hkv, lk, d, dtype_name, repeats: int) -> float | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available(): return None
    dtype = getattr(torch, dtype_name)
    q = [torch.randn(b, hq, 1, d, device="cuda", dtype=dtype) for _ in range(COPIES)]
    k = torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, hkv, lk, d, device="cuda", dtype=dtype)
    def run():
        for x in q: F.scaled_dot_product_attention(x, k, v, enable_gqa=hq != hkv)
    for _ in range(3): run()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); run(); end.record(); torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best / COPIES


def attention(args) -> list[str]:
    grid = [(b, hq, hkv, 128, lk, dt) for dt in ("bfloat16", "float16") for b in (1, 8, 32)
            for hq, hkv in ((32, 8), (32, 4), (16, 2), (64, 8)) for lk in (1024, 4096, 16384, 65536)
            if dt == "bfloat16" or (b == 1 and hq == 32)]
    grid += [(1, 32, 8, d, lk, "bfloat16") for d in (64, 256) for lk in (4096, 65536)]
    if args.quick: grid = [g for g in grid if g[0] == 1 and g[1] == 32 and g[2] == 8 and g[5] == "bfloat16"]
    name = device_name()
    peak = PEAK_BANDWIDTH.get(name)
    commit = os.environ.get("NUVEC_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                               text=True).stdout.strip()
    lines = [f"Decode attention (Lq = 1, no mask) on {name} ({Device.DEFAULT}), commit {commit or 'unknown'}; "
             f"µs per call (best of {args.repeats} replays of {COPIES} calls), K/V TB/s and share of peak "
             f"{'%.1f TB/s' % (peak / 1e12) if peak else '(unknown)'}.", "",
             "| B | Hq/Hkv | D | Lk | dtype | plan | nuvec µs | TB/s | % peak | tinygrad µs | torch µs | vs torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rng = np.random.default_rng(0)
    for b, hq, hkv, d, lk, dt in grid:
        dtype = getattr(dtypes, dt)
        make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtype).contiguous().realize()  # noqa: E731
        q_list = [make(b, hq, 1, d) for _ in range(COPIES)]
        k, v = make(b, hkv, lk, d), make(b, hkv, lk, d)
        plan = fast.plan_attention(q_list[0].shape, k.shape, v.shape, dtype)
        ours = time_tinygrad(lambda q, k, v: fast.scaled_dot_product_attention(q, k, v, d ** -0.5), q_list, k, v, args.repeats)
        theirs = None
        if b * lk <= 8 * 16384:  # tinygrad's composition materialises every score: only the smaller shapes
            theirs = time_tinygrad(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=hq != hkv), q_list, k, v,
                                   max(2, args.repeats // 2))
        torch_s = time_torch(b, hq, hkv, lk, d, dt, args.repeats)
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
        del q_list, k, v
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
