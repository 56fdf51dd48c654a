"""The benchmarks run end to end on tiny shapes (`--small`) on the CPU: every row is written; and
`python -m nuvec_tg.bench` picks those shapes by itself off a GPU with nuvec_tg's kernels. The
gated delta benchmark writes a decode and a prefill table, the latter with the plan's route, our
recurrent kernel and fla's two kernels in their columns (timings faked where no kernel runs). The
row operations' table has every operation, ours beside the composition (timed with the kernels
off) and PyTorch's dashes where it is missing, and counts each op's bytes. The
model benchmark writes its rows, transformers' (or why there are none), the roofline rows, and
skips a config whose family is not there yet. The
rotation passes twice the L2 or marks the row; the L2 size comes from a table by name where the
device does not say; the clocks are warmed after the capture, right before the timed replays."""
import argparse
import sys

import numpy as np
import pytest
from tinygrad import Device, Tensor
from tinygrad.helpers import Context

from nuvec_tg import models
from nuvec_tg.bench import common
from nuvec_tg.bench import linear as linear_bench
from nuvec_tg.bench import model as model_bench
from nuvec_tg.bench import rows as rows_bench
from nuvec_tg.kernels import kernel_backend, kernels_enabled
from nuvec_tg.bench.__main__ import BENCHMARKS, main

KERNEL_BENCHMARKS = [what for what in BENCHMARKS if what != "model"]
# ours' µs, counting cells from 1 (gated_delta and quant: in both their tables)
OURS_COLUMN = {"attention": 7, "prefill": 7, "gated_delta": 3, "linear": 5, "quant": 5, "rows": 4}


def small_args(**changes) -> argparse.Namespace:
    return argparse.Namespace(**{**dict(quick=False, small=True, repeats=1, markdown=None, part="1/1", batches=None), **changes})


def tables(lines: list[str]) -> list[list[str]]:
    """A benchmark's tables, each its caption, a blank line, the header, its rule and its rows; a
    blank line between tables."""
    found, start = [], 0
    for i, line in enumerate(lines):
        if line == "" and i and lines[i - 1].startswith("| "):  # a blank line after a table's rows
            found.append(lines[start:i])
            start = i + 1
    return found + [lines[start:]]


def ours_missing(what: str, caption: str, row: str) -> bool:
    """Where ours has no time off a GPU with the kernels: the gated delta prefill's rows longer than
    the composition is timed for."""
    from nuvec_tg.bench.gated_delta import COMPOSED_MAX_STEPS
    kernel = kernels_enabled() and kernel_backend(Device.DEFAULT) is not None
    return what == "gated_delta" and caption.startswith("Gated delta rule, prefill") and not kernel \
        and int(row.split("|")[2]) > COMPOSED_MAX_STEPS


@pytest.mark.parametrize("what", KERNEL_BENCHMARKS)
def test_the_benchmark_writes_its_table(what, capsys):
    lines = BENCHMARKS[what](small_args())
    out = capsys.readouterr().out
    found = tables(lines)
    assert len(found) == {"gated_delta": 2, "quant": 2}.get(what, 1)  # gated_delta: decode, then prefill; quant: then MoE
    for table in found:
        assert table[1] == "" and table[3].startswith("|---")  # the caption, a blank line, the header, its rule
        rows = table[4:]
        assert rows and all(line.startswith("| ") and line.count("|") == table[2].count("|") for line in rows)
        for line in rows:
            ours = line.split("|")[OURS_COLUMN[what]].strip()
            assert ours == "-" if ours_missing(what, table[0], line) else float(ours) > 0
        assert table[0] in out
        if what == "prefill": continue  # compute-bound calls of tens of MB: no rotation past the L2
        # --small caps a replay at 16 calls of a few KB, far under twice any L2: every row says so
        assert all(line.split("|")[1].strip().endswith(" (L2)") for line in rows)
        assert "a row marked (L2)" in table[0] and "16 calls" in table[0]


def test_prefill_counts_the_visible_pairs():
    from nuvec_tg.bench.prefill import flops, visible_pairs
    assert visible_pairs(4, 4, None) == 1 + 2 + 3 + 4
    assert visible_pairs(2, 5, None) == 4 + 5               # lower-right aligned
    assert visible_pairs(5, 5, 2) == 1 + 2 + 2 + 2 + 2
    assert visible_pairs(4, 2, None) == 0 + 0 + 1 + 2       # queries before the keys see nothing
    assert flops(2, 3, 4, 4, 8, 16, None) == 2 * 2 * 3 * 10 * 24


