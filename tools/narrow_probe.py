"""Few rows of a 4-bit product (a batched decode step's, issue 26): qmv, which the plan takes up
to 8 rows, against qmm on the matrix units at the same rows, at Qwen3-8B's projections, timed as
the benchmarks time a product (TinyJit replays of calls over rotated weight sets, device time).

Usage: DEV=CUDA python3 tools/narrow_probe.py [--rows 2,4,8] [--repeats 3]
"""
from __future__ import annotations

import argparse

from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from nuvec_tg.bench.common import device_name, rotation, time_jit, warm_up
from nuvec_tg.kernels import quant as qk

SHAPES = ((4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096))   # K x N: qkv, o, gate_up, down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{device_name()}; µs a call, device time of TinyJit replays over rotated 4-bit weights (affine, groups of 64)")
    print("| M | K x N | qmv µs | qmm µs | qmm / qmv |")
    print("|---|---|---|---|---|")
    warm_up()
    for k, n in SHAPES:
        sets = rotation(n * k // 2).sets
        weights = [quant.quantize(Tensor.randn(n, k, dtype=dtypes.bfloat16) * 0.02, 64, 4) for _ in range(sets)]
        tensors = [(w.weight.realize(), w.scales.realize(), w.biases.realize()) for w in weights]
        for rows in (int(r) for r in args.rows.split(",")):
            x = Tensor.randn(rows, k, dtype=dtypes.bfloat16).realize()
            common = dict(mode="affine", group_size=64, bits=4, out_dtype=dtypes.bfloat16, backend="cuda")
            calls = [(x, *t) for t in tensors]
            a = time_jit(lambda x, w, s, b: qk.qmv(x, w, s, b, **common), calls, args.repeats)
            c = time_jit(lambda x, w, s, b: qk.qmm(x, w, s, b, **common), calls, args.repeats)
            print(f"| {rows} | {k} x {n} | {a * 1e6:.1f} | {c * 1e6:.1f} | {c / a:.2f} |", flush=True)


if __name__ == "__main__":
    main()
