"""Many rows of a 4-bit product on Hopper (a prefill's, issues 23 and 26): qmm_wgmma, which
dequantizes every tile in its main loop, against dequantizing w once (`kernels.quant.dequantize`)
and running gemm_wgmma over the 16-bit rows, the route `quantized_matmul` takes from
`DEQUANTIZED_ROWS` rows; with the dequantization and the product timed alone, and whether the two
routes give the same bits (the rule that lets the row count choose between them). Timed as the
benchmarks time a product (TinyJit replays of calls over rotated weight sets, device time).

The tiled kernels are all timed, each in its own plan's tiles: qmm_wgmma (w dequantized into a
threadgroup tile), qmm_wgmma_rs (w dequantized into the products' registers; qmm plans it in
`QMM_WGMMA_RS_FORMATS`) and qmm_wgmma_ws (a producer warpgroup decodes while the consumers
multiply; planned where `QMM_WGMMA_WS_ROUTED`); `--rs-sweep` and `--ws-sweep` also time every RegisterTiles of
QMM_WGMMA_RS_SHAPES and every ProducerTiles of QMM_WGMMA_WS_SHAPES (with whether each gives the
plan's bits).

`--clocks 256x2x4,16x1x4x4`: where qmm_wgmma_rs's steps spend their clocks at each RegisterTiles
(rows x warpgroups x stages, x K split for few rows) and row count: its CLOCK_PROBE form, whose first threadgroup sums each
SIMD group's clocks by part of the step (the barrier, the copies' issue, the decoding, the scales'
loads, the products' issue, the wait for the step before's products), a step's mean per SIMD group.

`--moe`: the sorted gathered products of bench quant's MoE rows (Qwen3-30B-A3B, gpt-oss-20b) at
each gathered tile shape (64 or 128 rows of qmm_wgmma, qmm_wgmma_rs and qmm_wgmma_ws), the plan's marked *.

`--pieces 1,2,4`: first the dequantization alone at each count of pieces of 8 codes a thread
(`DEQUANTIZE_PIECES` is the kernel's), its TB/s, and whether its bits equal one piece a thread's.

`--no-pairs`: every kernel decodes with the general path (float32, then rounded), not two codes at
a time in x's type (`quant.PAIR_DECODING`; affine 4-bit, mxfp4 into bfloat16, nvfp4): the pairs' A/B.

Usage: DEV=CUDA python3 tools/dequantize_probe.py [--rows 64,128,256,512,2048] [--shapes 3] [--repeats 3] [--pieces 1,2,4]
                                                  [--rs-sweep] [--ws-sweep] [--clocks 256x2x4] [--moe] [--format mxfp4|nvfp4]
                                                  [--no-pairs]
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from nuvec_tg.bench.common import device_name, rotation, time_jit, warm_up
from nuvec_tg.kernels import linear as lk
from nuvec_tg.kernels import target
from nuvec_tg.kernels.program import int_buffer, launch
from nuvec_tg.kernels import quant as qk

SHAPES = ((4096, 14336), (4096, 4096), (14336, 4096))   # K x N: up, attention, down (Qwen3-8B-like)
COMMON = dict(mode="affine", group_size=64, bits=4, backend="cuda")
FORMATS = {"affine4": COMMON, "mxfp4": dict(mode="mxfp4", group_size=32, bits=4, backend="cuda"),
           "nvfp4": dict(mode="nvfp4", group_size=16, bits=4, backend="cuda")}  # the main table's (--format)


def dequantized_product(x: Tensor, w: Tensor, s: Tensor, b: Tensor | None = None, fmt: dict = COMMON) -> Tensor:
    dense = qk.dequantize(w, s, b, out_dtype=x.dtype, **fmt)
    return lk.gemm_wgmma(x, dense, None, out_dtype=x.dtype)


def weight_sets(k: int, n: int, fmt: dict = COMMON) -> tuple[int, list[tuple[Tensor, ...]]]:
    """Rotated sets of a random `[n, k]` weight quantized in `fmt` (affine 4-bit, groups of 64 by
    default), realized: (the count of sets, their (weight, scales[, biases]))."""
    sets = rotation(n * k // 2).sets
    weights = [quant.quantize(Tensor.randn(n, k, dtype=dtypes.bfloat16) * 0.02, fmt["group_size"], fmt["bits"], mode=fmt["mode"])
               for _ in range(sets)]
    return sets, [tuple(p.realize() for p in (w.weight, w.scales, w.biases) if p is not None) for w in weights]


def few_rows_variants(rows: int, k: int, n: int, bits: int) -> tuple[qk.RegisterTiles, ...]:
    """The few rows' plan (`few_rows_tiles`) first, then its tiles at each other K split and stage count."""
    planned = qk.few_rows_tiles(rows, k, n)
    others = [dataclasses.replace(planned, k_split=s, cluster_sum=planned.cluster_sum and s > 1)  # a cluster of 2 or more
              for s in (1, 2, 4, 8) if s != planned.k_split]
    others += [dataclasses.replace(planned, stages=s) for s in (4, 6, 8, 12) if s != planned.stages and
               qk.qmm_wgmma_rs_bytes(dataclasses.replace(planned, stages=s), bits) <= qk.WGMMA_MAX_DYNAMIC]
    return (planned, *others)