def test_the_model_benchmark_writes_its_tables(capsys):
    """The hybrid's row (the Qwen3 shape's random model is test_random_model's): ours, then
    transformers' (a reason where it does not run), then the roofline table."""
    args = argparse.Namespace(small=True, repeats=1, markdown=None, batches="1", configs="qwen3_5_9b",
                              formats="dense", prompt=8, generate=4, no_transformers=False, engine="1")
    lines = model_bench.run(args)
    rows = [line.split(" | ") for line in lines if line.startswith("| qwen3")]
    ours = [r for r in rows if r[1] == "nuvec_tg"]
    assert len(ours) == 1 and ours[0][2:4] == ["fp32", "1"] and all(float(cell) > 0 for cell in ours[0][4:7])
    theirs = [r for r in rows if r[1].startswith("transformers")]
    assert [r[1] for r in theirs] == ["transformers eager", "transformers SDPA"]
    roofline = [r for r in rows if len(r) == 8 and r[1] == "fp32"]
    assert len(roofline) == 1 and float(roofline[0][3]) > 0
    serving = [r for r in rows if len(r) == 9]
    # one request (several at once: tests/test_paged_models.py's engines; one here keeps the suite's time)
    assert len(serving) == 1 and serving[0][2:4] == ["1", "4"] and all(float(cell) > 0 for cell in serving[0][4:8])
    assert lines[0] in capsys.readouterr().out
    assert "qwen3_5" in models.FAMILIES and not any("skipped" in line for line in lines)


def test_the_model_benchmark_splits_a_model_over_two_devices():
    """`--devices 2`: Qwen3's tiny shape split over two CPU devices, its row named for them."""
    args = argparse.Namespace(small=True, repeats=1, markdown=None, batches="1", configs="qwen3_8b", formats="dense",
                              prompt=8, generate=4, no_transformers=True, engine=None, devices=2)
    lines = model_bench.run(args)
    ours = [line.split(" | ") for line in lines if line.startswith("| qwen3_8b | nuvec_tg")]
    assert len(ours) == 1 and ours[0][1] == "nuvec_tg, 2 devices" and all(float(cell) > 0 for cell in ours[0][4:7])
    assert "split over CPU:0, CPU:1" in lines[0]
    # the sums across devices timed alone: two a layer, and the head's gather (its vocabulary split)
    sums = [row for row in (line.split(" | ") for line in lines if line.startswith("| qwen3_8b | fp32 | 1 | ")) if len(row) == 6]
    layers = model_bench.SMALL_CONFIGS["qwen3_8b"]["num_hidden_layers"]
    assert [row[3] for row in sums] == [f"{2 * layers} + 1"] and float(sums[0][4]) > 0


def test_the_model_benchmark_takes_its_options(monkeypatch):
    runs = []
    monkeypatch.setitem(BENCHMARKS, "model", lambda args: runs.append(args) or [])
    monkeypatch.setattr(sys, "argv", ["python -m nuvec_tg.bench", "model", "--small", "--configs", "qwen3_8b",
                                      "--formats", "q4", "--prompt", "32", "--generate", "8", "--no-transformers",
                                      "--devices", "2"])
    main()
    args = runs[0]
    assert (args.configs, args.formats, args.prompt, args.generate, args.no_transformers) == ("qwen3_8b", "q4", 32, 8, True)
    assert args.devices == 2
    assert args.repeats == 3  # whole generations, not the kernels' 10 replays


@pytest.mark.parametrize("default, small", [("CPU", True), ("CUDA", False), ("METAL", False)])
def test_the_grid_is_small_off_a_gpu(default, small, monkeypatch, capsys):
    runs = []
    monkeypatch.setitem(BENCHMARKS, "quant", lambda args: runs.append(args) or [])
    monkeypatch.setattr(sys, "argv", ["python -m nuvec_tg.bench", "quant"])
    with Context(DEV=default):  # names the default device without opening it
        main()
    assert runs[0].small is small
    assert ("meant for a GPU" in capsys.readouterr().err) is small


