"""The RMS norm kernel (`src/rms_norm.h`) run on the CPU from its CUDA rendering
(`kernel_emulator`), against float64 numpy: row lengths at each launch shape and its boundaries
(1, 7, 32, 33, 300, 1000, 8192: one SIMD group, two, up to 1024 threads looping), with
and without a weight, the fused residual add (h rounded and stored), float32, float16 and
bfloat16 in mixed combinations; and a row's bits equal to the row computed alone."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import rows as kernel
from reference import assert_rows_close, round_to

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
TOLERANCE = {F32: 1e-6, F16: 1e-3, BF16: 8e-3}
EPS = 1e-6

# (rows, length, x dtype, weight dtype or None, residual dtype or None, out dtype)
CASES = {
    "one_element_f32": (3, 1, F32, None, None, F32),
    "seven_f16_weight": (4, 7, F16, F16, None, F16),
    "one_simd_group_bf16": (2, 32, BF16, BF16, None, BF16),
    "two_simd_groups_f32_weight": (5, 33, F32, F32, None, F32),
    "thousand_bf16_add": (3, 1000, BF16, BF16, BF16, BF16),
    "looped_8192_f16_add_f32_weight": (2, 8192, F16, F32, F16, F32),
    "add_no_weight_f32": (2, 300, F32, None, F32, F32),
}


def reference(x, residual, weight, out_dtype, h_dtype):
    """float64: `(h, y)` with h rounded to its dtype, y = round(h * r) then round(y * w)."""
    h = round_to(x + residual, h_dtype) if residual is not None else x
    normed = round_to(h / np.sqrt((h * h).mean(-1, keepdims=True) + EPS), out_dtype)
    return h, (normed if weight is None else round_to(normed * weight, out_dtype))


def emulate(rows, length, x_dtype, w_dtype, r_dtype, out_dtype, values):
    types = dict(x=x_dtype, y=out_dtype)
    if r_dtype is not None: types.update(residual=r_dtype, h=r_dtype)
    if w_dtype is not None: types["weight"] = w_dtype
    threads = kernel.plan(length)
    program = kernel.rms_norm_program("cuda", types, EPS, threads)
    empty = {F32: np.float32, F16: np.uint16, BF16: np.uint16}
    buffers = {"y": np.full((rows, length), 0xFFFF, empty[out_dtype]) if out_dtype != F32 else np.full((rows, length), np.nan, np.float32),
               "x": to_bits(values["x"], x_dtype), "ints": np.array([length, rows], np.int32)}
    if r_dtype is not None:
        buffers.update(h=np.zeros((rows, length), empty[r_dtype]), residual=to_bits(values["residual"], r_dtype))
    if w_dtype is not None: buffers["weight"] = to_bits(values["weight"], w_dtype)
    build(program)([buffers[p.name] for p in program.params], rows, threads)
    y = from_bits(buffers["y"], out_dtype)
    return (from_bits(buffers["h"], r_dtype) if r_dtype is not None else None), y


def inputs(rows, length, x_dtype, w_dtype, r_dtype, seed=0):
    rng = np.random.default_rng(seed)
    values = {"x": round_to(rng.standard_normal((rows, length)) * 3, x_dtype)}
    if r_dtype is not None: values["residual"] = round_to(rng.standard_normal((rows, length)), r_dtype)
    if w_dtype is not None: values["weight"] = round_to(rng.uniform(0.5, 1.5, length), w_dtype)
    return values


@pytest.mark.parametrize("name", CASES)
def test_emulated_rms_norm_matches_numpy(name):
    rows, length, x_dtype, w_dtype, r_dtype, out_dtype = CASES[name]
    values = inputs(rows, length, x_dtype, w_dtype, r_dtype)
    h, y = emulate(rows, length, x_dtype, w_dtype, r_dtype, out_dtype, values)
    want_h, want_y = reference(values["x"], values.get("residual"), values.get("weight"), out_dtype, r_dtype)
    if r_dtype is not None: np.testing.assert_array_equal(h, want_h)   # one rounding of an exact float32 sum
    assert_rows_close(name, y, want_y, TOLERANCE[out_dtype] + TOLERANCE[x_dtype])


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    values = inputs(6, 1000, BF16, BF16, BF16, seed=3)
    _, together = emulate(6, 1000, BF16, BF16, BF16, BF16, values)
    alone = {key: value[4:5] if value.ndim == 2 else value for key, value in values.items()}
    _, single = emulate(1, 1000, BF16, BF16, BF16, BF16, alone)
    np.testing.assert_array_equal(together[4:5], single)


def test_the_plan_depends_on_the_length_only_and_stays_within_a_threadgroup():
    assert [kernel.plan(n) for n in (1, 256, 257, 4096, 8192, 65536)] == [32, 32, 64, 512, 1024, 1024]
