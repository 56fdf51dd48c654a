"""The softmax family's kernels (`src/softmax.h`) run on the CPU from their CUDA rendering
(`kernel_emulator`), against float64 numpy: softmax, logsumexp and cross_entropy at row lengths on
each launch shape and its boundaries (1, 7, 32, 33: one SIMD group; 257: two; 1000, 4096; 8192
float32 or 16384 16-bit elements: 1024 threads, the last length held in registers; 8193 float32,
16385 16-bit, 20000, 65536: looped), float32, float16 and bfloat16; infinite and NaN rows in both the register and the looped form; hostile targets
(INT_MIN, INT_MAX, one past either end); and a row's bits equal to the row computed alone."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import dtypes

from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import softmax as kernel
from reference import assert_close, assert_rows_close, logsumexp_reference, round_to, softmax_reference

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
# The output's rounding (half an ulp of the row's largest element) and float32 arithmetic.
TOLERANCE = {F32: 2e-6, F16: 1e-3, BF16: 8e-3}
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# (mode, rows, length, dtype): every launch width, each side of the register / looped boundary.
CASES = {
    "softmax_one_element_f32": ("softmax", 3, 1, F32),
    "softmax_seven_f16": ("softmax", 4, 7, F16),
    "softmax_one_simd_group_bf16": ("softmax", 2, 32, BF16),
    "softmax_33_f32": ("softmax", 5, 33, F32),
    "softmax_two_simd_groups_257_f16": ("softmax", 3, 257, F16),
    "softmax_1000_bf16": ("softmax", 3, 1000, BF16),
    "softmax_4096_f32": ("softmax", 2, 4096, F32),
    "softmax_8192_in_registers_bf16": ("softmax", 2, 8192, BF16),
    "softmax_8193_looped_f32": ("softmax", 2, 8193, F32),
    "softmax_16385_looped_f16": ("softmax", 2, 16385, F16),
    "softmax_65536_looped_f32": ("softmax", 1, 65536, F32),
    "logsumexp_seven_f32": ("logsumexp", 3, 7, F32),
    "logsumexp_1000_f16": ("logsumexp", 3, 1000, F16),
    "logsumexp_16385_looped_bf16": ("logsumexp", 2, 16385, BF16),
    "logsumexp_20000_looped_f32": ("logsumexp", 2, 20000, F32),
    "cross_entropy_seven_f32": ("cross_entropy", 9, 7, F32),
    "cross_entropy_1000_bf16": ("cross_entropy", 3, 1000, BF16),
    "cross_entropy_16384_in_registers_f16": ("cross_entropy", 2, 16384, F16),
    "cross_entropy_30000_looped_f32": ("cross_entropy", 2, 30000, F32),
}






def cross_entropy_reference(x, targets):
    """float64: the row's log-sum-exp less its target's logit (a negative target counts from the
    end; one outside -C..C-1 subtracts nothing)."""
    classes = x.shape[-1]
    wrapped = np.where(targets < 0, targets.astype(np.int64) + classes, targets)
    hit = (wrapped >= 0) & (wrapped < classes)
    picked = np.take_along_axis(x, np.where(hit, wrapped, 0)[:, None], -1)[:, 0]
    with np.errstate(invalid="ignore"):
        return logsumexp_reference(x) - np.where(hit, picked, 0.0)


def reference(mode, x, targets=None):
    if mode == "softmax": return softmax_reference(x)
    if mode == "logsumexp": return logsumexp_reference(x)
    return cross_entropy_reference(x, targets)


def emulate(mode, x_values, dtype, targets=None, edit=None, shape=None):
    """Run the kernel of `mode` over the rows of `x_values` (float64, representable in `dtype`) as
    the plan launches it, or as `shape` (its rendering changed by `edit`, for planted faults);
    returns its output as float64 (`[rows, L]` or `[rows]`)."""
    rows, length = x_values.shape
    shape = shape or kernel.plan(length, dtype.itemsize)
    program = kernel.program("cuda", mode, dtype, shape)
    if edit is not None: program = edit(program)
    out_dtype = F32 if mode == "cross_entropy" else dtype
    out_shape = (rows, length) if mode == "softmax" else (rows,)
    y = np.full(out_shape, np.nan, np.float32) if out_dtype == F32 else np.full(out_shape, 0xFFFF, np.uint16)
    buffers = {"y": y, "x": np.ascontiguousarray(to_bits(x_values, dtype)), "ints": np.array([length, rows], np.int32)}
    if targets is not None: buffers["targets"] = np.asarray(targets, np.int32)
    build(program)([buffers[p.name] for p in program.params], rows, shape.threads)
    return from_bits(buffers["y"], out_dtype)


def inputs(rows, length, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return round_to(rng.standard_normal((rows, length)) * 3, dtype)


def targets_for(rows, length, seed=0):
    """Targets in range, negative ones among them."""
    return np.random.default_rng(seed + 1).integers(-length, length, rows).astype(np.int32)


def check(name, mode, got, want, dtype):
    if mode == "softmax": assert_rows_close(name, got, want, TOLERANCE[dtype])
    else: assert_close(name, got, want, TOLERANCE[F32 if mode == "cross_entropy" else dtype])


def check_case(name, edit=None):
    """The case against float64 numpy (what the test below and the planted faults run)."""
    mode, rows, length, dtype = CASES[name]
    x = inputs(rows, length, dtype)
    targets = targets_for(rows, length) if mode == "cross_entropy" else None
    check(name, mode, emulate(mode, x, dtype, targets, edit), reference(mode, x, targets), dtype)


@pytest.mark.parametrize("name", CASES)
def test_emulated_row_kernels_match_numpy(name):
    check_case(name)


def infinite_rows(length):
    """Rows of `length` (at least 7) whose statistics meet infinities and NaN where a thread's
    first element, a later block or another thread holds them."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, length)) * 3
    late = length - 2
    x[0] = -np.inf                                   # every element -inf
    x[1, [0, 3, late]] = -np.inf                     # some -inf, a finite maximum
    x[2, late] = np.inf                              # one +inf
    x[3, [1, late]] = np.inf                         # two +inf
    x[4, 2] = np.nan
    x[5] = -np.inf
    x[5, late] = 1.5                                 # one finite element after blocks of -inf
    x[6] *= 1000                                     # most exponentials underflow
    return round_to(x, F32)


