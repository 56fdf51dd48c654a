"""The norm kernels (`kernels/rows.py`, `src/norm.h`, `src/residual_norm.h`) on a GPU (METAL or
CUDA) against float64 numpy and the composition on the same device: `rms_norm`, `add_rms_norm`,
`layer_norm` and `residual_rms_norm` (with a scale, a scale tensor, the next norm) at row
lengths on every launch shape and its boundaries (1, 7: single elements; 32, 33; 1000, 4096,
8192: pieces held in registers; 65536: the row read again each pass), row counts 1 to 10k, every
dtype with and without weights and biases, transposed and sliced inputs, a row's bits equal to the
row computed alone, gradients equal to the composition's, and what stays a composition (float64,
integer inputs, other axes have no norm). Every call meant for a kernel asserts that it launched
(`expect_launches`)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, gradients, random, round_to, values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
EPS = 1e-5
RMS, LAYER = "nuvec_rms_norm", "nuvec_layer_norm"
# (rows, length): each launch shape and its edges; the longest rows fewer, the shortest many.
SHAPES = [(3, 1), (5, 7), (10000, 32), (4, 33), (300, 1000), (16, 4096), (3, 8192), (2, 65536)]


def numpy_norm(x, weight, bias, out_dtype, layer):
    """float64 `round(norm(x))`, then `round(y * w)`, `round(y + b)` in the result dtype."""
    centred = x - x.mean(-1, keepdims=True) if layer else x
    y = round_to(centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + EPS), out_dtype)
    if weight is not None: y = round_to(y * weight, out_dtype)
    if bias is not None: y = round_to(y + bias, out_dtype)
    return y


def check(name, got, want, composed, dtype):
    assert_rows_close(f"{name} vs numpy", values(got).reshape(want.shape), want, KERNEL_TOLERANCE[dtype])
    assert_rows_close(f"{name} vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[dtype])


@pytest.mark.parametrize("rows, length", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, weight_dtype", [(F32, F32), (BF16, BF16), (F16, F16), (BF16, F32), (F16, None)], ids=str)
def test_rms_norm_matches_numpy_and_the_composition(rows, length, dtype, weight_dtype):
    rng = np.random.default_rng(rows * 7 + length)
    x, xv = random(rng, (rows, length), dtype, gpu, spread=3.0)
    w, wv = random(rng, (length,), weight_dtype, gpu) if weight_dtype else (None, None)
    out_dtype = F32 if weight_dtype == F32 else dtype
    with expect_launches(gpu, RMS):
        y = fast.rms_norm(x, w, EPS).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fast.rms_norm(x, w, EPS).realize()
    assert y.dtype == out_dtype and y.shape == x.shape
    check(f"rms {rows}x{length}", y, numpy_norm(xv, wv, None, out_dtype, False), composed, out_dtype)


@pytest.mark.parametrize("rows, length", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, params", [(F32, "wb"), (BF16, "wb"), (F16, "w"), (BF16, "b"), (F32, "")], ids=str)
def test_layer_norm_matches_numpy_and_the_composition(rows, length, dtype, params):
    rng = np.random.default_rng(rows * 11 + length)
    x, _ = random(rng, (rows, length), dtype, gpu, spread=3.0)
    x = x + 1.0   # an offset mean: centring matters
    w, wv = random(rng, (length,), dtype, gpu) if "w" in params else (None, None)
    b, bv = random(rng, (length,), dtype, gpu) if "b" in params else (None, None)
    with expect_launches(gpu, LAYER):
        y = fast.layer_norm(x, w, b, EPS).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fast.layer_norm(x, w, b, EPS).realize()
    check(f"layer {rows}x{length}", y, numpy_norm(values(x), wv, bv, dtype, True), composed, dtype)


@pytest.mark.parametrize("rows, length", [(5, 7), (10000, 32), (300, 1000), (16, 4096), (2, 65536)], ids=str)
@pytest.mark.parametrize("dtypes_", [(BF16, BF16, BF16), (F16, F16, F32), (F32, BF16, None), (BF16, F16, BF16)], ids=str)
def test_add_rms_norm_matches_numpy_and_the_composition_and_h_is_exact(rows, length, dtypes_):
    x_dtype, r_dtype, w_dtype = dtypes_
    rng = np.random.default_rng(rows + length)
    x, xv = random(rng, (rows, length), x_dtype, gpu, spread=3.0)
    r, rv = random(rng, (rows, length), r_dtype, gpu)
    w, wv = random(rng, (length,), w_dtype, gpu) if w_dtype else (None, None)
    with expect_launches(gpu, RMS):
        h, y = fast.add_rms_norm(x, r, w, EPS)
        Tensor.realize(h, y)
    with expect_launches(gpu, None), compositions_only():
        ch, cy = fast.add_rms_norm(x, r, w, EPS)
        Tensor.realize(ch, cy)
    assert (h.dtype, y.dtype, h.shape, y.shape) == (ch.dtype, cy.dtype, ch.shape, cy.shape)
    np.testing.assert_array_equal(values(h), values(ch))   # one rounding of an exact float32 sum, both
    check(f"add {rows}x{length}", y, numpy_norm(values(h), wv, None, y.dtype, False), cy, y.dtype)
    with expect_launches(gpu, RMS):   # equal bit for bit to adding, then rms_norm (both kernels)
        np.testing.assert_array_equal(values(fast.rms_norm(h, w, EPS)), values(y))


def test_broadcast_and_batched_shapes():
    rng = np.random.default_rng(5)
    x, xv = random(rng, (2, 3, 4096), BF16, gpu)
    r, rv = random(rng, (4096,), BF16, gpu)
    with expect_launches(gpu, RMS):
        h, y = fast.add_rms_norm(x, r)
        Tensor.realize(h, y)
    assert h.shape == y.shape == (2, 3, 4096)
    np.testing.assert_array_equal(values(h), round_to(xv + rv, BF16))
    assert_rows_close("broadcast add", values(y).reshape(6, 4096), numpy_norm(values(h).reshape(6, 4096), None, None, BF16, False),
                      KERNEL_TOLERANCE[BF16])


@pytest.mark.parametrize("layout", ["transposed", "sliced", "strided_rows"])
def test_transposed_and_sliced_inputs(layout):
    rng = np.random.default_rng(9)
    base, bv = random(rng, (64, 1000), BF16, gpu, spread=2.0)
    x, xv = {"transposed": (base.T, bv.T), "sliced": (base[3:40], bv[3:40]), "strided_rows": (base[:, 8:520], bv[:, 8:520])}[layout]
    w, wv = random(rng, (x.shape[-1],), BF16, gpu)
    for op, kernel in ((lambda t: fast.rms_norm(t, w, EPS), RMS), (lambda t: fast.layer_norm(t, w, None, EPS), LAYER)):
        with expect_launches(gpu, kernel):
            y = op(x).realize()
        with compositions_only():
            composed = op(x).realize()
        assert_rows_close(f"{layout} {kernel}", values(y), values(composed), COMPOSITION_TOLERANCE[BF16])


def test_whole_rows_of_a_buffer_are_read_in_place():
    """A run of whole rows of a realized buffer (a slice along the leading axes, one row) is read
    where it is, as MLX reads a row-contiguous input: the call runs its kernel alone. Rows that are
    not whole (a slice of the last axis) are copied first, one kernel more: a kernel reading them
    through their buffer would send the gradient to the buffer, not to the view (design.md)."""
    from tinygrad import GlobalCounters
    rng = np.random.default_rng(10)
    # realized: `random` gives a lazy cast, whose kernels would count with the call's
    base, w = random(rng, (64, 1024), BF16, gpu)[0].realize(), random(rng, (1024,), BF16, gpu)[0].realize()
    ops = ((lambda t: fast.rms_norm(t, w[:t.shape[-1]], EPS), RMS), (lambda t: fast.softmax(t, -1), "nuvec_softmax"))
    for op, kernel in ops:
        for view, warm, kernels_run in ((base[5:40], base[3:38], 1), (base[7], base[6], 1), (base[:35, :512], base[1:36, :512], 2)):
            op(warm).realize()  # the call's runtime integers made once (`int_buffer`), as in a model's later calls
            before = GlobalCounters.kernel_count
            with expect_launches(gpu, kernel):
                op(view).realize()
            assert GlobalCounters.kernel_count - before == kernels_run, f"{kernel} of a {view.shape} view"


@pytest.mark.parametrize("length", [33, 4096, 65536])
def test_a_rows_bits_equal_the_row_computed_alone(length):
    rng = np.random.default_rng(length)
    x, _ = random(rng, (7, length), BF16, gpu, spread=3.0)
    r, _ = random(rng, (7, length), BF16, gpu)
    w, _ = random(rng, (length,), BF16, gpu)
    with expect_launches(gpu, RMS):
        h, y = fast.add_rms_norm(x, r, w)
        Tensor.realize(h, y)
        _, alone = fast.add_rms_norm(x[4:5].contiguous(), r[4:5].contiguous(), w)
    np.testing.assert_array_equal(values(y)[4:5], values(alone))
    with expect_launches(gpu, LAYER):
        together = fast.layer_norm(x, w, w).realize()
        alone = fast.layer_norm(x[2:3].contiguous(), w, w).realize()
    np.testing.assert_array_equal(values(together)[2:3], values(alone))


def test_gradients_equal_the_compositions():
    rng = np.random.default_rng(21)
    x, _ = random(rng, (6, 512), F32, gpu, spread=2.0)
    r, _ = random(rng, (6, 512), F32, gpu)
    w, _ = random(rng, (512,), F32, gpu)
    b, _ = random(rng, (512,), F32, gpu)
    cot, _ = random(rng, (6, 512), F32, gpu)
    cases = [
        (RMS, lambda: [fast.rms_norm(x, w)], [x, w]),
        (LAYER, lambda: [fast.layer_norm(x, w, b)], [x, w, b]),
        (RMS, lambda: list(fast.add_rms_norm(x, r, w)), [x, r, w]),
        (RMS, lambda: [fast.add_rms_norm(x, r, w)[1]], [x, r, w]),   # only y's gradient: told from h's by its shape
        (RMS, lambda: [fast.add_rms_norm(x, r, w)[0] * 3], [x, r]),   # only h's
    ]
    for kernel, outputs, wrt in cases:
        with expect_launches(gpu, kernel):
            got = gradients(sum(outputs()), cot, wrt)
        with compositions_only():
            want = gradients(sum(outputs()), cot, wrt)
        for i, (g, c) in enumerate(zip(got, want)):
            assert_rows_close(f"{kernel} gradient {i}", g.reshape(-1, g.shape[-1]), c.reshape(-1, c.shape[-1]), 1e-4)


def test_what_stays_a_composition():
    rng = np.random.default_rng(2)
    x64, xv = random(rng, (3, 64), dtypes.float64, gpu) if gpu != "METAL" else (None, None)
    if x64 is not None:
        with expect_launches(gpu, None):
            np.testing.assert_allclose(values(fast.rms_norm(x64)), xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + 1e-5), rtol=1e-12)
    ints = Tensor(np.arange(64, dtype=np.int32).reshape(2, 32), device=gpu)
    with expect_launches(gpu, None):
        fast.rms_norm(ints, Tensor.ones(32, device=gpu)).realize()
    empty = Tensor.empty(0, 64, dtype=F32, device=gpu)
    with expect_launches(gpu, None):
        assert fast.layer_norm(empty).realize().shape == (0, 64)


RESIDUAL = "nuvec_residual_norm"


@pytest.mark.parametrize("rows, length", [(5, 7), (10000, 32), (300, 1000), (16, 4096), (2, 65536)], ids=str)
@pytest.mark.parametrize("scale", [None, 0.7, "tensor"], ids=str)
@pytest.mark.parametrize("next_norm", [False, True], ids=["alone", "next"])
@pytest.mark.parametrize("dtypes_", [(BF16, BF16), (F16, F32)], ids=str)
def test_residual_rms_norm_matches_numpy_and_the_composition(rows, length, scale, next_norm, dtypes_):
    branch_dtype, stream_dtype = dtypes_
    rng = np.random.default_rng(rows * 3 + length)
    h, hv = random(rng, (rows, length), stream_dtype, gpu)
    x, xv = random(rng, (rows, length), branch_dtype, gpu, spread=3.0)
    w, wv = random(rng, (length,), branch_dtype, gpu)
    w2, w2v = random(rng, (length,), branch_dtype, gpu)
    factor = Tensor([0.8125], dtype=F32, device=gpu) if scale == "tensor" else scale
    next_ = (w2, 1e-6) if next_norm else None
    with expect_launches(gpu, RESIDUAL):
        s, y = fast.residual_rms_norm(h, x, w, EPS, scale=factor, next=next_)
        Tensor.realize(*(t for t in (s, y) if t is not None))
    with expect_launches(gpu, None), compositions_only():
        cs, cy = fast.residual_rms_norm(h, x, w, EPS, scale=factor, next=next_)
    assert s.dtype == cs.dtype and s.shape == cs.shape and (y is None) == (not next_norm)
    normed = numpy_norm(xv, wv, None, branch_dtype, False)
    want_s = round_to(hv + normed, s.dtype)
    if scale is not None: want_s = round_to(want_s * round_to(np.float64(0.8125 if scale == "tensor" else scale), s.dtype), s.dtype)
    # The branch is rounded to its own dtype inside s: the coarser of the two sets the tolerance.
    coarse = max((branch_dtype, s.dtype), key=lambda d: KERNEL_TOLERANCE[d])
    check(f"residual s {rows}x{length}", s, want_s, cs, coarse)
    if next_norm:
        assert y.dtype == cy.dtype
        want_y = round_to(round_to(values(s) / np.sqrt((values(s) ** 2).mean(-1, keepdims=True) + 1e-6), y.dtype) * w2v, y.dtype)
        check(f"residual y {rows}x{length}", y, want_y, cy, max((coarse, y.dtype), key=lambda d: KERNEL_TOLERANCE[d]))


def test_residual_rms_norm_broadcasts_and_its_gradients_equal_the_compositions():
    rng = np.random.default_rng(4)
    h, _ = random(rng, (2, 3, 512), F32, gpu)
    x, _ = random(rng, (3, 512), F32, gpu, spread=2.0)
    w, _ = random(rng, (512,), F32, gpu)
    w2, _ = random(rng, (512,), F32, gpu)
    cot, _ = random(rng, (2, 3, 512), F32, gpu)
    cases = [(lambda: list(fast.residual_rms_norm(h, x, w, EPS, next=(w2, 1e-6))), [h, x, w, w2]),
             (lambda: [fast.residual_rms_norm(h, x, w, EPS, next=(w2, 1e-6))[1]], [h, x, w, w2]),   # y alone: told from s by its shape
             (lambda: [fast.residual_rms_norm(h, x, w, EPS, scale=2.0)[0]], [h, x, w])]
    for outputs, wrt in cases:
        with expect_launches(gpu, RESIDUAL):
            got = gradients(sum(outputs()), cot, wrt)
        with compositions_only():
            want = gradients(sum(outputs()), cot, wrt)
        for i, (g, c) in enumerate(zip(got, want)):
            assert_rows_close(f"residual gradient {i}", g.reshape(-1, g.shape[-1]), c.reshape(-1, c.shape[-1]), 1e-4)
