"""The softmax family's row kernels on a GPU (METAL or CUDA) against float64 numpy and the
composition on the same device: softmax, logsumexp and cross_entropy over the last axis at row
lengths on each launch shape (1, 7, 32, 33, 1000, 4096, 8192 in registers; 8193, 65536 looped),
1 to 10,000 rows, every kernel dtype; transposed and sliced inputs; infinite and NaN rows; hostile
targets; gradients (the composition's); half precision as the float32 softmax rounded once; a
row's bits equal to the row computed alone; a jitted call. Every call meant for a kernel asserts
that it launched (`expect_launches`); rows are compared by `assert_rows_close` (tolerances in
reference.py), each row of logsumexp and cross_entropy against its own value."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only
from reference import (COMPOSITION_TOLERANCE, DTYPES, KERNEL_TOLERANCE, assert_rows_close, expect_launches, gradients,
                       logsumexp_reference, random, softmax_reference, tensor, values)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
KERNELS = {"softmax": "nuvec_softmax", "logsumexp": "nuvec_logsumexp", "cross_entropy": "nuvec_cross_entropy"}
# (rows, length): each launch shape of `kernels.softmax.plan`, from one SIMD group to the looped 1024 threads
# (float32 rows loop past 8192 elements, 16-bit ones past 16384).
SHAPES = [(10000, 1), (3000, 7), (1, 32), (257, 33), (100, 1000), (9, 4096), (3, 8192), (2, 8193), (2, 16385), (2, 65536)]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1






def target_logits(x, targets):
    """Each row's target logit (negative targets count from the end), 0 where none is hit."""
    classes = x.shape[-1]
    wrapped = np.where(targets < 0, targets.astype(np.int64) + classes, targets)
    hit = (wrapped >= 0) & (wrapped < classes)
    return np.where(hit, np.take_along_axis(x, np.where(hit, wrapped, 0)[..., None], -1)[..., 0], 0.0)


def cross_entropy_reference(x, targets):
    """float64: log-sum-exp less the target's logit (one outside -C..C-1 subtracts nothing)."""
    with np.errstate(invalid="ignore"):
        return logsumexp_reference(x) - target_logits(x, targets)


def loss_scale(x, targets):
    """What a loss's rounding is relative to: the larger of its row's |log-sum-exp| and |target
    logit|, whose difference it is (a loss near 0 keeps their absolute error)."""
    return np.maximum(np.abs(logsumexp_reference(x)), np.abs(target_logits(x, targets)))


def assert_losses_close(name, got, want, scale, tol):
    """Each loss within `tol * scale` of its row's; non-finite losses exactly as wanted."""
    got, want, scale = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (got, want, scale))
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        close = np.isfinite(want) & (np.abs(got - want) <= tol * scale)
    bad = ~(same | close)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} losses differ, first at {i}: {got[i]} vs {want[i]} "
                             f"(tol {tol} of {scale[i]:.3g})")


def reference(mode, x, targets=None):
    if mode == "softmax": return softmax_reference(x)
    if mode == "logsumexp": return logsumexp_reference(x)
    return cross_entropy_reference(x, targets)


def run(mode, x, targets=None):
    """The operation of `mode` on x (over the last axis)."""
    if mode == "softmax": return fast.softmax(x)
    if mode == "logsumexp": return fast.logsumexp(x)
    return fast.cross_entropy(x, targets)


def kernel_and_composition(mode, x, targets=None):
    """The call through its kernel (asserting that it launched) and through the composition."""
    with expect_launches(gpu, KERNELS[mode]):
        got = run(mode, x, targets).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = run(mode, x, targets).realize()
    return got, composed


def compare(name, mode, got, composed, xv, tv, dtype):
    """The kernel's result against float64 numpy (from the input's values `xv` and targets `tv`)
    and against the composition, row by row: a log-sum-exp as its own row, a loss relative to
    `loss_scale` (cross_entropy's float32 result at float32's tolerances)."""
    got, composed, want = values(got), values(composed), reference(mode, xv, tv)
    if mode == "cross_entropy":
        scale = loss_scale(xv, tv)
        assert_losses_close(f"{name} vs numpy", got, want, scale, KERNEL_TOLERANCE[dtypes.float32])
        assert_losses_close(f"{name} vs composition", got, composed, scale, COMPOSITION_TOLERANCE[dtypes.float32])
        return
    if mode == "logsumexp": got, composed, want = (np.reshape(a, (-1, 1)) for a in (got, composed, want))
    assert_rows_close(f"{name} vs numpy", got, want, KERNEL_TOLERANCE[dtype])
    assert_rows_close(f"{name} vs composition", got, composed, COMPOSITION_TOLERANCE[dtype])


