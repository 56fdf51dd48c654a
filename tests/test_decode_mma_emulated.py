"""The matrix-unit decode pass (`src/sdpa_decode_mma.h`) run on the CPU from its CUDA rendering
(`kernel_emulator`, whose mma follows the fragment layout the CUDA prelude documents): its
partials, merged in float64, against numpy attention, across the kernel's boundaries (rows past
a head's group, two row groups, key counts off the 16-key tile, empty blocks, causal rows, windows,
masks, slices of a longer cache, paged pools with hostile tables)."""
import dataclasses

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import TOLERANCE, Case, first_pass, make_inputs, merged_partials
from kernel_emulator import COMPILER
from reference import assert_rows_close

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F16 = dtypes.float16
# Hostile tables: entries past the pool and negative (clamped), a length past the table (clamped).
HOSTILE = dict(page=8, pool=7, tables=((3, -3, 9, 0, 6), (2, 7, 1, -1, 4)), lengths=(49, 13))
CASES = {
    "gqa8": Case(2, 16, 2, 1, 77, 128, 128, 2, 2, unroll=1),
    "gqa8_prefetch": Case(2, 16, 2, 1, 77, 128, 128, 2, 2, l2_ahead=2),
    "gqa4_lq4_causal": Case(1, 8, 2, 4, 50, 64, 64, 1, 2, causal=True, unroll=1),
    "two_row_groups_f16": Case(1, 12, 1, 2, 40, 128, 128, 2, 1, F16, causal=True, unroll=1),
    "rows6_d192": Case(1, 6, 2, 1, 33, 192, 128, 1, 2, unroll=1),
    "empty_blocks": Case(1, 4, 1, 1, 20, 64, 64, 4, 2, unroll=1),
    "eight_warps": Case(1, 8, 2, 1, 300, 128, 128, 2, 8),
    "one_stage_buffer": Case(1, 32, 2, 1, 200, 128, 128, 4, 4),  # 16 rows x 4 SIMD groups: one buffer
    "window": Case(1, 8, 1, 2, 70, 64, 64, 2, 2, causal=True, window=21, unroll=1),
    "bool_mask": Case(2, 8, 2, 1, 45, 64, 64, 2, 1, mask=1, unroll=1),
    "additive_mask_f16": Case(1, 8, 2, 2, 37, 64, 64, 1, 2, F16, mask=2, unroll=1),
    "cache_slice": Case(2, 8, 2, 1, 29, 64, 64, 2, 2, cache=(5, 48, 5, 48), unroll=1),
    "paged_hostile": Case(2, 8, 2, 1, 0, 64, 64, 2, 2, **HOSTILE, unroll=1),
    "paged_hostile_prefetch": Case(2, 8, 2, 1, 0, 64, 64, 4, 2, **HOSTILE, l2_ahead=3),
}
CASES = {name: dataclasses.replace(case, matrix=True) for name, case in CASES.items()}


def emulated_partials(name: str, blocks_per_group: int = 1, edit=None):
    """The case's partials from the emulated kernel (each threadgroup taking `blocks_per_group`
    blocks in turn; `edit` applied to its program first) and the case's inputs."""
    case = CASES[name]
    inputs = make_inputs(name, case)
    return first_pass(case, inputs, edit, blocks_per_group), inputs


def check_matrix_pass(name: str, edit=None) -> None:
    """The case's partials, merged in float64, against numpy; every partial written."""
    case = CASES[name]
    partials, inputs = emulated_partials(name, edit=edit)
    got = merged_partials(partials, inputs.expected.shape, case.blocks)
    assert_rows_close(name, got, inputs.expected, TOLERANCE[case.dtype])
    for part in partials.values(): assert not np.isnan(part).any(), f"{name}: a partial not written"


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_matrix_pass_matches_numpy(name):
    check_matrix_pass(name)


@pytest.mark.parametrize("name, blocks_per_group", [("empty_blocks", 3), ("paged_hostile_prefetch", 4), ("window", 2),
                                                      ("eight_warps", 2), ("one_stage_buffer", 4)])
def test_emulated_blocks_in_turn_give_the_same_partials(name, blocks_per_group):
    """A threadgroup taking several blocks in turn (a large batch) writes each block's partial with
    the bits of a threadgroup of its own (so a batch item's bits do not depend on its batch)."""
    alone, _ = emulated_partials(name)
    in_turn, _ = emulated_partials(name, blocks_per_group)
    for which in alone: np.testing.assert_array_equal(alone[which], in_turn[which], err_msg=which)
