"""Few rows of a 4-bit product (a batched decode step's, issue 26): qmv (the vector kernel, the plan's
up to 8 rows) against qmv_mma (the matrix units) and qmm at the same rows, at Qwen3-8B's
projections, timed as the benchmarks time a product (TinyJit replays of calls over rotated weight
sets, device time), with the bandwidth each reaches reading its weights, and qmv_mma without its
two-codes-at-a-time decoding (PAIRS).

Usage: DEV=CUDA python3 tools/narrow_probe.py [--rows 1,2,4,8] [--repeats 3] [--sweep] [--qmm]
  --sweep: qmv_mma at every plan of `tests/kernel_specialisations.QMV_MMA_PROBE_PLANS` too (8 rows)
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from nuvec_tg.bench.common import device_name, rotation, time_jit, warm_up
from nuvec_tg.kernels import quant as qk

SHAPES = ((4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096))   # K x N: qkv, o, gate_up, down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--qmm", action="store_true", help="time qmm at the same rows too")
    args = parser.parse_args()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from kernel_specialisations import QMV_MMA_PROBE_PLANS
    print(f"{device_name()}; µs a call, device time of TinyJit replays over rotated 4-bit weights (affine, groups of 64); "
          "TB/s: the weights' bytes (codes, scales, biases) over the time")
    print("| M | K x N | qmv µs | qmv_mma µs (plan) | qmv / qmv_mma | qmv_mma TB/s | qmv_mma without PAIRS µs |"
          + (" qmm µs |" if args.qmm else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.qmm else ""))
    warm_up()
    common = dict(mode="affine", group_size=64, bits=4, out_dtype=dtypes.bfloat16, backend="cuda")
    for k, n in SHAPES:
        weight_bytes = n * k // 2 + 2 * 2 * n * k // 64
        sets = rotation(weight_bytes).sets
        weights = [quant.quantize(Tensor.randn(n, k, dtype=dtypes.bfloat16) * 0.02, 64, 4) for _ in range(sets)]
        tensors = [(w.weight.realize(), w.scales.realize(), w.biases.realize()) for w in weights]
        for rows in (int(r) for r in args.rows.split(",")):
            x = Tensor.randn(rows, k, dtype=dtypes.bfloat16).realize()
            calls = [(x, *t) for t in tensors]
            vector = time_jit(lambda x, w, s, b: qk.qmv(x, w, s, b, **common), calls, args.repeats)
            plans = [qk.qmv_mma_plan(k, n)] + ([p for p in QMV_MMA_PROBE_PLANS if p != qk.qmv_mma_plan(k, n)]
                                               if args.sweep and rows == 8 else [])
            timed = []
            for plan in plans:
                seconds = time_jit(lambda x, w, s, b, plan=plan: qk.qmv_mma(x, w, s, b, mma_plan=plan, **common), calls, args.repeats)
                timed.append((seconds, plan))
                if args.sweep and rows == 8: print(f"  sweep M{rows} {k}x{n} {plan}: {seconds * 1e6:.1f} µs", flush=True)
            best, plan = min(timed, key=lambda t: t[0])
            default = timed[0][0]
            line = (f"| {rows} | {k} x {n} | {vector * 1e6:.1f} | {default * 1e6:.1f} ({timed[0][1]})"
                    + (f", best {best * 1e6:.1f} ({plan})" if len(timed) > 1 else "")
                    + f" | {vector / default:.2f} | {weight_bytes / default / 1e12:.2f} |")
            general = time_jit(lambda x, w, s, b: qk.qmv_mma(x, w, s, b, pairs=False, **common), calls, args.repeats)
            line += f" {general * 1e6:.1f} |"
            if args.qmm and rows > 1:
                line += f" {time_jit(lambda x, w, s, b: qk.qmm(x, w, s, b, **common), calls, args.repeats) * 1e6:.1f} |"
            print(line, flush=True)


if __name__ == "__main__":
    main()
