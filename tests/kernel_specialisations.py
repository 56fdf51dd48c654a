"""The specialisations of every kernel family that the plan can emit, rendered for a backend
through the functions a launch uses (`DecodeSpec.programs`, `gated_delta.program`,
`quant.qmv_program`, `qvm_program`, `qmm_program`, `linear.gemv_program`, `gemm_program`): for the compile checks
(`tests/test_cuda_check.py`, `tools/compile_cuda.py`).

Each family walks its whole space of specialisations (for attention, what `plan_call` gives over
head sizes, dtypes, groupings, key counts, batches, masks, windows, sinks, pages and symbolic
lengths). The walk has tens of thousands of members, most of them differing from another only in
a constant (a head count, a block count, a key count), so `specialisations` keeps a covering set:
a member is kept when it brings a combination not seen yet of what selects code or layout in the
source (each family's `cover` keys: the layout and pass kind with every dtype and head size; the
options with every dtype and pass kind; for the products every format with every dtype, every row
count and plan, every boundary shape). `full=True` keeps every distinct program instead.
`assembled` picks a few per family that between them reach every inline-assembly path of the
prelude (each mma and copy width, both staging modes, the L2 hint), for a check that assembles
them.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

from tinygrad import dtypes
from tinygrad.dtype import DType

from nuvec_tg.fast.plan import PlanTarget, Vector, plan_call, validate_attention
from nuvec_tg.kernels import gated_delta, linear, paged, prefill, rope, rows, softmax
from nuvec_tg.kernels import quant
from nuvec_tg.kernels.attention import (MATRIX_ROWS, DecodeSpec, default_launch, geometry, matrix_staging_bytes,
                                        paged_unsupported)
from nuvec_tg.kernels.program import FAMILIES, KERNEL_DTYPES, Param, Program, prelude
from nuvec_tg.tensor import dtype_name, promote_types


@dataclass(frozen=True)
class Specialisation:
    """One kernel program of a family, with a label that says which call it serves."""
    family: str
    label: str
    program: Program


class _Candidate(NamedTuple):
    """A member of a family's walk, not rendered yet: `make()` gives its label and program; its
    `cover` keys (it joins the covering set when one of them is new) and `assemble` keys (the
    same for the assembled set)."""
    family: str
    make: Callable[[], tuple[str, Program]]
    cover: tuple[tuple, ...]
    assemble: tuple[tuple, ...] = ()


HEADS = [(64, 64), (96, 96), (128, 128), (256, 256), (512, 512), (192, 128), (96, 64)]
# (query heads, key heads, query rows): every grouping up to the decode kernels' 32 rows per key
# head, and two key heads for some (the CUDA plan's block counts follow the key heads).
GROUPS = [(hq, 1, lq) for hq in (1, 2, 4, 8, 16, 32) for lq in range(1, 9) if hq * lq <= 32] + [(16, 2, 1), (16, 2, 2), (8, 2, 4)]
# Key counts: one pass, and two passes at few, some and many blocks.
KEY_COUNTS = (60, 600, 5000, 70000)
# One batch item, and (where the plan takes the matrix pass) enough that its L2 hint is off.
BATCHES = (1, 64)
# Plan targets per backend: Metal's GPU classes, CUDA at the default multiprocessor count (the H200's).
TARGETS = {"metal": [PlanTarget("metal", c) for c in ("g", "s", "d")], "cuda": [PlanTarget("cuda")]}
# The prefill route also differs on a CUDA target with Hopper's warpgroup products.
PREFILL_TARGETS = {"metal": TARGETS["metal"], "cuda": [PlanTarget("cuda"), PlanTarget("cuda", warpgroups=True)]}
# What the plan sees of a call's options (mask, window), then the options the kernels take for it:
# (mask kind 0 none / 1 bool / 2 additive, causal, window, sinks, paged block size).
PLANNED_OPTIONS = {
    ("none", None): [(0, False, False, sinks, 0) for sinks in (False, True)],
    ("array", None): [(kind, False, False, sinks, 0) for kind in (1, 2) for sinks in (False, True)],
    ("causal", None): [(0, True, False, sinks, page) for sinks in (False, True) for page in (0, 16)],
    ("causal", 100): [(0, True, True, sinks, page) for sinks in (False, True) for page in (0, 16)],
}
# The symbolic key count of a jitted decode step (a bound Variable), as a scalar parameter.
SYMBOLIC_LENGTH = ("(length+1)", (Param("length", "scalar"),))

FORMATS = [("affine", g, b) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
FLOATS = (dtypes.float32, dtypes.float16, dtypes.bfloat16)


def _planned_vectors(backend: str) -> Iterator[tuple[tuple, Vector, tuple]]:
    """((D, DV), dtype, (Hq, Hkv, Lq)), the plan's `Vector`, (mask, window) for each decode call
    of the walk that the plan gives the kernels."""
    for (d, dv), dtype, (hq, hkv, lq), lk, target in itertools.product(HEADS, KERNEL_DTYPES, GROUPS, KEY_COUNTS,
                                                                      TARGETS[backend]):
        for batch in BATCHES:
            matrix = False
            for mask, window in PLANNED_OPTIONS:
                call = validate_attention("check", (batch, hq, lq, d), (batch, hkv, lk, d), (batch, hkv, lk, dv), dtype,
                                          "causal" if mask == "causal" else None, None, window, None)
                if mask == "array": call = dataclasses.replace(call, mask="array")  # the plan reads only its kind
                vector = plan_call(call, target).kernel
                if not isinstance(vector, Vector): continue
                matrix |= vector.matrix
                yield ((d, dv), dtype, (hq, hkv, lq)), vector, (mask, call.window if window else None)
            if not matrix: break  # the batch changes only the matrix pass's L2 hint


def _decode_label(spec: DecodeSpec) -> str:
    options = [name for name, on in (("causal", spec.causal), ("window", spec.window), ("sinks", spec.sinks)) if on]
    options += [f"{('bool', 'additive')[spec.mask_kind - 1]} mask"] if spec.mask_kind else []
    options += [f"page {spec.page}"] if spec.page else []
    options += [] if spec.length == "ints" else ["symbolic length"]
    return (f"{dtype_name(spec.dtype)} D{spec.head_dim}/{spec.value_dim} Hq{spec.q_heads} Hkv{spec.kv_heads} Lq{spec.q_len} "
            f"passes {spec.passes} blocks {spec.blocks}" + (f" matrix l2_ahead {spec.l2_ahead}" if spec.matrix else "")
            + "".join(f" {o}" for o in options))


def _decode_candidates(backend: str) -> Iterator[_Candidate]:
    """The decode passes and merges of every call the walk plans for the kernels, as
    `decode_attention` builds them (contiguous caches with an integer and a symbolic key count,
    paged pools where `paged_unsupported` allows)."""
    for ((d, dv), dtype, (hq, hkv, lq)), vector, (mask, window) in _planned_vectors(backend):
        shape = default_launch(backend, vector.matrix)
        rows = hq // hkv * lq
        if vector.matrix:  # the matrix pass's layout: its staged rows (and so its staging buffers)
            pass_kind, layout = ("matrix", vector.l2_ahead > 0), (min(rows, MATRIX_ROWS),)
            family = "nuvec_sdpa_decode_mma"
            # each mma type, staging mode (mbarriers or a barrier) and L2 hint
            assemble = ((dtype,), (_stage_buffers(rows, dv, shape.warps),), pass_kind)
        else:              # the vector pass's: how lanes share a key line and rows a threadgroup
            g = geometry(d, dv, dtype, rows, shape.warps)
            pass_kind, layout = ("vector", vector.passes), (g.lanes_per_key, g.features_per_lane, g.values_per_lane, g.rows)
            family, assemble = "nuvec_sdpa_decode", (pass_kind,)
        sizes = (dtype, d, dv, hq, hkv, lq, vector.passes, vector.blocks)
        launch = (shape.warps, shape.unroll, vector.matrix, vector.l2_ahead if vector.matrix else 0)
        layout_key = (dtype, d, dv, pass_kind, layout)
        merge_key = (dtype, dv) + _merge_layout(dv, vector.blocks)
        for options in _decode_options(mask, window, d):
            mask_kind, causal, window_on, sinks, page, length = options
            make = _DecodeMaker(backend, sizes, options, launch)
            yield _Candidate(family, make.first, (layout_key, (dtype, pass_kind, options[:4], page > 0, length)), assemble)
            if vector.passes == 2:  # the merge's code: its value width, sinks, and how its threads split the blocks
                yield _Candidate("nuvec_sdpa_merge", make.merge, (merge_key + (sinks,),), ((),))


@functools.cache
def _decode_options(mask: str, window: int | None, head_dim: int) -> tuple[tuple, ...]:
    """(mask kind, causal, window, sinks, paged block size, key count) of the kernels for a call the
    plan saw with this mask and window: `PLANNED_OPTIONS`, paged where `paged_unsupported`
    allows, contiguous with an integer and a symbolic key count."""
    return tuple(option + (length,) for option in PLANNED_OPTIONS[(mask, window)]
                 if not (option[4] and paged_unsupported(head_dim, option[4]) is not None)
                 for length in (("ints",) if option[4] else ("ints", SYMBOLIC_LENGTH[0])))


class _DecodeMaker:
    """(label, program) of a decode specialisation's first pass or merge, built when asked."""
    def __init__(self, backend: str, sizes: tuple, options: tuple, launch: tuple):
        self.backend, self.sizes, self.options, self.launch = backend, sizes, options, launch

    def _programs(self) -> tuple[str, list[Program]]:
        mask_kind, causal, window_on, sinks, page, length = self.options
        spec = DecodeSpec(*self.sizes, causal, window_on, mask_kind, sinks, page, 0.125, length, *self.launch)
        length_params = list(SYMBOLIC_LENGTH[1]) if length == SYMBOLIC_LENGTH[0] else []
        return _decode_label(spec), spec.programs(self.backend, length_params)

    def first(self) -> tuple[str, Program]:
        label, programs = self._programs()
        return label, programs[0]

    def merge(self) -> tuple[str, Program]:
        label, programs = self._programs()
        return label, programs[1]


