"""The Metal check: every Metal specialisation the plans and routes can emit (decode attention,
gated delta, qmv, qvm, qmm, the row kernels, gemv, gemm, the paged write), rendered and compiled by a C++ compiler in syntax-only mode against a
Metal shim (`tests/metal_shim/metal_stdlib`), since no Metal compiler runs on Linux.

- C++14 with `-pedantic-errors`: the Metal language up to 3.2 is C++14, so C++17 syntax (which a
  compiler would otherwise accept as an extension) fails here.
- Programs without bfloat compile with the shim's bfloat removed (the Metal 3.0 language of macOS
  13 has none); the others with it.
- Each program's stated threadgroup (its family's `metal_resources`) is within an Apple GPU's
  limits, and its stated threadgroup memory equals the kernel's own `threadgroup` arrays: a
  preprocessor pass, with the shim leaving the `threadgroup` qualifier as a token, finds the arrays
  the defines leave declared (every use of the qualifier must be such an array or a pointer); the
  syntax-only compile then checks, in a `static_assert` at the end of each kernel, the sum of their
  `sizeof`s (each rounded up to 16 bytes) against the stated bytes. The compiler evaluates the
  sizes, so no define or expression is parsed here.
"""
import itertools
import pathlib
import re
import shutil
import subprocess

import pytest
from tinygrad import dtypes

from nuvec_tg.fast.plan import PlanTarget, Vector, plan_call, validate_attention
from nuvec_tg.kernels import gated_delta, linear, paged, rope, rows, softmax
from nuvec_tg.kernels import quant as qmv
from nuvec_tg.kernels.attention import DecodeSpec
from kernel_specialisations import specialisations, gemm_calls, gemv_calls, norm_calls, norm_rope_calls, norm_rope_program, paged_write_calls, \
    prefill_specs, residual_norm_calls, rope_calls, softmax_calls
from nuvec_tg.kernels.program import FAMILIES, KERNEL_DTYPES, Param, Program, Resources, metal_limit_reason, prelude, \
    threadgroup_array

SHIM = pathlib.Path(__file__).parent / "metal_shim"
COMPILER = next((c for c in ("clang++", "clang++-22", "clang++-21", "clang++-20", "clang++-19", "clang++-18", "g++")
                 if shutil.which(c)), None)
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
FLAGS = ["-std=c++14", "-pedantic-errors", "-Wno-unknown-attributes", f"-I{SHIM}", "-x", "c++"]
HEADS = [(64, 64), (96, 96), (128, 128), (256, 256), (512, 512), (192, 128), (96, 64)]
# The dialect's names of the dtypes (uint8: the floating-point modes' scale codes).
DTYPES = {"float": dtypes.float32, "half": dtypes.float16, "bfloat": dtypes.bfloat16, "uchar": dtypes.uint8}
# (query heads, key heads, query rows): every grouping up to the vector kernels' 32 rows.
GROUPS = [(hq, 1, lq) for hq in (1, 2, 4, 8, 16, 32) for lq in range(1, 9) if hq * lq <= 32]
FORMATS = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
# Before the kernels: the template whose static_assert compares stated and declared bytes (the
# error names both numbers).
AGREE = """
template <unsigned long Stated, unsigned long Declared> struct threadgroup_bytes_agree {
  static_assert(Stated == Declared, "the stated threadgroup bytes differ from the kernel's threadgroup arrays");
  static const bool value = true;
};
"""
MARK = "NUVEC_THREADGROUP"
_ARRAY = re.compile(rf"{MARK}\s+(?:const\s+)?\w+(?:\s+\w+)*?\s+(\w+\s*\[[^;]*);")   # the declarators
_POINTER = re.compile(rf"{MARK}\s+(?:const\s+)?\w+(?:\s+\w+)*?\s*\*")
_UNIT = re.compile(r"namespace (unit\d+) \{")