def table_head(caption: str, columns: list[str]) -> None:
    """A markdown table's caption (the device first), header and rule."""
    print(f"{device_name()}; {caption}")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def sweep_pieces(args, counts: list[int]) -> None:
    """The dequantization alone at each count of pieces a thread: µs, TB/s of the bytes read and
    written, the same bits as one piece a thread."""
    table_head("the dequantize kernel by pieces of 8 codes a thread (affine 4-bit, groups of 64, into bf16)",
               ["K x N", "pieces a thread", "µs", "TB/s", "same bits"])
    warm_up()
    for k, n in SHAPES[:args.shapes]:
        _, tensors = weight_sets(k, n)
        moved = n * k // 2 + 2 * 2 * n * (k // 64) + 2 * n * k  # codes and scales and biases read, bf16 written
        one = qk.dequantize(*tensors[0], out_dtype=dtypes.bfloat16, pieces=1, **COMMON).bitcast(dtypes.uint16).numpy()
        for pieces in counts:
            seconds = time_jit(lambda w, s, b, p=pieces: qk.dequantize(w, s, b, out_dtype=dtypes.bfloat16, pieces=p, **COMMON),
                               tensors, args.repeats)
            same = np.array_equal(qk.dequantize(*tensors[0], out_dtype=dtypes.bfloat16, pieces=pieces, **COMMON)
                                  .bitcast(dtypes.uint16).numpy(), one)
            print(f"| {k} x {n} | {pieces}{' *' if pieces == qk.DEQUANTIZE_PIECES else ''} | {seconds * 1e6:.1f} | "
                  f"{moved / seconds / 1e12:.2f} | {same} |", flush=True)
        del tensors
    print()


PROBE_PARTS = ("start", "barrier", "copies", "decode", "scales", "issue", "wait")