def targets_for(rows, classes, rng):
    """Targets in range, about half counted from the end."""
    return rng.integers(-classes, classes, rows).astype(np.int32)


@pytest.mark.parametrize("rows, length", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", KERNELS)
def test_the_kernels_match_numpy_and_the_composition(mode, rows, length, dtype):
    rng = np.random.default_rng(0x50F7)
    x, xv = random(rng, (rows, length), dtype, gpu, spread=8.0)
    tv = targets_for(rows, length, rng)
    targets = Tensor(tv, device=gpu) if mode == "cross_entropy" else None
    got, composed = kernel_and_composition(mode, x, targets)
    assert got.dtype == (dtypes.float32 if mode == "cross_entropy" else dtype)
    assert got.shape == ((rows, length) if mode == "softmax" else (rows,))
    compare(f"{mode} {dtype.name} {rows}x{length}", mode, got, composed, xv, tv, dtype)


@pytest.mark.parametrize("mode", KERNELS)
def test_transposed_sliced_and_batched_views(mode):
    """Inputs that are views (a transpose, a slice of the last axis, every other row, leading
    batch axes) read as their own rows; outputs take their shapes."""
    rng = np.random.default_rng(0x51)
    base, bv = random(rng, (4, 300, 6), dtypes.float16, gpu, spread=8.0)
    views = {"transposed": (base.transpose(1, 2), bv.transpose(0, 2, 1)),
             "sliced": (base.transpose(1, 2)[..., 3:290], bv.transpose(0, 2, 1)[..., 3:290]),
             "strided rows": (base[::2], bv[::2]), "batched": (base.reshape(2, 2, 300, 6), bv.reshape(2, 2, 300, 6))}
    for name, (x, xv) in views.items():
        tv = targets_for(int(np.prod(xv.shape[:-1])), xv.shape[-1], rng).reshape(xv.shape[:-1])
        got, composed = kernel_and_composition(mode, x, Tensor(tv, device=gpu) if mode == "cross_entropy" else None)
        assert got.shape == (xv.shape if mode == "softmax" else xv.shape[:-1])
        compare(f"{mode} {name}", mode, got, composed, xv, tv, dtypes.float16)


def infinite_rows(length):
    """Rows where infinities and NaN meet the statistics at a thread's first element, in a later
    block and in another thread."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-8, 8, (7, length))
    late = length - 2
    x[0] = -np.inf                        # every element -inf
    x[1, [0, 3, late]] = -np.inf          # some -inf, a finite maximum
    x[2, late] = np.inf                   # one +inf
    x[3, [1, late]] = np.inf              # two +inf
    x[4, 2] = np.nan
    x[5] = -np.inf
    x[5, late] = 1.5                      # one finite element after blocks of -inf
    x[6] *= 1000                          # most exponentials underflow
    return x


@pytest.mark.parametrize("length", [7, 9000], ids=["registers", "looped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_infinite_and_nan_rows_are_the_compositions(length, dtype):
    """A row of -inf or one holding +inf: softmax NaN, logsumexp the infinite maximum (the
    compositions'); a NaN gives NaN; -inf elements weigh nothing."""
    xv = infinite_rows(length)
    x = tensor(xv, dtype, gpu).realize()
    xv = values(x)   # as rounded to the dtype
    late = length - 2
    tv = np.array([0, 3, late, -length - 1, 2, late, INT32_MIN], np.int32)
    targets = Tensor(tv, device=gpu)
    for mode in KERNELS:
        got, composed = kernel_and_composition(mode, x, targets)
        compare(f"{mode} infinite rows {length}", mode, got, composed, xv, tv, dtype)
    got = values(fast.softmax(x))
    assert np.isnan(got[[0, 2, 3, 4]]).all() and (got[1, [0, 3, late]] == 0).all() and got[5, late] == 1
    np.testing.assert_array_equal(values(fast.logsumexp(x))[[0, 2, 3]], [-np.inf, np.inf, np.inf])


@pytest.mark.parametrize("length", [7, 30000], ids=["registers", "looped"])
def test_hostile_targets_hit_no_class(length):
    """int32 targets at both ends of int32 and one past either end of the classes, and int64
    targets outside int32 (clamped on the way to the kernel: still no class)."""
    rng = np.random.default_rng(0x52)
    x, xv = random(rng, (9, length), dtypes.bfloat16, gpu, spread=8.0)
    hostile = np.array([INT32_MIN, INT32_MAX, -length - 1, -length, length, length - 1, -1, 0, 2**30], np.int32)
    wide = np.array([2**40, -2**40, 2**31, -2**31 - 1, length, -length, 5, -1, 2**62], np.int64)
    lse = logsumexp_reference(xv)
    for name, tv in (("int32", hostile), ("int64", wide)):
        got, composed = kernel_and_composition("cross_entropy", x, Tensor(tv, device=gpu))
        compare(f"hostile {name} targets", "cross_entropy", got, composed, xv, tv, dtypes.bfloat16)
        missed = (tv < -length) | (tv >= length)
        assert missed.sum() >= 4
        assert_rows_close(f"{name}: no class hit", values(got)[missed].reshape(-1, 1), lse[missed].reshape(-1, 1),
                          KERNEL_TOLERANCE[dtypes.float32])


@pytest.mark.parametrize("length", [33, 4096, 8193], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gradients_through_the_kernels_are_the_compositions(length, dtype):
    rng = np.random.default_rng(0x53)
    x, _ = random(rng, (3, length), dtype, gpu, spread=4.0)
    (g, _), (gr, _) = random(rng, (3, length), dtypes.float32, gpu), random(rng, (3,), dtypes.float32, gpu)
    targets = Tensor(targets_for(3, length, rng), device=gpu)
    for mode, cotangent in (("softmax", g), ("logsumexp", gr), ("cross_entropy", gr)):
        with expect_launches(gpu, KERNELS[mode]):  # the forward; the backward is the composition's
            got, = gradients(run(mode, x, targets), cotangent, [x])
        with expect_launches(gpu, None), compositions_only():
            want, = gradients(run(mode, x, targets), cotangent, [x])
        assert_rows_close(f"d{mode} {dtype.name} {length}", got, want, COMPOSITION_TOLERANCE[dtype])


@pytest.mark.parametrize("shape", [(4, 300), (3, 4096), (6, 33), (2, 9000)], ids=str)
@pytest.mark.parametrize("dtype", (dtypes.float16, dtypes.bfloat16), ids=lambda d: d.name)
def test_half_precision_softmax_is_the_float32_softmax_rounded_once(shape, dtype):
    rng = np.random.default_rng(0x5F7)
    x, _ = random(rng, shape, dtype, gpu, spread=8.0)
    with expect_launches(gpu, KERNELS["softmax"]):
        got = fast.softmax(x).bitcast(dtypes.uint16).numpy()
        want = fast.softmax(x.cast(dtypes.float32)).cast(dtype).bitcast(dtypes.uint16).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("length", [7, 1000, 8192, 65536], ids=str)
@pytest.mark.parametrize("mode", KERNELS)
def test_a_rows_bits_do_not_depend_on_the_other_rows(mode, length):
    rng = np.random.default_rng(0x54)
    rows = 5 if length <= 8192 else 3
    x, _ = random(rng, (rows, length), dtypes.bfloat16, gpu, spread=8.0)
    tv = targets_for(rows, length, rng)
    bits = dtypes.uint32 if mode == "cross_entropy" else dtypes.uint16   # float32 losses, bfloat16 otherwise
    with expect_launches(gpu, KERNELS[mode]):
        together = run(mode, x, Tensor(tv, device=gpu)).bitcast(bits).numpy()
        for i in (0, rows - 1):
            alone = run(mode, x[i:i + 1], Tensor(tv[i:i + 1], device=gpu)).bitcast(bits).numpy()
            np.testing.assert_array_equal(together[i:i + 1], alone, err_msg=f"{mode} row {i} of {rows}")


def test_a_jitted_call_replays_the_kernel():
    """Under TinyJit (as a model's decode step calls softmax for its router) each replay runs the
    kernel on the new input."""
    rng = np.random.default_rng(0x55)
    step = TinyJit(lambda x: fast.softmax(x).realize())
    for i in range(4):
        x, xv = random(rng, (8, 64), dtypes.float32, gpu, spread=8.0)
        with expect_launches(gpu, KERNELS["softmax"] if i < 2 else None):  # built while capturing, then replayed
            got = step(x.realize())
        assert_rows_close(f"jitted call {i}", values(got), softmax_reference(xv), KERNEL_TOLERANCE[dtypes.float32])
