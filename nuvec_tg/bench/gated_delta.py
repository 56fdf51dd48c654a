"""The gated delta rule (`python -m nuvec_tg.bench gated_delta`) at Qwen3.5-9B's sizes (Hk 16, Hv
32, Dk = Dv = 128, bfloat16 q/k/v, float32 g, beta and state), in two tables.

Decode: a step (T = 1) for B in {1, 8, 64, 256}: nuvec_tg (`fast.gated_delta`), tinygrad's
composition and flash-linear-attention's `fused_recurrent_gated_delta_rule` (when importable), with
the bytes moved per second (the state read and written once, the inputs and outputs once) and the
fraction of peak bandwidth.

Prefill: prompts of T = 512, 2048, 8192 and 32768 tokens at B = 1 and 2048 at B = 8: ours as the
plan routes it (`fast.gated_delta`: the chunked kernel for long prompts, the recurrent one
otherwise) with the route it took and its tokens per second; our recurrent kernel forced (launch
`RECURRENT`); flash-linear-attention's `chunk_gated_delta_rule` and its fused recurrent kernel; and
fla's chunked and our recurrent times over ours.

Method, both tables: each side's calls over distinct input sets rotated past twice the L2
(`common.rotation` of the bytes a call moves), ours replayed as one TinyJit graph and timed on the
device, fla's captured as one CUDA graph after warm-up calls (where Triton autotunes) and timed
with CUDA events; best of the repeats, each started on warm clocks. fla gets the same sizes with
its decay in log space, its state `[B, Hv, Dk, Dv]`, its grouped value heads (Hv > Hk) natively and
scale 1 (ours does not scale q). fla is timed first, for every row, before tinygrad opens the GPU.
Compositions (a chain of kernels per step) are timed up to `COMPOSED_MAX_STEPS` steps only, so
without the kernel (on the CPU) the longer rows have no time of ours. A "-" is what could not run:
no kernel on the device, no PyTorch with a GPU, no flash-linear-attention."""
from __future__ import annotations

import numpy as np
from tinygrad import Device, Tensor, dtypes

from .. import fast
from ..kernels import compositions_only, kernels_enabled
from ..kernels import gated_delta as kernel
from ..kernels import kernel_backend
from .common import COPIES, MAX_CALLS, Rotation, cuda_torch, l2_marker, optional_us, part_of, rate_cells, release_torch, \
    rotation, start_table, time_jit, torch_graph_seconds

COMPOSED_MAX_STEPS = 16
RECURRENT = kernel.Launch(4, 1)  # the recurrent kernel's prefill launch, forced for the prefill table's recurrent column
FUSED_RECURRENT, CHUNKED = "fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule"  # fla's kernels
DECODE = [(b, 1) for b in (1, 8, 64, 256)]
PREFILL = [(1, 512), (1, 2048), (1, 8192), (1, 32768), (8, 2048)]


def moved_bytes(b: int, t: int, hk: int, hv: int, dk: int, dv: int) -> int:
    """The least a call moves: the float32 state once each way, bf16 q, k, v and y, float32 g and beta."""
    return 2 * b * hv * dv * dk * 4 + b * t * (2 * hk * dk * 2 + 2 * hv * dv * 2 + 2 * hv * 4)


def inputs(rng, b, t, hk, hv, dk, dv, turn: Rotation) -> list[tuple[Tensor, ...]]:
    """`turn.calls` calls' (q, k, v, g, beta, state), `turn.sets` distinct ones taken in turn; q and
    k `[b, t, hk, dk]` bf16 L2-normed as the layer feeds them, v `[b, t, hv, dv]` bf16, g in
    (0.9, 1) and beta in (0, 1) `[b, t, hv]` float32, state `[b, hv, dv, dk]` float32."""
    def make(*shape, scale=1.0):
        return Tensor(rng.standard_normal(shape, dtype=np.float32) * scale)
    made = []
    for _ in range(turn.sets):
        q, k = (make(b, t, hk, dk) for _ in range(2))
        q, k = (x / (x * x).sum(-1, keepdim=True).sqrt() for x in (q, k))
        g = Tensor(rng.uniform(0.9, 1.0, (b, t, hv)).astype(np.float32))
        beta = Tensor(rng.uniform(0.0, 1.0, (b, t, hv)).astype(np.float32))
        state = make(b, hv, dv, dk, scale=0.1)
        made.append(tuple(x.contiguous().realize() for x in (q.cast(dtypes.bfloat16), k.cast(dtypes.bfloat16),
                                                              make(b, t, hv, dv).cast(dtypes.bfloat16), g, beta, state)))
    return [made[i % turn.sets] for i in range(turn.calls)]


