"""depthwise_conv1d, causal_conv1d_slots, moe_route and weighted_sum against numpy."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from reference import assert_close, random, values


def conv_reference(x, w, stride=1, padding=0, dilation=1):
    n, length, c = x.shape
    taps = w.shape[1]
    x = np.pad(x, ((0, 0), (padding, padding), (0, 0)))
    out_len = (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1
    out = np.zeros((n, out_len, c))
    for l in range(out_len):
        for k in range(taps):
            out[:, l] += x[:, l * stride + k * dilation] * w[:, k, 0]
    return out


@pytest.mark.parametrize("options", [dict(), dict(stride=2), dict(padding=2), dict(dilation=3, padding=1),
                                     dict(stride=3, padding=1, dilation=2)], ids=str)
def test_depthwise_conv1d(device, options):
    rng = np.random.default_rng(0x70)
    (x, xv), (w, wv) = random(rng, (2, 11, 6), dtypes.float32, device), random(rng, (6, 3, 1), dtypes.float32, device)
    got = fast.depthwise_conv1d(x, w, **options)
    assert_close(str(options), values(got), conv_reference(xv, wv, **options), 2e-5)
    # The same as tinygrad's grouped convolution.
    stride, padding, dilation = options.get("stride", 1), options.get("padding", 0), options.get("dilation", 1)
    conv = x.transpose(1, 2).conv2d(w.reshape(6, 1, 3), groups=6, stride=stride, padding=padding, dilation=dilation)
    assert_close("conv2d", values(got), values(conv.transpose(1, 2)), 2e-5)


def test_causal_conv1d_slots(device):
    rng = np.random.default_rng(0x71)
    batch, length, channels, taps, places = 3, 4, 5, 4, 6
    (x, xv), (w, wv) = random(rng, (batch, length, channels), dtypes.float32, device), random(rng, (channels, taps, 1), dtypes.float32, device)
    pool, pv = random(rng, (places, taps - 1, channels), dtypes.float32, device)
    slots = [2, 7, 0]
    for silu in (False, True):
        y, new_pool = fast.causal_conv1d_slots(x, w, pool, Tensor(slots, device=device), silu=silu)
        y, new_pool = values(y), values(new_pool)
        for b, slot in enumerate(slots):
            if 0 <= slot < places:
                sequence = np.concatenate([pv[slot], xv[b]])[None]
                want = conv_reference(sequence, wv)[0]
                if silu: want = want / (1 + np.exp(-want))
                assert_close(f"y {b}", y[b], want, 2e-5)
                np.testing.assert_array_equal(new_pool[slot], sequence[0, length:].astype(np.float32))
            else:
                np.testing.assert_array_equal(y[b], 0.0)
        for untouched in (1, 3, 4, 5):
            np.testing.assert_array_equal(new_pool[untouched], pv[untouched].astype(np.float32))


def test_moe_route(device):
    probs_values = np.array([[0.1, 0.4, 0.2, 0.4, 0.05], [0.3, 0.3, 0.3, 0.05, 0.05]], np.float32)
    probs = Tensor(probs_values, device=device)
    indices, scores = fast.moe_route(probs, 3)
    assert indices.dtype == dtypes.uint32 and indices.shape == (2, 3)
    # Ascending order of probability, ties in ascending index (a stable sort's last three).
    np.testing.assert_array_equal(indices.numpy(), [[2, 1, 3], [0, 1, 2]])
    np.testing.assert_array_equal(values(scores), probs_values[[[0], [1]], indices.numpy()].astype(np.float64))
    _, normalized = fast.moe_route(probs, 3, normalize=True)
    want = probs_values[[[0], [1]], indices.numpy()]
    assert_close("normalized", values(normalized), want / want.sum(-1, keepdims=True), 1e-6)
    rng = np.random.default_rng(0x72)
    many = rng.uniform(size=(4, 3, 64)).astype(np.float32)
    got, _ = fast.moe_route(Tensor(many, device=device), 8)
    np.testing.assert_array_equal(got.numpy(), np.argsort(many, axis=-1, kind="stable")[..., -8:])


def test_weighted_sum(device):
    rng = np.random.default_rng(0x73)
    (x, xv), (w, wv) = random(rng, (3, 4, 8), dtypes.bfloat16, device), random(rng, (3, 4), dtypes.float32, device)
    got = fast.weighted_sum(x, w)
    assert got.dtype == dtypes.float32 and got.shape == (3, 8)
    assert_close("weighted", values(got), np.einsum("bkd,bk->bd", xv, wv), 1e-5)


INVALID = [
    (ValueError, "depthwise_conv1d", lambda: fast.depthwise_conv1d(Tensor.zeros(2, 5, 3), Tensor.zeros(4, 2, 1))),
    (ValueError, "depthwise_conv1d", lambda: fast.depthwise_conv1d(Tensor.zeros(2, 5, 3), Tensor.zeros(3, 2, 1), stride=0)),
    (ValueError, "depthwise_conv1d", lambda: fast.depthwise_conv1d(Tensor.zeros(2, 2, 3), Tensor.zeros(3, 4, 1))),
    (ValueError, "depthwise_conv1d", lambda: fast.depthwise_conv1d(Tensor.zeros(5, 3), Tensor.zeros(3, 2, 1))),
    (ValueError, "causal_conv1d_slots",
     lambda: fast.causal_conv1d_slots(Tensor.zeros(2, 5, 3), Tensor.zeros(3, 4, 1), Tensor.zeros(4, 2, 3), Tensor([0, 1]))),
    (TypeError, "causal_conv1d_slots",
     lambda: fast.causal_conv1d_slots(Tensor.zeros(2, 5, 3), Tensor.zeros(3, 4, 1), Tensor.zeros(4, 3, 3), Tensor([0.0, 1.0]))),
    (ValueError, "moe_route", lambda: fast.moe_route(Tensor.zeros(2, 4), 5)),
    (ValueError, "moe_route", lambda: fast.moe_route(Tensor.zeros(2, 4), 0)),
    (TypeError, "moe_route", lambda: fast.moe_route(Tensor.zeros(2, 4, dtype=dtypes.int32), 2)),
    (ValueError, "weighted_sum", lambda: fast.weighted_sum(Tensor.zeros(3, 4, 8), Tensor.zeros(3, 5))),
]


@pytest.mark.parametrize("error, op, call", INVALID)
def test_invalid_arguments(error, op, call):
    with pytest.raises(error, match=f"^{op}: "):
        call()