def planned_specs():
    """Each decode specialisation the plan emits, over head sizes, dtypes, groupings, key counts
    (one and two passes, every GPU class's block count) and options. No call is routed away for
    its threadgroup: the plan's own rules give the kernels only what fits."""
    specs = {}
    for (d, dv), dtype, (hq, hkv, lq) in itertools.product(HEADS, KERNEL_DTYPES, GROUPS):
        for lk, gpu_class in itertools.product((600, 5000, 70000), ("g", "s", "d")):
            for mask, sinks, window, page in (("none", False, None, 0), ("causal", True, 100, 0), ("bool", False, None, 0),
                                              ("additive", True, None, 0), ("causal", True, 100, 16)):
                call = validate_attention("check", (1, hq, lq, d), (1, hkv, lk, d), (1, hkv, lk, dv), dtype,
                                          "causal" if mask == "causal" else None, None, window, None)
                plan = plan_call(call, PlanTarget("metal", gpu_class))
                assert "threadgroup" not in plan.reason, plan.reason
                if not isinstance(plan.kernel, Vector) or (page and d != dv): continue
                mask_kind = {"none": 0, "causal": 0, "bool": 1, "additive": 2}[mask]
                spec = DecodeSpec(dtype, d, dv, hq, hkv, lq, plan.kernel.passes, plan.kernel.blocks, mask == "causal",
                                  window is not None, mask_kind, sinks, page, 0.125, "ints" if page else "(length+1)")
                specs[spec] = None
    return list(specs)


def decode_cases(specs) -> list[tuple[Program, Resources]]:
    """Each spec's Metal programs with their stated threadgroups."""
    return [case for spec in specs for case in zip(spec.programs("metal", [Param("length", "scalar")]), spec.metal_resources(),
                                                   strict=True)]


def _unit_source(texts: list[str], bfloat: bool) -> str:
    """One translation unit: the prelude (with bfloat where asked), then each text in a namespace
    of its own, its defines undone after it."""
    unit = []
    for i, text in enumerate(texts):
        defined = [line.split()[1].split("(")[0] for line in text.splitlines() if line.startswith("#define ")]
        unit.append(f"namespace unit{i} {{\n{text}\n}}\n" + "".join(f"#undef {d}\n" for d in defined))
    return ("#define NUVEC_BFLOAT 1\n" if bfloat else "") + prelude("metal") + AGREE + "\n".join(unit)


