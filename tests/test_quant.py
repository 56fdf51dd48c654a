"""Affine quantization against a float64/float32 numpy port of MLX's rule and the dequantized products."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from nuvec_tg.quant.affine import pack_codes, unpack_codes
from reference import assert_close, random, values

BITS = (1, 2, 3, 4, 5, 6, 8)


def mlx_affine(w, group_size, bits):
    """MLX's affine rule in numpy float32 (true division, round half to even): codes, scales, biases."""
    rows, columns = w.shape
    g = w.astype(np.float32).reshape(rows, columns // group_size, group_size)
    top, bottom = g.max(-1, keepdims=True), g.min(-1, keepdims=True)
    levels = np.float32(2 ** bits - 1)
    scale = np.maximum((top - bottom) / levels, np.float32(1e-7))
    if bits == 1:  # MLX's one-bit rule
        codes = np.clip(np.rint((g - bottom) / scale), 0, 1)
        return codes.reshape(rows, columns).astype(np.uint32), scale[..., 0], bottom[..., 0]
    low = np.abs(bottom) > np.abs(top)
    scale = np.where(low, scale, -scale)
    edge = np.where(low, bottom, top)
    first = np.rint(edge / scale)
    scale = np.where(first == 0, scale, edge / np.where(first == 0, 1, first)).astype(np.float32)
    bias = np.where(first == 0, 0, edge).astype(np.float32)
    codes = np.clip(np.rint((g - bias) / scale), 0, levels)
    return codes.reshape(rows, columns).astype(np.uint32), scale[..., 0], bias[..., 0]


def pack_reference(codes, bits):
    """One LSB-first bit stream per row in little-endian uint32 words."""
    rows, columns = codes.shape
    stream = ((codes[..., None] >> np.arange(bits)) & 1).reshape(rows, -1, 32).astype(np.uint64)
    return (stream << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)


@pytest.mark.parametrize("bits", BITS)
def test_packing_is_an_lsb_first_stream(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2 ** bits, size=(3, 64)).astype(np.uint32)
    packed = pack_codes(Tensor(codes, device="CPU"), bits)
    np.testing.assert_array_equal(packed.numpy(), pack_reference(codes, bits))
    np.testing.assert_array_equal(unpack_codes(packed, bits).numpy(), codes)


# Every width at groups of 64, and the other group sizes with whole and straddling codes.
FORMATS = [(bits, 64) for bits in BITS] + [(4, 32), (3, 32), (4, 128), (5, 128)]


@pytest.mark.parametrize("bits, group_size", FORMATS, ids=str)
def test_quantize_follows_mlx_and_round_trips_within_a_step(bits, group_size):
    rng = np.random.default_rng(0x51 + bits)
    w, wv = random(rng, (3, 2 * group_size), dtypes.float32, "CPU")
    qw = quant.quantize(w, group_size, bits)
    assert qw.weight.dtype == dtypes.uint32 and qw.weight.shape == (3, 2 * group_size * bits // 32)
    assert qw.scales.shape == (3, 2) and qw.biases.shape == (3, 2)
    codes, scales, biases = mlx_affine(wv, group_size, bits)
    np.testing.assert_array_equal(unpack_codes(qw.weight, bits).numpy(), codes)
    np.testing.assert_array_equal(values(qw.scales), scales)
    np.testing.assert_array_equal(values(qw.biases), biases)
    restored = values(quant.dequantize(qw))
    step = np.repeat(np.abs(values(qw.scales)), group_size, axis=1)
    assert (np.abs(restored - wv) <= step * 1.0001).all()
    assert np.abs(restored - wv).sum() <= step.sum() / 2


def test_zero_constant_and_one_signed_groups():
    v = np.concatenate([np.full(32, 0.75), -1.0 - np.arange(32) / 8.0, np.arange(32) / 31.0 - 0.25]).astype(np.float32)
    qw = quant.quantize(Tensor(v.reshape(3, 32), device="CPU"), 32, 4)
    back = values(quant.dequantize(qw))
    np.testing.assert_allclose(back[0], 0.75, atol=1e-6)
    # The larger-magnitude end of each group is exact, and zero is exact where a group spans it.
    assert back[1].min() == v[32:64].min()
    codes = unpack_codes(qw.weight, 4).numpy()[2].astype(np.float64)
    scale, bias = values(qw.scales)[2, 0], values(qw.biases)[2, 0]
    assert np.any(np.abs(codes * scale + bias) < 1e-7)


@pytest.mark.parametrize("bits, group_size", [(4, 64), (3, 32), (8, 128), (2, 32), (6, 64), (5, 32), (1, 64)])
def test_quantized_matmul_equals_the_dequantized_product(bits, group_size):
    rng = np.random.default_rng(0x52)
    w, _ = random(rng, (48, 128), dtypes.float32, "CPU")
    qw = quant.quantize(w, group_size, bits)
    dense = values(quant.dequantize(qw))
    for shape in ((128,), (5, 128), (2, 3, 128)):
        x, xv = random(rng, shape, dtypes.float32, "CPU")
        assert_close(f"{shape}", values(quant.quantized_matmul(x, qw)), xv @ dense.T, 1e-5)
    x, xv = random(rng, (4, 48), dtypes.float32, "CPU")
    assert_close("not transposed", values(quant.quantized_matmul(x, qw, transpose=False)), xv @ dense, 1e-5)


def test_batched_weights_broadcast_and_half_precision_promotes():
    rng = np.random.default_rng(0x53)
    w, _ = random(rng, (2, 1, 16, 64), dtypes.float16, "CPU")
    qw = quant.quantize(w, 32, 4)
    assert qw.scales.dtype == dtypes.float16
    x, xv = random(rng, (3, 5, 64), dtypes.float32, "CPU")
    got = quant.quantized_matmul(x, qw)
    assert got.shape == (2, 3, 5, 16) and got.dtype == dtypes.float32
    dense = values(quant.dequantize(qw, dtypes.float32))
    assert_close("batched", values(got), xv @ np.swapaxes(dense, -1, -2), 1e-5)


def test_batched_weights_broadcast_like_matmul_through_gather_qmm():
    """Weights with batch axes run as gather_qmm's entries: x with fewer batch axes, x of one row
    `[K]`, untransposed weights, and gradients, against numpy's matmul of the dense weights; batch
    shapes that do not broadcast raise naming quantized_matmul."""
    rng = np.random.default_rng(0x5A)
    qw = quant.quantize(random(rng, (3, 16, 64), dtypes.float32, "CPU")[0], 32, 4)
    dense = values(quant.dequantize(qw, dtypes.float32))
    for shape in ((64,), (5, 64), (1, 5, 64), (3, 2, 64)):
        x, xv = random(rng, shape, dtypes.float32, "CPU")
        got = quant.quantized_matmul(x, qw)
        want = xv @ np.swapaxes(dense, -1, -2)
        assert got.shape == want.shape, shape
        assert_close(f"{shape}", values(got), want, 1e-5)
    untransposed = quant.quantize(random(rng, (2, 64, 32), dtypes.float32, "CPU")[0], 32, 4)
    x, xv = random(rng, (2, 4, 64), dtypes.float32, "CPU")
    assert_close("not transposed", values(quant.quantized_matmul(x, untransposed, transpose=False)),
                 xv @ values(quant.dequantize(untransposed, dtypes.float32)), 1e-5)
    with pytest.raises(ValueError, match="quantized_matmul"):
        quant.quantized_matmul(random(rng, (2, 5, 64), dtypes.float32, "CPU")[0], qw)
    scales, biases = qw.scales.realize(), qw.biases.realize()
    x, xv = random(rng, (3, 2, 64), dtypes.float32, "CPU")
    g, gv = random(rng, (3, 2, 16), dtypes.float32, "CPU")
    weight = quant.QuantizedWeight(qw.weight, scales, biases, "affine", 32, 4)
    dx, = (quant.quantized_matmul(x, weight) * g).sum().gradient(x)
    assert_close("dx", values(dx), np.einsum("bmn,bnk->bmk", gv, dense), 1e-5)


def test_gradients_reach_x_scales_and_biases():
    rng = np.random.default_rng(0x54)
    w, _ = random(rng, (6, 64), dtypes.float32, "CPU")
    qw = quant.quantize(w, 32, 4)
    scales, biases = qw.scales.realize(), qw.biases.realize()
    x, xv = random(rng, (2, 3, 64), dtypes.float32, "CPU")
    g, gv = random(rng, (2, 3, 6), dtypes.float32, "CPU")
    weight = quant.QuantizedWeight(qw.weight, scales, biases, "affine", 32, 4)
    dx, ds, db = (quant.quantized_matmul(x, weight) * g).sum().gradient(x, scales, biases)
    codes = unpack_codes(qw.weight, 4).numpy().astype(np.float64).reshape(6, 2, 32)
    dense = (codes * values(scales)[..., None] + values(biases)[..., None]).reshape(6, 64)
    assert_close("dx", values(dx), gv @ dense, 1e-5)
    dense_grad = np.einsum("abn,abk->nk", gv, xv).reshape(6, 2, 32)       # d loss / d dense
    assert_close("ds", values(ds), (dense_grad * codes).sum(-1), 1e-5)
    assert_close("db", values(db), dense_grad.sum(-1), 1e-5)


INVALID = [
    (ValueError, "quantize", lambda w, qw: quant.quantize(w, 48, 4)),
    (ValueError, "quantize", lambda w, qw: quant.quantize(w, 64, 7)),
    (ValueError, "quantize", lambda w, qw: quant.quantize(Tensor.ones(64), 64, 4)),
    (ValueError, "quantize", lambda w, qw: quant.quantize(Tensor.ones(2, 96), 64, 4)),
    (TypeError, "quantize", lambda w, qw: quant.quantize(w.cast(dtypes.int32), 64, 4)),
    (ValueError, "quantize", lambda w, qw: quant.quantize(w, 32, 4, mode="fp4")),
    (ValueError, "dequantize", lambda w, qw: quant.dequantize(quant.QuantizedWeight(qw.weight, qw.scales, qw.biases, "affine", 32, 4))),
    (TypeError, "dequantize", lambda w, qw: quant.dequantize(quant.QuantizedWeight(qw.scales, qw.scales, qw.biases, "affine", 64, 4))),
    (ValueError, "quantized_matmul", lambda w, qw: quant.quantized_matmul(Tensor.ones(3, 63), qw)),
    (TypeError, "quantized_matmul", lambda w, qw: quant.quantized_matmul(Tensor.ones(3, 64, dtype=dtypes.int32), qw)),
    (ValueError, "swiglu_matmul", lambda w, qw: quant.swiglu_matmul(Tensor.ones(3, 64), qw)),   # gate and up: 128
    (TypeError, "swiglu_matmul", lambda w, qw: quant.swiglu_matmul(Tensor.ones(3, 128, dtype=dtypes.int32), qw)),
]


@pytest.mark.parametrize("mode, group, bits", [("affine", 32, 4), ("mxfp4", 32, 4)])
def test_swiglu_matmul_is_the_product_of_the_activation(mode, group, bits):
    """`swiglu_matmul(gate_up, w)` is `quantized_matmul(silu(gate) * up, w)` (here: the composition,
    bit for bit), against float64 numpy; gradients reach gate_up."""
    rng = np.random.default_rng(0x5917)
    qw = quant.quantize(random(rng, (6, 64), dtypes.float32, "CPU")[0], group, bits, mode=mode)
    gate_up, gv = random(rng, (2, 3, 128), dtypes.float32, "CPU")
    got = quant.swiglu_matmul(gate_up, qw)
    np.testing.assert_array_equal(values(got), values(quant.quantized_matmul(gate_up[..., :64].silu() * gate_up[..., 64:], qw)))
    activated = gv[..., :64] / (1 + np.exp(-gv[..., :64])) * gv[..., 64:]
    assert_close("swiglu", values(got), activated @ values(quant.dequantize(qw, dtypes.float32)).T, 1e-5)
    assert quant.swiglu_matmul(gate_up, qw).sum().gradient(gate_up)[0].shape == (2, 3, 128)


@pytest.mark.parametrize("error, op, call", INVALID)
def test_invalid_arguments(error, op, call):
    w = Tensor.ones(2, 64)
    with pytest.raises(error, match=f"^{op}: "):
        call(w, quant.quantize(w, 64, 4))


MLX = np.load(__file__.rsplit("/", 1)[0] + "/data/mlx_affine.npz")


@pytest.mark.parametrize("bits", BITS)
def test_bit_for_bit_with_mlx(bits):
    """MLX 0.32's own outputs (tests/data/mlx_affine.npz, from scripts/make_mlx_vectors.py):
    our quantize gives its packed words, scales and biases; its weights dequantize to its values
    within one float32 rounding."""
    for group_size in (32, 64, 128):
        key = f"{bits}_{group_size}"
        qw = quant.quantize(Tensor(MLX[f"w_{key}"], device="CPU"), group_size, bits)
        np.testing.assert_array_equal(qw.weight.numpy(), MLX[f"q_{key}"], err_msg=f"{key}: words")
        np.testing.assert_array_equal(qw.scales.numpy(), MLX[f"s_{key}"], err_msg=f"{key}: scales")
        np.testing.assert_array_equal(qw.biases.numpy(), MLX[f"b_{key}"], err_msg=f"{key}: biases")
        theirs = quant.QuantizedWeight(*(Tensor(MLX[f"{p}_{key}"], device="CPU") for p in "qsb"), "affine", group_size, bits)
        want = MLX[f"d_{key}"]
        got = quant.dequantize(theirs).numpy()
        # One rounding of the larger of the bias and the result (a fused multiply-add skips the
        # product's rounding, which matters most where the two nearly cancel).
        bias = np.repeat(np.abs(MLX[f"b_{key}"]), group_size, axis=1)
        assert np.all(np.abs(got - want) <= np.spacing(np.maximum(bias, np.abs(want)))), key
