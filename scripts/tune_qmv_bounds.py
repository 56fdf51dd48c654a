"""Does capping the vector qmv's registers (so more SIMD groups fit a multiprocessor) pay? For M = 1
at the benchmark's three (K, N), affine 4-bit in groups of 64, x bfloat16: the default kernel
against `__launch_bounds__(threads, blocks)` for several minimum resident threadgroups, timed as
the benchmark times (TinyJit replays over rotated weights), with each variant's output compared
bit for bit with the default's. `DEV=CUDA python3 scripts/tune_qmv_bounds.py`."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
from tinygrad import Device, Tensor, dtypes  # noqa: E402

from nuvec_tg import quant  # noqa: E402
from nuvec_tg.bench.common import COPIES, rotations, time_jit, warm_up  # noqa: E402
from nuvec_tg.bench.quant import weight_bytes  # noqa: E402
from nuvec_tg.kernels import quant as kq  # noqa: E402

original = kq.specialise
bound = {"blocks": 0}


def bounded(backend, name, source, defines, params):
    text = original(backend, name, source, defines, params)
    if not bound["blocks"] or name != "nuvec_qmv": return text
    threads = 32 * defines["COLUMN_WARPS"] * defines["K_SPLIT"]
    return text.replace("__global__ void ", f"__global__ void __launch_bounds__({threads}, {bound['blocks']}) ", 1)


kq.specialise = bounded
print(f"device {Device.DEFAULT}; cells: minimum resident threadgroups (0 = no bound): µs / weight TB/s, same bits", flush=True)
warm_up()
rng = np.random.default_rng(0)
for k, n in ((4096, 4096), (4096, 14336), (14336, 4096)):
    moved = weight_bytes("affine4", k, n)
    sets = rotations(moved)
    weights = []
    for _ in range(sets):
        qw = quant.quantize(Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16), 64, 4, mode="affine")
        weights.append(tuple(p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases)))
    xs = [Tensor(rng.standard_normal((1, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize() for _ in range(COPIES)]
    calls = [(xs[i], *weights[i % sets]) for i in range(COPIES)]
    product = lambda x, w, s, b: quant.quantized_matmul(x, quant.QuantizedWeight(w, s, b, "affine", 64, 4))  # noqa: E731
    threads = kq.plan(1, k, n).threads
    cells, reference = [], None
    for blocks in (0, 2048 // threads * 5 // 8, 2048 // threads * 3 // 4, 2048 // threads):
        bound["blocks"] = blocks
        try:
            seconds = time_jit(product, calls, 5)
            got = product(*calls[0]).numpy()
        except Exception as error:  # noqa: BLE001 - a variant that does not compile or launch
            cells.append(f"{blocks}: {str(error)[:40]}")
            continue
        reference = got if reference is None else reference
        cells.append(f"{blocks}: {seconds * 1e6:.1f}/{moved / seconds / 1e12:.2f} {'same' if np.array_equal(got, reference) else 'DIFFERENT'}")
    print(f"K {k} N {n} ({threads} threads): " + "  ".join(cells), flush=True)