@functools.cache
def _merge_layout(value_dim: int, blocks: int) -> tuple[int, int]:
    """The merge's splits and threads per query row (`DecodeSpec.merge_splits`, `merge_threads`)."""
    spec = DecodeSpec(dtypes.float32, value_dim, value_dim, 1, 1, 1, 2, blocks, False, False, 0, False, 0, 1.0)
    return spec.merge_splits(), spec.merge_threads()


def _stage_buffers(rows: int, value_dim: int, warps: int) -> int:
    """The matrix pass's staging buffers (`sdpa_decode_mma.h`'s STAGE_BUFFERS): its staging bytes
    over one buffer's (each SIMD group's staged rows of DV + 2 floats)."""
    return matrix_staging_bytes(rows, value_dim, warps) // (warps * min(rows, MATRIX_ROWS) * (value_dim + 2) * 4)


def _gated_delta_candidates(backend: str) -> Iterator[_Candidate]:
    """The three modes over both launches (decode, prefill), head sizes from the usual to odd
    ones (Dv not a multiple of a threadgroup's rows), grouped value heads, and the dtypes of
    activations, state, gate and storage."""
    for (dk, dv), activation, state, gate, mode, steps in itertools.product(
            [(128, 128), (64, 48), (32, 17), (96, 64)], KERNEL_DTYPES, KERNEL_DTYPES, (dtypes.float32, dtypes.bfloat16),
            ("final", "steps", "slots"), (1, 512)):
        for storage in ((dtypes.float16, dtypes.float32) if mode == "steps" else (state,)):
            types = dict(q=activation, k=activation, v=activation, g=gate, beta=activation, state=state, storage=storage)
            shape = gated_delta.plan(steps)

            def make(types=types, mode=mode, dk=dk, dv=dv, shape=shape) -> tuple[str, Program]:
                label = (f"{mode} Dk{dk} Dv{dv} " + " ".join(f"{name} {dtype_name(t)}" for name, t in types.items())
                         + f" {shape.warps} warps x {shape.rows} rows")
                return label, gated_delta.program(backend, types, mode, dk, dv, 2, 4, shape)
            cover = ((mode, shape, dk, dv, activation), (mode, activation, state, gate, storage))
            yield _Candidate("nuvec_gated_delta", make, cover, ((),))


def _gated_delta_chunked_candidates(backend: str) -> Iterator[_Candidate]:
    """The chunked prefill's two passes: head sizes from 16 to the largest it takes (Dv past Dk),
    both 16-bit activations, gates and rates of each dtype, the decay and its logarithm, every
    state dtype, the final state and the pool, and each threadgroup of the state pass."""
    for (dk, dv), activation, gate, log_decay in itertools.product(
            [(128, 128), (64, 48), (32, 16), (96, 64), (128, 256)], (dtypes.float16, dtypes.bfloat16), KERNEL_DTYPES, (False, True)):
        types = dict(q=activation, g=gate, beta=activation if log_decay else gate)

        def make_chunks(types=types, dk=dk, dv=dv, log_decay=log_decay) -> tuple[str, Program]:
            label = f"Dk{dk} Dv{dv} " + " ".join(f"{name} {dtype_name(t)}" for name, t in types.items()) + (" log decay" * log_decay)
            return label, gated_delta.chunks_program(backend, types, dk, dv, 2, 4, gated_delta.CHUNK, log_decay)
        yield _Candidate(gated_delta.GATED_DELTA_CHUNKS.stem, make_chunks, ((dk, dv, activation), (activation, gate, log_decay)), ((),))
    for (dk, dv), activation, state, slots, warps in itertools.product(
            [(128, 128), (64, 48), (32, 16), (96, 64), (128, 256)], (dtypes.float16, dtypes.bfloat16), KERNEL_DTYPES, (False, True),
            gated_delta.CHUNKED_WARPS):
        types = dict(q=activation, g=dtypes.float32, beta=dtypes.float32, state=state)
        shape = gated_delta.Chunked(gated_delta.CHUNK, warps)

        def make_pass(types=types, dk=dk, dv=dv, shape=shape, slots=slots) -> tuple[str, Program]:
            label = (f"{'slots' if slots else 'final'} Dk{dk} Dv{dv} " + " ".join(f"{name} {dtype_name(t)}" for name, t in types.items())
                     + f" {shape.warps} warps")
            return label, gated_delta.pass_program(backend, types, dk, dv, 2, 4, shape, slots)
        yield _Candidate(gated_delta.GATED_DELTA_PASS.stem, make_pass, ((dk, dv, activation, warps), (activation, state, slots)), ((),))


