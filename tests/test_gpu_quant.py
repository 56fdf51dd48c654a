"""The quantized product kernels (qmv, qvm, gather_qmv, qmm) on a GPU (METAL or CUDA) against the
composition on the same device: every affine width and floating-point mode, 1-8 rows (qmm: many),
N and K at the kernels' boundaries (N not a multiple of a SIMD group's columns or below them, K not
a multiple of a SIMD step, nvfp4's half chunks, K split across 1-8 SIMD groups), the kernel
actually running, each few-row product's rows equal to one-row products bit for bit, gradients."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import quant
from nuvec_tg.kernels import compositions_only, record_launches
from nuvec_tg.kernels import quant as qmv
from reference import random

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
FORMATS = [("affine", 32, b) for b in (1, 2, 3, 4, 5, 6, 8)] + [("affine", 64, 4), ("affine", 128, 8), ("mxfp4", 32, 4),
                                                                 ("mxfp8", 32, 8), ("nvfp4", 16, 4)]
TOL = {dtypes.float32: 1e-5, dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2}


def bits_of(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def assert_gradients_equal_the_composition(product, upstream: Tensor, targets: list, kernel: str, tolerance: float = 1e-4):
    """The gradients of `sum(product() * upstream)` in x, the scales and the biases (`targets`)
    through the kernels (the one named `kernel...` must run) equal the composition's."""
    with record_launches() as launches:
        grads = [g.float().realize() for g in (product() * upstream).sum().gradient(*targets)]
    assert any(name.startswith(kernel) for name, _ in launches), launches
    with compositions_only():
        composed = [g.float().realize() for g in (product() * upstream).sum().gradient(*targets)]
    for name, got, want in zip(("x", "scales", "biases"), grads, composed):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tolerance, atol=tolerance, err_msg=name)


@pytest.mark.parametrize("mode, group, width", FORMATS, ids=lambda f: str(f))
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_qmv_matches_the_composition_and_keeps_one_row_bits(mode, group, width, dtype):
    rng = np.random.default_rng(0x9A7)
    # N not a multiple of a SIMD group's columns; K two SIMD steps (split in two) and a part
    # (nvfp4: ending in a half chunk).
    n, k = 13, 2 * 1024 + (48 if mode == "nvfp4" else 3 * group)
    assert qmv.plan(1, k, n).k_split == 2
    check_rows(rng, n, k, mode, group, width, dtype, (1, 3, 8))


@pytest.mark.parametrize("n, k", [(3, 64), (4, 1024), (300, 4 * 1024 + 64), (37, 9 * 1024 + 192)], ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=lambda d: d.name)
def test_qmv_at_the_plans_boundaries(n, k, dtype):
    """Fewer columns than a SIMD group serves, one step exactly, K split in 4 and 8."""
    check_rows(np.random.default_rng(0x9A9), n, k, "affine", 64, 4, dtype, (1, 2, 5))


def check_rows(rng, n, k, mode, group, width, dtype, row_counts):
    w = random(rng, (n, k), dtype, gpu)[0]
    qw = quant.quantize(w, group, width, mode=mode)
    for rows in row_counts:
        x = random(rng, (rows, k), dtype, gpu)[0].realize()
        with record_launches() as launches:
            y = quant.quantized_matmul(x, qw).realize()
        assert any(name.startswith("nuvec_qmv") for name, _ in launches), launches
        with compositions_only():
            want = quant.quantized_matmul(x, qw).realize()
        got, ref = y.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
        assert np.abs(got - ref).max() <= TOL[dtype] * max(np.abs(ref).max(), 1.0), (mode, width, rows)
        for row in range(rows):
            alone = quant.quantized_matmul(x[row:row + 1].contiguous(), qw)
            np.testing.assert_array_equal(bits_of(alone), bits_of(y)[row:row + 1], err_msg=f"{mode} {width} row {row}")


