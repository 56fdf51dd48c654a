"""Sweep the norm kernel's launch (threads per row, pieces held per thread) on the device
(`DEV=CUDA python3 tools/tune_rows.py`): `rms_norm` with a weight and `add_rms_norm` over bf16 rows
of 4096 and 8192 elements at 4096 rows (prefill) and 32 rows (decode), each launch timed as
`bench rows` times it (`nuvec_tg.bench.common.time_jit` over rotated inputs), in µs and TB/s of
the op's bytes; `*` marks the plan's launch.

`--softmax` sweeps the softmax family's launch instead (threads per row x elements a thread, in
16-byte pieces): softmax and logsumexp over bf16 and float32 rows of 4096 and 8192 at 4096 rows
and of 4096 at 32 rows (`--quick`: bf16 rows of 4096), each launch's result checked against the
plan's."""
import argparse
import itertools
import math

import numpy as np
from tinygrad import Device, Tensor, dtypes

from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.kernels import kernel_backend
from nuvec_tg.kernels import rows as kernel
from nuvec_tg.kernels import softmax

BACKEND = kernel_backend(Device.DEFAULT)
if BACKEND is None: raise SystemExit(f"tune_rows: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
BF16 = dtypes.bfloat16
rng = np.random.default_rng(0)


def sweep_softmax(quick: bool) -> None:
    """The softmax family's launches (threads x elements a thread) at prefill and decode sizes
    (`quick`: bf16 rows of 4096 only)."""
    print("cells: threads x elements a thread: µs / TB/s (* the plan's)", flush=True)
    sizes = [(4096, 4096), (32, 4096)] if quick else [(4096, 4096), (4096, 8192), (32, 4096)]
    for (rows, length), dtype, mode in itertools.product(sizes, (BF16,) if quick else (BF16, dtypes.float32),
                                                         ("softmax", "logsumexp")):
        moved = rows * length * dtype.itemsize * (2 if mode == "softmax" else 1)
        turn = rotation(moved)
        sets = [Tensor(rng.standard_normal((rows, length)).astype(np.float32)).cast(dtype).realize() for _ in range(turn.sets)]
        calls = [(sets[i % len(sets)],) for i in range(turn.calls)]
        planned = softmax.plan(length, dtype.itemsize)
        run = softmax.softmax_kernel if mode == "softmax" else softmax.logsumexp_kernel
        want = run(sets[0], backend=BACKEND).float().numpy()
        cells = []
        for threads, items in itertools.product((64, 128, 256, 512, 1024), (8, 16, 32)):
            if threads * items > softmax.MAX_THREADS * softmax.ITEMS or threads * items * 4 < length: continue
            shape = softmax.Launch(threads, length > threads * items, 8, items)
            got = run(sets[0], backend=BACKEND, shape=shape).float().numpy()
            flag = "" if np.allclose(got, want, rtol=2e-2, atol=1e-4) else " WRONG"
            seconds = time_jit(lambda x, shape=shape: run(x, backend=BACKEND, shape=shape), calls, 5)
            mark = "*" if shape == planned else ""
            cells.append(f"{mark}{threads}x{items}{'l' if shape.looped else ''}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f}{flag}")
        print(f"{mode} {dtype.name} {rows}x{length}: " + "  ".join(cells), flush=True)
        del calls, sets


def sweep_norms() -> None:
    """rms_norm and add_rms_norm's launches (threads x pieces a thread)."""
    print("cells: threads x pieces a thread: µs / TB/s (* the plan's)", flush=True)
    for rows, length in [(4096, 4096), (4096, 8192), (32, 4096)]:
        for add in (False, True):
            moved = (3 if add else 2) * rows * length * 2 + length * 2 + (rows * length * 2 if add else 0)
            turn = rotation(moved)
            weight = Tensor(rng.uniform(0.5, 1.5, length).astype(np.float32)).cast(BF16).to(Device.DEFAULT).realize()
            sets = [tuple(Tensor(rng.standard_normal((rows, length)).astype(np.float32)).cast(BF16).to(Device.DEFAULT).realize()
                          for _ in range(2 if add else 1)) + (weight,) for _ in range(turn.sets)]
            calls = [sets[i % len(sets)] for i in range(turn.calls)]
            planned = kernel.plan(length)
            pieces = length // 8
            cells = []
            for threads in (64, 128, 256, 512, 1024):
                per = math.ceil(pieces / threads)
                if per > 8 or threads > pieces * 2: continue
                shape = kernel.Launch(threads, 8, per, True)

                def norm(*args, shape=shape):
                    if add:
                        return kernel.norm_kernel("rms", args[0], 1e-6, BF16, backend=BACKEND, weight=args[2], residual=args[1],
                                                  h_dtype=BF16, shape=shape)[1]
                    return kernel.norm_kernel("rms", args[0], 1e-6, BF16, backend=BACKEND, weight=args[1], shape=shape)
                seconds = time_jit(norm, calls, 5)
                mark = "*" if shape == planned else ""
                cells.append(f"{mark}{threads}x{per}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f}")
            print(f"{'add_rms_norm' if add else 'rms_norm'} {rows}x{length}: " + "  ".join(cells), flush=True)
            del calls, sets


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--softmax", action="store_true", help="the softmax family's launches, not the norms'")
    parser.add_argument("--quick", action="store_true", help="--softmax: bf16 rows of 4096 only")
    args = parser.parse_args()
    sweep_softmax(args.quick) if args.softmax else sweep_norms()