def _gated_delta_inputs_candidates(backend: str) -> Iterator[_Candidate]:
    """The layer's inputs kernel: both projection layouts, head sizes alike and not (threads past
    the smaller heads), the filter's taps from 1 to the largest, the pool and the state, the decay
    and its logarithm, every dtype of the projection, the state and the gates."""
    for (dk, dv), projection, state, gate, taps, grouped, slots, log_decay in itertools.product(
            [(128, 128), (64, 40), (32, 96)], KERNEL_DTYPES, KERNEL_DTYPES, (dtypes.float32, dtypes.bfloat16),
            (1, 4, gated_delta.INPUTS_MAX_TAPS), (False, True), (False, True), (False, True)):
        heads = gated_delta.DeltaNetHeads(2, 4, dk, dv, grouped)
        types = dict(projected=projection, conv=state, filters=projection, a_log=gate, dt_bias=gate)
        threads = gated_delta.inputs_plan(dk, dv, taps, 1)[0]

        def make(types=types, heads=heads, taps=taps, threads=threads, slots=slots, log_decay=log_decay) -> tuple[str, Program]:
            label = (f"Dk{heads.key_dim} Dv{heads.value_dim} {'grouped' if heads.grouped else 'separate'} taps {taps} "
                     + " ".join(f"{name} {dtype_name(t)}" for name, t in types.items()) + " slots" * slots + " log decay" * log_decay)
            return label, gated_delta.inputs_program(backend, types, heads, taps, threads, 1e-6, slots, log_decay)
        cover = ((dk, dv, taps, grouped, slots, log_decay), (projection, state, gate))
        yield _Candidate(gated_delta.GATED_DELTA_INPUTS.stem, make, cover, ((),))


def _qmv_candidates(backend: str) -> Iterator[_Candidate]:
    """qmv and gather_qmv: every mode, width and group, x (and y) dtype, affine scales dtype, 1-8
    rows; K and N at the kernel's boundaries (half chunks, fewer columns than a SIMD group serves,
    narrower loads, one row's wide columns), the default plan and another."""
    for (mode, group, bits), x, rows in itertools.product(FORMATS, FLOATS, range(1, 9)):
        for scales in (FLOATS if mode == "affine" else (dtypes.uint8,)):
            # (4096, 14336) at one row: 2 steps a SIMD group and enough of them, so the wide-column plan.
            shapes = ((4096, 4096), (group * 3, 3)) + (((4096 + 16, 14336),) if mode == "nvfp4" else ()) + (
                ((4096, 14336),) if rows == 1 else ())
            for k, n in shapes:
                plans = {quant.plan(rows, k, n)} | ({quant.QmvPlan(3, 2, 2, 2)} if rows == 1 and n > 3 else set())
                for p, batches in itertools.product(sorted(plans, key=str), (0, 3) if rows in (1, 8) else (0,)):
                    label = (f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} M{rows} K{k} N{n} "
                             f"{p}" + (f" gathered over {batches}" if batches else ""))
                    make = functools.partial(_product, quant.qmv_program, backend, label, x, scales, mode=mode, group_size=group,
                                             bits=bits, rows=rows, k=k, n=n, qmv_plan=p, batches=batches)
                    yield _Candidate("nuvec_qmv", make, ((mode, group, bits, x), (mode, x, scales), (mode, rows, p, batches > 0),
                                                         (mode, group, bits, k, n), (mode, group, bits, batches > 0)),
                                     ((mode == "affine",),))  # the affine codes' LOP3, the floating-point ones' half2
                    if batches or k % 8: continue
                    # SwiGLU's product (swiglu_matmul): x the gate and up halves, the activation in its loads
                    make = functools.partial(_product, quant.qmv_program, backend, label + " swiglu", x, scales, mode=mode,
                                             group_size=group, bits=bits, rows=rows, k=k, n=n, qmv_plan=p, glu=True)
                    yield _Candidate("nuvec_qmv", make, ((mode, x, "swiglu"), (rows, "swiglu")), ((mode == "affine", "swiglu"),))


def _product(program: Callable[..., Program], backend: str, label: str, x, scales, **args) -> tuple[str, Program]:
    """(label, program) of a quantized product with activations and results of x's dtype."""
    return label, program(backend, x, scales, x, **args)


def _qvm_candidates(backend: str) -> Iterator[_Candidate]:
    """qvm: every mode, width and group, x dtype, 1, 3 and 8 rows, K of many and few rows of w
    (its split), N of many columns and of a half chunk."""
    for (mode, group, bits), x, rows, k in itertools.product(FORMATS, FLOATS, (1, 3, 8), (4096, 100)):
        n = 4096 if k == 4096 else 3 * group  # nvfp4: 48, a half chunk
        scales = x if mode == "affine" else dtypes.uint8
        label = f"{mode} {bits}-bit g{group} x {dtype_name(x)} M{rows} K{k} N{n}"
        make = functools.partial(_product, quant.qvm_program, backend, label, x, scales, mode=mode, group_size=group, bits=bits,
                                 rows=rows, k=k, n=n)
        yield _Candidate("nuvec_qvm", make, ((mode, group, bits, x), (mode, rows, k)), ((mode == "affine",),))


