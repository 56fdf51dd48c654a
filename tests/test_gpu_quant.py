"""The quantized product kernels (qmv, qvm, gather_qmv, qmm) on a GPU (METAL or CUDA) against the
composition on the same device: every affine width and floating-point mode, 1-8 rows (qmm: many),
N and K at the kernels' boundaries (N not a multiple of a SIMD group's columns or below them, K not
a multiple of a SIMD step, nvfp4's half chunks, K split across 1-8 SIMD groups), each few-row
product's rows equal to one-row products bit for bit, gradients. Products are compared row by row
(`assert_rows_close`, tolerances in reference.py) with float64 numpy over the weights decoded in
numpy (quant_reference.py) and with the composition; every call meant for a kernel asserts that it
launched (`expect_launches`). On Hopper (CUDA sm_90) qmm with K a multiple of 64 is qmm_wgmma, every
tile shape of which gives the same bits (and qmm_wgmma_rs's, at 2, 4 and 8 bits, and qmm_wgmma_ws's)."""
import dataclasses
import itertools

import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import kernels, quant
from nuvec_tg.kernels import compositions_only
from nuvec_tg.kernels import quant as qmv
from quant_reference import dequantized
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, random, values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
WARPGROUPS = gpu is not None and kernels.target(gpu).warpgroups
FORMATS = [("affine", 32, b) for b in (1, 2, 3, 4, 5, 6, 8)] + [("affine", 64, 4), ("affine", 128, 8), ("mxfp4", 32, 4),
                                                                 ("mxfp8", 32, 8), ("nvfp4", 16, 4)]