def test_qmv_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9A8)
    qw = quant.quantize(random(rng, (16, 128), dtypes.float32, gpu)[0], 32, 4)
    x = random(rng, (2, 128), dtypes.float32, gpu)[0].realize()
    upstream = random(rng, (2, 16), dtypes.float32, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmv")


def test_empty_products_take_the_composition():
    """No rows of x, or no columns of w: nothing to launch (an empty grid), the composition's empty result."""
    qw = quant.quantize(Tensor.zeros(8, 64, device=gpu), 32, 4)
    assert quant.quantized_matmul(Tensor.zeros(0, 64, device=gpu), qw).numpy().shape == (0, 8)
    none = quant.quantize(Tensor.zeros(0, 64, device=gpu), 32, 4)
    assert quant.quantized_matmul(Tensor.ones(2, 64, device=gpu), none).numpy().shape == (2, 0)


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("affine", 32, 3), ("mxfp4", 32, 4), ("nvfp4", 16, 4)],
                         ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=lambda d: d.name)
def test_qvm_matches_the_composition_and_keeps_one_row_bits(mode, group, width, dtype):
    """x · w for untransposed weights (the qvm kernel): N past one threadgroup's columns and not a
    multiple of them, each row's bits equal to a one-row product's."""
    rng = np.random.default_rng(0x9B0)
    k, n = 300, 256 + 3 * group
    qw = quant.quantize(random(rng, (k, n), dtype, gpu)[0], group, width, mode=mode)
    x = random(rng, (5, k), dtype, gpu)[0].realize()
    with record_launches() as launches:
        y = quant.quantized_matmul(x, qw, transpose=False).realize()
    assert any(name.startswith("nuvec_qvm") for name, _ in launches), launches
    with compositions_only():
        want = quant.quantized_matmul(x, qw, transpose=False).realize()
    got, ref = y.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
    assert np.abs(got - ref).max() <= TOL[dtype] * max(np.abs(ref).max(), 1.0)
    for row in range(5):
        alone = quant.quantized_matmul(x[row:row + 1].clone(), qw, transpose=False)
        np.testing.assert_array_equal(bits_of(alone), bits_of(y[row:row + 1].clone()), err_msg=f"row {row}")


def test_qvm_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9B1)
    qw = quant.quantize(random(rng, (128, 64), dtypes.float32, gpu)[0], 32, 4)
    x = random(rng, (2, 128), dtypes.float32, gpu)[0].realize()
    upstream = random(rng, (2, 64), dtypes.float32, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw, transpose=False), upstream,
                                           [x, qw.scales, qw.biases], "nuvec_qvm")


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("affine", 32, 3), ("mxfp4", 32, 4), ("nvfp4", 16, 4)],
                         ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=lambda d: d.name)
def test_gather_qmv_matches_the_composition_and_keeps_one_row_bits(mode, group, width, dtype):
    """gather_qmm's few-row kernel (experts' rows): against the composition, each row with the bits
    of a one-row product of its expert (the seeds' sorted_few_row_gathers_keep_the_one_row_bits),
    hostile expert indices giving zeros."""
    rng = np.random.default_rng(0x9AD)
    experts, n, k, rows = 4, 13, 1024 + 3 * group, 2
    w = random(rng, (experts, n, k), dtype, gpu)[0]
    qw = quant.quantize(w, group, width, mode=mode)
    x = random(rng, (3, rows, k), dtype, gpu)[0].realize()
    lhs = Tensor([0, 0, 1, 2, 2, 1], dtype=dtypes.int32, device=gpu)
    rhs = Tensor([0, 1, 1, 3, -2, 4], dtype=dtypes.int32, device=gpu)   # sorted by expert, then two hostile
    with record_launches() as launches:
        y = quant.gather_qmm(x, qw, lhs, rhs, sorted_indices=True).realize()
    assert any(name.startswith("nuvec_qmv") for name, _ in launches), launches
    with compositions_only():
        want = quant.gather_qmm(x, qw, lhs, rhs, sorted_indices=True).realize()
    got, ref = y.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
    assert np.abs(got - ref).max() <= TOL[dtype] * max(np.abs(ref).max(), 1.0)
    assert not got[4:].any()                                              # experts -2 and 4 do not exist
    for entry, (item, expert) in enumerate(zip([0, 0, 1, 2], [0, 1, 1, 3])):
        one = quant.QuantizedWeight(*(None if t is None else t[expert].clone() for t in (qw.weight, qw.scales, qw.biases)),
                                    mode, group, width)
        for row in range(rows):
            alone = quant.quantized_matmul(x[item, row:row + 1].clone(), one)
            np.testing.assert_array_equal(bits_of(alone), bits_of(y[entry, row:row + 1].clone()), err_msg=f"{entry} {row}")


