"""The matrix-unit qmv (`src/qmv_mma.h`) run on the CPU (`kernel_emulator`): against numpy float64
over the weights rounded as the kernel's contract says (each decoded weight scaled in float32, then
rounded to x's type), for every affine width and floating-point mode; tiles moved back at N, K that
ends inside a unit (nvfp4: in a half chunk), K split across SIMD groups with units left over; each
row's bits the same whatever rows share the launch; 4-bit affine codes with scales of x's type
decoded two at a time (PAIRS) and by the general path."""
import numpy as np
import pytest
from tinygrad import dtypes

from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import quant as qmv
from nuvec_tg.kernels import Target
from quant_reference import dequantized
from reference import assert_rows_close, random, round_to
from test_qmv_emulated import as_float, quantized, raw

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
# Relative to a row's largest |want|: float32 results carry only the float32 sums' error; 16-bit
# results their rounding (half an ulp) besides.
TOL = {dtypes.float32: 2e-6, dtypes.float16: 1e-3, dtypes.bfloat16: 4e-3}


def emulated_qmv_mma(x: np.ndarray, qw, x_dtype, out_dtype, plan: qmv.QmvMmaPlan, pairs: bool | None = None) -> np.ndarray:
    """y's raw values from the emulated kernel for raw x `[M, K]` in `x_dtype` (`pairs`: its decoding)."""
    rows, k = x.shape
    n = qw.weight.shape[0]
    program = qmv.qmv_mma_program(x_dtype, qw.scales.dtype, out_dtype, mode=qw.mode, group_size=qw.group_size, bits=qw.bits,
                                  rows=rows, k=k, n=n, mma_plan=plan, pairs=pairs)
    y = np.full((rows, n), 7, dtype=np.float32 if out_dtype == dtypes.float32 else np.uint16)  # not zeros: all written
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    build(program)(buffers, plan.groups(n), plan.threads)
    return y


def reference(x_values: np.ndarray, qw, x_dtype) -> np.ndarray:
    """x · wᵀ in float64 over the kernel's weights: float64 dequantized, rounded to float32 (the
    kernel's fma), then to x's type."""
    return x_values @ round_to(round_to(dequantized(qw), dtypes.float32), x_dtype).T


CASES = [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 4, dtypes.float16), ("affine", 128, 8, dtypes.float16),
         ("affine", 32, 3, dtypes.bfloat16), ("affine", 32, 2, dtypes.float16), ("affine", 64, 6, dtypes.bfloat16),
         ("affine", 32, 1, dtypes.bfloat16), ("mxfp4", 32, 4, dtypes.bfloat16), ("mxfp8", 32, 8, dtypes.float16),
         ("nvfp4", 16, 4, dtypes.bfloat16)]


@pytest.mark.parametrize("mode, group, bits, dtype", CASES, ids=str)
def test_emulated_qmv_mma_matches_float64_and_keeps_each_rows_bits(mode, group, bits, dtype):
    """N = 37 (three tiles, the last moved back over the second); K = 3 units and a half (nvfp4: and
    a half chunk; groups of 128: 5 units), so the last unit's upper lanes read nothing; K split in 2
    with 2 units a load round, so a SIMD group's last round is partly past K."""
    rng = np.random.default_rng(0x3A1)
    n, k = 37, 3 * 128 + (48 if mode == "nvfp4" else 64 if group < 128 else 256)
    w, _ = random(rng, (n, k), dtype, "CPU")
    qw = quantized(w, mode, group, bits)
    x, x_values = random(rng, (8, k), dtype, "CPU")
    x = raw(x.realize())
    want = reference(x_values, qw, dtype)
    plan = qmv.QmvMmaPlan(2, 2)
    got = {rows: emulated_qmv_mma(x[:rows], qw, dtype, dtypes.float32, plan) for rows in (1, 3, 8)}
    assert_rows_close(f"{plan} float32 y", got[8].astype(np.float64), want, TOL[dtypes.float32])
    for rows in (1, 3):
        np.testing.assert_array_equal(got[rows], got[8][:rows], err_msg=f"{plan}: rows {rows} against 8")
    unsplit = emulated_qmv_mma(x, qw, dtype, dtypes.float32, qmv.QmvMmaPlan(1, 1))  # one SIMD group, no partials
    assert_rows_close("split 1", unsplit.astype(np.float64), want, TOL[dtypes.float32])
    y = emulated_qmv_mma(x[:5], qw, dtype, dtype, qmv.QmvMmaPlan(2, 2))
    assert_rows_close(f"{dtype} y", as_float(y, dtype), want[:5], TOL[dtype])
    if qmv.decodes_pairs(dtype, qw.scales.dtype, mode, bits):  # the general decoding of the same codes
        general = emulated_qmv_mma(x[:3], qw, dtype, dtypes.float32, qmv.QmvMmaPlan(2, 2), pairs=False)
        assert_rows_close("without pairs", general.astype(np.float64), want[:3], TOL[dtypes.float32])


