"""rope against a float64 numpy reference."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from reference import DTYPES, TOLERANCE, assert_close, finite_differences, gradients, random, tensor, values


def rope_reference(x, dims, traditional=False, base=10000.0, scale=1.0, offset=0, freqs=None):
    half, length = dims // 2, x.shape[-2]
    inv_freq = 1.0 / np.asarray(freqs, np.float64) if freqs is not None else base ** (-2.0 * np.arange(half) / dims)
    offset = np.asarray(offset).reshape(-1)
    if offset.size == 1:
        positions = offset[0] + np.arange(length)
    else:
        positions = offset.reshape((x.shape[0],) + (1,) * (x.ndim - 2)) + np.arange(length)
    theta = scale * positions[..., None] * inv_freq
    cos, sin = np.cos(theta), np.sin(theta)
    out = x.copy()
    if traditional:
        first, second = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = first * cos - second * sin, first * sin + second * cos
    else:
        first, second = x[..., :half], x[..., half:dims]
        out[..., :half], out[..., half:dims] = first * cos - second * sin, first * sin + second * cos
    return out


def test_rope_of_the_seeds():
    # Offset 0 leaves position 0 unchanged and rotates position 1 by theta = 1.
    x = Tensor([[[1.0, 2.0], [1.0, 2.0]]], device="CPU")
    got = values(fast.rope(x, 2, traditional=False, base=10000.0, scale=1.0, offset=Tensor(0, device="CPU")))
    c, s = np.cos(1.0), np.sin(1.0)
    assert_close("seeds", got.reshape(-1), [1.0, 2.0, c - 2 * s, s + 2 * c], 1e-6)


# (shape, dims, traditional, one offset per batch item, freqs)
CASES = [
    ((2, 3, 5, 8), 8, False, False, False),
    ((2, 3, 5, 8), 8, True, False, False),
    ((2, 3, 5, 16), 8, False, True, False),
    ((2, 4, 16), 16, True, True, True),
    ((3, 2, 1, 32), 32, False, False, False),
    ((3, 2, 1, 32), 16, True, False, True),
    ((2, 2, 3, 6, 8), 8, False, True, False),
]


@pytest.mark.float64
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_matches_the_reference_with_gradients(device, case, dtype):
    shape, dims, traditional, per_batch, with_freqs = case
    rng = np.random.default_rng(0x63)
    (x, xv), (g, gv) = random(rng, shape, dtype, device), random(rng, shape, dtype, device)
    offset_values = np.array([3 * i + 1 for i in range(shape[0])], np.int32) if per_batch else np.array(5, np.int32)
    freq_values = (1.0 + 3.0 * np.arange(dims // 2)).astype(np.float32) if with_freqs else None
    options = dict(traditional=traditional, scale=0.5, offset=Tensor(offset_values, device=device),
                   base=None if with_freqs else 10000.0,
                   freqs=None if freq_values is None else Tensor(freq_values, device=device))
    y = fast.rope(x, dims, **options)
    assert y.dtype == dtype and y.shape == shape
    want = rope_reference(xv, dims, traditional, 10000.0, 0.5, offset_values, freq_values)
    tol = TOLERANCE[dtype] * 4
    assert_close("forward", values(y), want, tol)
    got_grad, = gradients(y, g.cast(dtypes.float32), [x])
    x64 = tensor(xv, dtypes.float64, device)
    want_grad, = gradients(fast.rope(x64, dims, **options), tensor(gv, dtypes.float64, device), [x64])
    assert_close("gradient", got_grad, want_grad, tol)


@pytest.mark.float64
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_gradients_match_finite_differences(device, traditional):
    rng = np.random.default_rng(0x66)
    xv, gv = rng.uniform(-1, 1, size=(2, 3, 4, 6)), rng.uniform(-1, 1, size=(2, 3, 4, 6))
    x = tensor(xv, dtypes.float64, device)
    offsets = np.array([2, 7], np.int32)
    y = fast.rope(x, 4, traditional=traditional, offset=Tensor(offsets, device=device), scale=0.75, base=100.0)
    got, = gradients(y, tensor(gv, dtypes.float64, device), [x])
    loss = lambda x: np.sum(rope_reference(x, 4, traditional, 100.0, 0.75, offsets) * gv)  # noqa: E731
    assert_close("gradient", got, finite_differences(loss, [xv])[0], 1e-6)


def test_rope_int_offsets_and_the_untouched_tail(device):
    rng = np.random.default_rng(0x67)
    x, xv = random(rng, (1, 2, 3, 10), dtypes.float32, device)
    for offset in (0, 17, -4):
        y = values(fast.rope(x, 6, offset=offset))
        assert_close(f"offset {offset}", y, rope_reference(xv, 6, offset=offset), 2e-5)
        np.testing.assert_array_equal(y[..., 6:], xv[..., 6:])
    # A one-element offset tensor of any integer dtype, and int64 per-batch offsets.
    y = fast.rope(x, 10, offset=Tensor([9], device=device, dtype=dtypes.uint16))
    assert_close("uint16 offset", values(y), rope_reference(xv, 10, offset=9), 2e-5)