def time_fla(b, t, hk, hv, dk, dv, repeats: int, max_calls: int = MAX_CALLS, which: str = FUSED_RECURRENT) -> float | None:
    """flash-linear-attention's `which` (`FUSED_RECURRENT` or `CHUNKED`, from
    `fla.ops.gated_delta_rule`) per call, rotated as `inputs`, or None. Both take grouped value
    heads (Hv a multiple of Hk) as they are, the decay in log space and the state as `[B, Hv, Dk,
    Dv]`; Triton's autotuning runs in `torch_graph_seconds`' warm-up calls, before the capture."""
    torch = cuda_torch()
    if torch is None: return None
    try:
        from fla.ops import gated_delta_rule
    except ImportError:
        return None
    rule = getattr(gated_delta_rule, which)
    turn = rotation(moved_bytes(b, t, hk, hv, dk, dv), max_calls=max_calls)
    made = [dict(q=torch.nn.functional.normalize(torch.randn(b, t, hk, dk, device="cuda"), dim=-1).bfloat16(),
                 k=torch.nn.functional.normalize(torch.randn(b, t, hk, dk, device="cuda"), dim=-1).bfloat16(),
                 v=torch.randn(b, t, hv, dv, device="cuda").bfloat16(),
                 g=torch.empty(b, t, hv, device="cuda").uniform_(0.9, 1.0).log(),   # fla's decay is in log space
                 beta=torch.rand(b, t, hv, device="cuda"),
                 initial_state=0.1 * torch.randn(b, hv, dk, dv, device="cuda")) for _ in range(turn.sets)]

    def run():
        for i in range(turn.calls):
            rule(**made[i % turn.sets], scale=1.0, output_final_state=True)
    try:
        seconds = torch_graph_seconds(run, turn.calls, repeats)
    except Exception as error:  # noqa: BLE001 - an fla version that refuses the call, say
        print(f"flash-linear-attention's {which} failed at B {b} T {t}: {error}", flush=True)
        seconds = None
    made.clear()  # a 32768-token row's inputs are GBs: give them back before the next row's
    release_torch()
    return seconds


def route(shape) -> str:
    """The table's name for a launch of `kernel.route`: "recurrent 4x1" (warps x rows) or "chunked 32x4"
    (chunk x warps)."""
    if isinstance(shape, kernel.Launch): return f"recurrent {shape.warps}x{shape.rows}"
    return f"chunked {shape.chunk}x{shape.warps}"


def ratio(theirs: float | None, ours: float | None) -> str:
    return f" {theirs / ours:.2f}x |" if theirs and ours else " - |"


def grids(args) -> tuple[list[tuple[int, int]], list[tuple[int, int]], tuple[int, int, int, int]]:
    """The decode and prefill tables' (B, T) rows after --quick, --small, --part and --batches, and (Hk, Hv, Dk, Dv)."""
    sizes, decode, prefill = (16, 32, 128, 128), DECODE, PREFILL
    if args.quick: decode, prefill = [(1, 1), (8, 1)], [(1, 2048)]
    if args.small:  # tiny: the CPU runs them in the tests; 40 steps are a chunk of 32 and a tail
        sizes, decode, prefill = (2, 4, 32, 32), [(1, 1), (2, 3)], [(1, 40)]
    return part_of(decode, args.part, args.batches), part_of(prefill, args.part, args.batches), sizes


def run(args) -> list[str]:
    decode, prefill, (hk, hv, dk, dv) = grids(args)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    # PyTorch's side first, every row, before tinygrad opens the GPU
    fla = {(which, shape): time_fla(*shape, hk, hv, dk, dv, args.repeats, max_calls, which)
           for which, grid in ((FUSED_RECURRENT, decode), (FUSED_RECURRENT, prefill), (CHUNKED, prefill)) for shape in grid}
    release_torch()
    backend = kernel_backend(Device.DEFAULT) if kernels_enabled() else None
    rng = np.random.default_rng(0)
    lines = []
    if decode: lines += decode_table(args, decode, (hk, hv, dk, dv), max_calls, fla, backend is not None, rng)
    if prefill:
        if lines:
            print(flush=True)
            lines.append("")
        lines += prefill_table(args, prefill, (hk, hv, dk, dv), max_calls, fla, backend, rng)
    return lines