def test_gather_qmv_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9AE)
    qw = quant.quantize(random(rng, (3, 16, 128), dtypes.float32, gpu)[0], 32, 4)
    x = random(rng, (2, 1, 128), dtypes.float32, gpu)[0].realize()
    lhs, rhs = Tensor([0, 1, 1], dtype=dtypes.int32, device=gpu), Tensor([2, 0, 2], dtype=dtypes.int32, device=gpu)
    upstream = random(rng, (3, 1, 16), dtypes.float32, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.gather_qmm(x, qw, lhs, rhs), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmv")


@pytest.mark.parametrize("mode, group, width", FORMATS, ids=lambda f: str(f))
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_qmm_matches_the_composition(mode, group, width, dtype):
    """Many rows (the qmm kernel): row and column tiles with tails (M = 100, N = 200), batch axes,
    K over many steps (nvfp4: a half chunk at the end)."""
    rng = np.random.default_rng(0x9B6)
    n, k = 200, 1024 + (16 if mode == "nvfp4" else group)
    qw = quant.quantize(random(rng, (n, k), dtype, gpu)[0], group, width, mode=mode)
    x = random(rng, (2, 50, k), dtype, gpu)[0].realize()
    with record_launches() as launches:
        y = quant.quantized_matmul(x, qw).realize()
    assert any(name.startswith("nuvec_qmm") for name, _ in launches), launches
    with compositions_only():
        want = quant.quantized_matmul(x, qw).realize()
    got, ref = y.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
    assert y.shape == (2, 50, n) and np.abs(got - ref).max() <= TOL[dtype] * max(np.abs(ref).max(), 1.0)


def test_qmm_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9B7)
    qw = quant.quantize(random(rng, (96, 256), dtypes.bfloat16, gpu)[0], 64, 4)
    x = random(rng, (40, 256), dtypes.bfloat16, gpu)[0].realize()
    upstream = random(rng, (40, 96), dtypes.bfloat16, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmm", tolerance=2e-2)


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("mxfp4", 32, 4), ("nvfp4", 16, 4)], ids=str)
def test_sorted_many_row_gathers_run_the_gathered_qmm(mode, group, width):
    """A mixture-of-experts prefill: 300 single-row entries sorted by expert over 4 experts (more
    than 8 a batch: the gathered qmm), against the composition, with hostile expert indices."""
    rng = np.random.default_rng(0x9B9)
    experts, n, k, entries = 4, 96, 256 + (16 if mode == "nvfp4" else 0), 300
    qw = quant.quantize(random(rng, (experts, n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x = random(rng, (entries, 1, k), dtypes.bfloat16, gpu)[0].realize()
    picks = np.sort(rng.integers(0, experts, entries)).astype(np.int32)
    picks[-3:] = experts + 5
    rhs = Tensor(picks, device=gpu)
    with record_launches() as launches:
        y = quant.gather_qmm(x, qw, None, rhs, sorted_indices=True).realize()
    assert any(name.startswith("nuvec_qmm") for name, _ in launches), launches
    with compositions_only():
        want = quant.gather_qmm(x, qw, None, rhs, sorted_indices=True).realize()
    got, ref = y.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
    assert y.shape == (entries, 1, n) and np.abs(got - ref).max() <= TOL[dtypes.bfloat16] * max(np.abs(ref).max(), 1.0)
    assert not got[-3:].any()
