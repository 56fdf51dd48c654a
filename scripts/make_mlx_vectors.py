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