def _qmm_candidates(backend: str) -> Iterator[_Candidate]:
    """qmm and its gathered form: every mode, width and group, 16-bit x, affine scales in x's type
    and float32, K whose rows take wide or narrow weight loads."""
    for (mode, group, bits), x, k, gather in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), (4096, 4096 + 16),
                                                              (False, True)):
        if k % group: continue
        for scales in ((x, dtypes.float32) if mode == "affine" else (dtypes.uint8,)):
            label = (f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} K{k}"
                     + (" gathered" if gather else ""))
            make = functools.partial(_product, quant.qmm_program, backend, label, x, scales, mode=mode, group_size=group,
                                     bits=bits, k=k, gather=gather)
            # assembled: each copy width of the packed words (LOAD_WORDS) and each mma type
            yield _Candidate("nuvec_qmm", make, ((mode, group, bits, x, gather), (mode, x, scales, k, gather)),
                             ((quant.load_words(bits, k * bits // 32),), (x,)))


def _dequantize_candidates(backend: str) -> Iterator[_Candidate]:
    """dequantize: every mode, width and group into every float dtype (affine scales of that
    dtype: `quant.dequantize`'s rule), K whose rows take wide or narrow loads (nvfp4: a half chunk);
    and the probe's other pieces a thread."""
    for (mode, group, bits), out, k in itertools.product(FORMATS, FLOATS, (4096, 4096 + 16)):
        if k % group: continue
        for scales in ((out,) if mode == "affine" else (dtypes.uint8,)):
            label = f"{mode} {bits}-bit g{group} scales {dtype_name(scales)} into {dtype_name(out)} K{k}"
            make = functools.partial(_labelled, label, quant.dequantize_program, backend, scales, out, mode=mode, group_size=group,
                                     bits=bits, k=k)
            yield _Candidate(quant.DEQUANTIZE.stem, make, ((mode, group, bits, out), (mode, scales, k)),
                             ((mode == "affine",),))
    # the probe's sweep of pieces a thread (`tools/dequantize_probe.py --pieces`), at its format
    for pieces in (2, 4):
        make = functools.partial(_labelled, f"affine 4-bit g64 bf16 K4096, {pieces} pieces a thread", quant.dequantize_program,
                                 backend, dtypes.bfloat16, dtypes.bfloat16, mode="affine", group_size=64, bits=4, k=4096, pieces=pieces)
        yield _Candidate(quant.DEQUANTIZE.stem, make, (("pieces", pieces),), (("pieces", pieces),))


def _qmm_wgmma_candidates(backend: str) -> Iterator[_Candidate]:
    """qmm_wgmma (CUDA only): every mode, width and group, 16-bit x, affine scales in x's type and
    float32, plain and gathered, both plans' tiles at every width, the sweep's others at 4 bits."""
    if backend != "cuda": return
    for (mode, group, bits), x, gather in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), (False, True)):
        shapes = quant.QMM_WGMMA_SHAPES if bits == 4 else (quant.QMM_WGMMA_SMALL, quant.QMM_WGMMA_LARGE)
        for scales, tiles in itertools.product((x, dtypes.float32) if mode == "affine" else (dtypes.uint8,), shapes):
            if quant.qmm_wgmma_bytes(tiles, bits) > quant.WGMMA_MAX_DYNAMIC: continue
            label = (f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} {tiles}"
                     + (" gathered" if gather else ""))
            make = functools.partial(_labelled, label, quant.qmm_wgmma_program, x, scales, x, mode=mode, group_size=group,
                                     bits=bits, tiles=tiles, gather=gather)
            # assembled: each copy width of the packed words, each wgmma type and width
            yield _Candidate("nuvec_qmm_wgmma", make, ((mode, group, bits, x, gather), (mode, x, scales, gather, tiles)),
                             ((bits % 2,), (x, tiles.columns)))


def _qmm_wgmma_rs_candidates(backend: str) -> Iterator[_Candidate]:
    """qmm_wgmma_rs (CUDA only): every mode and group of its widths (2, 4, 8 bits), 16-bit x, affine
    scales in x's type and float32, plain and gathered, the plan's tiles at every width, the sweep's
    others at 4 bits (gathered: the plan's 64 rows)."""
    if backend != "cuda": return
    for (mode, group, bits), x, gather in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), (False, True)):
        if bits not in quant.QMM_WGMMA_RS_BITS: continue
        # gathered: the plan's 64 rows only (qmm_hopper_tiles)
        shapes = (quant.QMM_WGMMA_RS_SMALL,) if gather else quant.QMM_WGMMA_RS_SHAPES if bits == 4 else \
            (quant.QMM_WGMMA_RS_SMALL, *quant.QMM_WGMMA_RS_WIDE)
        for scales, tiles in itertools.product((x, dtypes.float32) if mode == "affine" else (dtypes.uint8,), shapes):
            if quant.qmm_wgmma_rs_bytes(tiles, bits) > quant.WGMMA_MAX_DYNAMIC: continue
            label = (f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} {tiles}"
                     + (" gathered" if gather else ""))
            make = functools.partial(_labelled, label, quant.qmm_wgmma_rs_program, x, scales, x, mode=mode, group_size=group,
                                     bits=bits, tiles=tiles, gather=gather)
            # assembled: each width's pair shifts, each wgmma type and width of x rows
            yield _Candidate(quant.QMM_WGMMA_RS.stem, make, ((mode, group, bits, x, gather), (mode, x, scales, gather, tiles)),
                             ((bits, mode), (x, tiles.rows, tiles.warpgroups)))
    # the few rows' tiles (`few_rows_tiles`, not gathered): each width of x rows, K whole and split
    # (float32 parts, or added in clusters of the plan's split and the largest), at every width
    for (mode, group, bits), x, rows in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), (16, 32, 64)):
        if bits not in quant.QMM_WGMMA_RS_BITS: continue
        planned = quant.few_rows_tiles(rows, 4096, 4096)
        splits = ((1, False), (planned.k_split, False), (planned.k_split, True), (quant.FEW_ROWS_MAX_SPLIT, True))
        for scales, (split, summed) in itertools.product((x, dtypes.float32) if mode == "affine" else (dtypes.uint8,), splits):
            tiles = dataclasses.replace(planned, k_split=split, cluster_sum=summed)
            out = dtypes.float32 if split > 1 and not summed else x
            label = f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} {tiles} (few rows)"
            make = functools.partial(_labelled, label, quant.qmm_wgmma_rs_program, x, scales, out, mode=mode, group_size=group,
                                     bits=bits, tiles=tiles)
            form = (split > 1, summed)
            yield _Candidate(quant.QMM_WGMMA_RS.stem, make, ((mode, group, bits, x, "few", form), (mode, x, scales, tiles)),
                             ((bits, mode, form), (x, tiles.rows, tiles.warpgroups, split)))


def _qmm_wgmma_ws_candidates(backend: str) -> Iterator[_Candidate]:
    """qmm_wgmma_ws (CUDA only): every mode, width and group, 16-bit x, affine scales in x's type and
    float32, plain and gathered, the plan's tiles at every width, the sweep's others at 4 bits, the
    scales loaded group by group; and each format's scales loaded a vector at once (K 4096:
    `whole_scale_vectors`)."""
    if backend != "cuda": return
    for (mode, group, bits), x, gather in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), (False, True)):
        shapes = quant.QMM_WGMMA_WS_SHAPES if bits == 4 else (quant.QMM_WGMMA_WS_LARGE,)
        for k, scales, tiles in itertools.product((None, 4096), (x, dtypes.float32) if mode == "affine" else (dtypes.uint8,), shapes):
            label = (f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} {tiles}"
                     + (" gathered" if gather else "") + (" scale vectors" if k else ""))
            make = functools.partial(_labelled, label, quant.qmm_wgmma_ws_program, x, scales, x, mode=mode, group_size=group,
                                     bits=bits, tiles=tiles, gather=gather, k=k)
            # assembled: each width's loads of words, each wgmma type and width, each way of loading scales
            yield _Candidate(quant.QMM_WGMMA_WS.stem, make, ((mode, group, bits, x, gather, k), (mode, x, scales, gather, tiles)),
                             ((bits, mode, k), (x, tiles.columns, tiles.warpgroups)))


