"""The paged pool's write kernel (`src/paged_write.h`) on the CPU from its CUDA rendering
(`kernel_emulator`), against numpy: every piece width (8, 4, 2 and 1 elements), each dtype and a
conversion (float32 rows into a bfloat16 pool, rounded to nearest even; float16 into float32),
shuffled slots across blocks, slots negative, past the pool and at both ends of int32 (skipped:
the pool's other rows keep their bits, NaN included), two rows naming one slot (the slot's
pieces come from either), infinities, NaN and signed zeros written as they are."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import paged as kernel

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# name: (source dtype, pool dtype, heads, length, blocks, block_size, slots)
CASES = {
    "bf16_pieces_of_8_shuffled": (BF16, BF16, 2, 64, 4, 4, [13, 2, 7, 8, 0, 15]),
    "f32_pieces_of_4": (F32, F32, 3, 12, 3, 2, [5, 0, 3]),
    "f16_pieces_of_2_length_6": (F16, F16, 1, 6, 2, 4, [1, 6, 4]),
    "f32_single_elements_length_7": (F32, F32, 2, 7, 2, 2, [3, 1]),
    "f32_into_bf16_rounded": (F32, BF16, 2, 16, 2, 8, [9, 0, 15]),
    "f16_into_f32": (F16, F32, 2, 32, 2, 4, [2, 5]),
    "hostile_slots_skipped": (BF16, BF16, 2, 32, 2, 4, [-1, 8, INT32_MAX, INT32_MIN, 3, 7]),
    "slots_just_past_either_end_f32": (F32, F32, 2, 8, 2, 2, [-1, 4, 2]),
}


def bits_of(x: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(to_bits(x, dtype))


def emulate(source_bits: np.ndarray, pool_bits: np.ndarray, slots, source_dtype, pool_dtype, edit=None,
            projection: tuple[int, int] | None = None) -> np.ndarray:
    """The kernel over rows `[N, H, D]` (as the dtype's bits) into a copy of the pool's bits
    `[blocks, H, block_size, D]`; returns the pool's bits after it. projection: (width, first
    column): the rows read in place from a `[N, width]` buffer (the rest of it all ones bits)."""
    count, heads, length = source_bits.shape
    layout = [0, heads * length, length]
    if projection is not None:
        width, start = projection
        buffer = np.full((count, width), 0xFFFF if source_bits.dtype == np.uint16 else np.nan, source_bits.dtype)
        buffer[:, start:start + heads * length] = source_bits.reshape(count, -1)
        source_bits, layout = buffer, [start, width, length]
    blocks, _, block_size, _ = pool_bits.shape
    shape = kernel.plan(length, max(source_dtype.itemsize, pool_dtype.itemsize))
    program = kernel.program("cuda", source_dtype, pool_dtype, shape)
    if edit is not None: program = edit(program)
    pool = pool_bits.copy()
    ints = np.array([length, count * heads, heads, block_size, blocks * block_size, *layout], np.int32)
    buffers = {"pool": pool, "source": source_bits, "slots": np.asarray(slots, np.int32), "ints": ints}
    build(program)([buffers[p.name] for p in program.params], shape.groups(count * heads, length), shape.threads)
    return pool


def expected(source: np.ndarray, pool: np.ndarray, slots) -> np.ndarray:
    """The pool (float64) with row `i` of `source` at `slots[i]` (outside the pool: skipped; the later row wins)."""
    blocks, heads, block_size, length = pool.shape
    out = pool.copy()
    for i, slot in enumerate(slots):
        if 0 <= slot < blocks * block_size: out[slot // block_size, :, slot % block_size] = source[i]
    return out


def case_inputs(name: str):
    source_dtype, pool_dtype, heads, length, blocks, block_size, slots = CASES[name]
    rng = np.random.default_rng(len(name))
    source = rng.uniform(-3, 3, (len(slots), heads, length))
    pool = rng.uniform(-3, 3, (blocks, heads, block_size, length))
    return source, pool, slots, source_dtype, pool_dtype


def check_case(name: str, edit=None) -> None:
    """The case against numpy, bit for bit (what the test below and the planted faults run)."""
    source, pool, slots, source_dtype, pool_dtype = case_inputs(name)
    source_bits, pool_bits = bits_of(source, source_dtype), bits_of(pool, pool_dtype)
    got = emulate(source_bits, pool_bits, slots, source_dtype, pool_dtype, edit)
    # the rows as the source holds them, then rounded to the pool's dtype once (to nearest even)
    want = expected(from_bits(source_bits, source_dtype), from_bits(pool_bits, pool_dtype), slots)
    np.testing.assert_array_equal(got, bits_of(want, pool_dtype), err_msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_paged_write_matches_numpy_bit_for_bit(name):
    check_case(name)


@pytest.mark.parametrize("dtype, projection", [(BF16, (96, 32)), (F32, (40, 4))])
def test_rows_of_a_projection_are_read_in_place(dtype, projection):
    """The value heads of a fused projection's output `[N, width]`, its first column a multiple of
    a piece: written as the rows alone are (nothing else of the buffer read: it is NaN)."""
    rng = np.random.default_rng(5)
    heads, length = 2, 16 if dtype == BF16 else 12
    source = bits_of(rng.uniform(-1, 1, (3, heads, length)), dtype)
    pool = bits_of(rng.uniform(-1, 1, (2, heads, 4, length)), dtype)
    np.testing.assert_array_equal(emulate(source, pool, [6, -1, 1], dtype, dtype, projection=projection),
                                  emulate(source, pool, [6, -1, 1], dtype, dtype))


def test_every_piece_width_is_covered():
    widths = {kernel.plan(length, max(s.itemsize, p.itemsize)).vec for s, p, _, length, *_ in CASES.values()}
    assert widths == {8, 4, 2, 1}


def test_infinities_and_nans_are_written_as_they_are():
    source = np.array([np.inf, -np.inf, np.nan, -0.0, 65504.0, 6e-8, 1.0, -2.0]).reshape(1, 1, 8)
    pool = np.zeros((1, 1, 2, 8))
    got = from_bits(emulate(bits_of(source, F16), bits_of(pool, F16), [1], F16, F16), F16)
    np.testing.assert_array_equal(got[0, 0, 1], from_bits(bits_of(source[0, 0], F16), F16))
    assert np.signbit(got[0, 0, 1, 3])


def test_two_rows_naming_one_slot_leave_the_slot_pieces_of_either():
    rng = np.random.default_rng(3)
    source = bits_of(rng.uniform(-1, 1, (3, 2, 64)), BF16)
    pool = bits_of(rng.uniform(-1, 1, (2, 2, 4, 64)), BF16)
    got = emulate(source, pool, [6, 1, 6], BF16, BF16)
    np.testing.assert_array_equal(got[0, :, 1], source[1])
    pieces = got[1, :, 2].reshape(2, -1, 8)                                 # the slot's pieces of 8
    for head in range(2):
        for p, piece in enumerate(pieces[head]):
            assert any(np.array_equal(piece, source[i, head, 8 * p:8 * p + 8]) for i in (0, 2)), (head, p)


def test_the_plan_depends_on_the_sizes_only():
    assert kernel.plan(128, 2) == kernel.Launch(256, 8)
    assert kernel.plan(128, 4) == kernel.Launch(256, 4)
    assert kernel.plan(100, 2) == kernel.Launch(256, 4)
    assert kernel.plan(9, 2) == kernel.Launch(256, 1)