def bits_of(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def assert_matches(name: str, product, kernel: str, want: np.ndarray) -> Tensor:
    """`product()` launches the program named `kernel...` and is within the kernels' tolerance of
    the float64 `want` and within the composition's of the composition (which launches nothing),
    row by row. Returns the kernel's result."""
    with expect_launches(gpu, kernel):
        got = product().realize()
    with expect_launches(gpu, None), compositions_only():
        composed = product().realize()
    assert_rows_close(f"{name} vs numpy", values(got), want, KERNEL_TOLERANCE[got.dtype])
    assert_rows_close(f"{name} vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[got.dtype])
    return got


def assert_gradients_equal_the_composition(product, upstream: Tensor, targets: list, kernel: str):
    """The gradients of `sum(product() * upstream)` in x, the scales and the biases (`targets`)
    through the kernels (the one named `kernel...` must run forward; the backward is the
    composition's) equal the composition's."""
    with expect_launches(gpu, kernel):
        grads = [g.realize() for g in (product() * upstream).sum().gradient(*targets)]
    with expect_launches(gpu, None), compositions_only():
        composed = [g.realize() for g in (product() * upstream).sum().gradient(*targets)]
    for name, got, want in zip(("x", "scales", "biases"), grads, composed):
        assert_rows_close(f"d{name}", values(got), values(want), COMPOSITION_TOLERANCE[upstream.dtype])


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
    """Each row count's product against numpy and the composition, each row's bits a one-row
    product's, or where the rows run qmv_mma (`takes_qmv_mma`: 2-8 rows of 16-bit x on CUDA) the
    bits of that row in the fewest rows qmv_mma takes (`[row] * QMV_MMA_MIN_ROWS`)."""
    w = random(rng, (n, k), dtype, gpu)[0]
    qw = quant.quantize(w, group, width, mode=mode)
    dense = dequantized(qw)
    for rows in row_counts:
        x, xv = random(rng, (rows, k), dtype, gpu)
        x = x.realize()
        mma = qmv.takes_qmv_mma(dtype, qw.scales.dtype, dtype, rows, k, n, kernels.target(gpu))
        kernel = "nuvec_qmv_mma" if mma else "nuvec_qmv"
        y = assert_matches(f"{mode} {width}-bit {rows} rows", lambda: quant.quantized_matmul(x, qw), kernel, xv @ dense.T)
        for row in range(rows):
            with expect_launches(gpu, kernel):
                if mma:
                    fewest = x[row:row + 1].expand(qmv.QMV_MMA_MIN_ROWS, k).contiguous()
                    alone = bits_of(quant.quantized_matmul(fewest, qw))[:1]
                else: alone = bits_of(quant.quantized_matmul(x[row:row + 1].contiguous(), qw))
            np.testing.assert_array_equal(alone, bits_of(y)[row:row + 1], err_msg=f"{mode} {width} row {row}")


CUDA = gpu is not None and kernels.target(gpu).backend == "cuda"


@pytest.mark.skipif(not CUDA, reason="qmv_mma is a CUDA kernel")
@pytest.mark.parametrize("mode, group, width", FORMATS, ids=lambda f: str(f))
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_qmv_mma_matches_numpy_and_keeps_each_rows_bits_over_2_to_8_rows(mode, group, width, dtype):
    """The matrix-unit qmv: N = 37 (the last tile moved back), K of 3.5 units (nvfp4: a half chunk
    at the end; groups of 128: 5 units) split over 2 SIMD groups; 2-8 rows within tolerance of numpy
    over the weights rounded to x's type, a row's bits the same in every row count and unroll (and
    a one-row launch of the kernel); the public call launches it once routed (`QMV_MMA_ROUTED`)."""
    rng = np.random.default_rng(0x9C1)
    n, k = 37, 3 * 128 + (48 if mode == "nvfp4" else 64 if group < 128 else 256)
    qw = quant.quantize(random(rng, (n, k), dtype, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (8, k), dtype, gpu)
    x = x.realize()
    want = xv @ dequantized(qw).T
    common = dict(mode=mode, group_size=group, bits=width, out_dtype=dtype, backend="cuda")

    def product(rows: int, plan: qmv.QmvMmaPlan) -> Tensor:
        with expect_launches(gpu, "nuvec_qmv_mma"):
            return qmv.qmv_mma(x[:rows].contiguous(), qw.weight, qw.scales, qw.biases, mma_plan=plan, **common).realize()
    eight = product(8, qmv.QmvMmaPlan(2, 2))
    assert_rows_close(f"{mode} {width}-bit 8 rows", values(eight), want, KERNEL_TOLERANCE[dtype])
    for rows, plan in ((1, qmv.QmvMmaPlan(2, 2)), (2, qmv.QmvMmaPlan(2, 1)), (3, qmv.QmvMmaPlan(2, 4)), (5, qmv.QmvMmaPlan(2, 2))):
        np.testing.assert_array_equal(bits_of(product(rows, plan)), bits_of(eight)[:rows], err_msg=f"{rows} rows, {plan}")
    if qmv.QMV_MMA_ROUTED and width == 4:
        with expect_launches(gpu, "nuvec_qmv_mma"):
            routed = quant.quantized_matmul(x[:4].contiguous(), qw).realize()
        assert_rows_close("routed", values(routed), want[:4], KERNEL_TOLERANCE[dtype])


@pytest.mark.skipif(not CUDA, reason="qmv_mma is a CUDA kernel")
@pytest.mark.parametrize("k, n", [(4096, 4096), (12288, 4096 + 16)], ids=str)
def test_qmv_mma_default_plans_at_model_shapes(k, n):
    """The plan's K split and unroll at a model's shapes (and N past a tile), 8 rows of bfloat16,
    against numpy; every probed unroll at the plan's split gives the same bits; the general decoding
    (without PAIRS) agrees."""
    rng = np.random.default_rng(0x9C2)
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu, 0.05)[0], 64, 4)
    x, xv = random(rng, (8, k), dtypes.bfloat16, gpu)
    x = x.realize()
    plan = qmv.qmv_mma_plan(k, n)
    common = dict(mode="affine", group_size=64, bits=4, out_dtype=dtypes.bfloat16, backend="cuda")
    y = qmv.qmv_mma(x, qw.weight, qw.scales, qw.biases, **common).realize()
    assert_rows_close(f"{plan}", values(y), xv @ dequantized(qw).T, KERNEL_TOLERANCE[dtypes.bfloat16])
    for other_plan in (p for p in qmv.QMV_MMA_PLANS if p.k_split == plan.k_split):
        other = qmv.qmv_mma(x, qw.weight, qw.scales, qw.biases, mma_plan=other_plan, **common)
        np.testing.assert_array_equal(bits_of(other.realize()), bits_of(y), err_msg=f"{other_plan}")
    general = qmv.qmv_mma(x, qw.weight, qw.scales, qw.biases, pairs=False, **common).realize()
    assert_rows_close("without PAIRS", values(general), values(y), KERNEL_TOLERANCE[dtypes.bfloat16])


def test_qmv_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9A8)
    qw = quant.quantize(random(rng, (16, 128), dtypes.float32, gpu)[0], 32, 4)
    x = random(rng, (2, 128), dtypes.float32, gpu)[0].realize()
    upstream = random(rng, (2, 16), dtypes.float32, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmv")


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("affine", 32, 3), ("mxfp4", 32, 4)], ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=lambda d: d.name)
def test_swiglu_matmul_runs_qmv_with_the_activation_in_its_loads(mode, group, width, dtype):
    """A gated MLP's down projection after its activation: qmv reading gate and up, against float64
    numpy of the activation rounded as the composition rounds it, and the composition; rows'
    bits a one-row call's; gradients through the composition."""
    rng = np.random.default_rng(0x5916)
    n, k = 13, 2 * 1024 + 3 * 64
    qw = quant.quantize(random(rng, (n, k), dtype, gpu)[0], group, width, mode=mode)
    dense = dequantized(qw)
    for rows in (1, 5):
        gate_up = (random(rng, (rows, 2 * k), dtype, gpu)[0] * 3).cast(dtype).realize()
        activated = values(gate_up[:, :k].silu() * gate_up[:, k:])  # in the dtype, as the composition and the kernel round it
        y = assert_matches(f"swiglu {mode} {rows} rows", lambda: quant.swiglu_matmul(gate_up, qw), "nuvec_qmv",
                           activated @ dense.T)
        for row in range(rows):
            with expect_launches(gpu, "nuvec_qmv"):
                alone = bits_of(quant.swiglu_matmul(gate_up[row:row + 1].contiguous(), qw))
            np.testing.assert_array_equal(alone, bits_of(y)[row:row + 1], err_msg=f"swiglu row {row}")
    upstream = random(rng, (5, n), dtype, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.swiglu_matmul(gate_up, qw), upstream, [gate_up], "nuvec_qmv")


