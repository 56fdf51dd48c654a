"""rms_norm, layer_norm, add_rms_norm and residual_rms_norm against float64 numpy references."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from reference import DTYPES, TOLERANCE, assert_close, finite_differences, gradients, random, round_to, tensor, values

SHAPES = [(9,), (3, 7), (2, 4, 64), (1100, 32), (2, 5000), (2, 7000)]


def rms_reference(x, w=None, eps=1e-5):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def layer_reference(x, w=None, b=None, eps=1e-5):
    centred = x - np.mean(x, axis=-1, keepdims=True)
    y = centred / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps)
    if w is not None: y = y * w
    return y if b is None else y + b


def test_fallbacks_match_direct_formulas():
    rows = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]])
    wv, bv = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, -1.0])
    x, w, b = (Tensor(a.astype(np.float32), device="CPU") for a in (rows, wv, bv))
    rms, ln = values(fast.rms_norm(x, w, 1e-5)), values(fast.layer_norm(x, w, b, 1e-5))
    for r, row in enumerate(rows):
        ms, mu = np.sum(row * row) / 3, np.sum(row) / 3
        var = np.sum((row - mu) ** 2) / 3
        for j in range(3):
            assert abs(rms[r, j] - row[j] / np.sqrt(ms + 1e-5) * wv[j]) < 1e-5
            assert abs(ln[r, j] - ((row[j] - mu) / np.sqrt(var + 1e-5) * wv[j] + bv[j])) < 1e-5


@pytest.mark.float64
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norms_match_the_reference_with_gradients(device, shape, dtype):
    rng = np.random.default_rng(0x61)
    d = shape[-1]
    (x, xv), (w, wv), (b, bv), (g, gv) = (random(rng, s, dtype, device) for s in (shape, (d,), (d,), shape))
    g32 = g.cast(dtypes.float32)
    tol = TOLERANCE[dtype]
    cases = {
        "rms": (lambda x, w, b: fast.rms_norm(x, w), lambda x, w, b: rms_reference(x, w)),
        "rms no weight": (lambda x, w, b: fast.rms_norm(x), lambda x, w, b: rms_reference(x)),
        "layer norm": (lambda x, w, b: fast.layer_norm(x, w, b), lambda x, w, b: layer_reference(x, w, b)),
        "layer norm bare": (lambda x, w, b: fast.layer_norm(x), lambda x, w, b: layer_reference(x)),
    }
    # Gradients against the same composition in float64 on the same (rounded) values; the float64
    # gradients themselves are checked against finite differences below.
    x64, w64, b64 = (tensor(v, dtypes.float64, device) for v in (xv, wv, bv))
    for name, (op, ref) in cases.items():
        y = op(x, w, b)
        assert y.dtype == dtype and y.shape == shape
        grads = gradients(y, g32, [x, w, b])
        want_grads = gradients(op(x64, w64, b64), tensor(gv, dtypes.float64, device), [x64, w64, b64])
        assert_close(f"{name} forward", values(y), ref(xv, wv, bv), tol)
        # bfloat16 weight gradients sum thousands of rounded products: scale with the rows.
        rows_factor = 8.0 if np.prod(shape[:-1]) > 1000 else 1.0
        for what, got, want in zip("xwb", grads, want_grads):
            assert_close(f"{name} d{what}", got, want, tol * rows_factor)


@pytest.mark.float64
@pytest.mark.parametrize("shape", [(3, 7), (2, 2, 16)], ids=str)
def test_norm_gradients_match_finite_differences(device, shape):
    rng = np.random.default_rng(0x62)
    d = shape[-1]
    xv, wv, bv, gv = (rng.uniform(-1, 1, size=s) for s in (shape, (d,), (d,), shape))
    x, w, b, g = (tensor(v, dtypes.float64, device) for v in (xv, wv, bv, gv))
    cases = [
        (lambda x, w, b: fast.rms_norm(x, w, 1e-5), lambda x, w, b: rms_reference(x, w)),
        (lambda x, w, b: fast.layer_norm(x, w, b, 1e-5), lambda x, w, b: layer_reference(x, w, b)),
    ]
    for op, ref in cases:
        got = gradients(op(x, w, b), g, [x, w, b])
        want = finite_differences(lambda x, w, b: np.sum(ref(x, w, b) * gv), [xv, wv, bv])
        for what, a, e in zip("xwb", got, want):
            assert_close(f"d{what}", a, e, 1e-6)


def test_a_transposed_input(device):
    rng = np.random.default_rng(0x63)
    x, xv = random(rng, (16, 6), dtypes.float32, device)
    assert_close("rms strided", values(fast.rms_norm(x.T, None, 1e-6)), rms_reference(xv.T, eps=1e-6), 2e-5)


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast(dtypes.uint16 if t.dtype.itemsize == 2 else dtypes.uint32).numpy()


@pytest.mark.parametrize("shape", [(9,), (3, 7), (2, 1, 1024), (700, 64), (2, 5000)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_rms_norm_equals_add_then_rms_norm(device, shape, dtype):
    rng = np.random.default_rng(0x67)
    (x, xv), (r, rv), (w, wv) = (random(rng, s, dtype, device) for s in (shape, shape, shape[-1:]))
    for weight, weight_values in ((w, wv), (None, None)):
        h, y = fast.add_rms_norm(x, r, weight, 1e-5)
        h_want = x + r
        y_want = fast.rms_norm(h_want, weight, 1e-5)
        assert (h.dtype, y.dtype) == (dtype, dtype)
        np.testing.assert_array_equal(bits(h), bits(h_want))
        np.testing.assert_array_equal(bits(y), bits(y_want))
        h_ref = round_to(xv + rv, dtype)
        assert_close("h", values(h), h_ref, TOLERANCE[dtype])
        assert_close("y", values(y), rms_reference(h_ref, weight_values), TOLERANCE[dtype])


def test_add_rms_norm_strided_and_widened(device):
    rng = np.random.default_rng(0x68)
    # A transpose and a slice.
    x = random(rng, (16, 6), dtypes.float32, device)[0].T
    r = random(rng, (8, 20), dtypes.float32, device)[0][1:7, 2:18]
    h, y = fast.add_rms_norm(x, r)
    np.testing.assert_array_equal(bits(h), bits(x + r))
    np.testing.assert_array_equal(bits(y), bits(fast.rms_norm(x + r)))
    # A float32 weight widens the norm of a bfloat16 sum.
    (x, xv), (r, rv) = random(rng, (2, 8), dtypes.bfloat16, device), random(rng, (2, 8), dtypes.bfloat16, device)
    w, wv = random(rng, (8,), dtypes.float32, device)
    h, y = fast.add_rms_norm(x, r, w)
    assert (h.dtype, y.dtype) == (dtypes.bfloat16, dtypes.float32)
    np.testing.assert_array_equal(bits(h), bits(x + r))
    np.testing.assert_array_equal(bits(y), bits(fast.rms_norm(x + r, w)))
    assert_close("widened", values(y), rms_reference(round_to(xv + rv, dtypes.bfloat16), wv), 1e-5)
    # A residual that broadcasts over the rows.
    (x, xv), (r, rv) = random(rng, (3, 4, 8), dtypes.float32, device), random(rng, (4, 8), dtypes.float32, device)
    h, y = fast.add_rms_norm(x, r)
    assert h.shape == (3, 4, 8)
    assert_close("broadcast", values(y), rms_reference(xv + rv), 2e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_residual_rms_norm(device, dtype):
    rng = np.random.default_rng(0x69)
    shape = (3, 5, 32)
    (h, hv), (x, xv), (w, wv), (w2, w2v) = (random(rng, s, dtype, device) for s in (shape, shape, (32,), (32,)))
    tol = TOLERANCE[dtype]
    s, y = fast.residual_rms_norm(h, x, w, 1e-5)
    assert y is None and s.dtype == dtype
    assert_close("plain", values(s), hv + rms_reference(xv, wv), tol)
    scale = Tensor([0.5], device=device).cast(dtype)
    s, y = fast.residual_rms_norm(h, x, w, 1e-5, scale=scale, next=(w2, 1e-6))
    s_ref = (hv + rms_reference(xv, wv)) * 0.5
    assert_close("scaled", values(s), s_ref, tol)
    assert_close("next", values(y), rms_reference(round_to(s_ref, dtype), w2v, 1e-6), tol)
    s, _ = fast.residual_rms_norm(h, x, w, 1e-5, scale=2.0)
    assert s.dtype == dtype
    assert_close("number scale", values(s), (hv + rms_reference(xv, wv)) * 2.0, tol)
    # Gradients reach every float input, from a call not realized (realizing a kernel's output
    # leaves a buffer, without the graph its gradient comes from).
    s, _ = fast.residual_rms_norm(h, x, w, 1e-5, scale=2.0)
    g = Tensor.ones(*shape, device=device)
    grads = (s.cast(dtypes.float32) * g).sum().gradient(h, x, w)
    assert all(gr.shape == t.shape for gr, t in zip(grads, (h, x, w)))
    assert_close("dh", values(grads[0]), np.full(shape, 2.0), tol)


def test_norm_dtypes_promote_with_the_weight(device):
    x = Tensor.ones(2, 4, device=device).cast(dtypes.float16)
    for w_dtype, want in ((dtypes.float16, dtypes.float16), (dtypes.bfloat16, dtypes.float32), (dtypes.float32, dtypes.float32)):
        w = Tensor.ones(4, device=device).cast(w_dtype)
        assert fast.rms_norm(x, w).dtype == want
        assert fast.layer_norm(x, w, None).dtype == want
        assert fast.layer_norm(x, None, w).dtype == want
    # An integer input with a float weight is normalised in the weight's dtype.
    xi = Tensor([[1, 2, 3, 4]], device=device)
    y = fast.rms_norm(xi, Tensor.ones(4, device=device))
    assert y.dtype == dtypes.float32
    assert_close("int input", values(y), rms_reference(np.array([[1.0, 2, 3, 4]])), 2e-5)


@pytest.mark.float64
def test_fused_residual_gradients_match_finite_differences(device):
    rng = np.random.default_rng(0x6A)
    shape = (2, 3, 8)
    xv, rv, wv, w2v, gh, gy = (rng.uniform(-1, 1, size=s) for s in (shape, shape, (8,), (8,), shape, shape))
    x, r, w, w2 = (tensor(v, dtypes.float64, device) for v in (xv, rv, wv, w2v))
    g_h, g_y = tensor(gh, dtypes.float64, device), tensor(gy, dtypes.float64, device)

    h, y = fast.add_rms_norm(x, r, w, 1e-5)
    got = [values(t) for t in ((h * g_h).sum() + (y * g_y).sum()).gradient(x, r, w)]
    loss = lambda x, r, w: np.sum((x + r) * gh) + np.sum(rms_reference(x + r, w) * gy)  # noqa: E731
    for what, a, e in zip(["x", "residual", "weight"], got, finite_differences(loss, [xv, rv, wv])):
        assert_close(f"add_rms_norm d{what}", a, e, 1e-6)

    scale = Tensor([0.7], device=device, dtype=dtypes.float64)
    s, y = fast.residual_rms_norm(x, r, w, 1e-5, scale=scale, next=(w2, 1e-6))
    got = [values(t) for t in ((s * g_h).sum() + (y * g_y).sum()).gradient(x, r, w, scale, w2)]

    def loss(h, x, w, scale, w2):
        s = (h + rms_reference(x, w)) * scale[0]
        return np.sum(s * gh) + np.sum(rms_reference(s, w2, 1e-6) * gy)

    want = finite_differences(loss, [xv, rv, wv, np.array([0.7]), w2v])
    for what, a, e in zip(["h", "x", "weight", "scale", "next weight"], got, want):
        assert_close(f"residual_rms_norm d{what}", a, e, 1e-6)
