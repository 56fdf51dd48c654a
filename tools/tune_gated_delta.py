"""Sweep the gated delta kernels' launches on the device (`DEV=CUDA python3 tools/tune_gated_delta.py
[--chunked]`), each setting timed as the benchmark times it (`nuvec_tg.bench.common.time_jit` over
rotated inputs) at Qwen3.5-9B's sizes (Hk 16, Hv 32, Dk = Dv = 128; bf16 q/k/v, float32 g, beta
and state).

Without options: the recurrent kernel's launch (SIMD groups per threadgroup x rows per SIMD group)
for a decode step at B in {1, 8, 64, 256} and the 512-token prefill at B = 1, with the bytes moved
per second and the largest difference from the composition (decode rows; the prefill's is 0).

`--chunked`: the chunked prefill kernel's launch (`kernel.Chunked(32, warps)` for each warps in
`kernel.CHUNKED_WARPS`, with 2 and 4 line buffers in the state pass on CUDA: `kernel.PASS_STAGES`)
for (B, T) in (1, 2048), (1, 8192), (8, 2048), beside
the recurrent kernel forced at 4 x 1 and the first pass alone (`kernel.chunk_forms`: every chunk's
forms, the part of the time that does not depend on the launch), with tokens per second and the
largest difference of the final state from the recurrent kernel's on the same inputs."""
import argparse

import numpy as np
from tinygrad import Device

from nuvec_tg import fast
from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.bench.gated_delta import inputs, moved_bytes
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import gated_delta as kernel

HK, HV, DK, DV = 16, 32, 128, 128
LAUNCH = [(w, r) for r in (1, 2, 4) for w in (2, 4, 8, 16)]
CHUNK = 32
CHUNKED_ROWS = [(1, 2048), (1, 8192), (8, 2048)]
RECURRENT = kernel.Launch(4, 1)
STAGES = {"cuda": (2, 4), "metal": (2,)}  # the state pass's line buffers (Metal's 32 KB hold two)
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--chunked", action="store_true", help="sweep the chunked prefill kernel's warps instead")
args = parser.parse_args()
BACKEND = kernel_backend(Device.DEFAULT)
if BACKEND is None: raise SystemExit(f"tune_gated_delta: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
rng = np.random.default_rng(0)


def launched(shape):
    def rule(q, k, v, g, beta, state):
        return kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=BACKEND, shape=shape)
    return rule


def sweep_recurrent() -> None:
    print("cells: SIMD groups per threadgroup x rows per SIMD group: µs / TB/s", flush=True)
    for b, t in [(1, 1), (8, 1), (64, 1), (256, 1), (1, 512)]:
        moved = moved_bytes(b, t, HK, HV, DK, DV)
        calls = inputs(rng, b, t, HK, HV, DK, DV, rotation(moved))
        if t == 1:
            with compositions_only():
                want = fast.gated_delta(*calls[0])[1].numpy()
        cells = []
        for warps, rows in LAUNCH:
            rule = launched(kernel.Launch(warps, rows))
            got = rule(*calls[0])[1].numpy()
            error = float(np.abs(got - want).max()) if t == 1 else 0.0
            seconds = time_jit(rule, calls, 5)
            cells.append(f"{warps}x{rows}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f} (err {error:.1e})")
        print(f"B {b} T {t}: " + "  ".join(cells), flush=True)
        del calls


def sweep_chunked() -> None:
    print(f"cells: recurrent {RECURRENT.warps}x{RECURRENT.rows}, then chunk x warps of the chunked kernel: µs / M tok/s "
          "(err: the largest difference of the final state from the recurrent kernel's)", flush=True)
    for b, t in CHUNKED_ROWS:
        calls = inputs(rng, b, t, HK, HV, DK, DV, rotation(moved_bytes(b, t, HK, HV, DK, DV)))
        recurrent = launched(RECURRENT)
        want = recurrent(*calls[0])[1].numpy()
        seconds = time_jit(recurrent, calls, 5)
        cells = [f"recurrent: {seconds * 1e6:.1f}/{b * t / seconds / 1e6:.2f}"]
        first = time_jit(lambda q, k, v, g, beta, state: tuple(kernel.chunk_forms(q, k, v, g, beta, BACKEND, CHUNK, False)), calls, 5)
        cells.append(f"first pass: {first * 1e6:.1f}")
        planned_stages = kernel.PASS_STAGES[BACKEND]
        for stages in STAGES[BACKEND]:
            kernel.PASS_STAGES[BACKEND] = stages  # read when the state pass's program is made
            for warps in kernel.CHUNKED_WARPS:
                rule = launched(kernel.Chunked(CHUNK, warps))
                got = rule(*calls[0])[1].numpy()
                error = float(np.abs(got - want).max())
                seconds = time_jit(rule, calls, 5)
                cells.append(f"{CHUNK}x{warps}, {stages} buffers: {seconds * 1e6:.1f}/{b * t / seconds / 1e6:.2f} (err {error:.1e})")
        kernel.PASS_STAGES[BACKEND] = planned_stages
        print(f"B {b} T {t}: " + "  ".join(cells), flush=True)
        del calls


if args.chunked: sweep_chunked()
else: sweep_recurrent()