MiB = 1 << 20


@pytest.mark.parametrize("call_bytes, max_calls, want", [
    (1 * MiB, 256, common.Rotation(calls=100, sets=100, in_l2=False)),   # B=1 16/2 Lk 1024 bf16 K/V: 100 distinct sets
    (4 * MiB + 1, 256, common.Rotation(calls=25, sets=25, in_l2=False)),  # 25 sets pass 100 MiB, 24 do not
    (40 * MiB, 256, common.Rotation(calls=16, sets=3, in_l2=False)),     # 16 calls over 3 sets: 120 MiB between reuses
    (300 * MiB, 256, common.Rotation(calls=16, sets=1, in_l2=False)),    # one set alone passes twice the L2
    (1024, 256, common.Rotation(calls=256, sets=256, in_l2=True)),       # capped: 256 KiB in all
    (1 * MiB, 16, common.Rotation(calls=16, sets=16, in_l2=True)),       # --small's cap
])
def test_rotation_passes_twice_the_l2_or_says_it_cannot(call_bytes, max_calls, want):
    assert common.rotation(call_bytes, 50 * MiB, max_calls) == want


def test_rotation_rejects_empty_calls():
    with pytest.raises(ValueError, match="rotation"):
        common.rotation(0, 50 * MiB)


@pytest.mark.parametrize("name, want", [("NVIDIA H200", (50 * MiB, "NVIDIA H200's")),
                                        ("Some GPU", (common.DEFAULT_L2_BYTES, "assumed"))])
def test_l2_size_by_name_where_the_device_does_not_say(name, want, monkeypatch):
    monkeypatch.setattr(common, "device_name", lambda: name)
    common.l2_size.cache_clear()
    try:
        with Context(DEV="CPU"):  # not CUDA: nothing to read from the device
            assert common.l2_size() == want
    finally:
        common.l2_size.cache_clear()


def test_time_jit_warms_the_clocks_after_the_capture_and_before_timing(monkeypatch):
    """The function runs for the JIT's first call and its capture, then the clocks are warmed, then the timed replays."""
    events = []
    timed = common.device_seconds
    monkeypatch.setattr(common, "warm_up", lambda: events.append("warm"))
    monkeypatch.setattr(common, "device_seconds", lambda run: events.append("time") or timed(run))
    x = Tensor([1.0, 2.0]).realize()
    assert common.time_jit(lambda a: events.append("trace") or a * 2, [(x,)], repeats=2) > 0
    assert events == ["trace", "trace", "warm", "time", "time"]


def test_time_jit_runs_every_call_even_where_calls_share_an_input_set(monkeypatch):
    """Calls over fewer input sets than calls build identical lazy graphs (a composition's), which
    a joint realize would compute once: the 4096 x 4096 rope composition's row was 8x too fast
    (16 calls over 2 sets) at twice the H200's peak bandwidth. Each call now runs its kernels."""
    from tinygrad import GlobalCounters
    from nuvec_tg import fast
    kernels = []

    def counted(run):
        before = GlobalCounters.kernel_count
        run()
        kernels.append(GlobalCounters.kernel_count - before)
        return 1.0
    monkeypatch.setattr(common, "warm_up", lambda: None)
    monkeypatch.setattr(common, "device_seconds", counted)
    a, b = Tensor.randn(1, 2, 4, 8).realize(), Tensor.randn(1, 2, 4, 8).realize()
    call = lambda x: fast.rope(x, 8)  # noqa: E731 - a composition: one lazy graph per input set
    common.time_jit(call, [(a,), (b,)], repeats=1)
    common.time_jit(call, [(a,), (b,)] * 4, repeats=1)
    assert kernels[1] == 4 * kernels[0] > 0


