"""MLX's floating-point quantization modes (mxfp4, mxfp8, nvfp4) against MLX's own outputs
(tests/data/mlx_fp.npz, written by scripts/make_mlx_vectors.py with MLX 0.32.4) and numpy float64
products, with the seeds' errors."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import quant

MLX = np.load(__file__.rsplit("/", 1)[0] + "/data/mlx_fp.npz")
DTYPES = {"float32": dtypes.float32, "float16": dtypes.float16, "bfloat16": dtypes.bfloat16}
MODES = ("mxfp4", "mxfp8", "nvfp4", "nvfp4_global")
GLOBAL = 0.37


def weights(dtype_name: str) -> Tensor:
    return Tensor(MLX[f"w_{dtype_name}"], device="CPU").cast(DTYPES[dtype_name])


def global_scale(mode: str):
    return Tensor([GLOBAL], dtype=dtypes.float32, device="CPU").reshape(()) if mode.endswith("global") else None


def bf16_bits(t: Tensor) -> np.ndarray:
    return t.bitcast(dtypes.uint16).numpy()


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_codes_and_scales_bit_for_bit_with_mlx(mode, dtype_name):
    key = f"{mode}_{dtype_name}"
    qw = quant.quantize(weights(dtype_name), mode=mode.split("_")[0], global_scale=global_scale(mode))
    assert qw.scales.dtype == dtypes.uint8 and qw.biases is None
    np.testing.assert_array_equal(qw.weight.numpy(), MLX[f"q_{key}"], err_msg=f"{key}: codes")
    np.testing.assert_array_equal(qw.scales.numpy(), MLX[f"s_{key}"], err_msg=f"{key}: scales")


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_mlx_weights_dequantize_to_mlx_values(mode, dtype_name):
    """MLX's codes and scales dequantize to MLX's float32 values (with a global scale, `g / 2688`
    divided as MLX divides) and, without one, to its default bfloat16 bits."""
    key = f"{mode}_{dtype_name}"
    theirs = quant.QuantizedWeight(Tensor(MLX[f"q_{key}"], device="CPU"), Tensor(MLX[f"s_{key}"], device="CPU"), None,
                                   mode.split("_")[0], *quant.DEFAULTS[mode.split("_")[0]], global_scale(mode))
    got = quant.dequantize(theirs, dtypes.float32).numpy()
    np.testing.assert_array_equal(got, MLX[f"d32_{key}"], err_msg=key)
    if mode.endswith("global"): return
    default = quant.dequantize(theirs)
    assert default.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(bf16_bits(default), MLX[f"d16_{key}"], err_msg=key)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mode", ("mxfp4", "mxfp8", "nvfp4"))
def test_quantized_matmul_equals_the_dequantized_product(mode, dtype_name):
    """x's dtype out; against float64 numpy over MLX's dequantized weights and against MLX's own
    product, at the seeds' tolerances (1e-5 float32, 2e-3 float16, 1.6e-2 bfloat16)."""
    key = f"{mode}_{dtype_name}"
    dtype = DTYPES[dtype_name]
    x = Tensor(MLX[f"x_{dtype_name}"], device="CPU").cast(dtype)
    qw = quant.quantize(weights(dtype_name), mode=mode)
    y = quant.quantized_matmul(x, qw)
    assert y.dtype == dtype and y.shape == (3, 6)
    tolerance = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype_name]
    reference = MLX[f"x_{dtype_name}"].astype(np.float64) @ MLX[f"d32_{key}"].astype(np.float64).T
    got = y.float().numpy()
    scale = np.abs(reference).max()
    assert np.abs(got - reference).max() <= tolerance * scale, key
    assert np.abs(got - MLX[f"y_{key}"]).max() <= tolerance * scale, key
    # Not transposed: x [3, 6] times w [6, 256].
    z = quant.quantized_matmul(Tensor(np.ones((3, 6), np.float32), device="CPU").cast(dtype), qw, transpose=False)
    np.testing.assert_allclose(z.float().numpy(), np.broadcast_to(MLX[f"d32_{key}"].astype(np.float64).sum(0), (3, 256)),
                               rtol=tolerance, atol=tolerance * np.abs(MLX[f"d32_{key}"]).max())


