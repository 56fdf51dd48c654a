"""The tiled prefill kernel (`src/sdpa_prefill.h`) run on the CPU from its CUDA rendering
(`kernel_emulator`: mma.sync's fragments, or with `metal_tiles` the Metal prelude's simdgroup
fragments) against float64 numpy, across its boundaries: rows and keys off the tiles, grouped heads
packed into a tile (group 1, 3, 4, 8), causal rows continuing a cache (`Lq < Lk`), windows below
and above the keys, boolean and additive masks, sinks, slices of longer caches, paged pools with
shuffled and hostile tables, head sizes with padding (72, 80) and DV != D; a row's bits alone."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import TOLERANCE, Case, from_bits, make_inputs, reference
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels.prefill import WGMMA_HEADS, PrefillSpec, Tiled
from reference import assert_rows_close

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F16 = dtypes.float16
SMALL = Tiled(warps=2, row_tiles=1, keys=32, q_resident=True)    # 32-row tiles: several per call at these sizes
# Hostile tables: entries past the pool and negative (clamped), a length past the table (clamped)
# and one shorter than the queries (its first rows see nothing).
HOSTILE = dict(page=8, pool=9, tables=((3, -3, 9, 0, 6, 2, 8, 1), (2, 7, 1, -1, 4, 5, 0, 3)), lengths=(70, 13))
CASES = {
    "causal_gqa4": Case(1, 8, 2, 45, 45, 64, 64, causal=True),
    "causal_continuing": Case(2, 4, 1, 37, 100, 64, 64, causal=True),      # a chunk after 63 cached keys
    "no_mask_gqa3": Case(1, 6, 2, 29, 70, 64, 64, dtype=F16),
    "window_below": Case(1, 4, 2, 60, 90, 64, 64, causal=True, window=17),
    "window_above_keys": Case(1, 2, 2, 20, 50, 64, 64, causal=True, window=49),
    "bool_mask": Case(2, 4, 2, 33, 41, 64, 64, mask=1),
    "additive_mask_f16": Case(1, 4, 1, 19, 64, 64, 64, dtype=F16, mask=2, mask_shape=(1, 4, 19, 64)),
    "sinks_causal": Case(1, 8, 1, 21, 21, 64, 64, causal=True, sinks=True),   # group 8 x 21 rows
    "d80": Case(1, 2, 1, 24, 40, 80, 80, causal=True),
    "d72_f16": Case(1, 2, 2, 17, 33, 72, 72, dtype=F16),
    "d96_dv64": Case(1, 4, 2, 30, 30, 96, 64, causal=True),
    "d128": Case(1, 2, 1, 40, 70, 128, 128, causal=True),
    "cache_slice": Case(2, 4, 2, 26, 29, 64, 64, causal=True, cache=(5, 48, 7, 40)),
    "paged_hostile": Case(2, 4, 2, 20, 0, 64, 64, **HOSTILE),
    "paged_window_sinks": Case(2, 4, 1, 20, 0, 64, 64, window=11, sinks=True, **HOSTILE),
    "d256_window": Case(1, 4, 2, 70, 150, 256, 256, causal=True, window=90),
    "d128_dv64_sinks": Case(1, 4, 1, 33, 140, 128, 64, causal=True, sinks=True),
}


def run_prefill(case: Case, inputs, shape: Tiled = SMALL, metal_tiles: bool = False, edit=None, scale: float | None = None) -> np.ndarray:
    """The emulated kernel's output `[B, Hq, Lq, DV]` (float64; NaN where it wrote nothing), at
    `scale` (default D^-0.5, as `make_inputs`'s reference)."""
    scale = case.head_dim ** -0.5 if scale is None else scale
    spec = PrefillSpec(case.dtype, case.head_dim, case.value_dim, case.q_heads, case.kv_heads, case.causal or case.page > 0,
                       case.window is not None, case.mask, case.sinks, case.page, scale, shape)
    program = spec.program("cuda")
    if edit is not None: program = edit(program)
    out = np.full(case.batch * case.q_heads * case.q_len * case.value_dim, 0xFFFF, np.uint16)  # NaN until written
    ints = dict(inputs.ints, q_len=case.q_len, k_len=case.k_len)
    arrays = dict(inputs.arrays, out=out, ints=np.array([ints[name] for name in spec.runtime_names()], np.int32))
    groups = spec.grid(case.batch, case.q_len)
    build(program, metal_tiles)([arrays[p.name] for p in program.params], groups[0], shape.warps * 32, groups[1], groups[2])
    return from_bits(out, case.dtype).reshape(case.batch, case.q_heads, case.q_len, case.value_dim)


def check(name: str, shape: Tiled = SMALL, metal_tiles: bool = False, edit=None) -> np.ndarray:
    case = CASES[name]
    inputs = make_inputs(name, case)
    got = run_prefill(case, inputs, shape, metal_tiles, edit)
    assert not np.isnan(got).any(), f"{name}: an output not written"
    assert_rows_close(name, got, inputs.expected, TOLERANCE[case.dtype])
    return got


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_prefill_matches_numpy(name):
    check(name)


@pytest.mark.parametrize("name", ["causal_gqa4", "window_below", "bool_mask", "d80", "paged_hostile"])
def test_emulated_prefill_with_metal_tiles(name):
    """The Metal prelude's fragment layout (float tiles, simdgroup matrices' lanes)."""
    check(name, metal_tiles=True)


@pytest.mark.parametrize("shape", [Tiled(4, 1, 64, True), Tiled(4, 2, 64, True), Tiled(4, 1, 32, True), Tiled(1, 2, 16, True),
                                   Tiled(2, 2, 32, False), Tiled(2, 1, 16, False), Tiled(1, 1, 16, False)])
def test_emulated_prefill_launch_shapes(shape):
    """Other SIMD group counts, row tiles and key tiles compute the same attention."""
    check("causal_continuing", shape)
    check("window_below", shape)


def test_emulated_prefill_row_alone_has_the_same_bits():
    """Each batch item equals the item computed alone, bit for bit (an item's bits never depend on
    its batch)."""
    name = "causal_continuing"
    case = CASES[name]
    inputs = make_inputs(name, case)
    together = run_prefill(case, inputs)
    alone_case = dataclasses.replace(case, batch=1)
    for b in range(case.batch):
        item = dataclasses.replace(inputs, arrays={key: (value[b:b + 1] if key in ("q", "k", "v") else value)
                                                   for key, value in inputs.arrays.items()})
        np.testing.assert_array_equal(run_prefill(alone_case, item), together[b:b + 1], err_msg=f"item {b}")


@pytest.mark.parametrize("name", ["additive_mask_f16", "sinks_causal", "window_below"])
def test_emulated_prefill_with_a_negative_scale(name):
    """A negative scale keeps its scores scaled before their maximum (the products' maximum would be
    the scaled scores' minimum)."""
    case = CASES[name]
    inputs = make_inputs(name, case)
    want = reference(inputs.q, inputs.k, inputs.v, -0.3, inputs.visible, inputs.bias, inputs.sinks)
    assert_rows_close(name, run_prefill(case, inputs, scale=-0.3), want, TOLERANCE[case.dtype])


# The warpgroup kernel (sdpa_prefill_wgmma.h, the emulator's wgmma): one warpgroup over 64-key tiles
# (several tiles a call at these sizes), and the plan's two warpgroups over 128.
WGMMA_SMALL = Tiled(4, 1, 64, False, wgmma_stages=2)
WGMMA_CASES = [name for name, case in CASES.items() if (case.head_dim, case.value_dim) in WGMMA_HEADS]


@pytest.mark.parametrize("name", WGMMA_CASES)
def test_emulated_prefill_wgmma_matches_numpy(name):
    check(name, WGMMA_SMALL)


@pytest.mark.parametrize("shape", [Tiled(8, 1, 128, False, wgmma_stages=2), Tiled(8, 1, 64, False, wgmma_stages=3),
                                   Tiled(4, 1, 128, False, wgmma_stages=4), Tiled(12, 1, 128, False, wgmma_stages=2)], ids=str)
def test_emulated_prefill_wgmma_launch_shapes(shape):
    check("causal_continuing", shape)
    check("paged_window_sinks", shape)