def test_empty_products_take_the_composition():
    """No rows of x, or no columns of w: nothing to launch (an empty grid), the composition's empty result."""
    qw = quant.quantize(Tensor.zeros(8, 64, device=gpu), 32, 4)
    none = quant.quantize(Tensor.zeros(0, 64, device=gpu), 32, 4)
    with expect_launches(gpu, None):
        assert quant.quantized_matmul(Tensor.zeros(0, 64, device=gpu), qw).numpy().shape == (0, 8)
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
    x, xv = random(rng, (5, k), dtype, gpu)
    x = x.realize()
    y = assert_matches(f"{mode} {width}-bit", lambda: quant.quantized_matmul(x, qw, transpose=False), "nuvec_qvm",
                       xv @ dequantized(qw))
    for row in range(5):
        with expect_launches(gpu, "nuvec_qvm"):
            alone = bits_of(quant.quantized_matmul(x[row:row + 1].clone(), qw, transpose=False))
        np.testing.assert_array_equal(alone, bits_of(y[row:row + 1].clone()), err_msg=f"row {row}")


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
    x, xv = random(rng, (3, rows, k), dtype, gpu)
    x = x.realize()
    lhs_picks, rhs_picks = [0, 0, 1, 2, 2, 1], [0, 1, 1, 3, -2, 4]                # sorted by expert, then two hostile
    lhs, rhs = (Tensor(p, dtype=dtypes.int32, device=gpu) for p in (lhs_picks, rhs_picks))
    dense = dequantized(qw)
    want = np.stack([xv[i] @ dense[e].T if 0 <= e < experts else np.zeros((rows, n)) for i, e in zip(lhs_picks, rhs_picks)])
    y = assert_matches(f"{mode} {width}-bit", lambda: quant.gather_qmm(x, qw, lhs, rhs, sorted_indices=True), "nuvec_qmv", want)
    assert not values(y)[4:].any()                                        # experts -2 and 4 do not exist
    for entry, (item, expert) in enumerate(zip(lhs_picks[:4], rhs_picks[:4])):
        one = quant.QuantizedWeight(*(None if t is None else t[expert].clone() for t in (qw.weight, qw.scales, qw.biases)),
                                    mode, group, width)
        for row in range(rows):
            with expect_launches(gpu, "nuvec_qmv"):
                alone = bits_of(quant.quantized_matmul(x[item, row:row + 1].clone(), one))
            np.testing.assert_array_equal(alone, bits_of(y[entry, row:row + 1].clone()), err_msg=f"{entry} {row}")


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
    x, xv = random(rng, (2, 50, k), dtype, gpu)
    x = x.realize()
    y = assert_matches(f"{mode} {width}-bit", lambda: quant.quantized_matmul(x, qw), "nuvec_qmm", xv @ dequantized(qw).T)
    assert y.shape == (2, 50, n)


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("mxfp4", 32, 4), ("affine", 32, 3)], ids=str)
def test_qmm_rows_keep_their_bits_in_every_row_count(mode, group, width):
    """A row's bits never depend on the row count that picks the kernel: the last rows of M = 9
    (qmm's boundary), 13, 100 and 257 equal those rows of the DEQUANTIZED_ROWS + 8 row product bit
    for bit (on Hopper, N past DEQUANTIZED_NARROW_N: the few rows' qmm_wgmma_rs up to 64 rows (their
    split 1 here), then qmm_wgmma_rs in affine 4-bit or qmm_wgmma, the dequantized route at the most),
    each within tolerance of numpy."""
    rng = np.random.default_rng(0x9C3)
    n, k, most = qmv.DEQUANTIZED_NARROW_N + 300, 1152, qmv.DEQUANTIZED_ROWS + 8
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (most, k), dtypes.bfloat16, gpu)
    x = x.realize()
    want = xv @ dequantized(qw).T
    with expect_launches(gpu, "nuvec_"):
        full = quant.quantized_matmul(x, qw).realize()
    assert_rows_close("all rows", values(full), want, KERNEL_TOLERANCE[dtypes.bfloat16])
    for rows in (9, 13, 100, 257):
        with expect_launches(gpu, "nuvec_qmm"):
            part = quant.quantized_matmul(x[most - rows:].contiguous(), qw).realize()
        np.testing.assert_array_equal(bits_of(part), bits_of(full)[most - rows:], err_msg=f"M {rows}")


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("mxfp4", 32, 4), ("affine", 128, 8), ("affine", 32, 2)], ids=str)
def test_few_rows_split_k_and_keep_each_rows_bits_over_9_to_64_rows(mode, group, width):
    """9 to 64 rows on Hopper (`few_rows_tiles`: qmm_wgmma_rs with x's rows in 16, 32 or 64 and K
    in 4 parts at K 4096 N 1000, the split K and N's): the 64-row product within tolerance of
    numpy and the composition, and with the parts added the other way (`cluster_sum`) bit for bit
    the same; the last rows of 9, 16, 17 and 33 (each width of x's rows) equal
    those rows of it bit for bit; gradients (affine) are the composition's."""
    rng = np.random.default_rng(0x9C4)
    n, k, most = 1000, 4096, qmv.FEW_ROWS
    assert qmv.few_rows_split(k, n) == 4
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (most, k), dtypes.bfloat16, gpu)
    x = x.realize()
    full = assert_matches(f"{mode} {width}-bit", lambda: quant.quantized_matmul(x, qw), "nuvec_qmm_wgmma_rs", xv @ dequantized(qw).T)
    # the parts added the other way (in the cluster, or by the second kernel): the same bits
    planned = qmv.few_rows_tiles(most, k, n)
    other = dataclasses.replace(planned, cluster_sum=not planned.cluster_sum)
    with expect_launches(gpu, "nuvec_qmm_wgmma_rs"):
        y = qmv.qmm(x, qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=width, out_dtype=x.dtype, backend="cuda",
                    tiles=other).realize()
    np.testing.assert_array_equal(bits_of(y), bits_of(full), err_msg=str(other))
    for rows in (9, 16, 17, 33):
        with expect_launches(gpu, "nuvec_qmm_wgmma_rs"):
            part = quant.quantized_matmul(x[most - rows:].contiguous(), qw).realize()
        np.testing.assert_array_equal(bits_of(part), bits_of(full)[most - rows:], err_msg=f"M {rows}")
    if mode == "affine":
        upstream = random(rng, (most, n), dtypes.bfloat16, gpu)[0].realize()
        assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                               "nuvec_qmm_wgmma_rs")


