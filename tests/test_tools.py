"""The measuring tools that run without a GPU: `tools/ncu_stalls.py` reading ncu's source page
(stalls, warp roles, tag lookups), `tools/ab_sources.py` extracting a revision's kernel sources."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SOURCE_PAGE = '''"Kernel Name","nuvec_example_0123",
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait","stall_barrier","stall_long_sb (Not Issued)"
"0x10","LDG.E.U16 R2, desc[UR8][R4.64]","1","0","1","0","0"
"0x20","IMAD.U32 R2, R2, 0x10000, RZ","60","58","2","0","58"
"0x30","BAR.SYNC.DEFER_BLOCKING 0x0","30","0","2","28","0"
"0x40","HMMA.16816.F32.BF16 R8, R12, R16, R8","9","0","9","0","0"
'''


def test_ncu_stalls_reads_the_source_page(tmp_path):
    ncu = tool("ncu_stalls")
    path = tmp_path / "source.csv"
    path.write_text(SOURCE_PAGE)
    name, instructions = ncu.read(str(path))
    assert name == "nuvec_example_0123" and len(instructions) == 4
    assert instructions[1].stalls == {"long_sb": 58.0, "wait": 2.0, "barrier": 0.0}  # "Not Issued" columns left out
    lines = ncu.report(name, instructions, top=2)
    assert lines[0] == "nuvec_example_0123: 4 instructions, 100 stall samples"
    assert lines[1].split() == ["long_sb", "58.0%"] and lines[2].split() == ["barrier", "28.0%"]
    assert "IMAD.U32" in lines[5] and "long_sb 97%" in lines[5]   # the most samples first
    assert "BAR.SYNC" in lines[6] and len(lines) == 7


ROLES_PAGE = '''"Kernel Name","nuvec_ws_0123",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","L1 Tag Requests Global","stall_long_sb","stall_selected"
"0x10","@!P4 LDG.E.U16.CONSTANT R2, desc[UR8][R4.64]","2","64","2048","0","2"
"0x20","LDG.E.128.CONSTANT R8, desc[UR8][R6.64]","8","64","1024","6","2"
"0x30","HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16], R24","10","128","0","0","10"
"0x40","@!P0 BRA 0x7f25","80","128","0","80","0"
'''


def test_ncu_stalls_splits_a_kernel_by_role_and_counts_tag_lookups(tmp_path):
    """Instructions executed equally often (a warp-specialised kernel's loops) as one set each,
    and the L1 tag lookups by opcode, a predicate skipped."""
    ncu = tool("ncu_stalls")
    path = tmp_path / "source.csv"
    path.write_text(ROLES_PAGE)
    _, instructions = ncu.read(str(path))
    assert [i.opcode for i in instructions][:2] == ["LDG.E.U16.CONSTANT", "LDG.E.128.CONSTANT"]
    lines = ncu.roles(instructions, 2)
    assert lines[1].split()[:5] == ["2", "instructions", "x", "128:", "90.0%"] and "long_sb 89%" in lines[1]
    assert lines[2].split()[:5] == ["2", "instructions", "x", "64:", "10.0%"]
    tags = ncu.tag_lookups(instructions)
    assert tags[0] == "L1 tag lookups of global memory: 3072" and tags[1].split() == ["LDG.E.U16.CONSTANT", "2048", "66.7%"]
    path.write_text(SOURCE_PAGE)
    assert ncu.tag_lookups(ncu.read(str(path))[1]) == []   # a page without them


def test_ncu_stalls_refuses_other_files(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="not ncu's source page"):
        tool("ncu_stalls").read(str(path))


@pytest.mark.skipif(subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0,
                    reason="not a git checkout")
def test_ab_sources_extracts_a_revisions_kernel_sources(tmp_path):
    into = tool("ab_sources").extract("HEAD", tmp_path / "src")
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:nuvec_tg/kernels/src/gated_delta_pass.h"],
                               capture_output=True, text=True, check=True).stdout
    assert (into / "gated_delta_pass.h").read_text() == committed
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD", "nuvec_tg/kernels/src/"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.name for p in into.iterdir()) == sorted(Path(n).name for n in names)


def test_ab_sources_needs_a_gpu():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "ab_sources.py"), "--base", "HEAD"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DEV": "PYTHON"}, cwd=ROOT)
    assert result.returncode != 0 and "needs a GPU" in result.stderr


def test_ab_sources_compares_emulated_outputs_bit_for_bit(tmp_path):
    """The same sources give the same bits; a source that drops the state's decay does not."""
    from kernel_emulator import COMPILER
    if COMPILER is None: pytest.skip("no C++ compiler")
    from nuvec_tg.kernels import program
    ab = tool("ab_sources")
    sources = program.SOURCE_DIR
    same = tmp_path / "same"
    faulty = tmp_path / "faulty"
    for into in (same, faulty):
        into.mkdir()
        for path in program.SOURCE_DIR.iterdir(): (into / path.name).write_text(path.read_text())
    pass_source = (faulty / "gated_delta_pass.h").read_text()
    assert pass_source.count("s[n].v[e] *= keep;") == 1
    (faulty / "gated_delta_pass.h").write_text(pass_source.replace("s[n].v[e] *= keep;", "s[n].v[e] *= 1.0f;"))
    assert ab.compare_emulated("gated_delta", same, ["chunked_bf16"]) == {"chunked_bf16": True}
    assert ab.compare_emulated("gated_delta", faulty, ["chunked_bf16"]) == {"chunked_bf16": False}
    assert program.SOURCE_DIR == sources   # the working tree's sources restored