def test_the_rows_table_has_every_operation_ours_and_the_composition(monkeypatch, capsys):
    """Every op has a row (rope at the decode layout too); ours is timed with the kernels on and
    the composition with them off, over the same calls; without PyTorch its cells are dashes."""
    timed = []

    def fake_time_jit(fn, calls, repeats):
        timed.append((kernels_enabled(), tuple(calls[0][0].shape), len(calls[0])))
        assert calls[0][0].uop.is_realized and all(t.shape for t in calls[0])  # inputs are realized tensors
        return 2e-6 if kernels_enabled() else 3e-6
    monkeypatch.setattr(rows_bench, "time_jit", fake_time_jit)
    monkeypatch.setattr(rows_bench, "cuda_torch", lambda: None)
    lines = rows_bench.run(small_args())
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[4:]]
    assert [c[:3] for c in cells] == [[op + " (L2)", "16x64", "float32"] for op in rows_bench.OPS] + \
        [["rope (L2)", "2x64", "float32"]]
    assert all(c[3] == "2.0" and c[6] == "3.0" and c[9:] == ["-"] * 4 for c in cells)
    assert timed[-2:] == [(True, (2, 2, 1, 32), 2), (False, (2, 2, 1, 32), 2)]  # x and the per-batch offsets
    assert [t[0] for t in timed] == [True, False] * len(cells)
    assert "[1, 2, 16, 32]" in lines[0] and "[2, 2, 1, 32]" in lines[0] and "its columns are -" in lines[0]
    assert lines[-1] in capsys.readouterr().out


def test_the_rows_bytes_count_each_input_and_output_once():
    big, decode = rows_bench.SHAPES
    n = 4096 * 4096 * 2  # bfloat16
    assert rows_bench.moved_bytes("add_rms_norm", big, 2) == 4 * n + 4096 * 2  # x, residual; h, y; the weight
    assert rows_bench.moved_bytes("cross_entropy", decode, 4) == 32 * 4096 * 4 + 32 * 4 + 32 * 4  # targets, losses
    assert rows_bench.moved_bytes("rope", decode, 2) == 2 * 32 * 4096 * 2 + 32 * 4  # x, y and the offsets
    assert rows_bench.moved_bytes("rope", big, 2) == 2 * n
    assert rows_bench.moved_bytes("norm_rope", decode, 2) == 2 * 32 * 4096 * 2 + 32 * 4 + 128 * 2  # and the head's weight
    assert rows_bench.moved_bytes("norm_then_rope", big, 4, head=32) == 2 * 2 * n + 32 * 4
    assert decode.rope_shape() == (32, 32, 1, 128) and big.rope_shape() == (1, 32, 4096, 128)
    with pytest.raises(ValueError, match="no operation"):
        rows_bench.moved_bytes("gelu", big, 2)


def test_the_linear_grid_and_its_bytes():
    """Every M at each weight shape (--batches picks M), and the bytes of w, x and y once."""
    assert len(linear_bench.grid_of(small_args(small=False))) == 15
    assert linear_bench.grid_of(small_args(small=False, batches="1,512")) == [(1, 4096, 14336), (512, 4096, 14336),
                                                                            (1, 4096, 4096), (512, 4096, 4096),
                                                                            (1, 14336, 4096), (512, 14336, 4096)]
    assert linear_bench.moved_bytes(1, 4096, 4096) == 2 * (4096 * 4096 + 4096 + 4096)


@pytest.mark.parametrize("changes, count", [({}, 48), ({"quick": True}, 24), ({"batches": "32"}, 24),
                                            ({"part": "2/4"}, 12), ({"ops": "norm_rope,rope"}, 8)])
def test_the_rows_grid(changes, count):
    grid, head = rows_bench.grid_of(small_args(small=False, **changes))
    assert len(grid) == count and head == 128
    assert {op for _, op, _ in grid} == set(changes.get("ops", ",".join(rows_bench.OPS)).split(","))
    if changes.get("batches"): assert all(shape.rows == 32 for shape, _, _ in grid)
    with pytest.raises(ValueError, match="no operation gelu"):
        rows_bench.grid_of(small_args(small=False, ops="rope,gelu"))


@pytest.mark.parametrize("changes, decode, prefill", [
    ({}, [(1, 1), (8, 1), (64, 1), (256, 1)], [(1, 512), (1, 2048), (1, 8192), (1, 32768), (8, 2048)]),
    ({"quick": True}, [(1, 1), (8, 1)], [(1, 2048)]),
    ({"batches": "8"}, [(8, 1)], [(8, 2048)]),
    ({"part": "2/2"}, [(8, 1), (256, 1)], [(1, 2048), (1, 32768)]),
    ({"batches": "64"}, [(64, 1)], []),   # no prefill table then
])
def test_the_gated_delta_grids(changes, decode, prefill):
    from nuvec_tg.bench import gated_delta as gated_delta_bench
    assert gated_delta_bench.grids(small_args(small=False, **changes)) == (decode, prefill, (16, 32, 128, 128))


