"""The Metal syntax check: every Metal specialisation of the decode kernels that the planner can
emit, rendered and compiled by a C++ compiler in syntax-only mode against a Metal shim
(`tests/metal_shim/metal_stdlib`), since no Metal compiler runs on Linux."""
import itertools
import pathlib
import shutil
import subprocess

import pytest
from tinygrad import dtypes

from nuvec_tg.fast.plan import PlanTarget, Vector, plan_call, validate_attention
from nuvec_tg.kernels import gated_delta
from nuvec_tg.kernels import quant as qmv
from nuvec_tg.kernels.attention import DecodeSpec
from nuvec_tg.kernels.program import FAMILIES, KERNEL_DTYPES, Param, prelude

SHIM = pathlib.Path(__file__).parent / "metal_shim"
COMPILER = next((c for c in ("clang++", "clang++-22", "clang++-21", "clang++-20", "clang++-19", "clang++-18", "g++")
                 if shutil.which(c)), None)
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
HEADS = [(64, 64), (96, 96), (128, 128), (256, 256), (512, 512), (192, 128), (96, 64)]
# The dialect's names of the dtypes (uint8: the floating-point modes' scale codes).
DTYPES = {"float": dtypes.float32, "half": dtypes.float16, "bfloat": dtypes.bfloat16, "uchar": dtypes.uint8}
# (query heads, key heads, query rows): every grouping up to the vector kernels' 32 rows.
GROUPS = [(hq, 1, lq) for hq in (1, 2, 4, 8, 16, 32) for lq in range(1, 9) if hq * lq <= 32]


def planned_specs():
    """Each decode specialisation the plan emits, over head sizes, dtypes, groupings, key counts
    (one and two passes, every GPU class's block count) and options."""
    specs = {}
    for (d, dv), dtype, (hq, hkv, lq) in itertools.product(HEADS, KERNEL_DTYPES, GROUPS):
        for lk, gpu_class in itertools.product((600, 5000, 70000), ("g", "s", "d")):
            for mask, sinks, window, page in (("none", False, None, 0), ("causal", True, 100, 0), ("bool", False, None, 0),
                                              ("additive", True, None, 0), ("causal", True, 100, 16)):
                call = validate_attention("check", (1, hq, lq, d), (1, hkv, lk, d), (1, hkv, lk, dv), dtype,
                                          "causal" if mask == "causal" else None, None, window, None)
                plan = plan_call(call, PlanTarget("metal", gpu_class))
                if not isinstance(plan.kernel, Vector) or (page and d != dv): continue
                mask_kind = {"none": 0, "causal": 0, "bool": 1, "additive": 2}[mask]
                spec = DecodeSpec(dtype, d, dv, hq, hkv, lq, plan.kernel.passes, plan.kernel.blocks, mask == "causal",
                                  window is not None, mask_kind, sinks, page, 0.125, "ints" if page else "(length+1)")
                specs[spec] = None
    return list(specs)


def test_the_shim_rejects_a_planted_error(tmp_path):
    spec = planned_specs()[0]
    text = spec.programs("metal", [Param("length", "scalar")])[0].text
    for planted in (text.replace("simd_shuffle_xor", "simd_shufle_xor", 1), text.replace("float score", "float3x score", 1)):
        source = tmp_path / "bad.metal"
        source.write_text("#define NUVEC_BFLOAT 1\n" + prelude("metal") + planted)
        result = subprocess.run([COMPILER, "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", f"-I{SHIM}", "-x", "c++",
                                 str(source)], capture_output=True, text=True)
        assert result.returncode != 0, planted[:200]


