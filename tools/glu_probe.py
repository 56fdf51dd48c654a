"""Whether SwiGLU's activation pays inside the down projection's loads (issue 26): `swiglu_matmul`
with the activation in qmv's (dense: gemv's) loads of x, against the activation as its own
kernel then the plain product, at a gated MLP's down projection, both timed as the benchmarks time
a product (TinyJit replays of calls over rotated weight sets, device time).

Usage: DEV=CUDA python3 tools/glu_probe.py [--shapes 12288x4096] [--rows 1,8] [--repeats 5]
"""
from __future__ import annotations

import argparse

from tinygrad import Tensor, dtypes

from nuvec_tg import fast, kernels, quant
from nuvec_tg.bench.common import device_name, rotation, time_jit, warm_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="12288x4096,9728x2560", help="KxN,... (the down projection's input and output)")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{device_name()}; µs a call, device time of TinyJit replays over rotated weights")
    print("| format | M | K x N | fused µs | activation, then product µs | fused / unfused |")
    print("|---|---|---|---|---|---|")
    warm_up()
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for form in ("q4", "dense"):
            dense = Tensor.randn(n, k, dtype=dtypes.bfloat16).realize() * 0.02
            weight = quant.quantize(dense, 64, 4) if form == "q4" else dense.realize()
            call_bytes = n * k // 2 if form == "q4" else n * k * 2
            sets = rotation(call_bytes).sets
            weights = [weight] + [quant.quantize(Tensor.randn(n, k, dtype=dtypes.bfloat16) * 0.02, 64, 4) if form == "q4"
                                  else (Tensor.randn(n, k, dtype=dtypes.bfloat16) * 0.02).realize() for _ in range(sets - 1)]
            tensors = [tuple(t for t in ((w.weight, w.scales, w.biases) if form == "q4" else (w,))) for w in weights]
            for t in tensors: Tensor.realize(*t)
            for rows in (int(r) for r in args.rows.split(",")):
                x = Tensor.randn(rows, 2 * k, dtype=dtypes.bfloat16).realize()

                def weight_of(parts):
                    if form == "dense": return parts[0]
                    return quant.QuantizedWeight(parts[0], parts[1], parts[2], "affine", 64, 4)

                def fused(x, *parts):
                    return quant.swiglu_matmul(x, weight_of(parts))

                def unfused(x, *parts):
                    activated = (x[:, :k].silu() * x[:, k:]).contiguous()
                    w = weight_of(parts)
                    return fast.linear(activated, w) if form == "dense" else quant.quantized_matmul(activated, w)
                calls = [(x, *t) for t in tensors]
                with kernels.record_launches() as launches:
                    fused(x, *tensors[0]).realize()
                if not any("glu" in label or "swiglu" in label for _, label in launches):
                    print(f"  (the fused route did not run for {form} M {rows} {k}x{n}: {[label for _, label in launches]})")
                a = time_jit(fused, calls, args.repeats)
                b = time_jit(unfused, calls, args.repeats)
                print(f"| {form} | {rows} | {k} x {n} | {a * 1e6:.1f} | {b * 1e6:.1f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