def check_infinite_rows(length, modes=("softmax", "logsumexp", "cross_entropy"), edit=None):
    """Each mode over `infinite_rows(length)` against float64 numpy; returns their outputs."""
    x = infinite_rows(length)
    # each row's target: -inf (twice), the +inf, one before the first class, the NaN, the one finite element, INT_MIN
    targets = np.array([0, 3, length - 2, -length - 1, 2, length - 2, INT32_MIN], np.int32)
    got = {}
    for mode in modes:
        got[mode] = emulate(mode, x, F32, targets if mode == "cross_entropy" else None, edit)
        check(f"{mode} length {length}", mode, got[mode], reference(mode, x, targets), F32)
    return got


@pytest.mark.parametrize("length", [7, 9000], ids=["registers", "looped"])
def test_infinite_and_nan_rows_are_the_compositions(length):
    got = check_infinite_rows(length)
    late = length - 2
    # What the comparison above holds, spelt out: NaN softmax rows where the maximum is infinite
    # or a NaN is present, the infinite maximum as the log-sum-exp, zeros for -inf elements.
    assert np.isnan(got["softmax"][[0, 2, 3, 4]]).all() and np.isnan(got["logsumexp"][4])
    np.testing.assert_array_equal(got["logsumexp"][[0, 2, 3]], [-np.inf, np.inf, np.inf])
    assert (got["softmax"][1, [0, 3, late]] == 0).all() and got["softmax"][5, late] == 1
    np.testing.assert_array_equal(got["cross_entropy"][[0, 1, 2, 3, 5]], [np.nan, np.inf, np.nan, np.inf, 0.0])


def check_hostile_targets(length, edit=None):
    """Targets far outside the classes against float64 numpy (the emulator fails any read
    outside the logits); returns the logits and the losses."""
    x = inputs(9, length, F32, seed=5)
    targets = np.array([INT32_MIN, INT32_MAX, -length - 1, -length, length, length - 1, -1, 0, 2**30], np.int32)
    got = emulate("cross_entropy", x, F32, targets, edit)
    assert_close("hostile targets", got, cross_entropy_reference(x, targets), TOLERANCE[F32])
    return x, got


@pytest.mark.parametrize("length", [7, 30000], ids=["registers", "looped"])
def test_hostile_targets_hit_no_class_and_read_nothing_outside(length):
    x, got = check_hostile_targets(length)
    lse = logsumexp_reference(x)
    np.testing.assert_allclose(got[[0, 1, 2, 4, 8]], lse[[0, 1, 2, 4, 8]], rtol=1e-6)   # no class hit
    np.testing.assert_allclose(got[3], lse[3] - x[3, 0], rtol=1e-6)                   # -C is class 0


@pytest.mark.parametrize("mode, length, dtype", [("softmax", 1000, BF16), ("cross_entropy", 16385, F16)])
def test_a_rows_bits_do_not_depend_on_the_other_rows(mode, length, dtype):
    x = inputs(3, length, dtype, seed=3)
    targets = targets_for(3, length) if mode == "cross_entropy" else None
    together = emulate(mode, x, dtype, targets)
    alone = emulate(mode, x[1:2], dtype, None if targets is None else targets[1:2])
    np.testing.assert_array_equal(together[1:2], alone)


def test_the_plan_depends_on_the_length_only_and_stays_within_a_threadgroup():
    shapes = [kernel.plan(n) for n in (1, 256, 257, 1000, 4096, 8192, 8193, 65536)]
    assert [s.threads for s in shapes] == [32, 32, 64, 128, 512, 1024, 1024, 1024]
    assert [s.looped for s in shapes] == [False] * 6 + [True] * 2
    assert [s.vec for s in shapes] == [1, 8, 1, 8, 8, 8, 1, 8]  # 16-byte pieces where 8 divides the length
    # 16-bit rows: 16 elements a thread (32 bytes, as float32's 8), looped past 16384
    assert kernel.plan(4096, 2) == kernel.Launch(256, False, 8, 16)
    assert [kernel.plan(n, 2).looped for n in (16384, 16385)] == [False, True]
    assert all(kernel.metal_resources(s).threadgroup_bytes <= 256 for s in shapes)


@pytest.mark.parametrize("mode", list(kernel.MODES))
@pytest.mark.parametrize("threads, items, looped", [(32, 16, False), (32, 32, False), (64, 16, True), (32, 32, True)])
def test_other_launches_the_sweep_times(mode, threads, items, looped):
    """Fewer threads holding more pieces each (tools/tune_rows.py --softmax): the same rows, within
    the tolerance of a float32 sum in another order."""
    length = 512 if not looped else 1536
    dtype = dtypes.bfloat16
    x = inputs(3, length, dtype, seed=11)
    targets = targets_for(3, length) if mode == "cross_entropy" else None
    got = emulate(mode, x, dtype, targets, shape=kernel.Launch(threads, looped, 8, items))
    want = emulate(mode, x, dtype, targets)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-5)