def decode_table(args, grid, sizes, max_calls, fla, kernel_runs: bool, rng) -> list[str]:
    """The decode table: ours, the composition and fla's fused recurrent kernel, with bytes per second."""
    hk, hv, dk, dv = sizes
    lines, peak = start_table(
        f"Gated delta rule, decode (Hk {hk}, Hv {hv}, Dk {dk}, Dv {dv}; bf16 q/k/v, float32 g, beta and state)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated inputs: TinyJit for ours, a CUDA graph "
        "for flash-linear-attention's fused recurrent kernel), bytes moved per second and share of peak",
        ["B", "T", "nuvec µs", "TB/s", "% peak", "composition µs", "fla µs", "vs fla"], max_calls)
    for b, t in grid:
        moved = moved_bytes(b, t, hk, hv, dk, dv)
        turn = rotation(moved, max_calls=max_calls)  # fla's calls rotate alike
        calls = inputs(rng, b, t, hk, hv, dk, dv, turn)
        step = lambda *x: fast.gated_delta(*x)  # noqa: E731
        ours = time_jit(step, calls, args.repeats) if kernel_runs or t <= COMPOSED_MAX_STEPS else None
        with compositions_only():
            composed = time_jit(step, calls, max(2, args.repeats // 2)) if t <= COMPOSED_MAX_STEPS else None
        theirs = fla[(FUSED_RECURRENT, (b, t))]
        row = f"| {b}{l2_marker(turn)} | {t} | " + (rate_cells(ours, moved, peak) if ours else "- | - | - |")
        row += " " + optional_us(composed) + " " + optional_us(theirs) + ratio(theirs, ours)
        print(row, flush=True)
        lines.append(row)
        del calls
    return lines


def prefill_table(args, grid, sizes, max_calls, fla, backend: str | None, rng) -> list[str]:
    """The prefill table: ours as planned (and its route), tokens per second, our recurrent kernel
    forced, fla's chunked and fused recurrent kernels, and the ratios."""
    hk, hv, dk, dv = sizes
    lines, _ = start_table(
        f"Gated delta rule, prefill (Hk {hk}, Hv {hv}, Dk {dk}, Dv {dv}; bf16 q/k/v, float32 g, beta and state)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated inputs: TinyJit for ours, a CUDA graph "
        "for flash-linear-attention's); ours: `fast.gated_delta` as the plan routes it (route: chunked chunk x "
        f"warps, or recurrent warps x rows); recurrent: our recurrent kernel forced ({RECURRENT.warps}x{RECURRENT.rows}); "
        "fla chunked: `chunk_gated_delta_rule`, fla recurrent: `fused_recurrent_gated_delta_rule` (both given Hv > Hk "
        "as grouped value heads, g in log space, scale 1); M tok/s: B x T over ours' time; vs fla chunked and vs "
        f"recurrent: their time over ours. Without a kernel ours is the composition, timed up to {COMPOSED_MAX_STEPS} "
        "steps",
        ["B", "T", "ours µs", "route", "M tok/s", "recurrent µs", "fla chunked µs", "fla recurrent µs", "vs fla chunked",
         "vs recurrent"], max_calls)

    def recurrent(q, k, v, g, beta, state):
        return kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=backend, shape=RECURRENT)
    for b, t in grid:
        turn = rotation(moved_bytes(b, t, hk, hv, dk, dv), max_calls=max_calls)  # fla's calls rotate alike
        calls = inputs(rng, b, t, hk, hv, dk, dv, turn)
        ours = time_jit(lambda *x: fast.gated_delta(*x), calls, args.repeats) \
            if backend is not None or t <= COMPOSED_MAX_STEPS else None
        taken = route(kernel.route(*calls[0][:3], "final")) if backend is not None else "composition" if ours else "-"
        forced = time_jit(recurrent, calls, args.repeats) if backend is not None else None
        chunked, fused = fla[(CHUNKED, (b, t))], fla[(FUSED_RECURRENT, (b, t))]
        row = (f"| {b}{l2_marker(turn)} | {t} | {optional_us(ours)} {taken} | "
               + (f"{b * t / ours / 1e6:.2f} |" if ours else "- |")
               + f" {optional_us(forced)} {optional_us(chunked)} {optional_us(fused)}"
               + ratio(chunked, ours) + ratio(forced, ours))
        print(row, flush=True)
        lines.append(row)
        del calls
    return lines
