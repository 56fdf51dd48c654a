"""The benchmarks run end to end on tiny shapes (`--small`) on the CPU: every row is written."""
import argparse

import pytest

from nuvec_tg.bench.__main__ import BENCHMARKS


@pytest.mark.parametrize("what", list(BENCHMARKS))
def test_the_benchmark_writes_its_table(what, capsys):
    lines = BENCHMARKS[what](argparse.Namespace(quick=False, small=True, repeats=1, markdown=None, part="1/1", batches=None))
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| B |") and not line.startswith("| M |")]
    assert rows and all(line.count("|") == lines[2].count("|") for line in rows)
    assert all(float(line.split("|")[3 if what == "gated_delta" else 7 if what == "attention" else 5]) > 0 for line in rows)
    assert lines[0] in capsys.readouterr().out
