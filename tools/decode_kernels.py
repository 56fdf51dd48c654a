"""The kernels of a model's jitted decode step as CUDA would run them, listed on a machine without
a GPU: tinygrad's NULL device (which schedules and captures but runs nothing) stands in for CUDA,
nuvec_tg's kernels are chosen as for CUDA (an H200's 132 multiprocessors) and not compiled. Prints
the captured step's kernel count, the count per name, and the first layer's kernels in launch
order with their buffers' sizes: what `tools/profile_decode_step.py` times on the GPU, without one.

Usage: python3 tools/decode_kernels.py [--config qwen3_8b] [--format q4|dense] [--batch 1]
       [--sequence 0,24] [--paged]

--paged: the serving engine's decode step instead (`models.Engine`: a paged cache, `--batch`
sequences of different prompt lengths, each at its own position).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

os.environ["DEV"] = "NULL"
os.environ.setdefault("NULL_ALLOW_COPYOUT", "1")

from tinygrad import Tensor, dtypes  # noqa: E402
from tinygrad.engine.jit import _prepare_jit_inputs  # noqa: E402
from tinygrad.engine.realize import resolve_params  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import nuvec_tg.kernels as kernels  # noqa: E402
import nuvec_tg.kernels.program as program  # noqa: E402
from nuvec_tg import models  # noqa: E402
from nuvec_tg.bench.model import CONFIGS, FORMATS  # noqa: E402
from profile_decode_step import call_name, kernel_calls  # noqa: E402

# NULL stands in for CUDA: the CUDA backend's choices, no compiler
_kernel_backend = kernels.kernel_backend
kernels.kernel_backend = lambda device: "cuda" if str(getattr(device, "device", device)).upper().startswith("NULL") \
    else _kernel_backend(device)
kernels.multiprocessors = lambda device: 132
program._compiled = lambda device, source, arch=None: b""
kernels.warpgroup_products = lambda device: True  # an H200 (sm_90)
program._give_dynamic_memory = lambda device, program_uop, dynamic_bytes: None  # NULL runs nothing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3_8b", choices=list(CONFIGS))
    parser.add_argument("--format", default="q4", choices=list(FORMATS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", default="0,24", help="FIRST,COUNT: the kernels listed in launch order")
    parser.add_argument("--paged", action="store_true", help="the serving engine's decode step (a paged cache)")
    args = parser.parse_args()
    model = models.random_model(CONFIGS[args.config], dtype=dtypes.bfloat16, quantize=FORMATS[args.format])
    if args.paged:
        jit, jit_inputs = paged_step(model, args.batch)
    else:
        cache = model.make_cache(args.batch, 256)
        cache.position = 16
        for _ in range(3): model._step_chained(cache)
        jit, length = cache.steps["chained"], cache.steps["length"]
        jit_inputs = (length.bind(cache.position),)
    calls = [call for _, call in kernel_calls(jit.captured.linear)]
    print(f"{args.config} {args.format} B={args.batch}: {len(calls)} kernels in the captured step")
    for name, count in Counter(call_name(c) for c in calls).most_common(): print(f"  x{count:<4d} {name}")
    inputs, _, _, _ = _prepare_jit_inputs(jit_inputs, {})
    first, count = (int(n) for n in args.sequence.split(","))
    for index, call in enumerate(calls[first:first + count], start=first):
        sizes = [u.buffer.size for u in resolve_params(call, tuple(inputs))]
        print(f"  {index:4d} {call_name(call):40s} buffers {sizes}")


def paged_step(model, batch: int):
    """The engine's captured decode step for `batch` running sequences (prompts of 8 to 8 + batch
    tokens, so every sequence sits at its own position), and the inputs of its last replay."""
    engine = models.Engine(model, max_sequences=batch, max_length=256, prefill_chunk=64)
    for i in range(batch): engine.submit(list(range(1, 9 + i)), max_tokens=16, stop_tokens=())
    while len(engine.running) < batch: engine.step()
    jit, captured = engine._step(batch, True), []

    class Recording:   # the engine's step as it calls it, its inputs kept
        def __call__(self, *inputs):
            captured[:] = inputs
            return jit(*inputs)
    engine.steps[(batch, True)] = Recording()
    for _ in range(3): engine.step()
    return jit, tuple(captured)


if __name__ == "__main__":
    main()
