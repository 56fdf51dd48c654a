"""Where one jitted decode step's time goes (issue 26): `generate_tokens`' prefill and decode
(greedy, its steps chained on the device), then the captured step's kernels (how many, in
how many graphs, how many of the graphs' nodes are re-parameterised at every replay), each
kernel's device time run alone (summed by name, largest first), what each family costs inside the
step's graph (the step rebuilt as one graph without it), and three wall clocks per step:
as `Model.generate_tokens` runs it (token from the host, result read back), the replay alone
(the jit call's host time until it returns, then its device wait), and steps chained on the
device (each step's tokens the previous one's output, one synchronisation at the end: what a
pipelined loop could reach).

Usage: DEV=CUDA python3 tools/profile_decode_step.py [--config qwen3_8b] [--format q4|dense]
       [--batch 1] [--prompt 512] [--steps 32] [--top 25] [--small] [--profile N]
(JIT_BATCH_SIZE=0 in the environment captures the step as one graph instead of tinygrad's
batches of 32, 64, 128, ...)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections import defaultdict

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.engine.jit import _prepare_jit_inputs, create_graph_call
from tinygrad.helpers import ansistrip
from tinygrad.engine.realize import ExecContext, get_graph_runtime, pm_exec, resolve_params
from tinygrad.uop.ops import Ops

from nuvec_tg import models
from nuvec_tg.bench.common import is_gpu
from nuvec_tg.bench.model import CONFIGS, FORMATS, SMALL_CONFIGS


def kernel_calls(linear):
    """The captured linear's calls with graphs opened: (graph index or None, call)."""
    for index, call in enumerate(linear.src):
        ast = call.src[0]
        if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
            for inner in ast.src[0].src: yield index, inner
        else: yield None, call


