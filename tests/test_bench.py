"""The benchmarks run end to end on tiny shapes (`--small`) on the CPU: every row is written; and
`python -m nuvec_tg.bench` picks those shapes by itself off a GPU with nuvec_tg's kernels."""
import argparse
import sys

import pytest
from tinygrad.helpers import Context

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
