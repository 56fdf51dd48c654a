"""The vector decode pass (`src/sdpa_decode.h`, with `sdpa_keys.h`) and the merge of its partials
(`src/sdpa_merge.h`) run on the CPU from their CUDA renderings (`kernel_emulator`), against float64
numpy attention: one pass and two (then the merge on the first pass's partials), key counts off a
SIMD step and a block, grouped heads in several row groups, causal rows, windows, boolean and
additive masks (broadcast over heads or batches), sinks, slices of longer caches, paged pools with
hostile tables and lengths (entries past the pool and negative, lengths past the table, zero and
negative, blocks left empty), one row, every head size the kernel reads in a different way, each
dtype; and the merge alone on partials with empty blocks, more blocks than its splits, and sinks."""
import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import TOLERANCE, Case, Inputs, attention, from_bits, make_inputs, merge_pass, to_bits
from kernel_emulator import COMPILER
from reference import assert_rows_close

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
# The CUDA launch is 8 SIMD groups of 2 key lines in flight; a few cases take Metal's 4 x 2 or 4 x 1.
CASES = {
    # One query row of one head, 37 keys (not a multiple of a SIMD step's 2 x 8 x 4): one pass.
    "one_row_f32": Case(1, 1, 1, 1, 37, 64, 64, passes=1, dtype=F32),
    # 4 query heads a key head x 2 positions: 8 rows in two row groups of 4; 150 keys in 3 blocks.
    "grouped_causal": Case(1, 8, 2, 2, 150, 128, 128, blocks=3, causal=True),
    # 9 rows a key head (odd: row groups of one), a window cutting the first block, sinks in the merge.
    "window_sinks": Case(1, 6, 2, 3, 90, 64, 64, blocks=2, warps=4, dtype=F16, causal=True, window=20, sinks=True),
    # D 96: a lane reads 3 features (3 words of float32); a boolean mask broadcast over heads; sinks in one pass.
    "bool_mask_sinks_d96": Case(2, 4, 1, 1, 45, 96, 96, passes=1, dtype=F32, mask=1, mask_shape=(2, 1, 1, 45), sinks=True),
    # D 192 / DV 128 (6 and 4 halves a lane); an additive mask with -inf entries, per head, shared by the batch.
    "additive_mask_d192": Case(1, 4, 2, 2, 70, 192, 128, blocks=2, mask=2, mask_shape=(1, 4, 2, 70)),
    # K and V slices of longer caches, at different starts in caches of different lengths.
    "cache_slices_d256": Case(2, 4, 2, 1, 29, 256, 256, blocks=2, warps=4, unroll=1, dtype=F16, cache=(5, 48, 11, 40)),
    # A paged pool: entries past the pool and negative, a length past the table, zero, negative and
    # short lengths (3 keys in 4 blocks: one left empty), sinks.
    "paged_hostile": Case(4, 4, 2, 2, 0, 64, 64, blocks=4, warps=4, page=8, pool=5, sinks=True,
                          tables=((4, -2, 7, 0), (1, 2, 3, 9), (0, 1, 2, 3), (3, 3, -1, 2)), lengths=(40, 3, 0, -5)),
    "paged_window_f32": Case(3, 2, 1, 1, 0, 128, 128, passes=1, dtype=F32, page=4, pool=6, window=5,
                             tables=((5, 0, 2, 8, 1), (3, 4, -7, 1, 0), (2, 2, 2, 2, 2)), lengths=(17, 3, 100)),
    # Head size 512: one query, 8 heads a group, rows one at a time.
    "d512": Case(1, 8, 1, 1, 40, 512, 512, passes=1, warps=4, dtype=F16),
}


def check_decode(name: str, first_edit=None, merge_edit=None) -> None:
    """The case through the emulated kernels (each program edited first where asked) against numpy."""
    case = CASES[name]
    inputs = make_inputs(name, case)
    assert_rows_close(name, attention(case, inputs, first_edit, merge_edit), inputs.expected, TOLERANCE[case.dtype])


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_decode_matches_numpy(name):
    check_decode(name)


def test_the_hostile_cases_reach_what_they_are_for():
    """The hostile paged case has a row that sees nothing (zero and negative lengths: zeros), a
    sequence clamped to its table, empty blocks; the window case sees fewer keys than its cache."""
    inputs = make_inputs("paged_hostile", CASES["paged_hostile"])
    seen = inputs.visible.sum(-1)
    assert (seen[2:] == 0).all() and seen[0, 0, -1] == 32 and seen[1, 0, -1] == 3
    assert not inputs.expected[2:].any() and inputs.expected[:2].all()
    window = make_inputs("window_sinks", CASES["window_sinks"])
    assert (window.visible.sum(-1) == 20).all()


# Merge-only cases: (rows, blocks, DV, dtype, sinks). DV 64 has 16 splits of 16 threads: 37 blocks
# take three rounds; DV 96 has 24 threads a split (threads not a multiple of a SIMD group's).
MERGE_CASES = {
    "rounds_of_splits": (6, 37, 64, F32, True),
    "dv96_bf16": (5, 7, 96, BF16, False),
}


def merge_inputs(name: str) -> tuple[Case, Inputs, dict[str, np.ndarray], np.ndarray]:
    """Random partials (some blocks empty: maximum -inf, sum 0) and their float64 merge."""
    rows, blocks, dv, dtype, sinks = MERGE_CASES[name]
    rng = np.random.default_rng(len(name) * 7919 + blocks)
    case = Case(1, rows, 1, 1, blocks, dv, dv, blocks=blocks, dtype=dtype, sinks=sinks)
    top = (rng.standard_normal((rows, blocks)) * 4).astype(np.float32)
    top[rng.random((rows, blocks)) < 0.25] = -np.inf
    top[0] = -np.inf                                                 # a row with no key at all
    sums = np.where(np.isfinite(top), rng.uniform(0.5, 20, (rows, blocks)), 0).astype(np.float32)
    acc = (rng.standard_normal((rows, blocks, dv)) * sums[..., None]).astype(np.float32)
    acc[~np.isfinite(top)] = 0
    partials = {"part_acc": acc.reshape(-1), "part_max": top.reshape(-1), "part_sum": sums.reshape(-1)}
    arrays = {name: np.zeros(1, np.uint16) for name in ("q", "k", "v")}
    sink = None
    if sinks:
        arrays["sinks"] = to_bits(rng.standard_normal(rows), dtype)
        sink = from_bits(arrays["sinks"], dtype) * np.log2(np.e)        # base 2, as the partials' maxima
    inputs = Inputs(arrays, {}, None, None, None, None, None, sink)
    best = np.maximum(top.max(1), -np.inf if sink is None else sink).astype(np.float64)
    best = np.where(np.isfinite(best), best, 0)
    factor = np.where(np.isfinite(top), np.exp2(top - best[:, None]), 0)
    total = (sums * factor).sum(1) + (0 if sink is None else np.exp2(sink - best))
    want = (acc * factor[..., None]).sum(1) / np.where(total > 0, total, 1)[:, None]
    return case, inputs, partials, want.reshape(1, rows, 1, dv)


@pytest.mark.parametrize("name", list(MERGE_CASES))
def test_emulated_merge_matches_numpy(name):
    check_merge(name)


def check_merge(name: str, edit=None) -> None:
    case, inputs, partials, want = merge_inputs(name)
    got = merge_pass(case, inputs, partials, edit)
    assert_rows_close(name, got, want, TOLERANCE[case.dtype])
