"""softmax, logsumexp and cross_entropy against float64 numpy references."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast, kernels
from nuvec_tg.kernels import softmax as row_kernels
from reference import (DTYPES, HALF_DTYPES, TOLERANCE, assert_close, finite_differences, gradients, launched, random,
                       stand_in_program, tensor, values)

SHAPES = [(5, 10), (2, 3, 257), (3, 5000), (1, 1, 9)]


def softmax_reference(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def logsumexp_reference(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return np.squeeze(np.where(np.isinf(m), m, out), axis)


def cross_entropy_reference(x, targets):
    classes = x.shape[-1]
    wrapped = np.where(targets < 0, targets + classes, targets)
    return logsumexp_reference(x) - np.take_along_axis(x, wrapped[..., None], -1)[..., 0]


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast(dtypes.uint16).numpy()


@pytest.mark.parametrize("shape", [(4, 300), (3, 4096), (6, 33)], ids=str)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("axis", [-1, 0])
def test_half_precision_softmax_is_precise(device, shape, dtype, axis):
    rng = np.random.default_rng(0x5F7)
    x, xv = random(rng, shape, dtype, device, spread=8.0)
    got = fast.softmax(x, axis)
    want = fast.softmax(x.cast(dtypes.float32), axis).cast(dtype)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert_close("softmax", values(got), softmax_reference(xv, axis), TOLERANCE[dtype])


def targets_for(rows, classes):
    """The seeds' targets: some negative (counted from the end)."""
    n = int(np.prod(rows))
    return np.array([(i * 7 % classes) - (i % 2) for i in range(n)], dtype=np.int32).reshape(rows)


@pytest.mark.float64
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_logsumexp_and_cross_entropy(device, shape, dtype):
    rng = np.random.default_rng(0x62)
    (x, xv), (g, gv) = random(rng, shape, dtype, device), random(rng, shape, dtype, device)
    rows = shape[:-1]
    gr, grv = random(rng, rows, dtypes.float32, device)
    tv = targets_for(rows, shape[-1])
    targets = Tensor(tv, device=device)
    tol = TOLERANCE[dtype]
    x64 = tensor(xv, dtypes.float64, device)
    ops = {
        "softmax": (lambda x: fast.softmax(x), softmax_reference(xv), g.cast(dtypes.float32), tensor(gv, dtypes.float64, device)),
        "logsumexp": (lambda x: fast.logsumexp(x), logsumexp_reference(xv), gr, tensor(grv, dtypes.float64, device)),
        "cross entropy": (lambda x: fast.cross_entropy(x, targets), cross_entropy_reference(xv, tv), gr,
                          tensor(grv, dtypes.float64, device)),
    }
    for name, (op, want, cotangent, cotangent64) in ops.items():
        y = op(x)
        assert y.dtype == (dtypes.float32 if name == "cross entropy" else dtype)
        assert_close(f"{name} forward", values(y), want, tol)
        got_grad, = gradients(y, cotangent, [x])
        want_grad, = gradients(op(x64), cotangent64, [x64])
        assert_close(f"{name} gradient", got_grad, want_grad, tol)


@pytest.mark.float64
def test_gradients_match_finite_differences(device):
    rng = np.random.default_rng(0x64)
    xv, gv = rng.uniform(-1, 1, size=(3, 7)), rng.uniform(-1, 1, size=(3, 7))
    tv = np.array([2, -1, 6])
    x, g = tensor(xv, dtypes.float64, device), tensor(gv, dtypes.float64, device)
    cases = [
        (fast.softmax(x, 0), g, lambda x: np.sum(softmax_reference(x, 0) * gv)),
        (fast.logsumexp(x), g[:, 0], lambda x: np.sum(logsumexp_reference(x) * gv[:, 0])),
        (fast.cross_entropy(x, Tensor(tv, device=device)), g[:, 0], lambda x: np.sum(cross_entropy_reference(x, tv) * gv[:, 0])),
    ]
    for out, cotangent, loss in cases:
        got, = gradients(out, cotangent, [x])
        assert_close("gradient", got, finite_differences(loss, [xv])[0], 1e-6)


def test_infinite_rows_and_other_axes(device):
    inf = float("inf")
    x = Tensor([[-inf, -inf], [1.0, inf], [-inf, 1.0], [0.0, 1.0]], device=device)
    got = values(fast.logsumexp(x, keepdims=True))
    assert_close("infinite rows", got[:, 0], [-inf, inf, 1.0, np.log(1 + np.e)], 2e-7)
    assert got.shape == (4, 1)
    assert_close("axis 0", values(fast.logsumexp(x[2:], axis=0)), [np.log(np.exp(-inf) + 1), np.log(np.e + np.e)], 1e-6)
    rng = np.random.default_rng(0x65)
    x, xv = random(rng, (4, 3, 5), dtypes.float32, device)
    assert_close("softmax axis 1", values(fast.softmax(x, 1)), softmax_reference(xv, 1), 2e-5)
    assert_close("logsumexp axis -2", values(fast.logsumexp(x, -2)), logsumexp_reference(xv, -2), 2e-5)


def test_cross_entropy_of_the_seeds():
    x = Tensor([[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]], device="CPU")
    ce = values(fast.cross_entropy(x, Tensor([2, -3], device="CPU")))
    rows = [[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]]
    for r, row in enumerate(rows):
        want = np.log(np.sum(np.exp(row))) - row[[2, 0][r]]
        assert abs(ce[r] - want) < 1e-5
    # Unsigned targets and a float64 loss for float64 logits.
    ce = fast.cross_entropy(x.cast(dtypes.float64), Tensor([2, 0], device="CPU", dtype=dtypes.uint8))
    assert ce.dtype == dtypes.float64
    assert_close("uint8 targets", values(ce), cross_entropy_reference(np.array(rows), np.array([2, 0])), 1e-12)