def _qmv_mma_candidates(backend: str) -> Iterator[_Candidate]:
    """qmv_mma (CUDA only): every mode, width and group, 16-bit x, affine scales in x's type and
    float32, 1-8 rows (2-8 routed, 1 tested); the default plan at K 4096 (4096 + 16 for nvfp4's half
    chunk) and at a K of one unit and a half, and the probe's other plans (affine 4-bit, 2 and 8 rows)."""
    if backend != "cuda": return
    for (mode, group, bits), x, rows in itertools.product(FORMATS, (dtypes.float16, dtypes.bfloat16), range(1, 9)):
        for scales in ((x, dtypes.float32) if mode == "affine" else (dtypes.uint8,)):
            shapes = ((4096 + (16 if mode == "nvfp4" else 0), 4096), (max(192, 2 * group), 40))
            for k, n in shapes:
                probed = bits == 4 and mode == "affine" and k >= 4096 and rows in (2, 8) and x == dtypes.bfloat16
                plans = {quant.qmv_mma_plan(k, n)} | (set(quant.QMV_MMA_PLANS) if probed else set())
                for p in sorted(plans, key=str):
                    label = f"{mode} {bits}-bit g{group} x {dtype_name(x)} scales {dtype_name(scales)} M{rows} K{k} N{n} {p}"
                    make = functools.partial(_labelled, label, quant.qmv_mma_program, x, scales, x, mode=mode, group_size=group,
                                             bits=bits, rows=rows, k=k, n=n, mma_plan=p)
                    yield _Candidate(quant.QMV_MMA.stem, make, ((mode, group, bits, x), (mode, x, scales), (mode, rows, p),
                                                                (mode, group, bits, k, n)),
                                     ((bits, mode), (x,)))  # each width's codes, each mma type


def gemv_calls() -> Iterator[tuple[DType, DType, DType | None, DType, int, int, int, quant.QmvPlan, bool]]:
    """gemv's calls by `(x, w, bias, y dtypes, rows, K, N, plan, glu)`, as `linear.route` gives them
    to the kernel: every dtype of x and w, no bias, a bias of x's dtype or float32 (y their
    promotion); 1-8 rows at K = N = 4096, 1 and 8 at a vocabulary's N (no K split), 1, 3 and 8 rows
    at K of each narrower piece (4, 2, 1 elements) with N off a SIMD group's columns and below
    them; the default plan and, for 1 and 8 rows, another; SwiGLU's product (`glu`) of every pair
    of dtypes at 1 and 8 rows, pieces of 8 and of 1."""
    for x, w in itertools.product(FLOATS, FLOATS):
        for bias in dict.fromkeys((None, x, dtypes.float32)):
            out = promote_types(promote_types(x, w), bias or x)
            for k, n, row_counts in ((4096, 4096, range(1, 9)), (4096, 151936, (1, 8)), (4100, 13, (1, 3, 8)),
                                     (4098, 3, (1, 3, 8)), (257, 5, (1, 3, 8))):
                for rows in row_counts:
                    plans = {linear.gemv_plan(rows, k, n)} | ({quant.QmvPlan(3, 2, 2, 3)} if n > 3 and rows in (1, 8) else set())
                    for p in sorted(plans, key=str): yield x, w, bias, out, rows, k, n, p, False
        for k, rows in itertools.product((4096, 257), (1, 8)):
            yield x, w, None, promote_types(x, w), rows, k, 4096, linear.gemv_plan(rows, k, 4096), True


def gemm_calls(backend: str) -> Iterator[tuple[DType, DType | None, DType, int, linear.Tiles, bool]]:
    """gemm's calls on `backend` by `(x and w dtype, bias dtype, y dtype, K, tiles, gathered)`: both
    16-bit types, no bias or a bias of each kernel dtype (y their promotion), K of each copy width
    (16, 8 and 4 bytes; on Metal an odd K too, read element by element), each tile shape the plan
    emits; gathered (no bias) at each K and tile shape."""
    tiles = (linear.GEMM_SMALL, linear.GEMM_MEDIUM, linear.GEMM_LARGE) if backend == "cuda" else (linear.GEMM_METAL,)
    for dtype, bias, k, shape in itertools.product((dtypes.float16, dtypes.bfloat16), (None,) + FLOATS,
                                                   (4096, 4100, 4098) + ((4097,) if backend == "metal" else ()), tiles):
        yield dtype, bias, promote_types(dtype, bias or dtype), k, shape, False
        if bias is None: yield dtype, bias, dtype, k, shape, True


def _gemm_wgmma_candidates(backend: str) -> Iterator[_Candidate]:
    """gemm_wgmma (CUDA only): both 16-bit types, no bias or a bias of each kernel dtype (y their
    promotion), each tile shape the plan emits and the tuning sweep's others."""
    if backend != "cuda": return
    for dtype, bias, tiles, gather in itertools.product((dtypes.float16, dtypes.bfloat16), (None,) + FLOATS, linear.WGMMA_SHAPES,
                                                        (False, True)):
        if gather and bias is not None: continue   # a gathered product has no bias
        out = promote_types(dtype, bias or dtype)
        label = f"x and w {dtype_name(dtype)} bias {dtype_name(bias) if bias else '-'} y {dtype_name(out)} {tiles}" + \
            (" gathered" if gather else "")
        make = functools.partial(_labelled, label, linear.wgmma_program, dtype, bias, out, tiles=tiles, gather=gather)
        # assembled: each wgmma type and width, plain and gathered
        yield _Candidate("nuvec_gemm_wgmma", make, ((dtype, bias, out, gather), (dtype, tiles, gather)),
                         ((dtype, tiles.columns, gather),))


def _gemv_candidates(backend: str) -> Iterator[_Candidate]:
    for x, w, bias, out, rows, k, n, p, glu in gemv_calls():
        label = f"x {dtype_name(x)} w {dtype_name(w)} bias {dtype_name(bias) if bias else '-'} M{rows} K{k} N{n} {p}" + \
            (" swiglu" if glu else "")
        make = functools.partial(_labelled, label, linear.gemv_program, backend, x, w, bias, out, rows=rows, k=k, n=n, plan=p, glu=glu)
        yield _Candidate("nuvec_gemv", make, ((x, w, bias, out, glu), (rows, p), (linear.piece_width(k), x, w, glu)), ((),))
    # gather_gemv (gather_mm's few entries): x and w of one dtype (gather_mm's promotion), 1 and 8
    # rows an entry, pieces of 8 and of 1, over a bank of 128 experts
    for dtype, rows, k in itertools.product(FLOATS, (1, 8), (2048, 257)):
        p = linear.gemv_plan(rows, k, 768)
        label = f"gathered x and w {dtype_name(dtype)} M{rows} K{k} N768 E128 {p}"
        make = functools.partial(_labelled, label, linear.gemv_program, backend, dtype, dtype, None, dtype, rows=rows, k=k, n=768,
                                 plan=p, batches=128)
        yield _Candidate("nuvec_gemv", make, ((dtype, "gathered"), (rows, "gathered"), (linear.piece_width(k), "gathered")), ((),))