def test_qmm_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9B7)
    qw = quant.quantize(random(rng, (96, 256), dtypes.bfloat16, gpu)[0], 64, 4)
    x = random(rng, (40, 256), dtypes.bfloat16, gpu)[0].realize()
    upstream = random(rng, (40, 96), dtypes.bfloat16, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmm")


@pytest.mark.parametrize("rows, kernel", [(1, "nuvec_qmv"), (5, "nuvec_qmv"), (40, "nuvec_qmm")], ids=str)
def test_batched_weights_run_the_gathered_kernels(rows, kernel):
    """quantized_matmul over weights with batch axes (x's batches broadcast against them) runs
    gather_qmm's kernels: up to 8 rows a batch gather_qmv (each row with the bits of its batch's
    one-row product), more the gathered qmm (each batch's rows with the bits of its batch's own
    product), one launch over every batch."""
    rng = np.random.default_rng(0x9BF)
    batches, n, k = 3, 96, 256
    qw = quant.quantize(random(rng, (batches, 1, n, k), dtypes.bfloat16, gpu)[0], 64, 4)
    x, xv = random(rng, (2, rows, k), dtypes.bfloat16, gpu)
    x = x.realize()
    dense = dequantized(qw)
    want = np.einsum("bmk,enk->ebmn", xv, dense[:, 0])
    y = assert_matches(f"{rows} rows", lambda: quant.quantized_matmul(x, qw), kernel, want)
    assert y.shape == (batches, 2, rows, n)
    for batch, item in itertools.product(range(batches), range(2)):
        one = quant.QuantizedWeight(*(t[batch, 0].clone() for t in (qw.weight, qw.scales, qw.biases)), "affine", 64, 4)
        for part in ([slice(r, r + 1) for r in range(rows)] if rows <= qmv.MAX_ROWS else [slice(0, rows)]):
            alone = bits_of(quant.quantized_matmul(x[item, part].clone(), one))
            np.testing.assert_array_equal(alone, bits_of(y[batch, item, part].clone()), err_msg=f"{batch} {item} {part}")


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("mxfp4", 32, 4)], ids=str)
def test_many_rows_of_untransposed_weights_dequantize_then_run_gemm_wgmma(mode, group, width):
    """`x · w` for untransposed w [K, N] past qvm's 8 rows on Hopper: the dense rows dequantized,
    then gemm_wgmma over their transpose, within tolerance of numpy and the composition."""
    rng = np.random.default_rng(0x9C2)
    k, n, rows = 320, 192, 40
    qw = quant.quantize(random(rng, (k, n), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (rows, k), dtypes.bfloat16, gpu)
    x = x.realize()
    with expect_launches(gpu, "nuvec_dequantize"):
        assert_matches(f"{mode} untransposed", lambda: quant.quantized_matmul(x, qw, transpose=False), "nuvec_gemm_wgmma",
                       xv @ dequantized(qw))


@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("mxfp4", 32, 4), ("nvfp4", 16, 4)], ids=str)
def test_sorted_many_row_gathers_run_the_gathered_qmm(mode, group, width):
    """A mixture-of-experts prefill: 300 single-row entries sorted by expert over 4 experts (more
    than 8 a batch: the gathered qmm), against the composition, with hostile expert indices."""
    rng = np.random.default_rng(0x9B9)
    experts, n, k, entries = 4, 96, 256 + (16 if mode == "nvfp4" else 0), 300
    qw = quant.quantize(random(rng, (experts, n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (entries, 1, k), dtypes.bfloat16, gpu)
    x = x.realize()
    picks = np.sort(rng.integers(0, experts, entries)).astype(np.int32)
    picks[-3:] = experts + 5
    rhs = Tensor(picks, device=gpu)
    dense = dequantized(qw)
    want = np.stack([xv[i] @ dense[e].T if e < experts else np.zeros((1, n)) for i, e in enumerate(picks)])
    y = assert_matches(f"{mode} gathered", lambda: quant.gather_qmm(x, qw, None, rhs, sorted_indices=True), "nuvec_qmm", want)
    assert y.shape == (entries, 1, n)
    assert not values(y)[-3:].any()



@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("mode, group, width", FORMATS, ids=lambda f: str(f))
def test_qmm_wgmma_matches_the_composition_in_every_tile_shape(mode, group, width):
    """qmm's Hopper kernel (K a multiple of 64 on sm_90: `qmm_hopper_tiles`' plan) at M = 130 (past a
    128-row tile), N = 300 past DEQUANTIZED_NARROW_N (past a 256-column tile; at a smaller N 130
    rows take the dequantized route), K = 1152 (a multiple of every group): the public call
    launches the planned kernel; every tile shape of the three kernels (qmm_wgmma_rs at 2, 4 and 8
    bits) that fits is within tolerance of numpy and, bit for bit, the plan's."""
    rng = np.random.default_rng(0x9BA)
    n, k = qmv.DEQUANTIZED_NARROW_N + 300, 1152
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (130, k), dtypes.bfloat16, gpu)
    x = x.realize()
    want = xv @ dequantized(qw).T
    planned = bits_of(assert_matches(f"{mode} {width}-bit", lambda: quant.quantized_matmul(x, qw),
                                     qmv.qmm_hopper_family(130, n, width, kernels.target(gpu).multiprocessors, mode=mode, k=k), want))
    for tiles in qmv.QMM_WGMMA_SHAPES + qmv.QMM_WGMMA_WS_SHAPES + (qmv.QMM_WGMMA_RS_SHAPES if width in qmv.QMM_WGMMA_RS_BITS else ()):
        family, needed = {qmv.RegisterTiles: ("nuvec_qmm_wgmma_rs", qmv.qmm_wgmma_rs_bytes),
                          qmv.ProducerTiles: ("nuvec_qmm_wgmma_ws", qmv.qmm_wgmma_ws_bytes),
                          qmv.WgmmaTiles: ("nuvec_qmm_wgmma", qmv.qmm_wgmma_bytes)}[type(tiles)]
        if needed(tiles, width) > qmv.WGMMA_MAX_DYNAMIC: continue
        with expect_launches(gpu, family):
            y = qmv.qmm(x, qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=width, out_dtype=dtypes.bfloat16,
                        backend="cuda", tiles=tiles).realize()
        assert_rows_close(f"{tiles}", values(y), want, KERNEL_TOLERANCE[dtypes.bfloat16])
        np.testing.assert_array_equal(bits_of(y), planned, err_msg=str(tiles))


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("mode, group, width, unsorted", [("affine", 64, 4, True), ("affine", 64, 4, False), ("mxfp4", 32, 4, False),
                                                     ("affine", 32, 3, True), ("mxfp8", 32, 8, False)], ids=str)
def test_qmm_wgmma_gathers_each_rows_batch(mode, group, width, unsorted):
    """The gathered qmm_wgmma (a mixture of experts' prefill): sorted runs longer than a row tile,
    hostile picks at both ends giving zeros, and (`unsorted`) an unsorted stretch (more runs than
    the tile table's slots: fixed tiles; sorted, each run's own); at 4 and 8 bits qmm_wgmma_rs's
    gathered tiles give the same bits, and at every width qmm_wgmma_ws's."""
    rng = np.random.default_rng(0x9BB)
    experts, n, k, entries = 4, 200, 512, 300
    qw = quant.quantize(random(rng, (experts, n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (entries, 1, k), dtypes.bfloat16, gpu)
    x = x.realize()
    picks = np.sort(rng.integers(0, experts, entries)).astype(np.int32)
    picks[:2], picks[-3:] = -1, experts + 5
    if unsorted: picks[150:160] = rng.integers(0, experts, 10)
    dense = dequantized(qw)
    want = np.stack([xv[i] @ dense[e].T if 0 <= e < experts else np.zeros((1, n)) for i, e in enumerate(picks)])
    y = assert_matches(f"{mode} gathered", lambda: quant.gather_qmm(x, qw, None, Tensor(picks, device=gpu), sorted_indices=True),
                       "nuvec_qmm_wgmma", want)
    assert not values(y)[:2].any() and not values(y)[-3:].any()
    if width in qmv.QMM_WGMMA_RS_BITS:  # the register kernel's gathered tiles, the same bits
        with expect_launches(gpu, "nuvec_qmm_wgmma_rs"):
            rs = qmv.qmm(x.reshape(entries, k), qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=width,
                         out_dtype=dtypes.bfloat16, backend="cuda", picks=Tensor(picks, device=gpu),
                         tiles=qmv.QMM_WGMMA_RS_SMALL).realize()
        np.testing.assert_array_equal(bits_of(rs), bits_of(y).reshape(entries, n))
    with expect_launches(gpu, "nuvec_qmm_wgmma_ws"):  # the warp-specialised kernel's gathered tiles, the same bits
        ws = qmv.qmm(x.reshape(entries, k), qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=width,
                     out_dtype=dtypes.bfloat16, backend="cuda", picks=Tensor(picks, device=gpu), tiles=qmv.ProducerTiles(2, 128, 4)).realize()
    np.testing.assert_array_equal(bits_of(ws), bits_of(y).reshape(entries, n))


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
def test_qmm_wgmma_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9BC)
    qw = quant.quantize(random(rng, (96, 256), dtypes.bfloat16, gpu)[0], 64, 4)
    x = random(rng, (40, 256), dtypes.bfloat16, gpu)[0].realize()
    upstream = random(rng, (40, 96), dtypes.bfloat16, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_qmm_wgmma")


@pytest.mark.parametrize("mode, group, width", FORMATS, ids=lambda f: str(f))
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=lambda d: d.name)
def test_dequantize_runs_its_kernel(mode, group, width, dtype):
    """`quant.dequantize` into the scales' dtype (the floating-point modes: into `dtype`): batched
    weights, K not a multiple of 64 (nvfp4: a half chunk), each weight within one rounding of
    numpy's and within the composition's tolerance of the composition."""
    rng = np.random.default_rng(0x9BD)
    k = 256 + (16 if mode == "nvfp4" else group)
    qw = quant.quantize(random(rng, (3, 40, k), dtype, gpu)[0], group, width, mode=mode)
    with expect_launches(gpu, "nuvec_dequantize"):
        got = quant.dequantize(qw, dtype).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = quant.dequantize(qw, dtype).realize()
    want = dequantized(qw)
    assert got.shape == (3, 40, k) and got.dtype == dtype
    np.testing.assert_array_less(np.abs(values(got) - want), (2.0**-7 if dtype == dtypes.bfloat16 else 2.0**-23) * np.abs(want) + 1e-30)
    assert_rows_close("vs composition", values(got).reshape(-1, k), values(composed).reshape(-1, k), COMPOSITION_TOLERANCE[dtype])


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("mode, group, width", [("affine", 64, 4), ("affine", 32, 3), ("affine", 128, 8), ("mxfp4", 32, 4),
                                                ("nvfp4", 16, 4)], ids=str)
def test_many_rows_dequantize_then_run_gemm_wgmma_with_qmm_wgmmas_bits(mode, group, width):
    """From DEQUANTIZED_ROWS rows on Hopper the product dequantizes w, then runs gemm_wgmma: within
    tolerance of numpy and the composition, and bit for bit the product of the same rows by qmm's
    own plan (qmm_wgmma_rs there for affine 4-bit; the route may follow the row count), here at M = DEQUANTIZED_ROWS + 8 (past the threshold
    and a 128-row tile), N = 300, K = 1152."""
    rng = np.random.default_rng(0x9BE)
    n, k, rows = 300, 1152, qmv.DEQUANTIZED_ROWS + 8
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu)[0], group, width, mode=mode)
    x, xv = random(rng, (rows, k), dtypes.bfloat16, gpu)
    x = x.realize()
    with expect_launches(gpu, "nuvec_dequantize"):
        routed = assert_matches(f"{mode} {width}-bit", lambda: quant.quantized_matmul(x, qw), "nuvec_gemm_wgmma",
                                xv @ dequantized(qw).T)
    with expect_launches(gpu, qmv.qmm_hopper_family(rows, n, width, kernels.target(gpu).multiprocessors, mode=mode, k=k)):
        tiled = qmv.qmm(x, qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=width, out_dtype=dtypes.bfloat16,
                        backend="cuda").realize()
    np.testing.assert_array_equal(bits_of(routed), bits_of(tiled))


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("n", [1000, 2000])
def test_a_prefill_chunk_runs_qmm_wgmma_rs_with_the_routes_bits(n):
    """Affine 4-bit: DEQUANTIZED_RS_ROWS - 1 rows (a prefill chunk's 512) run qmm_wgmma_rs by its
    plan, a row more the dequantized route; the chunk's rows equal those rows of the route's product
    bit for bit, within tolerance of numpy (N = 1000 and 2000 about DEQUANTIZED_NARROW_N's side of
    the old rule, K = 1152)."""
    rng = np.random.default_rng(0x9C6)
    k, rows = 1152, qmv.DEQUANTIZED_RS_ROWS - 1
    qw = quant.quantize(random(rng, (n, k), dtypes.bfloat16, gpu)[0], 64, 4)
    x, xv = random(rng, (rows + 1, k), dtypes.bfloat16, gpu)
    x = x.realize()
    with expect_launches(gpu, "nuvec_dequantize"):
        more = assert_matches("a row more", lambda: quant.quantized_matmul(x, qw), "nuvec_gemm_wgmma", xv @ dequantized(qw).T)
    with expect_launches(gpu, "nuvec_qmm_wgmma_rs"):
        chunk = quant.quantized_matmul(x[1:].contiguous(), qw).realize()
    np.testing.assert_array_equal(bits_of(chunk), bits_of(more)[1:])


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
def test_the_dequantized_routes_gradients_equal_the_compositions():
    rng = np.random.default_rng(0x9BF)
    rows = qmv.DEQUANTIZED_RS_ROWS  # fewer rows of affine 4-bit run qmm_wgmma_rs
    qw = quant.quantize(random(rng, (96, 256), dtypes.bfloat16, gpu)[0], 64, 4)
    x = random(rng, (rows, 256), dtypes.bfloat16, gpu)[0].realize()
    upstream = random(rng, (rows, 96), dtypes.bfloat16, gpu)[0].realize()
    assert_gradients_equal_the_composition(lambda: quant.quantized_matmul(x, qw), upstream, [x, qw.scales, qw.biases],
                                           "nuvec_gemm_wgmma")