def test_emulated_qmv_mma_with_float32_scales_and_the_default_plan():
    """Scales and biases of another dtype than x (float32: the kernel widens them as they are); the
    default plan's K split over K = 2048 + 128 (17 units) and N = 64."""
    rng = np.random.default_rng(0x3A2)
    n, k = 64, 2048 + 128
    w, _ = random(rng, (n, k), dtypes.float32, "CPU")
    qw = quantized(w, "affine", 64, 4)
    x, x_values = random(rng, (6, k), dtypes.bfloat16, "CPU")
    plan = qmv.qmv_mma_plan(k, n)
    assert plan.k_split > 1
    got = emulated_qmv_mma(raw(x.realize()), qw, dtypes.bfloat16, dtypes.float32, plan)
    assert_rows_close("float32 scales", got.astype(np.float64), reference(x_values, qw, dtypes.bfloat16), TOL[dtypes.float32])


def test_qmv_mma_plan_and_route():
    """The plan depends on K and N only; the route takes QMV_MMA_MIN_ROWS-8 rows of 16-bit x on CUDA
    when routed (fewer rows, float32 x, fewer than 16 outputs and other backends keep qmv)."""
    for k, n in ((4096, 4096), (12288, 4096), (4096, 24576), (4096 + 64, 40)):
        plan = qmv.qmv_mma_plan(k, n)
        units = -(-k // qmv.QMV_MMA_UNIT)
        assert plan.k_split <= min(qmv.QMV_MMA_MAX_SPLIT, units) and plan.k_split & (plan.k_split - 1) == 0
        assert 1 <= plan.unroll <= qmv.QMV_MMA_UNROLL
    bf16, f32 = dtypes.bfloat16, dtypes.float32
    cuda, metal = Target("cuda", multiprocessors=132), Target("metal", "g")

    def route(rows, x=bf16, n=4096, target=cuda):
        return qmv.product_route(x, x, x, rows, 4096, n, bits=4, mode="affine", transpose=True, batched=False, target=target)[0]
    routed = qmv.QMV_MMA_ROUTED
    try:
        qmv.QMV_MMA_ROUTED = True
        low = qmv.QMV_MMA_MIN_ROWS
        assert [route(rows) for rows in (1, low - 1, low, 8, 9)] == ["qmv", "qmv", "qmv_mma", "qmv_mma", "qmm"]
        assert route(4, x=f32) == "qmv" and route(4, n=8) == "qmv" and route(4, target=metal) == "qmv"
        qmv.QMV_MMA_ROUTED = False
        assert route(4) == "qmv"
    finally:
        qmv.QMV_MMA_ROUTED = routed
    assert qmv.qmv_mma_unsupported(bf16, bf16, bf16, 4, 4096, 4096, metal) == "qmv_mma is a CUDA kernel"
    assert "16" in qmv.qmv_mma_unsupported(bf16, bf16, bf16, 4, 4096, 8, cuda)
    assert "float32" in qmv.qmv_mma_unsupported(f32, f32, f32, 4, 4096, 4096, cuda)