def _gemm_candidates(backend: str) -> Iterator[_Candidate]:
    for dtype, bias, out, k, tiles, gather in gemm_calls(backend):
        label = f"x and w {dtype_name(dtype)} bias {dtype_name(bias) if bias else '-'} y {dtype_name(out)} K{k} {tiles}" + \
            (" gathered" if gather else "")
        make = functools.partial(_labelled, label, linear.gemm_program, backend, dtype, bias, out, k=k, tiles=tiles, gather=gather)
        # assembled: each mma type, copy width and tile shape (ldmatrix and cp.async from each layout), plain and gathered
        yield _Candidate("nuvec_gemm", make, ((dtype, bias, out, gather), (dtype, k, tiles, gather)),
                         ((dtype, gather), (linear.copy_bytes(k),), (tiles,)))


def _labelled(label: str, program: Callable[..., Program], *args, **kwargs) -> tuple[str, Program]:
    return label, program(*args, **kwargs)


def norm_calls() -> Iterator[tuple[str, dict, int]]:
    """The norms' calls by `(kind, types, length)`: the RMS norm alone and fused with the add,
    with and without a weight; the layer norm with and without a weight and a bias; every dtype
    of each buffer, at each launch shape (single elements, pieces held in registers by one SIMD
    group up to 1024 threads, the longest row read again each pass)."""
    for x, h, w, out, length, add, weighted in itertools.product(KERNEL_DTYPES, KERNEL_DTYPES, KERNEL_DTYPES, KERNEL_DTYPES,
                                                                 (7, 4096, 32768, 65536), (False, True), (False, True)):
        if (not add and h != x) or (not weighted and w != x): continue   # h and the weight only where present
        yield "rms", dict(x=x, y=out) | (dict(residual=x, h=h) if add else {}) | (dict(weight=w) if weighted else {}), length
    for x, p, out, length, weighted, biased in itertools.product(KERNEL_DTYPES, KERNEL_DTYPES, KERNEL_DTYPES, (7, 4096, 65536),
                                                                 (False, True), (False, True)):
        if not (weighted or biased) and p != x: continue
        yield "layer", dict(x=x, y=out) | (dict(weight=p) if weighted else {}) | (dict(bias=p) if biased else {}), length


def residual_norm_calls() -> Iterator[tuple[dict, int, float | None, float | None]]:
    """The sandwich norm's calls by `(types, length, scale, next eps)`: every dtype of x (the
    weight's alike), h, s and y, without and with a scale (a number, a tensor) and the next norm,
    at each launch shape."""
    for x, h, s, y, length, scale, next_norm in itertools.product(KERNEL_DTYPES, KERNEL_DTYPES, KERNEL_DTYPES, KERNEL_DTYPES,
                                                                  (7, 4096, 65536), (None, 0.5, "tensor"), (False, True)):
        if (not next_norm and y != s) or (h.itemsize > s.itemsize and s != dtypes.float32): continue
        types = dict(x=x, h=h, weight=x, normed=x, s=s) | (dict(scale=dtypes.float32) if scale == "tensor" else {})
        if next_norm: types |= dict(y=y, next_weight=y)
        yield types, length, (None if scale == "tensor" else scale), (1e-6 if next_norm else None)


def _norm_candidates(backend: str) -> Iterator[_Candidate]:
    for kind, types, length in norm_calls():
        shape = rows.plan(length)

        def make(kind=kind, types=types, shape=shape) -> tuple[str, Program]:
            label = " ".join(f"{name} {dtype_name(t)}" for name, t in types.items()) + \
                f" {shape.threads} threads, pieces of {shape.vec}, {shape.per} {'held' if shape.cached else 'looped'}"
            return label, rows.norm_program(backend, kind, types, 1e-6, shape)
        buffers = tuple(name in types for name in ("residual", "weight", "bias"))
        cover = ((buffers, shape), tuple(types.values()))
        yield _Candidate(f"nuvec_{kind}_norm", make, cover, (buffers,))


