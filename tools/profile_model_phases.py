"""Where a model benchmark's wall-clock time goes, phase by phase, printed as each ends (so that a
run stopped at a time limit still says how far it got): making the random model, the first and
a second prefill of the prompt (compiles, then steady), the first decode steps (the jitted
step's two runs before its capture replays) and steady steps, for one config and format of
`nuvec_tg.bench.model`.

Usage: DEV=CUDA python3 tools/profile_model_phases.py [--config qwen3_5_9b] [--format dense|q4]
       [--batch 1] [--prompt 512] [--steps 8] [--small]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from tinygrad import Device, Tensor, dtypes

from nuvec_tg import models
from nuvec_tg.bench.common import is_gpu
from nuvec_tg.bench.model import CONFIGS, FORMATS, SMALL_CONFIGS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3_5_9b")
    parser.add_argument("--format", default="dense", choices=list(FORMATS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="the tiny config of the same family")
    args = parser.parse_args()
    config = (SMALL_CONFIGS if args.small else CONFIGS)[args.config]
    dtype = dtypes.bfloat16 if is_gpu() else dtypes.float32
    clock = time.perf_counter()

    def phase(what: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        print(f"{what}: {now - clock:.2f} s", flush=True)
        clock = now

    print(f"{args.config} {args.format} B={args.batch} prompt {args.prompt} on {Device.DEFAULT}", flush=True)
    model = models.random_model(config, dtype=dtype, quantize=FORMATS[args.format])
    phase("random model made")
    tokens = np.random.default_rng(0).integers(0, model.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    length = -(-(args.prompt + args.steps + 1) // 256) * 256
    for attempt in ("first", "second"):
        cache = model.make_cache(args.batch, length)
        logits = model(tokens, cache=cache)
        logits[:, -1].argmax(-1).numpy()
        phase(f"{attempt} prefill of {args.prompt} (cached, eager)")
    token = Tensor(np.zeros((args.batch, 1), dtype=np.int32))
    for step in range(args.steps):
        model(token, cache=cache).numpy()
        phase(f"decode step {step + 1}" + (" (runs eagerly)" if step == 0 else " (captures)" if step == 1 else ""))


if __name__ == "__main__":
    main()
