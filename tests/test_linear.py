"""`fast.linear` on every device (the CPU's composition; on a GPU the kernels, checked against the
same references): `x · wᵀ + bias` against float64 numpy for every dtype and MLX's promotion of
mixed ones, leading axes and a 1-D x, the bias added before the one rounding, float64, empty
products, gradients in x, w and bias against numpy's, and NUVEC_DEBUG's account of the route."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast, kernels
from reference import TOLERANCE, assert_close, expect_launches, gradients, random, round_to, values

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64


# (x, w, bias, result): each dtype alone, and promotions (float16 with bfloat16 is float32).
DTYPES = [(F32, F32, F32, F32), (F16, F16, None, F16), (BF16, BF16, BF16, BF16), (F16, BF16, None, F32),
          (BF16, F32, BF16, F32), (F16, F16, F32, F32)]


@pytest.mark.parametrize("x_dtype, w_dtype, bias_dtype, out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_shape", [(3,), (1, 40), (2, 5, 40), (13, 40)], ids=str)
def test_linear_matches_numpy(device, x_dtype, w_dtype, bias_dtype, out_dtype, x_shape):
    rng = np.random.default_rng(0x1E)
    k = x_shape[-1] if len(x_shape) > 1 else 3
    x, xv = random(rng, x_shape[:-1] + (k,), x_dtype, device)
    w, wv = random(rng, (24, k), w_dtype, device)
    b, bv = random(rng, (24,), bias_dtype, device) if bias_dtype else (None, 0.0)
    y = fast.linear(x, w, b)
    assert y.dtype == out_dtype and y.shape == x.shape[:-1] + (24,)
    # the products accumulated in float32 and rounded once: within the dtype's tolerance of the exact result
    assert_close("linear", values(y), xv @ wv.T + bv, TOLERANCE[out_dtype] if out_dtype != F32 else 1e-5)


def test_the_bias_is_added_before_the_one_rounding(device):
    """1 + 2^-8 (a tie between bfloat16 neighbours) plus 2^-9: rounded once it is 1 + 2^-7; rounding
    the product first (to 1, the even neighbour) and adding the bias would give 1."""
    x = Tensor([[1.0, 2.0 ** -8]], device=device).cast(BF16)
    w = Tensor([[1.0, 1.0]], device=device).cast(BF16)
    b = Tensor([2.0 ** -9], device=device).cast(BF16)
    assert values(fast.linear(x, w, b))[0, 0] == 1 + 2.0 ** -7


@pytest.mark.float64
def test_float64_stays_float64(device):
    rng = np.random.default_rng(0x1F)
    x, xv = random(rng, (4, 33), F64, device)
    w, wv = random(rng, (7, 33), F32, device)
    y = fast.linear(x, w, Tensor(np.arange(7.0), device=device))
    assert y.dtype == F64
    np.testing.assert_allclose(y.numpy(), xv @ wv.T + np.arange(7.0), rtol=1e-12, atol=1e-12)


def test_empty_products(device):
    assert fast.linear(Tensor.zeros(0, 8, device=device), Tensor.ones(5, 8, device=device)).numpy().shape == (0, 5)
    assert fast.linear(Tensor.ones(2, 8, device=device), Tensor.ones(0, 8, device=device)).numpy().shape == (2, 0)
    y = fast.linear(Tensor.ones(2, 0, device=device), Tensor.ones(3, 0, device=device), Tensor.ones(3, device=device))
    np.testing.assert_array_equal(y.numpy(), np.ones((2, 3)))


@pytest.mark.parametrize("rows", [2, 12], ids=lambda r: f"M{r}")
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_gradients_reach_x_w_and_bias(device, rows, dtype):
    """d sum(y * g): g · w for x, gᵀ · x for w, the column sums of g for the bias (bfloat16: within
    its tolerance of numpy's, from the bfloat16 inputs' exact values)."""
    rng = np.random.default_rng(0x20 + rows)
    x, xv = random(rng, (rows, 16), dtype, device)
    w, wv = random(rng, (8, 16), dtype, device)
    b, _ = random(rng, (8,), dtype, device)
    g, gv = random(rng, (rows, 8), F32, device)
    dx, dw, db = gradients(fast.linear(x, w, b), g, [x, w, b])
    tolerance = 1e-5 if dtype == F32 else TOLERANCE[dtype]
    for name, got, want in (("dx", dx, gv @ wv), ("dw", dw, gv.T @ xv), ("db", db, gv.sum(0))):
        assert_close(name, got, round_to(want, dtype), tolerance)


def test_debug_says_which_program_runs(device, monkeypatch, capsys):
    monkeypatch.setenv("NUVEC_DEBUG", "1")
    fast.linear(Tensor.ones(2, 64, device=device), Tensor.ones(32, 64, device=device))
    fast.linear(Tensor.ones(20, 64, device=device, dtype=F16), Tensor.ones(32, 64, device=device, dtype=F16))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nuvec_tg: linear")]
    assert len(lines) == 2 and all(f"on {device}" in line for line in lines)
    if device == "CPU":
        assert all(line.endswith("composition (CPU has no kernels)") for line in lines)
    else:
        # GPUs with warpgroup products (Hopper) run the 16-bit rows on the wgmma kernel
        gemm = "gemm_wgmma" if kernels.target(device).warpgroups else "gemm"
        assert lines[0].endswith("the gemv kernel") and lines[1].endswith(f"the {gemm} kernel")


@pytest.mark.parametrize("rows", [1, 5, 9], ids=lambda r: f"M{r}")
def test_swiglu_matmul_of_a_dense_weight_is_the_product_of_the_activation(device, rows):
    """A gated MLP's down projection with a dense weight: up to 8 rows gemv with the activation in
    its loads (on a GPU), more the product of the activation; against float64 numpy of the
    activation as the composition rounds it."""
    from nuvec_tg import quant
    rng = np.random.default_rng(0x5918)
    k, n = 264, 24
    gate_up = Tensor(rng.uniform(-3, 3, (rows, 2 * k)), device=device).cast(dtypes.bfloat16).realize()
    w = Tensor(rng.uniform(-1, 1, (n, k)), device=device).cast(dtypes.bfloat16).realize()
    activated = values(gate_up[:, :k].silu() * gate_up[:, k:])
    with expect_launches(device, "nuvec_gemv" if rows <= 8 else "nuvec_gemm"):
        got = quant.swiglu_matmul(gate_up, w).realize()
    assert got.shape == (rows, n) and got.dtype == dtypes.bfloat16
    assert_close("swiglu", values(got), round_to(activated @ values(w).T, dtypes.bfloat16), 2 * TOLERANCE[dtypes.bfloat16])