def test_gradients_reach_x_only():
    w = weights("float32")
    qw = quant.quantize(w, mode="mxfp4")
    x = Tensor(MLX["x_float32"], device="CPU")
    upstream = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    loss = (quant.quantized_matmul(x, qw) * Tensor(upstream, device="CPU")).sum()
    (grad,) = loss.gradient(x)
    want = upstream.astype(np.float64) @ MLX["d32_mxfp4_float32"].astype(np.float64)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_empty_products_and_weights():
    qw = quant.quantize(Tensor.full((8, 64), 0.5, device="CPU"), mode="mxfp8")
    assert quant.quantized_matmul(Tensor.zeros(0, 64, device="CPU"), qw).numpy().shape == (0, 8)
    none = quant.quantize(Tensor.full((0, 64), 0.5, device="CPU"), mode="nvfp4")
    assert none.weight.shape == (0, 8) and none.scales.shape == (0, 4)
    assert quant.quantized_matmul(Tensor.ones(3, 64, device="CPU"), none).numpy().shape == (3, 0)


def _mxfp8(w):
    return quant.quantize(w, mode="mxfp8")


INVALID = [
    (ValueError, "quantize", "mxfp4 quantization requires group size 32 but got 64", lambda w: quant.quantize(w, 64, mode="mxfp4")),
    (ValueError, "quantize", "nvfp4 quantization requires bits to be 4 but got 8", lambda w: quant.quantize(w, bits=8, mode="nvfp4")),
    (ValueError, "quantize", "mode must be one of", lambda w: quant.quantize(w, mode="fp4")),
    (ValueError, "quantize", "not float64", lambda w: quant.quantize(w.cast(dtypes.float64), mode="mxfp4")),
    (ValueError, "quantize", "only supported for 'nvfp4'",
     lambda w: quant.quantize(w, mode="mxfp4", global_scale=Tensor([1.0], device="CPU"))),
    (TypeError, "quantize", "must be float32",
     lambda w: quant.quantize(w, mode="nvfp4", global_scale=Tensor([1.0], device="CPU").cast(dtypes.float16))),
    (ValueError, "quantize", "one element", lambda w: quant.quantize(w, mode="nvfp4", global_scale=Tensor([1.0, 2.0], device="CPU"))),
    (ValueError, "dequantize", "biases must be null", lambda w: quant.dequantize(
        quant.QuantizedWeight(_mxfp8(w).weight, _mxfp8(w).scales, Tensor.zeros(2, 2, device="CPU"), "mxfp8", 32, 8))),
    (ValueError, "dequantize", "biases must be provided", lambda w: quant.dequantize(
        quant.QuantizedWeight(_mxfp8(w).weight, _mxfp8(w).scales.float(), None, "affine", 32, 8))),
    (TypeError, "dequantize", "scale type must be uint8", lambda w: quant.dequantize(
        quant.QuantizedWeight(_mxfp8(w).weight, _mxfp8(w).scales.float(), None, "mxfp8", 32, 8))),
    (TypeError, "dequantize", "", lambda w: quant.dequantize(_mxfp8(w), dtypes.int32)),
    (ValueError, "quantized_matmul", "not float64",
     lambda w: quant.quantized_matmul(Tensor.ones(3, 64, device="CPU").cast(dtypes.float64), _mxfp8(w))),
    (ValueError, "quantized_matmul", "last dimension", lambda w: quant.quantized_matmul(Tensor.ones(3, 63, device="CPU"), _mxfp8(w))),
    (ValueError, "quantized_matmul", "global scale", lambda w: quant.quantized_matmul(
        Tensor.ones(3, 64, device="CPU"), quant.quantize(w, mode="nvfp4", global_scale=Tensor([2.0], device="CPU")))),
]


@pytest.mark.parametrize("error, op, text, call", INVALID, ids=[row[2] or "integer dtype" for row in INVALID])
def test_invalid_arguments(error, op, text, call):
    with pytest.raises(error, match=f"^{op}: .*{text}"):
        call(Tensor.ones(2, 64, device="CPU"))
