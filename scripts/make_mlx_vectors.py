"""Write tests/data/mlx_affine.npz: MLX's own affine quantization of fixed inputs (packed words,
scales, biases, dequantized values) for every width and group size, the independent reference
of tests/test_quant.py. Run where MLX is installed (`pip install "mlx[cpu]"` on Linux):
`python scripts/make_mlx_vectors.py`."""
import pathlib

import mlx.core as mx
import numpy as np

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
out = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "mlx_affine.npz"
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
out = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "mlx_fp.npz"
np.savez_compressed(out, **fp)
print(f"wrote {out} ({out.stat().st_size} bytes, MLX {mx.__version__})")
