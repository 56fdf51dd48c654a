"""The row gather kernel (`src/take_rows.h`, `fast.take`) on the CPU from its CUDA rendering
(`kernel_emulator`), against numpy: every chunk width (16, 8, 4 and 2 bytes), rows of each of a
model's embedding layouts (bfloat16 rows, a quantized table's uint32 words and its scales), indices
repeated, shuffled, negative, past the table and at both ends of int32 (zeros, and nothing read:
the emulator's bounds check), rows copied as their bits (NaN payloads, infinities, signed zeros)."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import paged as kernel

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# name: (numpy dtype of x, x's shape, indices)
CASES = {
    "bf16_embedding_rows_chunks_of_16": (np.uint16, (50, 64), [7, 0, 49, 7, 12]),
    "quantized_words_chunks_of_16": (np.uint32, (30, 20), [[3, 29], [3, 0]]),
    "scales_chunks_of_8": (np.uint16, (9, 4, 3), [8, 1]),
    "f32_rows_of_3_chunks_of_4": (np.float32, (5, 3), [4, 0, 2]),
    "f16_rows_of_1_chunks_of_2": (np.uint16, (6, 1), [5, 5, 0]),
    "hostile_indices_give_zeros": (np.float32, (4, 8), [-1, 4, INT32_MAX, INT32_MIN, 3, 2]),
    "indices_just_past_either_end": (np.float32, (4, 8), [-1, 4, 2]),
}


def table(dtype, shape, seed: int = 0) -> np.ndarray:
    """x's values as bits: random, with a NaN of a payload, infinities and a negative zero in row 0."""
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        x = rng.standard_normal(shape).astype(np.float32)
        flat = x.reshape(shape[0], -1)
        flat[0, :3] = [np.inf, -0.0, -np.inf]
        flat[0, -1:] = np.uint32(0x7FC01234).view(np.float32)
        return x
    return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


def emulate(x: np.ndarray, indices, edit=None) -> np.ndarray:
    """The kernel as `fast.take` launches it: y `[*indices.shape, *x.shape[1:]]`, its bits."""
    indices = np.asarray(indices, np.int64)
    count, rows, row_bytes = indices.size, x.shape[0], x[0].nbytes
    width = kernel.take_plan(row_bytes)
    program = kernel.take_program("cuda", width)
    if edit is not None: program = edit(program)
    poison = np.nan if x.dtype == np.float32 else np.iinfo(x.dtype).max // 3   # a row the kernel misses shows
    y = np.full((*indices.shape, *x.shape[1:]), poison, x.dtype)
    clamped = np.clip(indices, INT32_MIN, INT32_MAX).astype(np.int32)
    buffers = {"y": y, "x": np.ascontiguousarray(x), "indices": clamped.reshape(-1),
               "ints": np.array([row_bytes // width, count, rows], np.int32)}
    build(program)([buffers[p.name] for p in program.params], -(-count * (row_bytes // width) // kernel.THREADS), kernel.THREADS)
    return y


def want(x: np.ndarray, indices) -> np.ndarray:
    indices = np.asarray(indices, np.int64)
    inside = (indices >= 0) & (indices < x.shape[0])
    out = x[np.where(inside, indices, 0)]
    out[~inside] = 0
    return out


def check_case(name: str, edit=None) -> None:
    """The case's bits against numpy's (what the test below and the planted faults run)."""
    dtype, shape, indices = CASES[name]
    x = table(dtype, shape)
    got, expected = emulate(x, indices, edit), want(x, indices)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), err_msg=name)


@pytest.mark.parametrize("name", CASES)
def test_emulated_take_copies_the_rows_named_as_their_bits(name):
    check_case(name)


def test_every_chunk_width_is_covered_and_the_plan_follows_the_row_bytes():
    widths = {kernel.take_plan(np.zeros(shape[1:], dtype).nbytes) for dtype, shape, _ in CASES.values()}
    assert widths == {16, 8, 4, 2}
    assert [kernel.take_plan(n) for n in (8192, 1024, 24, 12, 6, 2)] == [16, 16, 8, 4, 2, 2]
    from nuvec_tg.kernels import Target
    assert kernel.take_unsupported(7, 3, 5, Target("cuda")) is not None and kernel.take_unsupported(8, 0, 5, Target("cuda"))
    assert kernel.take_unsupported(8192, 4, 151936, Target("metal")) is None
