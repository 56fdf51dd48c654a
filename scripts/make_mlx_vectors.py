"""Write MLX's own quantization of fixed inputs, the independent references of the quantization tests:

- tests/data/mlx_affine.npz (tests/test_quant.py): affine packed words, scales, biases and
  dequantized values for every width and group size;
- tests/data/mlx_fp.npz (tests/test_quant_fp.py): the floating-point modes' codes, scale codes,
  dequantized values and products;
- tests/data/mlx_groups.npz (tests/test_quant_mlx.py): a digest of each row of MLX's outputs over
  10,240 random groups (tests/quant_groups.py) per mode, bits, group size and dtype.

Run where MLX is installed (`pip install "mlx[cpu]"` on Linux): `python scripts/make_mlx_vectors.py`.
"""
import pathlib
import sys

import mlx.core as mx
import numpy as np

TESTS = pathlib.Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))
import quant_groups  # noqa: E402 - from tests/, which the test rebuilds its weights with

rng = np.random.default_rng(0x4D4C58)
arrays = {}
for bits in (1, 2, 3, 4, 5, 6, 8):
    for group_size in (32, 64, 128):
        w = (rng.uniform(-1, 1, (8, 256)) * rng.uniform(0.01, 4, (8, 1))).astype(np.float32)
        w[0, :group_size] = 0.75                                  # a constant group
        w[1, :group_size] = -np.abs(w[1, :group_size]) - 0.1      # a one-signed group
        q, s, b = mx.quantize(mx.array(w), group_size, bits)
        key = f"{bits}_{group_size}"
        arrays[f"w_{key}"] = w
        arrays[f"q_{key}"], arrays[f"s_{key}"], arrays[f"b_{key}"] = np.array(q), np.array(s), np.array(b)
        arrays[f"d_{key}"] = np.array(mx.dequantize(q, s, b, group_size, bits))
out = TESTS / "data" / "mlx_affine.npz"
np.savez_compressed(out, **arrays)
print(f"wrote {out} ({out.stat().st_size} bytes, MLX {mx.__version__})")

# The floating-point modes: codes, scale codes, dequantized values (float32 and MLX's default
# bfloat16, as raw bits) for float32, float16 and bfloat16 weights, nvfp4 also with a global scale,
# and a quantized product; written to tests/data/mlx_fp.npz.
fp = {}
rng = np.random.default_rng(0x4650)
for dtype_name in ("float32", "float16", "bfloat16"):
    dtype = getattr(mx, dtype_name)
    w = (rng.standard_normal((6, 256)) * np.exp(rng.uniform(-6, 4, (6, 1)))).astype(np.float32)
    w[0, :32] = 0.0                                                    # a zero group
    w[1, :32] = np.tile([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], 4) * 2.0  # e2m1 ties
    w[2, :32] = -np.abs(w[2, :32])                                       # a one-signed group
    w_mx = mx.array(w).astype(dtype)
    fp[f"w_{dtype_name}"] = np.array(w_mx.astype(mx.float32))
    x = mx.array(rng.standard_normal((3, 256)).astype(np.float32)).astype(dtype)
    fp[f"x_{dtype_name}"] = np.array(x.astype(mx.float32))
    for mode in ("mxfp4", "mxfp8", "nvfp4", "nvfp4_global"):
        name = mode.split("_")[0]
        extra = {"global_scale": mx.array(np.float32(0.37))} if mode.endswith("global") else {}
        q, s = mx.quantize(w_mx, mode=name, **extra)
        key = f"{mode}_{dtype_name}"
        fp[f"q_{key}"], fp[f"s_{key}"] = np.array(q), np.array(s)
        fp[f"d32_{key}"] = np.array(mx.dequantize(q, s, mode=name, dtype=mx.float32, **extra))
        fp[f"d16_{key}"] = np.array(mx.dequantize(q, s, mode=name, **extra).view(mx.uint16))
        if not extra: fp[f"y_{key}"] = np.array(mx.quantized_matmul(x, q, s, mode=name).astype(mx.float32))
out = TESTS / "data" / "mlx_fp.npz"
np.savez_compressed(out, **fp)
print(f"wrote {out} ({out.stat().st_size} bytes, MLX {mx.__version__})")

# Many random groups (tests/quant_groups.py's weights, rebuilt there): one digest per row of MLX's
# outputs (packed words, then scales, then biases; scales and biases as their dtype's bits), per
# (mode, bits, group size, dtype), of the floating-point modes' dequantized values (MLX's default
# dtype: bfloat16, float32 with a global scale; every NaN as the dtype's positive quiet NaN), and one digest of each set of weights; written to
# tests/data/mlx_groups.npz. nvfp4's global scales are such that tinygrad's reciprocal products
# would miss MLX's 2688 / g (0.37) and g / 2688 (0.00123).
GLOBAL_SCALES = np.array([0.37, 0.00123], dtype=np.float32)
groups = {"global_scales": GLOBAL_SCALES}


def as_bits(x: mx.array) -> np.ndarray:
    """An array's bits: uint8 as it is, float32 as uint32, 16-bit floats as uint16."""
    if x.dtype == mx.uint8: return np.array(x)
    return np.array(x.view(mx.uint32 if x.dtype == mx.float32 else mx.uint16))


def floating_point(key: str, q: mx.array, s: mx.array, **extra) -> None:
    """The digests of a floating-point mode's codes and scale codes, and of their dequantized values."""
    groups[key] = quant_groups.digest(np.array(q), as_bits(s))
    values = mx.dequantize(q, s, mode=key.split("_")[0], **extra)
    groups[f"{key}_dequantized"] = quant_groups.digest(quant_groups.canonical_nans(as_bits(values), str(values.dtype).split(".")[-1]))


for dtype_name in quant_groups.DTYPES:
    for group_size in (16, 32, 64, 128):
        bits_of_w = quant_groups.weights(group_size, dtype_name)
        groups[f"weights_{group_size}_{dtype_name}"] = quant_groups.digest(quant_groups.digest(bits_of_w)[None])
        w = mx.array(bits_of_w).view(getattr(mx, dtype_name))
        if group_size == 16:
            floating_point(f"nvfp4_{dtype_name}", *mx.quantize(w, mode="nvfp4"))
            for index, scale in enumerate(GLOBAL_SCALES):
                extra = {"global_scale": mx.array(scale)}
                floating_point(f"nvfp4_global{index}_{dtype_name}", *mx.quantize(w, mode="nvfp4", **extra), **extra)
            continue
        if group_size == 32:
            for mode in ("mxfp4", "mxfp8"):
                floating_point(f"{mode}_{dtype_name}", *mx.quantize(w, mode=mode))
        for bits in (1, 2, 3, 4, 5, 6, 8):
            q, s, b = mx.quantize(w, group_size, bits)
            groups[f"affine_{bits}_{group_size}_{dtype_name}"] = quant_groups.digest(np.array(q), as_bits(s), as_bits(b))
out = TESTS / "data" / "mlx_groups.npz"
np.savez_compressed(out, **groups)
print(f"wrote {out} ({out.stat().st_size} bytes, MLX {mx.__version__})")
