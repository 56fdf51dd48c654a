"""The CUDA compile check: every CUDA specialisation the plan can emit (the covering set of
`tests/kernel_specialisations.py`), rendered and compiled for sm_90 on the CPU by clang's CUDA
device compiler, without the CUDA SDK: `-nocudainc -nocudalib` against `tests/cuda_shim/`, which
declares what nvrtc gives a program without an #include (and what `prelude_cuda.h` includes) with
CUDA's signatures and overload sets.

Two stages. All of them are checked by clang's front end (`-fsyntax-only`: types, overloads,
templates, host and device functions, the asm statements' operands), since generating code for
each would take minutes. A few per family that between them reach every inline-assembly path of the
prelude (`kernel_specialisations.assembled`) are compiled to PTX and, where a `ptxas` is installed,
assembled for sm_90: clang passes an asm statement's text through unread, so only ptxas checks the
PTX instructions (and the 48 KB of static threadgroup memory). nvrtc itself runs on the GPU machine:
`tools/compile_cuda.py`, from `scripts/device_check.sh`.
"""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
from typing import Sequence

import pytest

import kernel_specialisations as ks
from nuvec_tg.kernels.program import FAMILIES, Program

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIM = pathlib.Path(__file__).parent / "cuda_shim"
ARCH = "sm_90"


def _cuda_clang() -> str | None:
    """The first clang++ whose build has the NVPTX backend."""
    for name in ("clang++", "clang++-22", "clang++-21", "clang++-20", "clang++-19", "clang++-18", "clang++-17", "clang++-16"):
        if shutil.which(name) and "nvptx64" in subprocess.run([name, "-print-targets"], capture_output=True, text=True).stdout:
            return name
    return None


