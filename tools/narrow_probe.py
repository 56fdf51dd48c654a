"""Few rows of a 4-bit product (a batched decode step's, issue 26): qmv (the vector kernel, the plan's
up to 8 rows) against qmv_mma (the matrix units) and qmm at the same rows, at Qwen3-8B's
projections, timed as the benchmarks time a product (TinyJit replays of calls over rotated weight
sets, device time), with the bandwidth each reaches reading its weights, and qmv_mma without its
two-codes-at-a-time decoding (PAIRS).

Usage: DEV=CUDA python3 tools/narrow_probe.py [--rows 1,2,4,8] [--repeats 3] [--sweep] [--qmm] [--moe-decode]
  --sweep: qmv_mma at every launch of `quant.QMV_MMA_PLANS` too (8 rows)
  --moe-decode: instead, a bf16 MoE decode step's expert products (Qwen3-30B-A3B: 128 experts of
    2048 -> 2 x 768 and 768 -> 2048, top 8) at 1 and 8 tokens: gather_gemv against the composition
    (the chosen experts' weights copied, then tinygrad's matmul)
"""
from __future__ import annotations

import argparse

from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from nuvec_tg.bench.common import device_name, rotation, time_jit, warm_up
from nuvec_tg.kernels import quant as qk

SHAPES = ((4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096))   # K x N: qkv, o, gate_up, down


MOE_EXPERTS, MOE_TOP = 128, 8
MOE_SHAPES = (("gate_up", 2048, 2 * 768), ("down", 768, 2048))   # (projection, K, N) a Qwen3-30B-A3B expert


def moe_decode(repeats: int) -> None:
    """gather_gemv against gather_mm's composition at a bf16 MoE decode step's entries."""
    from nuvec_tg.kernels import compositions_only
    print(f"{device_name()}; µs a call, device time of TinyJit replays; {MOE_EXPERTS} bf16 experts, top {MOE_TOP}, "
          "unsorted entries of one row; TB/s: the chosen experts' bytes over the time")
    print("| tokens | projection | K x N | gather_gemv µs | TB/s | composition µs | composition / gather_gemv |")
    print("|---|---|---|---|---|---|---|")
    warm_up()
    for name, k, n in MOE_SHAPES:
        # enough banks that one token's chosen experts, bank after bank, pass 2x the L2
        banks = [(Tensor.randn(MOE_EXPERTS, n, k, dtype=dtypes.bfloat16) * 0.02).realize()
                 for _ in range(rotation(MOE_TOP * n * k * 2).sets)]
        for tokens in (1, 8):
            entries = tokens * MOE_TOP
            x = Tensor.randn(entries, 1, k, dtype=dtypes.bfloat16).realize()
            picks = Tensor.randint(entries, low=0, high=MOE_EXPERTS).cast(dtypes.int32).realize()
            calls = [(x, bank, picks) for bank in banks]
            product = lambda x, bank, picks: quant.gather_mm(x, bank.transpose(-1, -2), None, picks)  # noqa: E731
            kernel = time_jit(product, calls, repeats)
            with compositions_only():
                composed = time_jit(product, calls, repeats)
            chosen_bytes = entries * n * k * 2
            print(f"| {tokens} | {name} | {k} x {n} | {kernel * 1e6:.1f} | {chosen_bytes / kernel / 1e12:.2f} | "
                  f"{composed * 1e6:.1f} | {composed / kernel:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--qmm", action="store_true", help="time qmm at the same rows too")
    parser.add_argument("--moe-decode", action="store_true", help="a bf16 MoE decode step's gathered products instead")
    args = parser.parse_args()
    if args.moe_decode: return moe_decode(args.repeats)
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
            plans = [qk.qmv_mma_plan(k, n)] + ([p for p in qk.QMV_MMA_PLANS if p != qk.qmv_mma_plan(k, n)]
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