def _compile(tmp_path, source: str, bfloat: bool, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "unit.metal"
    path.write_text(source)
    return subprocess.run([COMPILER, *FLAGS, *([] if bfloat else ["-DSHIM_NO_BFLOAT"]), *flags, str(path)],
                          capture_output=True, text=True)


def _threadgroup_arrays(tmp_path, texts: list[str], bfloat: bool) -> list[list[str]]:
    """The names of each text's threadgroup arrays, as its defines leave them: from the
    preprocessor's output with the qualifier marked."""
    result = _compile(tmp_path, _unit_source(texts, bfloat), bfloat, "-E", "-P", "-DSHIM_MARK_THREADGROUP")
    assert result.returncode == 0, result.stderr[:3000]
    pieces = _UNIT.split(result.stdout)  # text before the first unit, then (name, body) pairs
    arrays = [_array_names(body) for body in pieces[2::2]]
    assert len(arrays) == len(texts)
    return arrays


def _array_names(preprocessed: str) -> list[str]:
    """The threadgroup arrays a preprocessed kernel declares (the qualifier marked); every other
    use of the qualifier must be a pointer's."""
    declarations = _ARRAY.findall(preprocessed)
    assert len(declarations) + len(_POINTER.findall(preprocessed)) == preprocessed.count(MARK), \
        f"a threadgroup use that is neither an array nor a pointer:\n{preprocessed[:3000]}"
    names = []
    for declarators in declarations:  # `a[...], b[...]`: split at the commas outside brackets
        depth, start = 0, 0
        for i, c in enumerate(declarators + ","):
            depth += (c in "[(") - (c in "])")
            if c == "," and depth == 0:
                names.append(re.match(r"\s*(\w+)", declarators[start:i]).group(1))
                start = i + 1
    return names


def _with_bytes_check(text: str, arrays: list[str], stated: int) -> str:
    """`text` with a static_assert, before its kernel's closing brace, that its threadgroup arrays
    take `stated` bytes (each rounded up to 16)."""
    declared = " + ".join(f"(sizeof({name}) + 15) / 16 * 16" for name in arrays) or "0"
    end = text.rindex("}")
    return f"{text[:end]}  static_assert(threadgroup_bytes_agree<{stated}ul, {declared}>::value, \"\");\n{text[end:]}"


def check_metal(tmp_path, cases: list[tuple[Program, Resources]], per_unit: int = 150):
    """Hold each program's stated threadgroup within an Apple GPU's limits, then compile the
    programs (each once) in units against the shim: without bfloat where they do not need it,
    each with the check that its threadgroup arrays take the bytes stated."""
    for program, resources in cases:
        assert metal_limit_reason(resources) is None, (program.name, resources)
    unique = {program.name: (program, resources) for program, resources in cases}
    for bfloat in (False, True):
        group = [case for case in unique.values() if case[0].bfloat == bfloat]
        for start in range(0, len(group), per_unit):
            unit = group[start:start + per_unit]
            arrays = _threadgroup_arrays(tmp_path, [program.text for program, _ in unit], bfloat)
            texts = [_with_bytes_check(program.text, names, resources.threadgroup_bytes)
                     for (program, resources), names in zip(unit, arrays)]
            result = _compile(tmp_path, _unit_source(texts, bfloat), bfloat, "-fsyntax-only")
            assert result.returncode == 0, result.stderr[:3000]


def test_the_check_rejects_planted_errors(tmp_path):
    """A misspelt name, a type Metal lacks, C++17 syntax, bfloat on the Metal 3.0 shim, and a
    stated threadgroup 16 bytes short of the kernel's arrays each fail."""
    f16 = DecodeSpec(dtypes.float16, 128, 128, 4, 1, 1, 2, 32, True, False, 0, True, 0, 0.125)
    bf16 = DecodeSpec(dtypes.bfloat16, 128, 128, 4, 1, 1, 1, 1, False, False, 0, False, 0, 0.125)
    program, resources = decode_cases([f16])[0]
    bf16_program = bf16.programs("metal")[0]
    assert not program.bfloat and bf16_program.bfloat
    check_metal(tmp_path, [(program, resources), (bf16_program, bf16.metal_resources()[0])])
    short = _with_bytes_check(program.text, _threadgroup_arrays(tmp_path, [program.text], False)[0],
                              resources.threadgroup_bytes - 16)
    for text, prelude_bfloat, shim_bfloat in ((program.text.replace("simd_shuffle_xor", "simd_shufle_xor", 1), False, False),
                                              (program.text.replace("float score", "float3x score", 1), False, False),
                                              (program.text.replace("float score", "if constexpr (true) {} float score", 1),
                                               False, False),
                                              (bf16_program.text, True, False), (short, False, False)):
        result = _compile(tmp_path, _unit_source([text], prelude_bfloat), shim_bfloat, "-fsyntax-only")
        assert result.returncode != 0, text[-300:]


def test_every_threadgroup_array_is_found():
    """Arrays declared alone and together, sizes with commas; pointers are not arrays; any other
    use of the qualifier fails the check."""
    assert _array_names(f"{MARK} float a[4 * 8]; {MARK} float b[4], c[min(2, 3)]; const {MARK} float* p = a; "
                        f"q = (const {MARK} uint4*)to; {MARK} unsigned long long d[2];") == ["a", "b", "c", "d"]
    with pytest.raises(AssertionError, match="neither an array nor a pointer"):
        _array_names(f"{MARK} float& r = a[0];")


def test_every_planned_metal_specialisation_compiles(tmp_path):
    specs = planned_specs()
    assert len(specs) > 100
    check_metal(tmp_path, decode_cases(specs))


def test_every_gated_delta_metal_specialisation_compiles(tmp_path):
    cases = []
    for (dk, dv), activation, state, gate, mode, steps in itertools.product(
            [(128, 128), (64, 48), (32, 17), (96, 64)], KERNEL_DTYPES, KERNEL_DTYPES, (dtypes.float32, dtypes.bfloat16),
            ("final", "steps", "slots"), (1, 512)):
        types = dict(q=activation, k=activation, v=activation, g=gate, beta=activation, state=state,
                     storage=dtypes.float16 if mode == "steps" else state)
        shape = gated_delta.plan(steps)
        assert gated_delta.unsupported(tuple(types.values()), 1, steps, 4, dk, dv, PlanTarget("metal")) is None
        cases.append((gated_delta.program("metal", types, mode, dk, dv, 2, 4, shape), gated_delta.metal_resources(shape)))
    check_metal(tmp_path, cases)


def test_every_chunked_gated_delta_metal_specialisation_compiles(tmp_path):
    """The chunked prefill's two passes: every head size it takes up to Dv 256, both 16-bit
    activations, each gate dtype with the decay and its logarithm, each state dtype, the final
    state and the pool, and each threadgroup of the state pass, within an Apple GPU's limits (Dk
    128 with Dv 256 is not: its first pass's tiles pass 32 KB, and the recurrence takes it)."""
    assert "threadgroup memory" in gated_delta.chunked_unsupported((dtypes.float16,) * 3, 128, 256, PlanTarget("metal"))
    cases = []
    for (dk, dv), activation in itertools.product([(128, 128), (64, 48), (32, 16), (96, 64), (64, 256)],
                                                  (dtypes.float16, dtypes.bfloat16)):
        assert gated_delta.chunked_unsupported((activation,) * 3, dk, dv, PlanTarget("metal")) is None
        for gate, log_decay in itertools.product(KERNEL_DTYPES, (False, True)):
            types = dict(q=activation, g=gate, beta=gate)
            first, _ = gated_delta.chunked_metal_resources(activation, dk, dv, gated_delta.Chunked(gated_delta.CHUNK, 1))
            cases.append((gated_delta.chunks_program("metal", types, dk, dv, 2, 4, gated_delta.CHUNK, log_decay), first))
        for state, slots, warps in itertools.product(KERNEL_DTYPES, (False, True), gated_delta.CHUNKED_WARPS):
            shape = gated_delta.Chunked(gated_delta.CHUNK, warps)
            types = dict(q=activation, g=dtypes.float32, beta=dtypes.float32, state=state)
            _, second = gated_delta.chunked_metal_resources(activation, dk, dv, shape)
            cases.append((gated_delta.pass_program("metal", types, dk, dv, 2, 4, shape, slots), second))
    check_metal(tmp_path, cases)


def test_every_norm_metal_specialisation_compiles(tmp_path):
    cases = []
    for kind, types, length in norm_calls():
        assert rows.unsupported(tuple(types.values()), 2, length, PlanTarget("metal")) is None
        shape = rows.plan(length)
        cases.append((rows.norm_program("metal", kind, types, 1e-6, shape), rows.metal_resources(shape)))
    assert len(cases) > 100
    check_metal(tmp_path, cases)


def test_every_softmax_metal_specialisation_compiles(tmp_path):
    """softmax, logsumexp and cross_entropy: every dtype at every launch the plan emits."""
    cases = []
    for mode, dtype, length in softmax_calls():
        assert softmax.unsupported(dtype, 2, length, PlanTarget("metal")) is None
        shape = softmax.plan(length, dtype.itemsize)
        cases.append((softmax.program("metal", mode, dtype, shape), softmax.metal_resources(shape)))
    assert len(cases) == 3 * 3 * 35  # 32 thread counts, the looped launch in pieces and not, 257 (single elements)
    check_metal(tmp_path, cases)


def test_every_residual_norm_metal_specialisation_compiles(tmp_path):
    cases = []
    for types, length, scale, next_eps in residual_norm_calls():
        assert rows.unsupported(tuple(types.values()), 2, length, PlanTarget("metal")) is None
        shape = rows.plan(length)
        cases.append((rows.residual_norm_program("metal", types, 1e-6, shape, scale=scale, next_eps=next_eps),
                      rows.metal_resources(shape)))
    assert len(cases) > 100
    check_metal(tmp_path, cases)


def test_every_rope_metal_specialisation_compiles(tmp_path):
    """rope: every dtype and pair layout at every piece width, with and without features past dims."""
    cases = []
    for dtype, traditional, scale, length, dims in rope_calls():
        assert rope.unsupported(dtype, 2, length, dims, PlanTarget("metal")) is None
        shape = rope.plan(length, dims)
        cases.append((rope.program("metal", dtype, traditional, scale, shape), rope.metal_resources(shape)))
    assert len(cases) == 3 * 2 * 7 + 1
    check_metal(tmp_path, cases)


def test_every_norm_rope_metal_specialisation_compiles(tmp_path):
    """norm_rope: every dtype and pair layout at every launch shape and unit width, each
    destination with and without a weight and values, mixed dtypes, queries beside keys."""
    cases = []
    for types, destination, traditional, length, dims in norm_rope_calls():
        dtypes_read = (types["x"], types["normed"]) + tuple(t for name, t in types.items() if name not in ("x", "normed"))
        assert rope.norm_rope_unsupported(dtypes_read, 2, length, dims, 0, PlanTarget("metal")) is None
        cases.append((norm_rope_program("metal", types, destination, traditional, length, dims),
                      rope.norm_rope_metal_resources(rope.norm_rope_plan(length, dims), types["normed"])))
    assert len(cases) > 80
    check_metal(tmp_path, cases)


def test_every_paged_write_metal_specialisation_compiles(tmp_path):
    """paged_write: every pair of source and pool dtypes at every piece width."""
    cases = []
    for source, pool, length in paged_write_calls():
        assert paged.unsupported((source, pool), 2, length, 16, PlanTarget("metal")) is None
        shape = paged.plan(length, max(source.itemsize, pool.itemsize))
        cases.append((paged.program("metal", source, pool, shape), paged.metal_resources(shape)))
    assert len(cases) == 3 * 3 * 4
    check_metal(tmp_path, cases)


def test_every_take_metal_specialisation_compiles(tmp_path):
    """take (the row gather): every chunk width."""
    check_metal(tmp_path, [(paged.take_program("metal", width), Resources(paged.THREADS, 0)) for width in (16, 8, 4, 2)])


def test_every_gated_delta_inputs_metal_specialisation_compiles(tmp_path):
    """The gated DeltaNet layer's inputs kernel: its covering set (`kernel_specialisations`), each
    within an Apple GPU's limits."""
    cases = []
    for spec in specialisations("metal")[gated_delta.GATED_DELTA_INPUTS.stem]:
        threads = int(spec.program.text.split("#define THREADS ")[1].split()[0])
        cases.append((spec.program, Resources(threads, threadgroup_array(threads // 32, 4))))
    assert len(cases) >= 30
    check_metal(tmp_path, cases)


def qmv_cases():
    """Each qmv specialisation the routing emits, up to sizes: every mode, width and group, x (and
    y) dtype, affine scales dtype, 1-8 rows; K and N at the kernel's boundaries (half chunks, fewer
    columns than a SIMD group serves, narrower loads, one row's wide columns), the default plan and a
    few others."""
    float_types = ("float", "half", "bfloat")
    for (mode, group, bits), x, rows in itertools.product(FORMATS, float_types, range(1, 9)):
        for scales in (float_types if mode == "affine" else ("uchar",)):
            # (4096, 14336) at one row: 2 steps a SIMD group and enough of them, so the wide-column plan.
            shapes = ((4096, 4096), (group * 3, 3)) + (((4096 + 16, 14336),) if mode == "nvfp4" else ()) + (
                ((4096, 14336),) if rows == 1 else ())
            for k, n in shapes:
                plans = {qmv.plan(rows, k, n)} | ({qmv.QmvPlan(3, 2, 2, 2)} if rows == 1 and n > 3 else set())
                for p in plans:
                    for batches in ((0, 3) if rows in (1, 8) else (0,)):  # plain, and gathered over 3 weight batches
                        yield (qmv.qmv_program("metal", DTYPES[x], DTYPES[scales], DTYPES[x], mode=mode, group_size=group,
                                               bits=bits, rows=rows, k=k, n=n, qmv_plan=p, batches=batches),
                               qmv.qmv_metal_resources(rows, p))
                    if k == 4096 and rows in (1, 8):  # SwiGLU's product (swiglu_matmul)
                        yield (qmv.qmv_program("metal", DTYPES[x], DTYPES[scales], DTYPES[x], mode=mode, group_size=group,
                                               bits=bits, rows=rows, k=k, n=n, qmv_plan=p, glu=True),
                               qmv.qmv_metal_resources(rows, p))


def test_every_qmv_metal_specialisation_compiles(tmp_path):
    cases = list(qmv_cases())
    assert len(cases) > 1000
    check_metal(tmp_path, cases, per_unit=400)


def test_every_qvm_metal_specialisation_compiles(tmp_path):
    cases = []
    for (mode, group, bits), x, rows, k in itertools.product(FORMATS, ("float", "half", "bfloat"), (1, 3, 8), (4096, 100)):
        n = 4096 if k == 4096 else 3 * group   # nvfp4: 48, a half chunk
        scales = DTYPES[x if mode == "affine" else "uchar"]
        assert qmv.product_route(DTYPES[x], scales, DTYPES[x], rows, k, n, bits=bits, mode=mode, transpose=False, batched=False,
                                 target=PlanTarget("metal")) == ("qvm", None)
        cases.append((qmv.qvm_program("metal", DTYPES[x], scales, DTYPES[x], mode=mode, group_size=group, bits=bits,
                                      rows=rows, k=k, n=n), qmv.qvm_metal_resources(rows, k)))
    check_metal(tmp_path, cases, per_unit=400)


def test_every_qmm_metal_specialisation_compiles(tmp_path):
    """Every mode, width, group, 16-bit x, scale dtype, load width (K's alignment), plain and
    gathered: each one the routes give to qmm on an Apple7 GPU (float32 scales promote x past
    qmm's types, and are compiled all the same)."""
    cases = []
    for (mode, group, bits), x, k, gather in itertools.product(FORMATS, ("half", "bfloat"), (4096, 4096 + 16), (False, True)):
        if k % group: continue
        for scales in ((x, "float") if mode == "affine" else ("uchar",)):
            if scales != "float":
                assert qmv.product_route(DTYPES[x], DTYPES[scales], DTYPES[x], 64, k, 4096, bits=bits, mode=mode, transpose=True,
                                         batched=False, target=PlanTarget("metal")) == ("qmm", None)
            cases.append((qmv.qmm_program("metal", DTYPES[x], DTYPES[scales], DTYPES[x], mode=mode, group_size=group,
                                          bits=bits, k=k, gather=gather), qmv.qmm_metal_resources(bits)))
    assert len(cases) > 180
    check_metal(tmp_path, cases, per_unit=200)


def test_every_dequantize_metal_specialisation_compiles(tmp_path):
    """Every mode, width and group into each float dtype (affine scales of that dtype), K whose
    rows take wide or narrow loads: each one `quant.dequantize` gives the kernel on an Apple GPU."""
    cases = []
    for (mode, group, bits), out, k in itertools.product(FORMATS, ("float", "half", "bfloat"), (4096, 4096 + 16)):
        if k % group: continue
        scales = DTYPES[out if mode == "affine" else "uchar"]
        assert qmv.dequantize_unsupported(scales, DTYPES[out], 8, k, PlanTarget("metal")) is None
        cases.append((qmv.dequantize_program("metal", scales, DTYPES[out], mode=mode, group_size=group, bits=bits, k=k),
                      Resources(qmv.DEQUANTIZE_THREADS, 0)))
    check_metal(tmp_path, cases, per_unit=200)


def test_every_prefill_metal_specialisation_compiles(tmp_path):
    """The tiled prefill kernel: every head size, 16-bit dtype and option at each launch the plan
    gives an Apple GPU's class."""
    specs = set(prefill_specs("metal"))
    assert len(specs) > 100
    check_metal(tmp_path, [(spec.program("metal"), spec.metal_resources()) for spec in specs], per_unit=100)


def test_every_gemv_metal_specialisation_compiles(tmp_path):
    """gemv: every dtype of x and w, with and without a bias, 1-8 rows, each piece width (K), N
    below a SIMD group's columns, the default plans and another, SwiGLU's product (`gemv_calls`),
    each one the route gives the kernel on Metal."""
    cases = []
    for x, w, bias, out, rows_, k, n, p, glu in gemv_calls():
        assert linear.route(x, w, bias, out, rows_, k, n, PlanTarget("metal")) == ("gemv", None)
        cases.append((linear.gemv_program("metal", x, w, bias, out, rows=rows_, k=k, n=n, plan=p, glu=glu),
                      linear.gemv_metal_resources(rows_, p)))
    assert len(cases) > 400
    check_metal(tmp_path, cases, per_unit=400)


def test_every_gemm_metal_specialisation_compiles(tmp_path):
    """gemm: both 16-bit types, every bias dtype (and none), K of every alignment (odd too: Metal
    reads element by element), gathered, on an Apple7 GPU (`gemm_calls`)."""
    cases = []
    for dtype, bias, out, k, tiles, gather in gemm_calls("metal"):
        assert linear.route(dtype, dtype, bias, out, 64, k, 4096, PlanTarget("metal")) == ("gemm", None)
        assert linear.gemm_plan(64, "metal") == tiles
        cases.append((linear.gemm_program("metal", dtype, bias, out, k=k, tiles=tiles, gather=gather),
                      linear.gemm_metal_resources(tiles)))
    assert len(cases) == 2 * 4 * 5
    check_metal(tmp_path, cases)


def test_every_metal_family_is_checked():
    """A new kernel family lands with its Metal specialisations in this file."""
    checked = {"nuvec_sdpa_decode", "nuvec_sdpa_merge", "nuvec_gated_delta", "nuvec_qmv", "nuvec_qvm", "nuvec_qmm", "nuvec_rms_norm",
               "nuvec_layer_norm", "nuvec_residual_norm", "nuvec_softmax", "nuvec_logsumexp", "nuvec_cross_entropy",
               "nuvec_rope", "nuvec_norm_rope", "nuvec_sdpa_prefill", "nuvec_gemv", "nuvec_gemm",
               "nuvec_gated_delta_chunks", "nuvec_gated_delta_pass", "nuvec_paged_write", "nuvec_take_rows",
               "nuvec_gated_delta_inputs", "nuvec_dequantize"}
    assert {f.stem for f in FAMILIES if "metal" in f.backends} == checked
