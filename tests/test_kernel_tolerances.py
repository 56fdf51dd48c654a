"""The GPU tests' yardstick on the CPU: `KERNEL_TOLERANCE` and `COMPOSITION_TOLERANCE` pass numpy
models of correct kernels with margin and fail planted faults (a zero output, dropped keys, a
wrong scale, a swapped head, ...), by `row_error`, which `assert_rows_close` bounds; and the
helpers that prove a kernel ran (`expect_launches`, `attention_kernel`), and conftest's rule that
a GPU asked for must open.

A model is the kernel's arithmetic in numpy: float32 sums and products of the 16-bit inputs,
softmax weights rounded to the input dtype where attention's matrix pass feeds them to the matrix
units, states rounded where the kernel stores them, the output rounded once."""
import math

import numpy as np
import pytest
from tinygrad import dtypes

import conftest
from nuvec_tg import quant
from attention_reference import attention_reference
from quant_reference import dequantized
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, attention_kernel, expect_launches, \
    random, round_to, row_error, values

DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
# A correct model stays within this share of the tolerance; a fault exceeds the composition's
# tolerance (the looser one) by this factor.
MARGIN = 2.0


def attention_model(q, k, v, scale, dtype, *, score_factor=1.0, dropped_keys=0, head_shift=0):
    """Attention as the decode kernels compute it (float32, scores in base 2, 16-bit weights
    rounded for the matrix units, the output rounded to `dtype`), with planted faults: scores
    times `score_factor`, the last `dropped_keys` keys left out, key heads rolled by `head_shift`."""
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (np.roll(np.repeat(a, group, axis=1), head_shift * group, axis=1) for a in (k, v))
    keys = k.shape[2] - dropped_keys
    scores = (q @ np.swapaxes(k[:, :, :keys], -1, -2)) * np.float32(scale * math.log2(math.e) * score_factor)
    weights = np.exp2(scores - scores.max(-1, keepdims=True))
    total = weights.sum(-1, keepdims=True, dtype=np.float32)
    if dtype != dtypes.float32: weights = round_to(weights, dtype).astype(np.float32)
    return round_to((weights @ v[:, :, :keys]) / total, dtype)


