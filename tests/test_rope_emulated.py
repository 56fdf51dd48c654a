"""The rope kernel (`src/rope.h`) runs on the CPU from its CUDA rendering (`kernel_emulator`),
against float64 numpy whose angles are the contract's float32 ones (`scale * (offset + t)` then
times `inv_freq`, each rounded to float32; only the sine, cosine and rotation in float64): both
pair layouts, every piece width (8, 4, 2 and 1 pairs a thread), `dims < D`, per-batch offsets,
`scale`, `freqs`, rank 3 and 5, float32, float16 and bfloat16; positions near 500000 and offsets at
both ends of int32 (the positions wrap as the composition's int32 add does; nothing is read
outside the buffers); features past dims copied bit for bit; a row's bits equal to the row
computed alone."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import rope as kernel
from reference import assert_rows_close, int32_positions, rope_reference, round_to

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
# The output's rounding (half an ulp of the row's largest element) and float32 arithmetic.
TOLERANCE = {F32: 2e-6, F16: 1e-3, BF16: 8e-3}
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# name: (shape, dims, traditional, dtype, offsets (one, or one per batch item), scale, freqs)
CASES = {
    "halves_128_f32": ((2, 3, 5, 128), 128, False, F32, [5], 1.0, False),
    "traditional_128_bf16": ((2, 3, 5, 128), 128, True, BF16, [5], 1.0, False),
    "halves_dims_64_of_128_per_batch_f16": ((2, 2, 3, 128), 64, False, F16, [1, 4], 0.5, False),
    "traditional_dims_40_of_80_freqs_f32": ((3, 2, 4, 80), 40, True, F32, [2], 1.0, True),      # 4 pairs a thread
    "halves_4_of_6_per_batch_bf16": ((2, 4, 6), 4, False, BF16, [3, 9], 0.75, False),           # 2 pairs a thread
    "traditional_6_of_7_f32": ((1, 3, 7), 6, True, F32, [0], 1.0, False),                       # single pairs
    "halves_rank_5_per_batch_f32": ((2, 2, 3, 6, 16), 16, False, F32, [1, 4], 0.5, True),
    "halves_position_500000_f32": ((1, 2, 4, 64), 64, False, F32, [500000], 1.0, False),
    "traditional_position_500000_bf16": ((1, 2, 4, 64), 64, True, BF16, [499998], 1.0, False),
}


def inverse_frequencies(dims, base=10000.0, freqs=None):
    """The kernel's `[dims / 2]` float32 input, as fast/rope.py builds it."""
    if freqs is not None: return (np.float32(1.0) / np.asarray(freqs, np.float32)).astype(np.float32)
    return np.exp2(np.arange(dims // 2, dtype=np.float32) * np.float32(-2.0 * math.log2(base) / dims)).astype(np.float32)






def emulate(x, dims, traditional, dtype, offsets, scale, inv_freq, edit=None):
    """The kernel over `x` (float64, representable in `dtype`) as the plan launches it (its
    rendering changed by `edit`, for planted faults); returns y as float64."""
    shape = x.shape
    rows, length = math.prod(shape[:-1]), shape[-1]
    launch = kernel.plan(length, dims)
    program = kernel.program("cuda", dtype, traditional, scale, launch)
    if edit is not None: program = edit(program)
    offsets = np.asarray(offsets, np.int32)
    y = np.full(shape, np.nan, np.float32) if dtype == F32 else np.full(shape, 0xFFFF, np.uint16)
    ints = np.array([length, dims // 2, shape[-2], rows // shape[0], rows, int(offsets.size > 1)], np.int32)
    buffers = {"y": y, "x": np.ascontiguousarray(to_bits(x, dtype)), "inv_freq": inv_freq, "offsets": offsets, "ints": ints}
    build(program)([buffers[p.name] for p in program.params], launch.groups(rows), launch.threads)
    return from_bits(buffers["y"], dtype)


def check_case(name, edit=None):
    """The case against float64 numpy (what the test below and the planted faults run)."""
    shape, dims, traditional, dtype, offsets, scale, with_freqs = CASES[name]
    rng = np.random.default_rng(len(name))
    x = round_to(rng.uniform(-2, 2, shape), dtype)
    inv_freq = inverse_frequencies(dims, freqs=(1.0 + 3.0 * np.arange(dims // 2)) if with_freqs else None)
    got = emulate(x, dims, traditional, dtype, offsets, scale, inv_freq, edit)
    want = round_to(rope_reference(x, dims, traditional, offsets, scale, inv_freq), dtype)
    assert_rows_close(name, got, want, TOLERANCE[dtype])
    np.testing.assert_array_equal(got[..., dims:], x[..., dims:], err_msg=f"{name}: the features past dims")
    return got


@pytest.mark.parametrize("name", CASES)
def test_emulated_rope_matches_numpy(name):
    check_case(name)


def test_every_piece_width_is_planned():
    widths = {kernel.plan(CASES[name][0][-1], CASES[name][1]).vec for name in CASES}
    assert widths == {8, 4, 2, 1}


def test_hostile_offsets_wrap_as_int32_and_read_nothing_outside():
    """Offsets at both ends of int32: the positions wrap (the emulator fails any access outside
    the buffers, here one offset per batch item and a single one)."""
    rng = np.random.default_rng(9)
    shape, dims = (3, 2, 4, 32), 32
    x = round_to(rng.uniform(-2, 2, shape), F32)
    inv_freq = inverse_frequencies(dims)
    for traditional in (False, True):
        for offsets in ([INT32_MAX - 1, INT32_MIN, -3], [INT32_MAX]):
            got = emulate(x, dims, traditional, F32, offsets, 1.0, inv_freq)
            want = rope_reference(x, dims, traditional, offsets, 1.0, inv_freq)
            assert_rows_close(f"offsets {offsets}", got, want, TOLERANCE[F32])


def test_position_zero_is_unchanged_and_position_one_turns_by_one_radian():
    """The seeds' case: offset 0 leaves row 0 as it is; row 1's pair turns by theta = 1."""
    x = np.array([[[1.0, 2.0], [1.0, 2.0]]])
    got = emulate(x, 2, False, F32, [0], 1.0, inverse_frequencies(2))
    c, s = math.cos(1.0), math.sin(1.0)
    np.testing.assert_allclose(got.reshape(-1), [1.0, 2.0, c - 2 * s, s + 2 * c], rtol=1e-6)


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    rng = np.random.default_rng(3)
    shape, dims = (3, 4, 5, 64), 48
    x = round_to(rng.uniform(-2, 2, shape), BF16)
    inv_freq = inverse_frequencies(dims)
    together = emulate(x, dims, False, BF16, [7, 100, 3000], 1.0, inv_freq)
    alone = emulate(x[1:2], dims, False, BF16, [100], 1.0, inv_freq)
    np.testing.assert_array_equal(together[1:2], alone)


def test_the_plan_depends_on_the_sizes_only():
    assert kernel.plan(128, 128) == kernel.Launch(256, 8, 8, 8)
    assert kernel.plan(128, 64) == kernel.Launch(256, 8, 4, 12)
    assert kernel.plan(80, 40) == kernel.Launch(256, 4, 5, 15)
    assert kernel.plan(7, 6) == kernel.Launch(256, 1, 3, 4)
    assert kernel.metal_resources(kernel.plan(128, 128)).threadgroup_bytes == 0