def test_the_gated_delta_prefill_row_with_a_kernel(monkeypatch, capsys):
    """Where a kernel runs (faked: nothing is launched), the prefill row has ours as routed, the
    plan's route, tokens per second, our recurrent kernel forced, fla's chunked and fused recurrent
    kernels, and fla chunked's and the recurrent kernel's time over ours; fla is asked for both of
    its kernels at every prefill row and its fused recurrent one at every decode row."""
    from types import SimpleNamespace
    from nuvec_tg.bench import gated_delta as gated_delta_bench
    from nuvec_tg.kernels import gated_delta as kernel
    asked = []

    def fake_time_fla(b, t, hk, hv, dk, dv, repeats, max_calls, which):
        asked.append((which, (b, t)))
        return {gated_delta_bench.CHUNKED: 30e-6, gated_delta_bench.FUSED_RECURRENT: 60e-6}[which]

    def fake_time_jit(fn, calls, repeats):
        assert all(t.uop.is_realized for t in calls[0]) and len(calls[0]) == 6
        if fn.__name__ == "recurrent": return 40e-6
        return 10e-6 if kernels_enabled() else 20e-6
    monkeypatch.setattr(gated_delta_bench, "time_fla", fake_time_fla)
    monkeypatch.setattr(gated_delta_bench, "time_jit", fake_time_jit)
    monkeypatch.setattr(gated_delta_bench, "kernel_backend", lambda device: "cuda")
    lines = gated_delta_bench.run(small_args())
    decode, prefill = tables(lines)
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in prefill[4:]]
    assert cells == [["1 (L2)", "40", "10.0", gated_delta_bench.route(kernel.plan(40, chunkable=True)), "4.00", "40.0", "30.0", "60.0",
                      "3.00x", "4.00x"]]
    assert [line.split("|")[7].strip() for line in decode[4:]] == ["60.0", "60.0"]  # fla's fused recurrent kernel
    assert sorted(asked) == sorted([(gated_delta_bench.FUSED_RECURRENT, (1, 1)), (gated_delta_bench.FUSED_RECURRENT, (2, 3)),
                                    (gated_delta_bench.FUSED_RECURRENT, (1, 40)), (gated_delta_bench.CHUNKED, (1, 40))])
    assert gated_delta_bench.route(kernel.Launch(4, 1)) == "recurrent 4x1"
    assert gated_delta_bench.route(kernel.Chunked(32, 4)) == "chunked 32x4"
    out = capsys.readouterr().out
    assert decode[-1] + "\n\n" + prefill[0] in out  # printed as written, a blank line between the tables


def test_the_moe_rows_route_their_tokens_to_distinct_experts():
    """The MoE table's rows: gate_up (N twice the expert MLP) then down for each model in its
    format, then Qwen3-30B-A3B's dense bfloat16 experts; its routing gives each token `top_k`
    distinct experts, sorted, counted per expert."""
    from nuvec_tg.bench import quant as quant_bench
    grid = quant_bench.moe_grid(small=False)
    assert [(row[0], row[1], row[5], row[6], row[7]) for row in grid] == [
        ("qwen3_30b_a3b", "gate_up", 2048, 1536, "affine4"), ("qwen3_30b_a3b", "down", 768, 2048, "affine4"),
        ("gpt_oss_20b", "gate_up", 2880, 5760, "mxfp4"), ("gpt_oss_20b", "down", 2880, 2880, "mxfp4"),
        ("qwen3_30b_a3b", "gate_up", 2048, 1536, "bfloat16"), ("qwen3_30b_a3b", "down", 768, 2048, "bfloat16")]
    picks = quant_bench.routing(np.random.default_rng(0), 128, 8, 512)
    assert picks.shape == (512, 8) and all(len(set(row)) == 8 for row in picks.tolist()) and picks.max() < 128
    ordered, counts = quant_bench.sorted_rows(picks, 128)
    assert len(ordered) == 4096 and (np.diff(ordered) >= 0).all() and counts.tolist() == np.bincount(picks.reshape(-1), minlength=128).tolist()