# (B, Hq, Hkv, Lq, Lk, D, Dv): test_gpu_attention's shortest cache, a single key head, its longest
# (with 4 query heads of its 16, for time)
ATTENTION_SHAPES = [(2, 4, 4, 1, 37, 64, 64), (1, 2, 1, 1, 20, 192, 128), (1, 4, 2, 1, 9000, 128, 128)]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=str)
def test_attention_tolerances_pass_the_kernels_and_fail_planted_faults(shape):
    b, hq, hkv, lq, lk, d, dv = shape
    rng = np.random.default_rng(0x66)
    scale = 1 / math.sqrt(d)
    for dtype in DTYPES:
        q, k, v = (round_to(rng.uniform(-1, 1, s), dtype) for s in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
        want = attention_reference(q, k, v, scale)
        correct = row_error(attention_model(q, k, v, scale, dtype), want)
        assert correct * MARGIN <= KERNEL_TOLERANCE[dtype], (dtype, correct)
        faults = {"zero": np.zeros_like(want),
                  "last 1/16 of the keys dropped": attention_model(q, k, v, scale, dtype, dropped_keys=max(1, lk // 16)),
                  "scores scaled by ln 2": attention_model(q, k, v, scale, dtype, score_factor=math.log(2))}
        if hkv > 1: faults["key heads rolled by one"] = attention_model(q, k, v, scale, dtype, head_shift=1)
        for fault, got in faults.items():
            assert row_error(got, want) >= MARGIN * COMPOSITION_TOLERANCE[dtype], (dtype.name, fault, row_error(got, want))
        if lk >= 2048:  # the floor of 1 that the tolerance replaced passed dropped keys at long caches
            dropped = attention_model(q, k, v, scale, dtype, dropped_keys=lk // 16)
            assert np.abs(dropped - want).max() < 0.05 * max(np.abs(want).max(), 1.0)


def gated_delta_model(q, k, v, g, beta, state, arithmetic, *, fault=None):
    """The gated delta rule in `arithmetic` (np.float32: the kernel; np.float64: the reference):
    `(y [B, T, Hv, Dv], final state)`. Planted faults: "drop" the last step's update, "beta" and
    "gate" ignored (taken as 1), "head" value heads on key head `h % Hk` instead of `h // (Hv / Hk)`."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    s = np.array(state, arithmetic)
    y = np.zeros((b, t, hv, dv), arithmetic)
    for h in range(hv):
        kh = h % hk if fault == "head" else h // (hv // hk)
        for step in range(t):
            key, query = k[:, step, kh].astype(arithmetic), q[:, step, kh].astype(arithmetic)
            gate = 1 if fault == "gate" else g[:, step, h, None, None].astype(arithmetic)
            rate = 1 if fault == "beta" else beta[:, step, h, None].astype(arithmetic)
            s[:, h] *= gate
            if not (fault == "drop" and step == t - 1):
                delta = (v[:, step, h].astype(arithmetic) - np.einsum("brk,bk->br", s[:, h], key)) * rate
                s[:, h] += delta[:, :, None] * key[:, None, :]
            y[:, step, h] = np.einsum("brk,bk->br", s[:, h], query)
    return y, s


@pytest.mark.parametrize("shape", [(1, 1, 2, 4, 128, 128), (2, 5, 1, 2, 64, 48), (1, 17, 2, 4, 64, 32)], ids=str)
def test_gated_delta_tolerances_pass_the_kernel_and_fail_planted_faults(shape):
    """test_gpu_gated_delta's inputs (unit keys, gates near 0.85, rates near 0.5) at one step,
    several, and past the decode launch; y in q's dtype, the state in float32."""
    b, t, hk, hv, dk, dv = shape
    rng = np.random.default_rng(0x68)
    for dtype in DTYPES:
        q = round_to(rng.uniform(-1, 1, (b, t, hk, dk)), dtype)
        k = rng.uniform(-1, 1, (b, t, hk, dk))
        k = round_to(k / np.sqrt((k * k).sum(-1, keepdims=True)), dtype)
        v = round_to(rng.uniform(-1, 1, (b, t, hv, dv)), dtype)
        g, beta = round_to(rng.uniform(0.75, 0.95, (b, t, hv)), dtype), round_to(rng.uniform(0.3, 0.7, (b, t, hv)), dtype)
        state = rng.uniform(-1, 1, (b, hv, dv, dk)).astype(np.float32)
        want_y, want_state = gated_delta_model(q, k, v, g, beta, state, np.float64)
        y, final = gated_delta_model(q, k, v, g, beta, state, np.float32)
        assert row_error(round_to(y, dtype), want_y) * MARGIN <= KERNEL_TOLERANCE[dtype]
        assert row_error(final, want_state) * MARGIN <= KERNEL_TOLERANCE[dtypes.float32]
        faults = ["drop", "beta", "gate"] + (["head"] if 1 < hk < hv else [])
        for fault in faults:
            y, final = gated_delta_model(q, k, v, g, beta, state, np.float32, fault=fault)
            error = max(row_error(round_to(y, dtype), want_y), row_error(final, want_state))
            assert error >= MARGIN * COMPOSITION_TOLERANCE[dtype], (dtype.name, fault, error)


def test_quant_tolerances_pass_the_kernels_and_fail_planted_faults():
    """A 4-bit affine product as test_gpu_quant's qmv (N 13, K two steps and 3 groups): the kernel
    (float32 on the dequantized weights) against float64, the composition (dense weights rounded
    to the dtype) within COMPOSITION_TOLERANCE of it, and faults: the K tail (3 groups) dropped,
    each group's scale and bias taken from its neighbour, columns shifted by one."""
    rng = np.random.default_rng(0x9A7)
    n, k, group, rows = 13, 2048 + 96, 32, 8
    for dtype in DTYPES:
        w = round_to(rng.uniform(-1, 1, (n, k // group, group)), dtype)
        low = round_to(w.min(-1, keepdims=True), dtype)
        step = round_to((w.max(-1, keepdims=True) - low) / 15, dtype)
        codes = np.clip(np.round((w - low) / step), 0, 15)
        dense = (codes * step.astype(np.float32) + low.astype(np.float32)).astype(np.float32).reshape(n, k)
        x = round_to(rng.uniform(-1, 1, (rows, k)), dtype).astype(np.float32)
        want = x.astype(np.float64) @ dense.astype(np.float64).T
        kernel = round_to(x @ dense.T, dtype)
        composition = round_to(x @ round_to(dense, dtype).astype(np.float32).T, dtype)
        assert row_error(kernel, want) * MARGIN <= KERNEL_TOLERANCE[dtype]
        assert row_error(kernel, composition) * MARGIN <= COMPOSITION_TOLERANCE[dtype]
        tail = dense.copy()
        tail[:, -3 * group:] = 0
        neighbours = (codes * np.roll(step, 1, axis=1) + np.roll(low, 1, axis=1)).reshape(n, k)
        for fault, weights in (("tail", tail), ("neighbour's scale", neighbours), ("columns", np.roll(dense, 1, axis=0))):
            error = row_error(round_to(x @ weights.astype(np.float32).T, dtype), want)
            assert error >= MARGIN * COMPOSITION_TOLERANCE[dtype], (dtype.name, fault, error)


def test_dense_tolerances_pass_the_kernels_and_fail_planted_faults():
    """A dense product with a bias as test_gpu_linear's gemv (N 13, K two steps of 256 and 40): the
    kernels (exact products summed in float32, the bias added, rounded once) against float64, the
    CPU's composition (each product rounded to the dtype first) within COMPOSITION_TOLERANCE of
    them, and faults: the K tail (40) dropped, the bias left out, columns shifted by one."""
    rng = np.random.default_rng(0x21)
    n, k, rows = 13, 552, 8
    for dtype in DTYPES:
        x, w, bias = (round_to(rng.uniform(-1, 1, shape), dtype) for shape in ((rows, k), (n, k), (n,)))
        want = x @ w.T + bias

        def product(x, w, bias, rounded=False):
            products = x[:, None, :].astype(np.float32) * w[None, :, :].astype(np.float32)
            if rounded: products = round_to(products, dtype).astype(np.float32)
            return round_to(products.sum(-1, dtype=np.float32) + bias.astype(np.float32), dtype)
        kernel = product(x, w, bias)
        assert row_error(kernel, want) * MARGIN <= KERNEL_TOLERANCE[dtype]
        assert row_error(kernel, product(x, w, bias, rounded=True)) * MARGIN <= COMPOSITION_TOLERANCE[dtype]
        tail = w.copy()
        tail[:, -40:] = 0
        for fault, got in (("tail", product(x, tail, bias)), ("bias", product(x, w, 0 * bias)),
                           ("columns", product(x, np.roll(w, 1, axis=0), np.roll(bias, 1)))):
            error = row_error(got, want)
            assert error >= MARGIN * COMPOSITION_TOLERANCE[dtype], (dtype.name, fault, error)


# ---- the helpers -----------------------------------------------------------------------------

def test_row_error_and_assert_rows_close_measure_each_row_by_its_largest_value():
    want = np.array([[1e-3, -2e-3], [100.0, 1.0], [0.0, 0.0]])
    got = want + np.array([[1e-5, 0], [0, 0.3], [0, 0]])
    assert row_error(got, want) == pytest.approx(1e-5 / 2e-3)
    assert_rows_close("small rows", got, want, 6e-3)
    with pytest.raises(AssertionError, match="small rows: 1 of 6 elements differ, first at \\(0, 0\\)"):
        assert_rows_close("small rows", got, want, 4e-3)  # 5e-3 of the first row's largest
    with pytest.raises(AssertionError):
        assert_rows_close("zero", np.zeros_like(want), want, 0.5)
    with pytest.raises(AssertionError):  # an all-zero row of want takes zeros only
        assert_rows_close("zero row", want + np.array([0, 0, 1e-30])[:, None], want, 0.5)
    assert row_error(np.zeros(3), np.ones(3)) == 1.0


def test_expect_launches_wants_the_kernel_on_a_gpu_and_nothing_elsewhere():
    with expect_launches("CUDA", "nuvec_qmv") as launches:
        launches.append(("nuvec_qmv_affine_4", "label"))
    for device, kernel, recorded in (("CUDA", "nuvec_qmv", []), ("METAL", "nuvec_qmv", [("nuvec_qmm", "")]),
                                     ("CPU", "nuvec_qmv", [("nuvec_qmv", "")]), ("CUDA", None, [("nuvec_qmv", "")])):
        with pytest.raises(AssertionError, match=device):
            with expect_launches(device, kernel) as launches:
                launches.extend(recorded)
    with expect_launches("CPU", "nuvec_qmv"), expect_launches("CUDA", None):
        pass  # no kernel where the device has none or the plan composes
    with pytest.raises(ZeroDivisionError):  # an error inside the block is the error reported
        with expect_launches("CUDA", "nuvec_qmv"):
            1 / 0


def test_attention_kernel_follows_the_plan_with_kernels_on():
    assert attention_kernel("CPU", (1, 8, 1, 64), (1, 2, 300, 64), (1, 2, 300, 64), dtypes.float16) is None
    assert attention_kernel("METAL", (1, 8, 1, 64), (1, 2, 300, 64), (1, 2, 300, 64), dtypes.float16) == "nuvec_sdpa_decode"
    assert attention_kernel("METAL", (1, 8, 1, 8), (1, 2, 300, 8), (1, 2, 300, 8), dtypes.float16) is None  # head size 8
    assert attention_kernel("METAL", (1, 8, 9, 64), (1, 2, 300, 64), (1, 2, 300, 64), dtypes.float16) is None  # 9 queries


@pytest.mark.parametrize("mode, group, bits", [("affine", 32, 3), ("mxfp8", 32, 8), ("nvfp4", 16, 4)], ids=str)
def test_the_numpy_decoding_of_quantized_weights_equals_dequantize(mode, group, bits):
    """quant_reference.dequantized (test_gpu_quant's reference weights) against the package's
    dequantize on the CPU (itself checked against MLX's vectors): a 3-bit stream straddling its
    words, e4m3 elements with e8m0 scales, e2m1 elements with e4m3 scales."""
    qw = quant.quantize(random(np.random.default_rng(0x9A), (2, 3, 128), dtypes.float32, "CPU")[0], group, bits, mode=mode)
    np.testing.assert_allclose(dequantized(qw), values(quant.dequantize(qw, dtypes.float32)), rtol=2.0 ** -24, atol=0)


def test_a_gpu_asked_for_by_dev_must_open():
    def open_only(*names):
        def open_device(name):
            if name not in names: raise RuntimeError(f"{name} is absent")
        return open_device
    assert conftest.gpu_devices({}, open_only()) == []
    assert conftest.gpu_devices({"DEV": "CPU"}, open_only()) == []
    assert conftest.gpu_devices({"DEV": "CUDA"}, open_only("CUDA")) == ["CUDA"]
    for environment in ({"DEV": "CUDA"}, {"DEV": "CUDA:PTX"}, {"DEV": "metal"}, {"NUVEC_REQUIRE_GPU": "1"}):
        with pytest.raises(RuntimeError, match="did not open|no GPU device opened"):
            conftest.gpu_devices(environment, open_only())
    with pytest.raises(RuntimeError, match="METAL"):  # the one asked for, though another opened
        conftest.gpu_devices({"DEV": "METAL"}, open_only("CUDA"))
