"""Sweep the norm kernel's launch (threads per row, pieces held per thread) on the device
(`DEV=CUDA python3 tools/tune_rows.py`): `rms_norm` with a weight and `add_rms_norm` over bf16 rows
of 4096 and 8192 elements at 4096 rows (prefill) and 32 rows (decode), each launch timed as
`bench rows` times it (`nuvec_tg.bench.common.time_jit` over rotated inputs), in µs and TB/s of
the op's bytes; `*` marks the plan's launch."""
import math

import numpy as np
from tinygrad import Device, Tensor, dtypes

from nuvec_tg.bench.common import rotation, time_jit
from nuvec_tg.kernels import kernel_backend
from nuvec_tg.kernels import rows as kernel

BACKEND = kernel_backend(Device.DEFAULT)
if BACKEND is None: raise SystemExit(f"tune_rows: needs a GPU with nuvec_tg's kernels (DEV=CUDA or DEV=METAL), not {Device.DEFAULT}")
BF16 = dtypes.bfloat16
rng = np.random.default_rng(0)
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