def call_name(call) -> str:
    ast = call.src[0]
    if ast.op is Ops.PROGRAM: return ansistrip(ast.arg.name)
    return "copy" if ast.op is Ops.COPY else str(ast.arg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3_8b")
    parser.add_argument("--format", default="q4", choices=list(FORMATS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sequence", default="", help="FIRST,COUNT: also list those kernels in launch order with their buffers' sizes")
    parser.add_argument("--small", action="store_true", help="the tiny config of the same family")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also the replays' host time under cProfile: the N functions of most time of their own")
    args = parser.parse_args()
    config = (SMALL_CONFIGS if args.small else CONFIGS)[args.config]
    dtype = dtypes.bfloat16 if is_gpu() else dtypes.float32
    print(f"{args.config} {args.format} B={args.batch} prompt {args.prompt} on {Device.DEFAULT}", flush=True)
    model = models.random_model(config, dtype=dtype, quantize=FORMATS[args.format])
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    for attempt in ("first (compiles)", "second"):   # as a user runs it: generate_tokens, greedy
        list(model.generate_tokens(prompt.tolist(), max_tokens=args.steps, stop_tokens=()))
        stats = model.last_generation
        print(f"generate_tokens, {attempt}: prefill {stats.prompt_seconds * 1e3:.1f} ms "
              f"({stats.prompt_tokens / stats.prompt_seconds:.0f} tokens/s), decode "
              f"{stats.generation_seconds / (args.steps - 1) * 1e3:.3f} ms a step "
              f"({stats.generated_tokens / stats.generation_seconds:.1f} tokens/s)", flush=True)
    cache = model.make_cache(args.batch, -(-(args.prompt + 3 * args.steps + 8) // 256) * 256)
    model(prompt, cache=cache)[:, -1].argmax(-1).numpy()
    token = Tensor(np.zeros((args.batch, 1), dtype=np.int32), device=model.device)

    # as generate_tokens runs it: the first two steps run eagerly and capture
    walls = []
    for _ in range(args.steps):
        began = time.perf_counter()
        out = model._step(cache, Tensor(np.zeros((args.batch, 1), dtype=np.int32), device=model.device), greedy=True).numpy()
        walls.append(time.perf_counter() - began)
    jit, length = cache.steps["greedy"], cache.steps["length"]
    print(f"generate's step: first two {walls[0] * 1e3:.1f} / {walls[1] * 1e3:.1f} ms, "
          f"median after {statistics.median(walls[2:]) * 1e3:.3f} ms", flush=True)

    # the replay alone: host time until the call returns, then the device's remainder
    hosts, totals = [], []
    for _ in range(args.steps):
        cache.position += 1
        token = token.contiguous().realize()
        Device[model.device].synchronize()
        began = time.perf_counter()
        jit(token, length.bind(cache.position))
        hosts.append(time.perf_counter() - began)
        Device[model.device].synchronize()
        totals.append(time.perf_counter() - began)
    print(f"replay: host {statistics.median(hosts) * 1e3:.3f} ms until the call returns, "
          f"{statistics.median(totals) * 1e3:.3f} ms with the device's wait", flush=True)
    if args.profile:   # where the host's time of a replay goes (issue 26): tinygrad's and the driver's calls
        profiler = cProfile.Profile()
        for _ in range(args.steps):
            cache.position += 1
            Device[model.device].synchronize()
            profiler.enable()
            jit(token, length.bind(cache.position))
            profiler.disable()
        Device[model.device].synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        print(f"replay host time under cProfile, {args.steps} replays, the {args.profile} functions of most time of their own:")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip()), flush=True)

    # chained on the device: one synchronisation for all the steps
    Device[model.device].synchronize()
    began = time.perf_counter()
    for _ in range(args.steps):
        cache.position += 1
        out = jit(token, length.bind(cache.position))
        token = out.reshape(args.batch, 1).contiguous().realize()
    Device[model.device].synchronize()
    print(f"chained: {(time.perf_counter() - began) / args.steps * 1e3:.3f} ms a step", flush=True)

    # the captured step's kernels, each run alone with a device wait
    captured = jit.captured
    inputs, var_vals, _, _ = _prepare_jit_inputs((token, length.bind(cache.position)), {})
    calls = list(kernel_calls(captured.linear))
    graphs = [c for c in captured.linear.src if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph"]
    updatable = sum(len(getattr(get_graph_runtime(g.src[0]), "updatable", [])) for g in graphs)
    print(f"captured: {len(calls)} kernels, {len(graphs)} graphs of "
          f"{[len(g.src[0].src[0].src) for g in graphs]}, {updatable} nodes re-parameterised a replay, "
          f"{len(captured.linear.src) - len(graphs)} calls outside graphs", flush=True)
    if args.sequence:
        first, count = (int(n) for n in args.sequence.split(","))
        for index, (_, call) in enumerate(calls[first:first + count], start=first):
            sizes = [u.buffer.size for u in resolve_params(call, tuple(inputs))]
            print(f"  {index:4d} {call_name(call):40s} buffers {sizes}")
    context = ExecContext(var_vals, tuple(inputs), update_stats=False, jit=True, wait=True)
    per_name: dict[str, list[float]] = defaultdict(list)
    for _ in range(2):   # the first run warms caches; the second is kept
        per_name.clear()
        for _, call in calls:
            per_name[call_name(call)].append(sum(t or 0.0 for t in pm_exec.rewrite(call, context) or []))
    total = sum(sum(v) for v in per_name.values())
    print(f"kernels alone: {total * 1e3:.3f} ms device time in all", flush=True)
    for name, times in sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:args.top]:
        print(f"  {sum(times) * 1e3:8.3f} ms {100 * sum(times) / total:5.1f}%  x{len(times):<4d} {name}")
    if graphs: ablation(calls, per_name, context, args.top)


def ablation(calls, per_name: dict[str, list[float]], context: ExecContext, top: int) -> None:
    """What each kernel family costs inside the step's graph: the captured kernels rebuilt as one graph,
    then without that family's kernels, each timed best of 5 replays. A kernel run alone pays a launch
    and an idle device around it (about 10 µs on the H200 whatever it does); inside a graph it pays its
    own time plus the gap to the next, which is what a step loses or saves by it. The values the
    remaining kernels compute are wrong then, their time is not: no kernel's work depends on values.
    A family's kernels are also the graph's edges between its neighbours: without them later kernels
    may run beside earlier ones, and where that costs more than the family a saving comes out
    negative (the rows, not their sum, are what this says)."""
    def graph_time(kept) -> float:
        graph = create_graph_call([call for _, call in kept])
        return min(sum(t or 0.0 for t in pm_exec.rewrite(graph, context) or []) for _ in range(5))
    whole = graph_time(calls)
    print(f"in one graph: {whole * 1e3:.3f} ms a step; without each family (the top {top} by time alone):", flush=True)
    for name, times in sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        saved = whole - graph_time([(g, call) for g, call in calls if call_name(call) != name])
        print(f"  {saved * 1e3:8.3f} ms {100 * saved / whole:5.1f}%  x{len(times):<4d} "
              f"{saved / len(times) * 1e6:6.1f} µs each  {name}", flush=True)


if __name__ == "__main__":
    main()
