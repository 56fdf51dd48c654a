"""The serving Engine's decode step on the host (issue 26): the whole step and the parts that are
host work on any device, the step's two inputs made as new tensors from host arrays (what the
Engine did before `model.StepInput`) or copied into kept buffers (what it does), and the read-back
of a step's tokens. On the CPU the step's kernels run on the host too, so only the parts are
device-independent; on a GPU the whole step adds the device time.

Usage: python tools/engine_host.py [--model tests/data/models/qwen3] [--requests 8] [--steps 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg import models
from nuvec_tg.models.model import StepInput
from nuvec_tg.models.paged import Engine


def milliseconds(run, repeats: int) -> float:
    """The median of `repeats` timings of `run()` in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tests/data/models/qwen3")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    model = models.load(args.model, progress=False)
    engine = Engine(model, max_sequences=args.requests, max_length=64 + 2 * args.steps)
    rng = np.random.default_rng(0)
    for i in range(args.requests):
        engine.submit(rng.integers(0, 100, 5 + i).tolist(), max_tokens=2 * args.steps, stop_tokens=())
    while engine.prefilling or engine.waiting: engine.step()
    for _ in range(5): engine.step()   # every decode jit captured
    step = milliseconds(engine.step, args.steps)
    tokens = np.zeros((args.requests, 1), np.int32)
    meta = np.zeros((args.requests, 4 + engine.cache.table_blocks), np.int32)
    new = milliseconds(lambda: Tensor.realize(Tensor(tokens, device=model.device), Tensor(meta, device=model.device)), args.steps)
    kept = StepInput(tokens.shape, model.device), StepInput(meta.shape, model.device)
    copied = milliseconds(lambda: (kept[0].write(tokens), kept[1].write(meta)), args.steps)
    out = Tensor.zeros(args.requests, dtype=dtypes.int32, device=model.device).contiguous().realize()
    read = milliseconds(out.numpy, args.steps)
    print(f"Engine decode step on {model.device}, {args.requests} requests, median of {args.steps}, ms\n")
    print("| the whole step | its two inputs as new tensors | copied into kept buffers (StepInput) | tokens read back |")
    print("|---|---|---|---|")
    print(f"| {step:.2f} | {new:.2f} | {copied:.3f} | {read:.2f} |")


if __name__ == "__main__":
    main()
