"""The benchmarks run end to end on tiny shapes (`--small`) on the CPU: every row is written; and
`python -m nuvec_tg.bench` picks those shapes by itself off a GPU with nuvec_tg's kernels. The
clocks are warmed after the capture, right before the timed replays."""
import argparse
import sys

import pytest
from tinygrad import Tensor
from tinygrad.helpers import Context

from nuvec_tg.bench import common
from nuvec_tg.bench.__main__ import BENCHMARKS, main


@pytest.mark.parametrize("what", list(BENCHMARKS))
def test_the_benchmark_writes_its_table(what, capsys):
    lines = BENCHMARKS[what](argparse.Namespace(quick=False, small=True, repeats=1, markdown=None, part="1/1", batches=None))
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| B |") and not line.startswith("| M |")]
    assert rows and all(line.count("|") == lines[2].count("|") for line in rows)
    assert all(float(line.split("|")[3 if what == "gated_delta" else 7 if what == "attention" else 5]) > 0 for line in rows)
    assert lines[0] in capsys.readouterr().out


@pytest.mark.parametrize("default, small", [("CPU", True), ("CUDA", False), ("METAL", False)])
def test_the_grid_is_small_off_a_gpu(default, small, monkeypatch, capsys):
    runs = []
    monkeypatch.setitem(BENCHMARKS, "quant", lambda args: runs.append(args) or [])
    monkeypatch.setattr(sys, "argv", ["python -m nuvec_tg.bench", "quant"])
    with Context(DEV=default):  # names the default device without opening it
        main()
    assert runs[0].small is small
    assert ("meant for a GPU" in capsys.readouterr().err) is small


def test_time_jit_warms_the_clocks_after_the_capture_and_before_timing(monkeypatch):
    """The function runs for the JIT's first call and its capture, then the clocks are warmed, then the timed replays."""
    events = []
    timed = common.device_seconds
    monkeypatch.setattr(common, "warm_up", lambda: events.append("warm"))
    monkeypatch.setattr(common, "device_seconds", lambda run: events.append("time") or timed(run))
    x = Tensor([1.0, 2.0]).realize()
    assert common.time_jit(lambda a: events.append("trace") or a * 2, [(x,)], repeats=2) > 0
    assert events == ["trace", "trace", "warm", "time", "time"]