def softmax_calls() -> Iterator[tuple[str, DType, int]]:
    """The softmax family's calls by `(mode, dtype, length)`: each mode and dtype at a length for
    every launch the plan emits (32 to 1024 threads holding the row in registers, the looped 1024)."""
    for mode, dtype in itertools.product(softmax.MODES, KERNEL_DTYPES):
        block = 32 * softmax.plan(1, dtype.itemsize).items  # a row's elements a SIMD group holds
        lengths = [block * k for k in range(1, softmax.MAX_THREADS // 32 + 1)] + [softmax.MAX_THREADS // 32 * block + 1,
                                                                                 softmax.MAX_THREADS // 32 * block + 8, 257]
        for length in lengths: yield mode, dtype, length


def _softmax_candidates(backend: str) -> Iterator[_Candidate]:
    for mode, dtype, length in softmax_calls():
        shape = softmax.plan(length, dtype.itemsize)

        def make(mode=mode, dtype=dtype, shape=shape) -> tuple[str, Program]:
            label = f"{mode} {dtype_name(dtype)} {shape.threads} threads, pieces of {shape.vec}" + (" looped" if shape.looped else "")
            return label, softmax.program(backend, mode, dtype, shape)
        cover = ((dtype, shape.looped, shape.vec), (shape.threads, shape.looped))
        yield _Candidate(softmax.BY_MODE[mode].stem, make, cover, ((),))  # no inline assembly of its own


def _residual_norm_candidates(backend: str) -> Iterator[_Candidate]:
    for types, length, scale, next_eps in residual_norm_calls():
        shape = rows.plan(length)

        def make(types=types, shape=shape, scale=scale, next_eps=next_eps) -> tuple[str, Program]:
            label = " ".join(f"{name} {dtype_name(t)}" for name, t in types.items()) + f" scale {scale}" + \
                f" {shape.threads} threads, pieces of {shape.vec}, {shape.per} {'held' if shape.cached else 'looped'}"
            return label, rows.residual_norm_program(backend, types, 1e-6, shape, scale=scale, next_eps=next_eps)
        options = ("scale" in types, scale is not None, next_eps is not None)
        yield _Candidate("nuvec_residual_norm", make, ((options, shape), tuple(types.values())), (options,))


def rope_calls() -> Iterator[tuple[DType, bool, float, int, int]]:
    """rope's calls by `(dtype, traditional, scale, length, dims)`: each dtype and pair layout at
    every piece width (8, 4, 2 and 1 pairs a thread), all features rotated and a part, and a
    scale other than 1."""
    shapes = [(128, 128), (128, 64), (80, 40), (6, 4), (7, 6), (256, 256), (64, 32)]
    for dtype, traditional, (length, dims) in itertools.product(KERNEL_DTYPES, (False, True), shapes):
        yield dtype, traditional, 1.0, length, dims
    yield dtypes.bfloat16, False, 0.25, 128, 128


def _rope_candidates(backend: str) -> Iterator[_Candidate]:
    for dtype, traditional, scale, length, dims in rope_calls():
        shape = rope.plan(length, dims)

        def make(dtype=dtype, traditional=traditional, scale=scale, length=length, dims=dims, shape=shape) -> tuple[str, Program]:
            label = (f"{dtype_name(dtype)} {'traditional' if traditional else 'halves'} D {length} dims {dims} scale {scale}, "
                     f"{shape.vec} pairs a thread")
            return label, rope.program(backend, dtype, traditional, scale, shape)
        cover = ((dtype, traditional, shape.vec), (shape.vec, shape.units > shape.rotating), (scale,))
        yield _Candidate(rope.ROPE.stem, make, cover, ((),))  # no inline assembly of its own (sincosf: the library's)


# Prefill calls (more than 8 queries): groupings and query/key counts the tiled route sees.
PREFILL_CALLS = [(8, 8, 512, 512), (32, 8, 1024, 1024), (16, 2, 100, 3000), (12, 4, 2048, 8192)]
# What the plan sees of a prefill call's options (mask, window), then the kernel's: (mask kind,
# causal, window, sinks, paged block size; paged only causal, as paged_attention is).
PREFILL_OPTIONS = {
    ("none", None): [(0, False, False, sinks, 0) for sinks in (False, True)],
    ("array", None): [(kind, False, False, sinks, 0) for kind in (1, 2) for sinks in (False, True)],
    ("causal", None): [(0, True, False, sinks, page) for sinks in (False, True) for page in (0, 16)],
    ("causal", 100): [(0, True, True, sinks, page) for sinks in (False, True) for page in (0, 16)],
}


def prefill_specs(backend: str) -> Iterator[prefill.PrefillSpec]:
    """The tiled kernel for every prefill call the walk plans for it on `backend` (every head size
    and 16-bit dtype, each target), with every option it takes."""
    for (d, dv), dtype, (hq, hkv, lq, lk), target in itertools.product(sorted(prefill.PREFILL_HEADS), prefill.PREFILL_DTYPES,
                                                                       PREFILL_CALLS, PREFILL_TARGETS[backend]):
        for mask, window in PREFILL_OPTIONS:
            call = validate_attention("check", (1, hq, lq, d), (1, hkv, lk, d), (1, hkv, lk, dv), dtype,
                                      "causal" if mask == "causal" else None, None, window, None)
            if mask == "array": call = dataclasses.replace(call, mask="array")  # the plan reads only its kind
            shape = plan_call(call, target).kernel
            if not isinstance(shape, prefill.Tiled): continue
            for mask_kind, causal, window_on, sinks, page in PREFILL_OPTIONS[(mask, window)]:
                yield prefill.PrefillSpec(dtype, d, dv, hq, hkv, causal, window_on, mask_kind, sinks, page, 0.125, shape)


def _prefill_candidates(backend: str) -> Iterator[_Candidate]:
    for spec in prefill_specs(backend):
        def make(spec=spec) -> tuple[str, Program]:
            options = [name for name, on in (("causal", spec.causal), ("window", spec.window), ("sinks", spec.sinks),
                                             ("bool mask", spec.mask_kind == 1), ("additive mask", spec.mask_kind == 2),
                                             (f"page {spec.page}", spec.page)) if on]
            label = (f"{dtype_name(spec.dtype)} D{spec.head_dim}/{spec.value_dim} Hq{spec.q_heads} Hkv{spec.kv_heads} "
                     f"{prefill.describe(spec.shape)}" + "".join(f" {o}" for o in options))
            return label, spec.program(backend)
        options = (spec.mask_kind, spec.causal, spec.window, spec.sinks, spec.page > 0)
        cover = ((spec.dtype, spec.head_dim, spec.value_dim, spec.shape), (spec.dtype, spec.shape, options))
        # assembled: each mma type (the warpgroup kernel: each with each width of V's products)
        yield _Candidate(spec.family.stem, make, cover, ((spec.dtype, spec.value_dim if spec.shape.wgmma_stages else 0),))


NORM_ROPE_SHAPES = [(64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024), (8192, 8192), (80, 40), (7, 6), (6, 4),
                    (100, 100)]


def norm_rope_calls() -> Iterator[tuple[dict[str, DType], str, bool, int, int]]:
    """norm_rope's calls by `(types, destination, traditional, length, dims)` (`types` as
    `rope.norm_rope_program` takes them): each dtype and pair layout at every launch shape (8, 16
    and 32 lanes a row, two pieces a lane, rows of 64 and 1024 lanes, single elements) and unit
    width the kernel takes; each destination with and without a weight and values (a pool has no
    normalised values: no operation asks for them); values copied beside the keys into caches and
    pools (a model's K and V), of each dtype and of pieces of 1; mixed dtypes; a model's queries
    beside its keys into caches and pools, of each dtype, with and without a weight, a row of a
    threadgroup and single elements."""
    for dtype, traditional, (length, dims) in itertools.product(KERNEL_DTYPES, (False, True), NORM_ROPE_SHAPES):
        if rope.norm_rope_unsupported((dtype, dtype), 1, length, dims, 0, PlanTarget("cuda")) is None:
            yield dict(x=dtype, normed=dtype, rotated=dtype, weight=dtype), "fresh", traditional, length, dims
    for dtype, destination, weight, values in itertools.product(KERNEL_DTYPES, rope.DESTINATIONS, (True, False), (False, True)):
        if (destination == "pool" and values) or (destination == "fresh" and not weight and not values): continue
        types = dict(x=dtype, normed=dtype, rotated=dtype) | (dict(weight=dtype) if weight else {}) | \
            (dict(values=dtype) if values else {})
        yield types, destination, False, 128, 128
    for dtype, destination, weight in itertools.product(KERNEL_DTYPES, ("cache", "pool"), (True, False)):
        types = dict(x=dtype, normed=dtype, rotated=dtype) | (dict(weight=dtype) if weight else {})
        yield types | dict(values=dtype, values_in=dtype), destination, False, 128, 128
    yield dict(x=dtypes.float32, normed=dtypes.float32, rotated=dtypes.bfloat16, weight=dtypes.float32, values=dtypes.bfloat16,
               values_in=dtypes.float16), "pool", True, 7, 6
    yield dict(x=dtypes.float16, normed=dtypes.float32, rotated=dtypes.bfloat16, weight=dtypes.float32, values=dtypes.float32), \
        "cache", True, 80, 40
    yield dict(x=dtypes.bfloat16, normed=dtypes.bfloat16, rotated=dtypes.float32, weight=dtypes.bfloat16), "pool", False, 64, 32
    yield dict(x=dtypes.float16, normed=dtypes.float32, rotated=dtypes.float32, weight=dtypes.bfloat16), "fresh", False, 1024, 512
    # a model's queries beside its keys (QUERIES), with and without a weight and copied values
    for dtype, destination, weight in itertools.product(KERNEL_DTYPES, ("cache", "pool"), (True, False)):
        types = dict(x=dtype, normed=dtype, rotated=dtype) | (dict(weight=dtype) if weight else {})
        yield types | dict(values=dtype, values_in=dtype, queries=dtype), destination, False, 128, 128
    yield dict(x=dtypes.bfloat16, normed=dtypes.float32, rotated=dtypes.bfloat16, weight=dtypes.float32,
               queries=dtypes.float32), "cache", True, 1024, 512
    yield dict(x=dtypes.float32, normed=dtypes.float32, rotated=dtypes.float16, queries=dtypes.float32), "pool", True, 7, 6


def norm_rope_program(backend: str, types: dict[str, DType], destination: str, traditional: bool, length: int,
                      dims: int) -> Program:
    """A `norm_rope_calls` member's program, with its plan's launch."""
    return rope.norm_rope_program(backend, types, destination, traditional, 1.0, rope.norm_rope_plan(length, dims),
                                  eps=1e-6 if "weight" in types else None,
                                  v_eps=1e-5 if "values" in types and "values_in" not in types else None)


def _norm_rope_candidates(backend: str) -> Iterator[_Candidate]:
    for types, destination, traditional, length, dims in norm_rope_calls():
        shape = rope.norm_rope_plan(length, dims)

        def make(types=types, destination=destination, traditional=traditional, length=length, dims=dims,
                 shape=shape) -> tuple[str, Program]:
            label = " ".join(f"{name} {dtype_name(t)}" for name, t in types.items()) + \
                f" into {destination} {'traditional' if traditional else 'halves'} D {length} dims {dims}, " \
                f"{rope.describe_norm_rope(shape)}"
            return label, norm_rope_program(backend, types, destination, traditional, length, dims)
        layout = (shape.lanes > 32, shape.norm.per, shape.norm.vec, shape.rotation.vec)
        options = (destination, "weight" in types, "values" in types, "values_in" in types, "queries" in types)
        cover = ((types["x"], traditional, layout), (options, tuple(types.values())), (shape.lanes,))
        yield _Candidate(rope.NORM_ROPE.stem, make, cover, ((),))  # no inline assembly of its own (sincosf: the library's)


def paged_write_calls() -> Iterator[tuple[DType, DType, int]]:
    """paged_write's calls by `(source dtype, pool dtype, row length)`: each pair of dtypes at
    every piece width (8, 4, 2 and 1 elements a thread)."""
    for source, pool, length in itertools.product(KERNEL_DTYPES, KERNEL_DTYPES, (128, 12, 6, 7)):
        yield source, pool, length


def _paged_write_candidates(backend: str) -> Iterator[_Candidate]:
    for source, pool, length in paged_write_calls():
        shape = paged.plan(length, max(source.itemsize, pool.itemsize))

        def make(source=source, pool=pool, shape=shape) -> tuple[str, Program]:
            return paged.describe(shape, source, pool), paged.program(backend, source, pool, shape)
        yield _Candidate(paged.PAGED_WRITE.stem, make, ((source, pool, shape.vec),), ((),))


def _take_candidates(backend: str) -> Iterator[_Candidate]:
    """take (the row gather): each chunk width (16, 8, 4 and 2 bytes)."""
    for width in (16, 8, 4, 2):
        yield _Candidate(paged.TAKE_ROWS.stem, functools.partial(_labelled, f"chunks of {width} bytes", paged.take_program, backend, width),
                         ((width,),), ((),))


_WALKS = (_decode_candidates, _prefill_candidates, _gated_delta_candidates, _gated_delta_chunked_candidates, _gated_delta_inputs_candidates,
          _qmv_candidates, _qvm_candidates, _qmm_candidates, _qmm_wgmma_candidates, _qmm_wgmma_rs_candidates, _qmm_wgmma_ws_candidates, _qmv_mma_candidates, _dequantize_candidates,
          _norm_candidates, _residual_norm_candidates, _softmax_candidates, _rope_candidates, _norm_rope_candidates,
          _gemv_candidates, _gemm_candidates, _gemm_wgmma_candidates, _paged_write_candidates,
          _take_candidates)


@functools.cache
def _walk(backend: str) -> tuple[_Candidate, ...]:
    return tuple(candidate for walk in _WALKS for candidate in walk(backend))


@functools.cache
def _select(backend: str, keys: str, everything: bool = False) -> dict[str, tuple[Specialisation, ...]]:
    """Per family stem (every family written for `backend`, in `FAMILIES` order), the candidates
    that bring a new one of their family's `keys` ("cover" or "assemble"; all with
    `everything`), rendered, each program once."""
    by_family: dict[str, list[Specialisation]] = {f.stem: [] for f in FAMILIES if backend in f.backends}
    seen_keys: set[tuple] = set()
    seen_names: set[str] = set()
    for candidate in _walk(backend):
        new = {(candidate.family, i, key) for i, key in enumerate(getattr(candidate, keys))} - seen_keys
        if not new and not everything: continue
        seen_keys |= new
        label, program = candidate.make()
        if program.name in seen_names: continue
        seen_names.add(program.name)
        by_family[candidate.family].append(Specialisation(candidate.family, label, program))
    return {family: tuple(items) for family, items in by_family.items()}


def specialisations(backend: str, full: bool = False) -> dict[str, tuple[Specialisation, ...]]:
    """The covering set per family stem, for every family written for `backend`; with `full`,
    every distinct program of the walk (tens of thousands)."""
    return dict(_select(backend, "cover", full))


def assembled(backend: str) -> dict[str, tuple[Specialisation, ...]]:
    """A few specialisations per family that between them reach every inline-assembly path of
    the backend's prelude (each family's `assemble` keys), for a check that assembles them."""
    return dict(_select(backend, "assemble"))


def translation_unit(backend: str, programs: Sequence[Program]) -> tuple[str, list[int]]:
    """One translation unit of `programs` for a compile check, and the line (from 1) where each
    program's part starts. Each program's source is its header (what it puts before the prelude:
    defines the prelude or its text reads), the prelude, then its text; here the headers' defines
    all stand before the one prelude, and each program's part, in a namespace of its own (the
    kernels' names are distinct already), repeats its own header before its text, every define
    undone after it."""
    headers = [program.source[:program.source.index(prelude(backend))] for program in programs]
    top = "".join(dict.fromkeys(line for header in headers for line in header.splitlines(keepends=True)))
    text = top + prelude(backend) + "\n" + _undefine(top)
    parts, starts, line = [text], [], text.count("\n") + 1
    for i, (header, program) in enumerate(zip(headers, programs)):
        part = f"namespace spec{i} {{\n{header}{program.text}}}\n" + _undefine(header + program.text)
        parts.append(part)
        starts.append(line)
        line += part.count("\n")
    return "".join(parts), starts


def _undefine(text: str) -> str:
    """An #undef for each macro `text` defines."""
    return "".join(f"#undef {row.split()[1].split('(')[0]}\n" for row in text.splitlines() if row.startswith("#define "))