# ---- the kernel path, on the CPU ---------------------------------------------------------------
# The CPU has no kernels: these tests give the routes a backend and the launch a C stand-in for the
# kernel (the real kernels run in test_softmax_emulated.py and on a GPU in test_gpu_softmax.py), to
# check what the operations do around a kernel: the route, shapes and dtypes, the targets as the
# kernel reads them, and the backward (the composition's gradient).

STAND_INS = {
    "softmax": "for (int i = 0; i < ints[0] * ints[1]; i++) y[i] = x[i];",             # the input itself
    "logsumexp": "for (int r = 0; r < ints[1]; r++) y[r] = x[r * ints[0]];",           # each row's first element
    "cross_entropy": "for (int r = 0; r < ints[1]; r++) y[r] = (float)targets[r];",    # the targets as read
}


@pytest.fixture
def stand_ins(monkeypatch):
    """Kernels on for every device, each program replaced by its C stand-in (float32 only)."""
    render = row_kernels.program

    def stand_in(backend, mode, dtype, shape):
        return stand_in_program(f"stand_in_{mode}", render(backend, mode, dtype, shape).params, STAND_INS[mode])
    monkeypatch.setattr(kernels, "active_backend", lambda device: "cuda")
    monkeypatch.setattr(row_kernels, "program", stand_in)


def test_the_last_axis_launches_the_kernel_with_the_compositions_gradient(stand_ins):
    rng = np.random.default_rng(0x66)
    x, xv = random(rng, (2, 3, 5), dtypes.float32, "CPU")
    (g, _), (gr, _) = random(rng, (2, 3, 5), dtypes.float32, "CPU"), random(rng, (2, 3), dtypes.float32, "CPU")
    with kernels.record_launches() as launches:
        y, lse, kept = fast.softmax(x), fast.logsumexp(x), fast.logsumexp(x, -1, keepdims=True)
        transposed = fast.softmax(x.transpose(1, 2))
    assert launched(launches) == ["stand_in_softmax", "stand_in_logsumexp", "stand_in_logsumexp", "stand_in_softmax"]
    assert launches[0][1] == "cuda softmax 6x5" and launches[1][1] == "cuda logsumexp 6x5"
    assert y.dtype == lse.dtype == dtypes.float32 and lse.shape == (2, 3) and kept.shape == (2, 3, 1)
    np.testing.assert_array_equal(y.numpy(), xv)
    np.testing.assert_array_equal(lse.numpy(), xv[..., 0])
    np.testing.assert_array_equal(kept.numpy(), xv[..., :1])
    np.testing.assert_array_equal(transposed.numpy(), xv.transpose(0, 2, 1))   # read as its own rows
    for name, op, cotangent in (("softmax", fast.softmax, g), ("logsumexp", fast.logsumexp, gr),
                                ("keepdims", lambda x: fast.logsumexp(x, keepdims=True), gr.unsqueeze(-1))):
        got, = gradients(op(x), cotangent, [x])
        with kernels.compositions_only():
            want, = gradients(op(x), cotangent, [x])
        assert_close(f"{name} gradient", got, want, 1e-6)


def test_cross_entropy_targets_reach_the_kernel_as_int32_hitting_the_same_classes(stand_ins):
    rng = np.random.default_rng(0x67)
    x, _ = random(rng, (5, 4), dtypes.float32, "CPU")
    wide = Tensor(np.array([2**40, -2**40, -1, 3, 2**31 + 4]), dtype=dtypes.int64, device="CPU")
    with kernels.record_launches() as launches:
        read = fast.cross_entropy(x, wide)
        narrow = fast.cross_entropy(x, Tensor(np.array([200, 1, 0, 255, 7], np.uint8), device="CPU"))
    assert launched(launches) == ["stand_in_cross_entropy"] * 2
    assert read.dtype == dtypes.float32 and read.shape == (5,)
    clamped = np.array([2**31 - 1, -2**31, -1, 3, 2**31 - 1]).astype(np.float32)   # outside int32: still no class
    np.testing.assert_array_equal(read.numpy(), clamped)
    np.testing.assert_array_equal(narrow.numpy(), [200, 1, 0, 255, 7])
    cotangent = random(rng, (5,), dtypes.float32, "CPU")[0]
    got, = gradients(fast.cross_entropy(x, wide), cotangent, [x])
    with kernels.compositions_only():
        want, = gradients(fast.cross_entropy(x, wide), cotangent, [x])
    assert_close("cross_entropy gradient", got, want, 1e-6)
    one = fast.cross_entropy(x[0], Tensor(2, device="CPU"))   # 1-D logits, a scalar (weak int) target
    assert one.shape == () and one.item() == 2


def test_other_axes_float64_and_empty_calls_compose(stand_ins):
    x = Tensor.ones(2, 3, device="CPU")
    with kernels.record_launches() as launches:
        fast.softmax(x, 0).realize()
        fast.logsumexp(x, -2).realize()
        fast.softmax(x.cast(dtypes.float64)).realize()
        fast.cross_entropy(x.cast(dtypes.float64), Tensor([0, 1], device="CPU")).realize()
        fast.softmax(Tensor.ones(0, 3, device="CPU")).realize()
        fast.logsumexp(Tensor.ones(2, 0, device="CPU")).realize()
    assert launches == []