def clock_parts(args, shapes: list[qk.RegisterTiles]) -> None:
    """qmm_wgmma_rs's CLOCK_PROBE form at each shape and row count of `--rows` (K x N the first of
    SHAPES): a step's clocks by part, the mean over the first threadgroup's SIMD groups."""
    k, n = SHAPES[0]
    table_head(f"qmm_wgmma_rs's clocks a step by part (CLOCK_PROBE, threadgroup (0, 0), mean of its SIMD groups), K {k} N {n}",
               ["M", "tiles", *PROBE_PARTS, "step", "whole (k clocks)"])
    _, tensors = weight_sets(k, n)
    w, scales, biases = tensors[0]
    for rows in (int(r) for r in args.rows.split(",")):
        x = Tensor.randn(rows, k, dtype=dtypes.bfloat16).realize()
        for tiles in shapes:
            y_dtype = dtypes.float32 if tiles.k_split > 1 else x.dtype  # a split writes float32 parts
            program = qk.qmm_wgmma_rs_program(x.dtype, scales.dtype, y_dtype, mode="affine", group_size=64, bits=4, tiles=tiles,
                                              clock_probe=True)
            for _ in range(2):  # the second call's clocks: the first warms the caches and the clocks
                y = Tensor.empty(tiles.k_split, rows, n, dtype=y_dtype)
                ins = [x, w, scales, biases, int_buffer(x.device, (rows, n, k))]
                y = launch(program, x.device, [y], ins, tiles.grid(rows, n), tiles.threads)[0]
                first_words = y.reshape(-1)[:4 * 8 * tiles.warpgroups * 4 // y_dtype.itemsize]
                words = first_words.bitcast(dtypes.uint32).numpy().reshape(-1, 8).astype(np.float64)
            steps = k // qk.WGMMA_STEP // tiles.k_split  # threadgroup (0, 0, 0)'s: the first part
            parts = words[:, :len(PROBE_PARTS)].mean(axis=0) / steps
            print(f"| {rows} | {tiles} | " + " | ".join(f"{p:.0f}" for p in parts) +
                  f" | {parts.sum():.0f} | {words[:, -1].mean() / 1e3:.0f} |", flush=True)
    del tensors
    print()


GATHERED_TILES = (qk.QMM_WGMMA_SMALL, qk.QMM_WGMMA_LARGE, qk.QMM_WGMMA_RS_SMALL, qk.RegisterTiles(128, 2, 4), qk.QMM_WGMMA_WS_SMALL,
                  qk.ProducerTiles(2, 256, 4), qk.ProducerTiles(2, 128, 4))


def moe_tiles(args) -> None:
    """bench quant's quantized MoE rows (rows sorted by expert, its routing) through qmm with picks at
    each of GATHERED_TILES: µs a call and TFLOP/s, the plan's tiles marked *."""
    from nuvec_tg.bench import quant as bench_quant
    table_head("sorted gathered qmm (MoE prefill rows of bench quant) by tiles, µs a call, TFLOP/s",
               ["model", "projection", "rows (experts)", "tiles", "table slots", "µs", "TFLOP/s"])
    rng = np.random.default_rng(1)
    multiprocessors = target(Tensor.empty(1).device).multiprocessors
    for name, projection, experts, top_k, tokens, k, n, fmt in bench_quant.moe_grid(False):
        if fmt == bench_quant.DENSE: continue
        ordered, _ = bench_quant.sorted_rows(bench_quant.routing(rng, experts, top_k, tokens), experts)
        mode, group, bits = bench_quant.FORMATS[fmt]
        qw = quant.quantize(Tensor(rng.standard_normal((experts, n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16), group, bits,
                            mode=mode)
        parts = tuple(p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases) if p is not None)
        x = Tensor(rng.standard_normal((len(ordered), k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
        picks = Tensor(ordered).realize()
        planned = qk.qmm_hopper_tiles(len(ordered), n, bits, multiprocessors, experts, k=k)
        for tiles in GATHERED_TILES:
            if isinstance(tiles, qk.RegisterTiles) and bits not in qk.QMM_WGMMA_RS_BITS: continue
            seconds = time_jit(lambda x, p, *w, t=tiles: qk.qmm(x, w[0], w[1], w[2] if len(w) > 2 else None, mode=mode,
                                                                 group_size=group, bits=bits, out_dtype=x.dtype, backend="cuda",
                                                                 picks=p, tiles=t),
                               [(x, picks, *parts)], args.repeats)
            slots = qk.gather_tile_slots(len(ordered), tiles.rows, experts)
            print(f"| {name} | {projection} | {len(ordered)} ({experts}) | {tiles}{' *' if tiles == planned else ''} | {slots} | "
                  f"{seconds * 1e6:.1f} | {2 * len(ordered) * k * n / seconds / 1e12:.0f} |", flush=True)
        del qw, parts, x
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,128,256,512,2048")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first this many of SHAPES")
    parser.add_argument("--pieces", default="", help="pieces a thread to time the dequantization at, e.g. 1,2,4")
    parser.add_argument("--rs-sweep", action="store_true", help="time every RegisterTiles of QMM_WGMMA_RS_SHAPES too")
    parser.add_argument("--ws-sweep", action="store_true", help="time every ProducerTiles of QMM_WGMMA_WS_SHAPES too")
    parser.add_argument("--clocks", default="", help="RegisterTiles as rows x warpgroups x stages (x K split) to probe, e.g. 256x2x4,16x1x4x4")
    parser.add_argument("--moe", action="store_true", help="only the MoE rows' gathered products by tiles")
    parser.add_argument("--format", default="affine4", choices=list(FORMATS), help="the main table's weights")
    parser.add_argument("--few-sweep", action="store_true", help="up to FEW_ROWS rows, also the few rows' tiles "
                        "(`few_rows_tiles`, first) at each K split and stage count (a split other than the plan's gives other bits)")
    parser.add_argument("--no-pairs", action="store_true", help="every kernel with the general decoding (`PAIR_DECODING` "
                        "off): run once with, once without, for the pairs' A/B")
    args = parser.parse_args()
    if args.no_pairs: qk.PAIR_DECODING = False
    if args.moe:
        moe_tiles(args)
        return
    if args.clocks:
        clock_parts(args, [qk.RegisterTiles(*(int(v) for v in t.split("x"))) for t in args.clocks.split(",")])
        return
    if args.pieces: sweep_pieces(args, [int(p) for p in args.pieces.split(",")])
    fmt = FORMATS[args.format]
    table_head(f"µs a call, device time of TinyJit replays over rotated {args.format} weights, bf16 x",
               ["M", "K x N", "qmm_wgmma µs", "qmm_wgmma_rs µs (tiles)", "qmm_wgmma_ws µs (tiles)", "TFLOP/s", "dequantize µs",
                "gemm_wgmma µs", "dequantize + gemm_wgmma µs", "qmm_wgmma_ws / route", "same bits"])
    warm_up()
    multiprocessors = target(Tensor.empty(1).device).multiprocessors
    product = lambda x, w, s, *b, t: qk.qmm(x, w, s, b[0] if b else None, out_dtype=x.dtype, tiles=t, **fmt)  # noqa: E731
    routed = lambda x, w, s, *b: dequantized_product(x, w, s, b[0] if b else None, fmt)  # noqa: E731
    for k, n in SHAPES[:args.shapes]:
        sets, tensors = weight_sets(k, n, fmt)
        dequant = time_jit(lambda w, s, *b: qk.dequantize(w, s, b[0] if b else None, out_dtype=dtypes.bfloat16, **fmt), tensors,
                           args.repeats)
        dense_sets = rotation(n * k * 2).sets
        dense = [qk.dequantize(*tensors[i % sets][:2], *tensors[i % sets][2:] or (None,), out_dtype=dtypes.bfloat16, **fmt).realize()
                 for i in range(dense_sets)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = Tensor.randn(rows, k, dtype=dtypes.bfloat16).realize()
            calls = [(x, *t) for t in tensors]
            planned = (qk.qmm_wgmma_plan(rows, n, multiprocessors), qk.qmm_wgmma_rs_plan(rows, n, multiprocessors),
                       qk.qmm_wgmma_ws_plan(rows, n, multiprocessors))
            tiled, registers, producer = (time_jit(lambda *a, t=t: product(*a, t=t), calls, args.repeats) for t in planned)
            gemm = time_jit(lambda x, w: lk.gemm_wgmma(x, w, None, out_dtype=x.dtype), [(x, w) for w in dense], args.repeats)
            route = time_jit(routed, calls, args.repeats)
            results = [product(x, *tensors[0], t=t) for t in planned]
            results.append(routed(x, *tensors[0]))
            bits = [r.bitcast(dtypes.uint16).numpy() for r in results]
            same = all(np.array_equal(b, bits[0]) for b in bits[1:])
            print(f"| {rows} | {k} x {n} | {tiled * 1e6:.1f} | {registers * 1e6:.1f} ({planned[1]}) | "
                  f"{producer * 1e6:.1f} ({planned[2]}) | {2 * rows * k * n / producer / 1e12:.0f} | {dequant * 1e6:.1f} | "
                  f"{gemm * 1e6:.1f} | {route * 1e6:.1f} | {producer / route:.2f} | {same} |", flush=True)
            sweeps = (qk.QMM_WGMMA_RS_SHAPES if args.rs_sweep else ()) + (qk.QMM_WGMMA_WS_SHAPES if args.ws_sweep else ())
            if args.few_sweep and rows <= qk.FEW_ROWS: sweeps += few_rows_variants(rows, k, n, fmt["bits"])
            for tiles in sweeps:
                seconds = time_jit(lambda *a, t=tiles: product(*a, t=t), calls, args.repeats)
                same = np.array_equal(product(x, *tensors[0], t=tiles).bitcast(dtypes.uint16).numpy(), bits[0])
                print(f"|   | {tiles} | | | {seconds * 1e6:.1f} | {2 * rows * k * n / seconds / 1e12:.0f} | | | | | {same} |",
                      flush=True)
        del dense, tensors

if __name__ == "__main__":
    main()
