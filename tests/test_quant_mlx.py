"""quantize bit for bit with MLX 0.32.4 over 10,240 random groups per mode, bits, group size and
dtype: a digest of each row (eight groups) of our packed words, scales and biases (floating-point
modes: codes and scale codes, and their dequantized values) against the digest of MLX's own
(tests/data/mlx_groups.npz, written by scripts/make_mlx_vectors.py from the weights of
tests/quant_groups.py, rebuilt here), on the CPU and on each GPU (the integer division of
`quant/exact.py` on every device)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import quant
from quant_groups import GROUPS_PER_ROW, canonical_nans, digest, weights

MLX = np.load(__file__.rsplit("/", 1)[0] + "/data/mlx_groups.npz")
DTYPES = {"float32": dtypes.float32, "float16": dtypes.float16, "bfloat16": dtypes.bfloat16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
BITS = (1, 2, 3, 4, 5, 6, 8)


def weight_tensor(group_size: int, dtype_name: str, device: str) -> Tensor:
    """The weights MLX quantized, checked against the digest of those it saw."""
    bits = weights(group_size, dtype_name)
    assert digest(digest(bits)[None]) == MLX[f"weights_{group_size}_{dtype_name}"], \
        "the rebuilt weights are not those MLX quantized: rerun scripts/make_mlx_vectors.py"
    return Tensor(bits, device=device).bitcast(DTYPES[dtype_name])


def raw(t: Tensor) -> Tensor:
    """A tensor's bits (uint8 scale codes as they are)."""
    if t.dtype == dtypes.uint8: return t
    return t.bitcast(dtypes.uint32 if t.dtype == dtypes.float32 else dtypes.uint16)


def assert_rows_match(outputs: dict[str, tuple[Tensor, ...]]) -> None:
    """Each output's rows' digest is MLX's (outputs: key in mlx_groups.npz -> its tensors, realized
    together; float tensors as their bits, every NaN the dtype's positive quiet NaN, as the digests
    of MLX's values were made)."""
    Tensor.realize(*(t for tensors in outputs.values() for t in tensors))
    for key, tensors in outputs.items():
        bits = [canonical_nans(raw(t).numpy(), DTYPE_NAMES[t.dtype]) if dtypes.is_float(t.dtype) else t.numpy()
                for t in tensors]
        differ = np.flatnonzero(digest(*bits) != MLX[key])
        assert differ.size == 0, (f"{key}: {differ.size} of {len(MLX[key])} rows ({GROUPS_PER_ROW} groups each) "
                                  f"differ from MLX's, the first {differ[:8].tolist()}")


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("group_size", (32, 64, 128))
def test_affine_bit_for_bit_with_mlx(group_size, dtype_name, device):
    w = weight_tensor(group_size, dtype_name, device)
    outputs = {}
    for bits in BITS:
        qw = quant.quantize(w, group_size, bits)
        outputs[f"affine_{bits}_{group_size}_{dtype_name}"] = (qw.weight, raw(qw.scales), raw(qw.biases))
    assert_rows_match(outputs)


def floating_point_outputs(dtype_name: str, device: str, dequantized: bool) -> dict[str, tuple[Tensor, ...]]:
    """Codes and scale codes of every floating-point mode (nvfp4 also with MLX's global scales), or
    their dequantized values: bfloat16 (MLX's default), float32 with a global scale (MLX's dtype then)."""
    outputs = {}

    def add(key: str, qw: quant.QuantizedWeight) -> None:
        if dequantized:
            outputs[f"{key}_dequantized"] = (quant.dequantize(qw, dtypes.float32 if qw.global_scale is not None else None),)
        else:
            outputs[key] = (qw.weight, qw.scales)

    w = weight_tensor(32, dtype_name, device)
    for mode in ("mxfp4", "mxfp8"):
        add(f"{mode}_{dtype_name}", quant.quantize(w, mode=mode))
    w = weight_tensor(16, dtype_name, device)
    add(f"nvfp4_{dtype_name}", quant.quantize(w, mode="nvfp4"))
    for index, scale in enumerate(MLX["global_scales"]):
        scale = Tensor([scale], dtype=dtypes.float32, device=device)
        add(f"nvfp4_global{index}_{dtype_name}", quant.quantize(w, mode="nvfp4", global_scale=scale))
    return outputs


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_floating_point_modes_bit_for_bit_with_mlx(dtype_name, device):
    assert_rows_match(floating_point_outputs(dtype_name, device, dequantized=False))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_floating_point_dequantize_bit_for_bit_with_mlx(dtype_name, device):
    assert_rows_match(floating_point_outputs(dtype_name, device, dequantized=True))