def _ptxas() -> str | None:
    """ptxas on the PATH, or in the CUDA SDK at CUDA_PATH or /usr/local/cuda."""
    candidates = [os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", "ptxas"), "/usr/local/cuda/bin/ptxas"]
    return shutil.which("ptxas") or next((c for c in candidates if os.access(c, os.X_OK)), None)


COMPILER, PTXAS = _cuda_clang(), _ptxas()
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no clang with the NVPTX backend")
# clang as nvrtc compiles a program (C++17, one sm_90 device, nothing included but the shim), PTX ISA
# 7.8 (CUDA 11.8, the first with sm_90, so any ptxas since reads it), and no CUDA installation
# looked for: what an SDK on the machine holds changes nothing.
FLAGS = ["-x", "cuda", "--cuda-device-only", f"--cuda-gpu-arch={ARCH}", "-nocudainc", "-nocudalib", "--cuda-path=/nonexistent",
         "--cuda-feature=+ptx78", "-std=c++17", f"-I{SHIM}", "-include", str(SHIM / "nvrtc_builtins.h")]
NO_PTXAS = "no ptxas (CUDA_PATH, /usr/local/cuda, PATH): the prelude's inline PTX is not assembled"


def _compile(path: pathlib.Path, items: Sequence[ks.Specialisation], stage: list[str]) -> tuple[int, str]:
    """Write `items` as one translation unit at `path` and run clang on it with `stage`'s flags:
    the exit status, and the output led by the specialisation the first error is in."""
    text, starts = ks.translation_unit("cuda", [item.program for item in items])
    path.write_text(text)
    result = subprocess.run([COMPILER, *FLAGS, *stage, str(path)], capture_output=True, text=True)
    output = result.stderr[:4000]
    if result.returncode and (found := re.search(rf"{re.escape(path.name)}:(\d+):", result.stderr)):
        at = sum(start <= int(found.group(1)) for start in starts) - 1
        if at >= 0: output = f"{items[at].family}: {items[at].label} ({items[at].program.name})\n{output}"
    return result.returncode, output


def test_every_cuda_family_is_checked():
    """Each family written for CUDA has specialisations in both stages."""
    cuda_families = [f.stem for f in FAMILIES if "cuda" in f.backends]
    every, assembled = ks.specialisations("cuda"), ks.assembled("cuda")
    assert list(every) == cuda_families and list(assembled) == cuda_families
    assert all(every[f] for f in cuda_families) and all(assembled[f] for f in cuda_families)
    assert sum(map(len, every.values())) > 800


# Code paths the covering set must reach: per family, defines and the values each must take in some
# specialisation (a change to the plan or the walk that loses one fails here, not silently).
REACHED = {
    "nuvec_sdpa_decode": {"TWO_PASS": {"0", "1"}, "MASK_KIND": {"0", "1", "2"}, "CAUSAL": {"0", "1"}, "WINDOW_ON": {"0", "1"},
                          "SINKS": {"0", "1"}, "PAGED": {"0", "1"}, "T": {"half", "bfloat", "float"},
                          "ROWS": {"1", "2", "4", "8"}, "TPK": {"8", "16", "32"}, "K_LEN": {"int_length", "(length+1)"}},
    "nuvec_sdpa_decode_mma": {"MMA": {"mma_f16", "mma_bf16"}, "L2_AHEAD": {"0", "2"}, "MASK_KIND": {"0", "1", "2"},
                              "WINDOW_ON": {"0", "1"}, "PAGED": {"0", "1"}, "D": {"64", "96", "128"}, "DV": {"64", "128"},
                              "K_LEN": {"int_length", "(length+1)"}},
    "nuvec_sdpa_merge": {"SINKS": {"0", "1"}, "T": {"half", "bfloat", "float"}, "DV": {"64", "96", "128", "256", "512"}},
    "nuvec_gated_delta": {"STATE_OUT": {"0", "1"}, "STEPS_OUT": {"0", "1"}, "SLOTS": {"0", "1"}, "WARPS": {"2", "4"},
                          "TS": {"half", "bfloat", "float"}, "TQ": {"half", "bfloat", "float"}},
    "nuvec_gated_delta_chunks": {"T": {"half", "bfloat"}, "DECAY_LOG": {"0", "1"}, "TG": {"half", "bfloat", "float"},
                                 "DK": {"32", "64", "96", "128"}, "DV": {"16", "48", "64", "128", "256"}},
    "nuvec_gated_delta_pass": {"T": {"half", "bfloat"}, "SLOTS": {"0", "1"}, "WARPS": {"1", "2", "4"},
                               "TS": {"half", "bfloat", "float"}, "DK": {"32", "64", "96", "128"}},
    "nuvec_qmv": {"MODE": {"0", "1", "2", "3"}, "BITS": {"1", "2", "3", "4", "5", "6", "8"}, "XM": {str(m) for m in range(1, 9)},
                  "GATHER": {"0", "1"}, "TX": {"half", "bfloat", "float"}, "TS": {"half", "bfloat", "float", "uchar"},
                  "COLUMNS": {"3", "4", "8"}, "LOAD_WORDS": {"1", "2", "4"}, "GLU": {"0", "1"}},
    "nuvec_qvm": {"MODE": {"0", "1", "2", "3"}, "XM": {"1", "3", "8"}, "TX": {"half", "bfloat", "float"}},
    "nuvec_qmm": {"MODE": {"0", "1", "2", "3"}, "LOAD_WORDS": {"1", "2", "4"}, "GATHER": {"0", "1"}, "TX": {"half", "bfloat"},
                  "TS": {"half", "bfloat", "float", "uchar"}},
    "nuvec_rms_norm": {"ADD": {"0", "1"}, "WEIGHT": {"0", "1"}, "VEC": {"1", "8"}, "CACHED": {"0", "1"},
                       "TO": {"half", "bfloat", "float"}, "TH": {"half", "bfloat", "float"}},
    "nuvec_layer_norm": {"WEIGHT": {"0", "1"}, "BIAS": {"0", "1"}, "VEC": {"1", "8"}, "CACHED": {"0", "1"},
                         "TO": {"half", "bfloat", "float"}},
    "nuvec_residual_norm": {"SCALE": {"0", "1", "2"}, "NEXT": {"0", "1"}, "VEC": {"1", "8"}, "CACHED": {"0", "1"},
                            "TS": {"half", "bfloat", "float"}, "TO": {"half", "bfloat", "float"}},
    "nuvec_softmax": {"MODE": {"0"}, "LOOPED": {"0", "1"}, "TO": {"half", "bfloat", "float"}, "THREADS": {"32", "1024"}, "VEC": {"1", "8"}},
    "nuvec_logsumexp": {"MODE": {"1"}, "LOOPED": {"0", "1"}, "TO": {"half", "bfloat", "float"}, "THREADS": {"32", "1024"}, "VEC": {"1", "8"}},
    "nuvec_cross_entropy": {"MODE": {"2"}, "LOOPED": {"0", "1"}, "TO": {"float"}, "THREADS": {"32", "1024"}, "VEC": {"1", "8"}},
    "nuvec_rope": {"TRADITIONAL": {"0", "1"}, "VEC": {"1", "2", "4", "8"}, "TX": {"half", "bfloat", "float"},
                   "SCALE": {"1.0f", "0.25f"}},
    "nuvec_norm_rope": {"DEST": {"0", "1", "2"}, "NORM": {"0", "1"}, "VALUES": {"0", "1", "2"}, "TRADITIONAL": {"0", "1"},
                        "LANES": {"8", "16", "32", "64", "512"}, "PER": {"1", "2"}, "VEC": {"1", "8"},
                        "UNIT": {"1", "2", "4", "8"}, "TX": {"half", "bfloat", "float"}, "TO": {"half", "bfloat", "float"},
                        "TK": {"half", "bfloat", "float"}, "QUERIES": {"0", "1"}},
    "nuvec_paged_write": {"VEC": {"1", "2", "4", "8"}, "TS": {"half", "bfloat", "float"}, "TP": {"half", "bfloat", "float"}},
    "nuvec_take_rows": {"CHUNK": {"uint4", "uint2", "uint", "ushort"}},
    "nuvec_gemv": {"XM": {str(m) for m in range(1, 9)}, "VEC": {"1", "2", "4", "8"}, "BIAS": {"0", "1"}, "GLU": {"0", "1"},
                   "TX": {"half", "bfloat", "float"}, "TW": {"half", "bfloat", "float"}, "TY": {"half", "bfloat", "float"},
                   "CHUNK_W": {"uint4", "uint2", "uint", "ushort"}, "K_SPLIT": {"1", "2", "8"}, "COLUMNS": {"3", "4"}},
    "nuvec_gemm": {"TX": {"half", "bfloat"}, "TY": {"half", "bfloat", "float"}, "BIAS": {"0", "1"}, "GATHER": {"0", "1"},
                   "COPY_BYTES": {"4", "8", "16"}, "BM": {"64", "128"}, "BN": {"64", "128"}},
    "nuvec_qmm_wgmma": {"MODE": {"0", "1", "2", "3"}, "BITS": {"1", "2", "3", "4", "5", "6", "8"}, "GATHER": {"0", "1"},
                        "TX": {"half", "bfloat"}, "TS": {"half", "bfloat", "float", "uchar"}, "COPY_BYTES": {"8", "16"},
                        "BM": {"64", "128"}, "BN": {"128", "256"}},
    "nuvec_gemm_wgmma": {"TX": {"half", "bfloat"}, "TY": {"half", "bfloat", "float"}, "BIAS": {"0", "1"}, "GATHER": {"0", "1"},
                         "BM": {"64", "128"}, "BN": {"64", "128", "256"}},
    "nuvec_sdpa_prefill_wgmma": {"T": {"half", "bfloat"}, "D": {"64", "128", "256"}, "DV": {"64", "128", "256"},
                                 "MASK_KIND": {"0", "1", "2"}, "CAUSAL": {"0", "1"}, "WINDOW_ON": {"0", "1"},
                                 "SINKS": {"0", "1"}, "PAGED": {"0", "1"}, "WARPGROUPS": {"1", "2", "3"},
                                 "KEYS": {"64", "128"}},
}


def _defines(program: Program) -> dict[str, str]:
    return dict(row.split(" ", 2)[1:] for row in program.text.splitlines() if row.startswith("#define ") and row.count(" ") >= 2)


def test_the_covering_set_reaches_every_code_path():
    for family, wanted in REACHED.items():
        found: dict[str, set[str]] = {}
        for item in ks.specialisations("cuda")[family]:
            for name, value in _defines(item.program).items(): found.setdefault(name, set()).add(value)
        for name, values in wanted.items():
            assert values <= found.get(name, set()), f"{family}: {name} never takes {sorted(values - found.get(name, set()))}"
    # the assembled set: the matrix pass's mma types and L2 hint, qmm's and gemm's copy widths and mma types
    assembled = {family: [_defines(item.program) for item in items] for family, items in ks.assembled("cuda").items()}
    assert {d["MMA"] for d in assembled["nuvec_sdpa_decode_mma"]} == {"mma_f16", "mma_bf16"}
    assert {d["L2_AHEAD"] for d in assembled["nuvec_sdpa_decode_mma"]} == {"0", "2"}
    assert {d["LOAD_WORDS"] for d in assembled["nuvec_qmm"]} == {"1", "2", "4"}
    assert {d["TX"] for d in assembled["nuvec_qmm"]} == {"half", "bfloat"}
    assert {d["COPY_BYTES"] for d in assembled["nuvec_gemm"]} == {"4", "8", "16"}
    assert {d["TX"] for d in assembled["nuvec_gemm"]} == {"half", "bfloat"}
    assert {d["BM"] for d in assembled["nuvec_gemm"]} == {"64", "128"}
    assert {(d["TX"], d["BN"]) for d in assembled["nuvec_gemm_wgmma"]} == {(t, n) for t in ("half", "bfloat")
                                                                            for n in ("64", "128", "224", "256")}
    assert {(d["T"], d["DV"]) for d in assembled["nuvec_sdpa_prefill_wgmma"]} == {(t, n) for t in ("half", "bfloat")
                                                                                  for n in ("64", "128", "256")}


@pytest.mark.parametrize("family", [f.stem for f in FAMILIES if "cuda" in f.backends])
def test_every_planned_cuda_specialisation_compiles(tmp_path, family):
    status, output = _compile(tmp_path / f"{family}.cu", ks.specialisations("cuda")[family], ["-fsyntax-only"])
    assert status == 0, output


# The programs built for the device's own architecture, and for sm_90a (Program.arch: the wgmma
# kernels), whose PTX needs ISA 8.0 (CUDA 12.0, the first with wgmma) and an sm_90a assembler.
ARCH_FLAGS = {ARCH: [], "sm_90a": [f"--cuda-gpu-arch={ARCH}", "--no-cuda-gpu-arch=sm_90", "--cuda-gpu-arch=sm_90a",
                                   "--cuda-feature=+ptx80"]}


@pytest.fixture(scope="module", params=list(ARCH_FLAGS))
def assembled_ptx(request, tmp_path_factory) -> tuple[str, list[ks.Specialisation], pathlib.Path]:
    """The assembled set of one architecture compiled to PTX in one unit (clang -O0: code
    generation's checks, quickly)."""
    arch = request.param
    items = [item for items in ks.assembled("cuda").values() for item in items if (item.program.arch or ARCH) == arch]
    folder = tmp_path_factory.mktemp("ptx")
    status, output = _compile(folder / "assembled.cu", items, [*ARCH_FLAGS[arch], "-O0", "-S", "-o", str(folder / "assembled.ptx")])
    assert status == 0, output
    return arch, items, folder / "assembled.ptx"


def test_the_assembly_paths_generate_ptx(assembled_ptx):
    arch, items, ptx = assembled_ptx
    entries = set(re.findall(r"\.entry (\w+)", ptx.read_text()))
    assert items and entries == {item.program.name for item in items}
    assert f".target {arch}" in ptx.read_text()


@pytest.mark.skipif(PTXAS is None, reason=NO_PTXAS)
def test_the_assembly_paths_assemble(assembled_ptx):
    arch, items, ptx = assembled_ptx
    result = subprocess.run([PTXAS, f"-arch={arch}", "-O1", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:4000]


def _planted(family: str, edits: list[tuple[str, str]], pool: dict[str, tuple[ks.Specialisation, ...]]) -> str:
    """The whole source of `family`'s first program in `pool` with each edit `(original, planted)`
    made once (an edit whose original is missing fails the test: the planted error must exist)."""
    source = pool[family][0].program.source
    for original, planted in edits:
        assert original in source, f"{original!r} is not in {family}'s program or the prelude"
        source = source.replace(original, planted, 1)
    return source


# Errors clang's front end must find, as nvrtc would: a misspelled intrinsic, a call that CUDA's
# overloads of min make ambiguous (an int with a double), a host function called from a kernel.
FRONT_END_ERRORS = {
    "misspelled intrinsic": ("nuvec_sdpa_decode", [("__shfl_xor_sync(0xffffffffu, x, mask)",
                                                    "__shfl_xor_synk(0xffffffffu, x, mask)")], "__shfl_xor_synk"),
    "ambiguous overload": ("nuvec_sdpa_decode", [("min(k_len, key_begin + per_block)", "min(k_len, 0.5 * per_block)")],
                           "ambiguous"),
    "host function": ("nuvec_gated_delta", [('extern "C" __global__',
                                             'float host_only(float x) { return x; }\nextern "C" __global__'),
                                            ("nv_thread = threadIdx;\n", "nv_thread = threadIdx;\n  (void)host_only(1.0f);\n")],
                      "host_only"),
}


@pytest.mark.parametrize("planted", FRONT_END_ERRORS)
def test_the_front_end_rejects_a_planted_error(tmp_path, planted):
    family, edits, message = FRONT_END_ERRORS[planted]
    source = tmp_path / "planted.cu"
    source.write_text(_planted(family, edits, ks.specialisations("cuda")))
    result = subprocess.run([COMPILER, *FLAGS, "-fsyntax-only", str(source)], capture_output=True, text=True)
    assert result.returncode != 0 and message in result.stderr, result.stderr[:2000]


# Errors only the assembler finds (clang passes them on into the PTX): an inline-assembly
# instruction misspelled, threadgroup memory past the 48 KB a kernel may declare (16 stages of qmm).
ASSEMBLER_ERRORS = {
    "inline PTX": ("nuvec_sdpa_decode", [("ex2.approx.ftz.f32", "ex2.approximate.ftz.f32")], "Unknown modifier"),
    "threadgroup memory": ("nuvec_qmm", [("#define STAGES 4\n", "#define STAGES 16\n")], "too much shared data"),
}


@pytest.mark.skipif(PTXAS is None, reason=NO_PTXAS)
@pytest.mark.parametrize("planted", ASSEMBLER_ERRORS)
def test_the_assembler_rejects_a_planted_error(tmp_path, planted):
    family, edits, message = ASSEMBLER_ERRORS[planted]
    source, ptx = tmp_path / "planted.cu", tmp_path / "planted.ptx"
    source.write_text(_planted(family, edits, ks.assembled("cuda")))
    generated = subprocess.run([COMPILER, *FLAGS, "-O0", "-S", "-o", str(ptx), str(source)], capture_output=True, text=True)
    assert generated.returncode == 0, generated.stderr[:2000]
    result = subprocess.run([PTXAS, f"-arch={ARCH}", "-O1", str(ptx), "-o", str(tmp_path / "planted.cubin")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and message in result.stderr, result.stderr[:2000]


def _tool():
    """tools/compile_cuda.py as a module."""
    spec = importlib.util.spec_from_file_location("compile_cuda", ROOT / "tools" / "compile_cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_check_lists_every_specialisation(capsys):
    """`tools/compile_cuda.py --list` (the device check's enumeration, runnable without a GPU):
    each specialisation once, with its family, program and label, then each family's count."""
    tool = _tool()
    assert tool.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    every = ks.specialisations("cuda")
    listed = [line.split("\t") for line in lines if "\t" in line]
    assert [(family, name) for family, name, _ in listed] == [(i.family, i.program.name) for items in every.values()
                                                              for i in items]
    counts = [f"{family}: {len(items)} specialisations" for family, items in every.items()]
    assert [line for line in lines if "\t" not in line] == counts
    assert tool.main(["--list", "--family", "nuvec_qmm", "--family", "nuvec_sdpa_merge"]) == 0
    counts = [line for line in capsys.readouterr().out.splitlines() if "\t" not in line]
    assert counts == [f"nuvec_sdpa_merge: {len(every['nuvec_sdpa_merge'])} specialisations",
                      f"nuvec_qmm: {len(every['nuvec_qmm'])} specialisations"]
    with pytest.raises(SystemExit):
        tool.main(["--list", "--family", "nuvec_nothing"])
