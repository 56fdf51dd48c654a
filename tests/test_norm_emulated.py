"""The norm kernel (`src/norm.h`) run on the CPU from its CUDA rendering (`kernel_emulator`),
against float64 numpy: the RMS norm (with the fused residual add: h rounded and stored) and the
layer norm, at row lengths on each launch shape and its boundaries (1 and 7: single elements;
32, 33; 1000 and 8192: pieces of 8 held in registers; 65536: the row read again each pass), with
and without a weight and bias, float32, float16 and bfloat16 in mixed combinations; a row's bits
equal to the row computed alone; the launch from the length alone."""
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

# (kind, rows, length, x dtype, weight dtype or None, residual dtype or None, bias dtype or None, out dtype)
CASES = {
    "rms_one_element_f32": ("rms", 3, 1, F32, None, None, None, F32),
    "rms_seven_f16_weight": ("rms", 4, 7, F16, F16, None, None, F16),
    "rms_one_simd_group_bf16": ("rms", 2, 32, BF16, BF16, None, None, BF16),
    "rms_33_single_elements_f32_weight": ("rms", 5, 33, F32, F32, None, None, F32),
    "rms_thousand_bf16_add": ("rms", 3, 1000, BF16, BF16, BF16, None, BF16),
    "rms_8192_f16_add_f32_weight": ("rms", 2, 8192, F16, F32, F16, None, F32),
    "rms_looped_65536_bf16_add": ("rms", 1, 65536, BF16, BF16, BF16, None, BF16),
    "rms_add_no_weight_f32": ("rms", 2, 300, F32, None, F32, None, F32),
    "layer_seven_f32": ("layer", 3, 7, F32, None, None, None, F32),
    "layer_4096_bf16_weight_bias": ("layer", 2, 4096, BF16, BF16, None, BF16, BF16),
    "layer_1000_f16_bias_only": ("layer", 3, 1000, F16, None, None, F16, F16),
    "layer_looped_65536_f32_weight_bias": ("layer", 1, 65536, F32, F32, None, F32, F32),
}


def reference(kind, values, out_dtype, h_dtype):
    """float64: `(h, y)` with h rounded to its dtype, y = round(norm(h)), then round(y * w), round(y + b)."""
    x = values["x"]
    h = round_to(x + values["residual"], h_dtype) if "residual" in values else x
    centred = h - h.mean(-1, keepdims=True) if kind == "layer" else h
    y = round_to(centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + EPS), out_dtype)
    if "weight" in values: y = round_to(y * values["weight"], out_dtype)
    if "bias" in values: y = round_to(y + values["bias"], out_dtype)
    return h, y


def emulate(kind, rows, length, x_dtype, w_dtype, r_dtype, b_dtype, out_dtype, values, eps=EPS):
    types = dict(x=x_dtype, y=out_dtype)
    if r_dtype is not None: types.update(residual=r_dtype, h=r_dtype)
    if w_dtype is not None: types["weight"] = w_dtype
    if b_dtype is not None: types["bias"] = b_dtype
    shape = kernel.plan(length)
    program = kernel.norm_program("cuda", kind, types, eps, shape)
    poison = {F32: np.float32, F16: np.uint16, BF16: np.uint16}
    buffers = {"y": np.full((rows, length), np.nan, np.float32) if out_dtype == F32 else np.full((rows, length), 0xFFFF, poison[out_dtype]),
               "x": to_bits(values["x"], x_dtype), "ints": np.array([length, rows], np.int32)}
    if r_dtype is not None:
        buffers.update(h=np.zeros((rows, length), poison[r_dtype]), residual=to_bits(values["residual"], r_dtype))
    for name in ("weight", "bias"):
        if name in values: buffers[name] = to_bits(values[name], types[name])
    build(program)([buffers[p.name] for p in program.params], rows, shape.threads)
    y = from_bits(buffers["y"], out_dtype)
    return (from_bits(buffers["h"], r_dtype) if r_dtype is not None else None), y


def inputs(rows, length, x_dtype, w_dtype, r_dtype, b_dtype, seed=0):
    rng = np.random.default_rng(seed)
    values = {"x": round_to(rng.standard_normal((rows, length)) * 3 + 0.5, x_dtype)}
    if r_dtype is not None: values["residual"] = round_to(rng.standard_normal((rows, length)), r_dtype)
    if w_dtype is not None: values["weight"] = round_to(rng.uniform(0.5, 1.5, length), w_dtype)
    if b_dtype is not None: values["bias"] = round_to(rng.standard_normal(length), b_dtype)
    return values


@pytest.mark.parametrize("name", CASES)
def test_emulated_norm_matches_numpy(name):
    kind, rows, length, x_dtype, w_dtype, r_dtype, b_dtype, out_dtype = CASES[name]
    values = inputs(rows, length, x_dtype, w_dtype, r_dtype, b_dtype)
    h, y = emulate(kind, rows, length, x_dtype, w_dtype, r_dtype, b_dtype, out_dtype, values)
    want_h, want_y = reference(kind, values, out_dtype, r_dtype)
    if r_dtype is not None: np.testing.assert_array_equal(h, want_h)   # one rounding of an exact float32 sum
    assert_rows_close(name, y, want_y, TOLERANCE[out_dtype] + TOLERANCE[x_dtype])


@pytest.mark.parametrize("kind, length", [("rms", 1000), ("layer", 4096), ("rms", 65536)])
def test_a_rows_bits_do_not_depend_on_the_other_rows(kind, length):
    bias = BF16 if kind == "layer" else None
    residual = BF16 if kind == "rms" else None
    values = inputs(3, length, BF16, BF16, residual, bias, seed=3)
    _, together = emulate(kind, 3, length, BF16, BF16, residual, bias, BF16, values)
    alone = {key: value[1:2] if value.ndim == 2 else value for key, value in values.items()}
    _, single = emulate(kind, 1, length, BF16, BF16, residual, bias, BF16, alone)
    np.testing.assert_array_equal(together[1:2], single)