def test_every_planned_metal_specialisation_compiles(tmp_path):
    specs = planned_specs()
    assert len(specs) > 100
    units, current = [], []
    for i, spec in enumerate(specs):
        for program in spec.programs("metal", [Param("length", "scalar")]):
            defined = [line.split()[1] for line in program.text.splitlines() if line.startswith("#define ")]
            current.append(f"namespace spec{i}_{program.name} {{\n{program.text}\n}}\n" + "".join(f"#undef {d}\n" for d in defined))
        if len(current) >= 150: units.append(current); current = []
    units.append(current)
    for n, unit in enumerate(units):
        source = tmp_path / f"unit{n}.metal"
        source.write_text("#define NUVEC_BFLOAT 1\n" + prelude("metal") + "\n".join(unit))
        result = subprocess.run([COMPILER, "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", f"-I{SHIM}", "-x", "c++",
                                 str(source)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[:3000]


def _check_metal(tmp_path, texts: list[str], per_unit: int = 150):
    """Compile Metal kernel texts (no prelude) in syntax-only mode against the shim, in units."""
    for n in range(0, len(texts), per_unit):
        unit = []
        for i, text in enumerate(texts[n:n + per_unit]):
            defined = [line.split()[1].split("(")[0] for line in text.splitlines() if line.startswith("#define ")]
            unit.append(f"namespace unit{n + i} {{\n{text}\n}}\n" + "".join(f"#undef {d}\n" for d in defined))
        source = tmp_path / f"unit{n}.metal"
        source.write_text("#define NUVEC_BFLOAT 1\n" + prelude("metal") + "\n".join(unit))
        result = subprocess.run([COMPILER, "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", f"-I{SHIM}", "-x", "c++",
                                 str(source)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[:3000]


def test_every_gated_delta_metal_specialisation_compiles(tmp_path):
    texts = []
    for (dk, dv), activation, state, gate, mode, steps in itertools.product(
            [(128, 128), (64, 48), (32, 17), (96, 64)], KERNEL_DTYPES, KERNEL_DTYPES, (dtypes.float32, dtypes.bfloat16),
            ("final", "steps", "slots"), (1, 512)):
        types = dict(q=activation, k=activation, v=activation, g=gate, beta=activation, state=state,
                     storage=dtypes.float16 if mode == "steps" else state)
        texts.append(gated_delta.program("metal", types, mode, dk, dv, 2, 4, gated_delta.plan(steps)).text)
    _check_metal(tmp_path, texts)


def qmv_programs():
    """Each qmv specialisation the routing emits, up to sizes: every mode, width and group, x (and
    y) dtype, affine scales dtype, 1-8 rows; K and N at the kernel's boundaries (half chunks, fewer
    columns than a SIMD group serves, narrower loads, one row's wide columns), the default plan and a
    few others."""
    formats = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
        ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
    float_types = ("float", "half", "bfloat")
    for (mode, group, bits), x, rows in itertools.product(formats, float_types, range(1, 9)):
        for scales in (float_types if mode == "affine" else ("uchar",)):
            # (4096, 14336) at one row: 2 steps a SIMD group and enough of them, so the wide-column plan.
            shapes = ((4096, 4096), (group * 3, 3)) + (((4096 + 16, 14336),) if mode == "nvfp4" else ()) + (
                ((4096, 14336),) if rows == 1 else ())
            for k, n in shapes:
                plans = {qmv.plan(rows, k, n)} | ({qmv.QmvPlan(3, 2, 2, 2)} if rows == 1 and n > 3 else set())
                for p in plans:
                    for batches in ((0, 3) if rows in (1, 8) else (0,)):  # plain, and gathered over 3 weight batches
                        yield qmv.qmv_program("metal", DTYPES[x], DTYPES[scales], DTYPES[x], mode=mode, group_size=group,
                                              bits=bits, rows=rows, k=k, n=n, qmv_plan=p, batches=batches).text


def test_every_qmv_metal_specialisation_compiles(tmp_path):
    texts = list(qmv_programs())
    assert len(texts) > 1000
    _check_metal(tmp_path, texts, per_unit=400)


def test_every_qvm_metal_specialisation_compiles(tmp_path):
    formats = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
        ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
    texts = []
    for i, ((mode, group, bits), x, rows, k) in enumerate(itertools.product(formats, ("float", "half", "bfloat"), (1, 3, 8),
                                                                           (4096, 100))):
        n = 4096 if k == 4096 else 3 * group   # nvfp4: 48, a half chunk
        texts.append(qmv.qvm_program("metal", DTYPES[x], DTYPES[x if mode == "affine" else "uchar"], DTYPES[x], mode=mode,
                                     group_size=group, bits=bits, rows=rows, k=k, n=n).text)
    _check_metal(tmp_path, texts, per_unit=400)


def test_every_qmm_metal_specialisation_compiles(tmp_path):
    formats = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
        ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
    texts = []
    for (mode, group, bits), x, k, gather in itertools.product(formats, ("half", "bfloat"), (4096, 4096 + 16), (False, True)):
        if k % group: continue
        for scales in ((x, "float") if mode == "affine" else ("uchar",)):
            texts.append(qmv.qmm_program("metal", DTYPES[x], DTYPES[scales], DTYPES[x], mode=mode, group_size=group,
                                         bits=bits, k=k, gather=gather).text)
    assert len(texts) > 180
    _check_metal(tmp_path, texts, per_unit=200)


def test_every_metal_family_is_checked():
    """A new kernel family lands with its Metal specialisations in this file."""
    checked = {"nuvec_sdpa_decode", "nuvec_sdpa_merge", "nuvec_gated_delta", "nuvec_qmv", "nuvec_qvm", "nuvec_qmm"}
    assert {f.stem for f in FAMILIES if "metal" in f.backends} == checked
