"""The rope kernel (`kernels/rope.py`, `src/rope.h`) on a GPU (METAL or CUDA) against float64
numpy and the composition on the same device: both pair layouts at every piece width, `dims < D`,
`scale`, `freqs`, ranks 3 to 5, every kernel dtype; offsets as an int, a one-element tensor, one
per batch item (int64 too); positions near 500000 and offsets at both ends of int32 (against numpy
only: the composition's own sine loses its range reduction there); a transposed input; gradients
(the composition's, to x and to freqs); a row's bits equal to the row computed alone; a jitted
call whose Tensor offset comes from a bound Variable (a decode step's); float64 stays the
composition. Every call meant for the kernel asserts that it launched (`expect_launches`).

numpy's angles are the contract's float32 ones from the device's own float32 inverse frequencies
(tinygrad's exp2 and division, which the kernel reads too); only the sine, cosine and rotation
are float64."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.fast.rope import _base_frequencies
from nuvec_tg.kernels import compositions_only
from reference import (COMPOSITION_TOLERANCE, DTYPES, KERNEL_TOLERANCE, assert_rows_close, expect_launches, gradients, int32_positions,
                       random, rope_reference, values)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
ROPE = "nuvec_rope"
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
BASE = 10000.0

# (shape, dims, traditional, per-batch offsets, freqs): each piece width (8, 4, 2, 1 pairs).
CASES = [
    ((2, 8, 33, 128), 128, False, False, False),
    ((2, 8, 33, 128), 128, True, True, False),
    ((1, 32, 300, 128), 64, False, False, False),
    ((3, 4, 5, 80), 40, True, True, True),
    ((2, 3, 5, 16), 8, False, True, False),
    ((2, 4, 6), 4, True, False, True),
    ((3, 2, 7), 6, False, True, False),
    ((2, 2, 3, 6, 8), 8, True, True, False),
    ((64, 32, 1, 128), 128, False, True, False),   # a decode step: one row a sequence, each at its own position
]


def periods(dims):
    return (1.0 + 3.0 * np.arange(dims // 2)).astype(np.float32)


def device_inverse_frequencies(dims, freqs=None):
    """The float32 inverse frequencies the kernel reads, as the device computes them."""
    if freqs is None: return _base_frequencies(gpu, dims, BASE).numpy()
    return (1.0 / Tensor(freqs, device=gpu)).numpy()






def call(x, dims, traditional, offset, freqs, scale=0.5):
    return fast.rope(x, dims, traditional=traditional, base=None if freqs is not None else BASE, scale=scale, offset=offset,
                     freqs=freqs)


def kernel_and_composition(x, dims, traditional, offset, freqs, scale=0.5):
    with expect_launches(gpu, ROPE):
        got = call(x, dims, traditional, offset, freqs, scale).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = call(x, dims, traditional, offset, freqs, scale).realize()
    return got, composed


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_rope_matches_numpy_and_the_composition(case, dtype):
    shape, dims, traditional, per_batch, with_freqs = case
    rng = np.random.default_rng(0x70)
    x, xv = random(rng, shape, dtype, gpu, spread=2.0)
    ov = np.array([3 * i + 1 for i in range(shape[0])], np.int32) if per_batch else np.array(5, np.int32)
    fv = periods(dims) if with_freqs else None
    freqs = None if fv is None else Tensor(fv, device=gpu)
    got, composed = kernel_and_composition(x, dims, traditional, Tensor(ov, device=gpu), freqs)
    assert got.dtype == dtype and got.shape == shape
    want = rope_reference(xv, dims, traditional, ov, 0.5, device_inverse_frequencies(dims, fv))
    name = f"{dtype.name} {shape} dims {dims} traditional {traditional}"
    assert_rows_close(f"{name} vs numpy", values(got), want, KERNEL_TOLERANCE[dtype])
    assert_rows_close(f"{name} vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[dtype])
    np.testing.assert_array_equal(values(got)[..., dims:], xv[..., dims:])


@pytest.mark.parametrize("offset", [0, 17, -4, "one-element", "per-batch int64"], ids=str)
def test_every_kind_of_offset(offset):
    rng = np.random.default_rng(0x71)
    x, xv = random(rng, (2, 3, 9, 64), dtypes.bfloat16, gpu, spread=2.0)
    if offset == "one-element": given, ov = Tensor([9], dtype=dtypes.uint16, device=gpu), np.array([9])
    elif offset == "per-batch int64": given, ov = Tensor([40, 2], dtype=dtypes.int64, device=gpu), np.array([40, 2])
    else: given, ov = offset, np.array(offset)
    got, composed = kernel_and_composition(x, 64, False, given, None, scale=1.0)
    want = rope_reference(xv, 64, False, ov, 1.0, device_inverse_frequencies(64))
    assert_rows_close(f"offset {offset} vs numpy", values(got), want, KERNEL_TOLERANCE[dtypes.bfloat16])
    assert_rows_close(f"offset {offset} vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[dtypes.bfloat16])


@pytest.mark.parametrize("offsets", [[500000], [499990, 500100], [INT32_MAX - 2, INT32_MIN, -3], [INT32_MAX]], ids=str)
@pytest.mark.parametrize("traditional", [False, True])
def test_large_and_hostile_positions_against_numpy(offsets, traditional):
    """Positions near 500000 (float32 angles far from exact, yet the contract's) and offsets at
    both ends of int32 (the positions wrap as the composition's int32 add does)."""
    rng = np.random.default_rng(0x72)
    batch = len(offsets) if len(offsets) > 1 else 2
    x, xv = random(rng, (batch, 4, 8, 128), dtypes.float32, gpu, spread=2.0)
    with expect_launches(gpu, ROPE):
        got = fast.rope(x, 128, traditional=traditional, offset=Tensor(np.array(offsets, np.int32), device=gpu)).realize()
    want = rope_reference(xv, 128, traditional, offsets, 1.0, device_inverse_frequencies(128))
    assert_rows_close(f"offsets {offsets}", values(got), want, KERNEL_TOLERANCE[dtypes.float32])


def test_a_transposed_input():
    """q as a projection gives it, `[B, T, H, D]` transposed to `[B, H, T, D]`."""
    rng = np.random.default_rng(0x73)
    base, bv = random(rng, (2, 7, 4, 128), dtypes.float16, gpu, spread=2.0)
    x, xv = base.transpose(1, 2), bv.transpose(0, 2, 1, 3)
    got, composed = kernel_and_composition(x, 128, False, 3, None, scale=1.0)
    want = rope_reference(xv, 128, False, [3], 1.0, device_inverse_frequencies(128))
    assert_rows_close("transposed vs numpy", values(got), want, KERNEL_TOLERANCE[dtypes.float16])
    assert_rows_close("transposed vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[dtypes.float16])


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gradients_through_the_kernel_are_the_compositions(traditional, dtype):
    rng = np.random.default_rng(0x74)
    x, _ = random(rng, (2, 3, 5, 80), dtype, gpu, spread=2.0)
    g, _ = random(rng, (2, 3, 5, 80), dtypes.float32, gpu)
    offset = Tensor(np.array([1, 4], np.int32), device=gpu)
    for with_freqs in (False, True):
        freqs = Tensor(periods(40), device=gpu) if with_freqs else None
        inputs = [x] + ([freqs] if with_freqs else [])
        with expect_launches(gpu, ROPE):  # the forward; the backward is the composition's
            got = gradients(call(x, 40, traditional, offset, freqs), g, inputs)
        with expect_launches(gpu, None), compositions_only():
            want = gradients(call(x, 40, traditional, offset, freqs), g, inputs)
        assert_rows_close(f"dx {dtype.name} freqs {with_freqs}", got[0], want[0], COMPOSITION_TOLERANCE[dtype])
        if with_freqs: assert_rows_close(f"dfreqs {dtype.name}", got[1], want[1], COMPOSITION_TOLERANCE[dtypes.float32])


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    rng = np.random.default_rng(0x75)
    x, _ = random(rng, (4, 8, 16, 128), dtypes.bfloat16, gpu, spread=2.0)
    ov = np.array([0, 100, 3000, 70000], np.int32)
    with expect_launches(gpu, ROPE):
        together = fast.rope(x, 128, offset=Tensor(ov, device=gpu)).bitcast(dtypes.uint16).numpy()
        for i in (0, 3):
            alone = fast.rope(x[i:i + 1], 128, offset=Tensor(ov[i:i + 1], device=gpu)).bitcast(dtypes.uint16).numpy()
            np.testing.assert_array_equal(together[i:i + 1], alone, err_msg=f"batch item {i}")


def test_a_jitted_decode_step_takes_its_position_from_a_bound_variable():
    """As the model's decode step: the offset `Tensor(length) - 1` of a bound Variable; each
    replay runs the kernel at the new position without building anything."""
    rng = np.random.default_rng(0x76)
    step = TinyJit(lambda x, length: fast.rope(x, 128, offset=Tensor(length, device=gpu) - 1).realize())
    length = UOp.variable("length", 1, 100000)
    for i, position in enumerate([5, 9, 300, 70000]):
        x, xv = random(rng, (2, 8, 1, 128), dtypes.bfloat16, gpu, spread=2.0)
        with expect_launches(gpu, ROPE if i < 2 else None):  # built while capturing, then replayed
            got = step(x.realize(), length.bind(position + 1))
        want = rope_reference(xv, 128, False, [position], 1.0, device_inverse_frequencies(128))
        assert_rows_close(f"jitted step at {position}", values(got), want, KERNEL_TOLERANCE[dtypes.bfloat16])


@pytest.mark.skipif(gpu == "METAL", reason="Metal has no float64")
def test_float64_stays_the_composition():
    rng = np.random.default_rng(0x77)
    x, xv = random(rng, (1, 2, 3, 16), dtypes.float64, gpu)
    with expect_launches(gpu, None):
        got = values(fast.rope(x, 16, offset=2))
    np.testing.assert_allclose(got, rope_reference(xv, 16, False, [2], 1.0, device_inverse_frequencies(16)), atol=1e-5)
