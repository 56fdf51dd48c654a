"""Sweep the gated delta kernel's launch (SIMD groups per threadgroup x rows per SIMD group) on the device
(`DEV=CUDA python3 tools/tune_gated_delta.py`): a decode step at Qwen3.5-9B's sizes for B in
{1, 8, 64, 256} and the 512-token prefill at B = 1, each setting timed as the benchmark times it
(`nuvec_tg.bench.common.time_jit` over rotated inputs), with the bytes moved per second and the
largest difference from the composition."""
import numpy as np
from tinygrad import Device

from nuvec_tg import fast
from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.bench.gated_delta import inputs, moved_bytes
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import gated_delta as kernel

HK, HV, DK, DV = 16, 32, 128, 128
LAUNCH = [(w, r) for r in (1, 2, 4) for w in (2, 4, 8, 16)]
BACKEND = kernel_backend(Device.DEFAULT)
if BACKEND is None: raise SystemExit(f"tune_gated_delta: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
rng = np.random.default_rng(0)
print("cells: SIMD groups per threadgroup x rows per SIMD group: µs / TB/s", flush=True)
for b, t in [(1, 1), (8, 1), (64, 1), (256, 1), (1, 512)]:
    moved = moved_bytes(b, t, HK, HV, DK, DV)
    calls = inputs(rng, b, t, HK, HV, DK, DV, rotation(moved))
    if t == 1:
        with compositions_only():
            want = fast.gated_delta(*calls[0])[1].numpy()
    cells = []
    for warps, rows in LAUNCH:
        def rule(q, k, v, g, beta, state, shape=kernel.Launch(warps, rows)):
            return kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=BACKEND, shape=shape)
        got = rule(*calls[0])[1].numpy()
        error = float(np.abs(got - want).max()) if t == 1 else 0.0
        seconds = time_jit(rule, calls, 5)
        cells.append(f"{warps}x{rows}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f} (err {error:.1e})")
    print(f"B {b} T {t}: " + "  ".join(cells), flush=True)
    del calls