def test_the_plan_depends_on_the_length_only_and_stays_within_a_threadgroup():
    shapes = {n: kernel.plan(n) for n in (1, 7, 33, 512, 520, 4096, 8192, 32768, 32776, 65536, 1 << 20)}
    assert {n: (s.threads, s.vec, s.per, s.cached) for n, s in shapes.items()} == {
        1: (32, 1, 1, True), 7: (32, 1, 1, True), 33: (32, 1, 2, True), 512: (32, 8, 2, True), 520: (64, 8, 2, True),
        4096: (256, 8, 2, True), 8192: (512, 8, 2, True), 32768: (1024, 8, 4, True), 32776: (1024, 8, 4, False),
        65536: (1024, 8, 4, False), 1 << 20: (1024, 8, 4, False)}
    assert all(32 <= s.threads <= kernel.MAX_THREADS and s.threads % 32 == 0 for s in shapes.values())


def test_the_programs_refuse_what_their_kind_lacks():
    with pytest.raises(ValueError, match="takes no residual"):
        kernel.norm_program("cuda", "layer", dict(x=F32, y=F32, residual=F32, h=F32), EPS, kernel.plan(8))
    with pytest.raises(ValueError, match="takes no bias"):
        kernel.norm_program("cuda", "rms", dict(x=F32, y=F32, bias=F32), EPS, kernel.plan(8))


# (rows, length, x, h, weight, s, next weight or None (no y), scale: None, a number, or "tensor")
RESIDUAL_CASES = {
    "seven_f32_next": (3, 7, F32, F32, F32, F32, F32, None),
    "thousand_bf16_sandwich": (3, 1000, BF16, BF16, BF16, BF16, BF16, None),
    "4096_bf16_f32_stream_scaled": (2, 4096, BF16, F32, BF16, F32, None, 0.7),
    "33_f16_scale_tensor_next_f32": (4, 33, F16, F16, F16, F32, F32, "tensor"),
    "looped_65536_bf16_next": (1, 65536, BF16, BF16, BF16, BF16, BF16, 1.5),
}


def residual_reference(values, types, scale, next_eps):
    """float64 with each rounding of the composition: n, s (and its scaling), y."""
    x, h = values["x"], values["h"]
    normed = round_to(round_to(x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS), types["normed"]) * values["weight"],
                      types["normed"])
    s = round_to(h + normed, types["s"])
    if scale is not None: s = round_to(s * round_to(np.float64(scale), types["s"]), types["s"])
    if next_eps is None: return s, None
    y = round_to(round_to(s / np.sqrt((s * s).mean(-1, keepdims=True) + next_eps), types["y"]) * values["next_weight"], types["y"])
    return s, y


def emulate_residual(rows, length, types, scale, next_eps, values):
    shape = kernel.plan(length)
    program = kernel.residual_norm_program("cuda", types, EPS, shape, scale=None if scale == "tensor" else scale,
                                           next_eps=next_eps)
    poison = {F32: np.float32, F16: np.uint16, BF16: np.uint16}
    buffers = {name: to_bits(values[name], types[name]) for name in ("x", "h", "weight", "next_weight", "scale") if name in values}
    buffers["s"] = np.full((rows, length), 0xFFFF, poison[types["s"]])
    if "y" in types: buffers["y"] = np.full((rows, length), 0xFFFF, poison[types["y"]])
    buffers["ints"] = np.array([length, rows], np.int32)
    build(program)([buffers[p.name] for p in program.params], rows, shape.threads)
    return from_bits(buffers["s"], types["s"]), (from_bits(buffers["y"], types["y"]) if "y" in types else None)


@pytest.mark.parametrize("name", RESIDUAL_CASES)
def test_emulated_residual_norm_matches_numpy(name):
    rows, length, x_dtype, h_dtype, w_dtype, s_dtype, v_dtype, scale = RESIDUAL_CASES[name]
    rng = np.random.default_rng(7)
    values = {"x": round_to(rng.standard_normal((rows, length)) * 3, x_dtype), "h": round_to(rng.standard_normal((rows, length)), h_dtype),
              "weight": round_to(rng.uniform(0.5, 1.5, length), w_dtype)}
    types = dict(x=x_dtype, h=h_dtype, weight=w_dtype, normed=x_dtype if x_dtype == w_dtype else F32, s=s_dtype)
    number = scale
    if scale == "tensor":
        types["scale"] = F32
        values["scale"] = np.array([0.8125])
        number = 0.8125
    next_eps = None
    if v_dtype is not None:
        next_eps = 1e-5
        types.update(y=s_dtype if v_dtype == s_dtype else F32, next_weight=v_dtype)
        values["next_weight"] = round_to(rng.uniform(0.5, 1.5, length), v_dtype)
    s, y = emulate_residual(rows, length, types, scale, next_eps, values)
    want_s, want_y = residual_reference(values, types, number, next_eps)
    assert_rows_close(f"{name} s", s, want_s, TOLERANCE[s_dtype] + TOLERANCE[x_dtype])
    if y is not None: assert_rows_close(f"{name} y", y, want_y, 2 * (TOLERANCE[types["y"]] + TOLERANCE[x_dtype]))


def test_the_residual_program_refuses_a_half_given_next():
    types = dict(x=F32, h=F32, weight=F32, normed=F32, s=F32, y=F32)
    with pytest.raises(ValueError, match="come together"):
        kernel.residual_norm_program("cuda", types, EPS, kernel.plan(8))
