"""The gated delta rule (`python -m nuvec_tg.bench gated_delta`): a decode step (T = 1) at
Qwen3.5-9B's sizes (Hk 16, Hv 32, Dk = Dv = 128, bfloat16 q/k/v, float32 g, beta and state) for
B in {1, 8, 64, 256}, and a 512-token prefill chunk at B = 1: nuvec_tg, tinygrad's composition
and flash-linear-attention's fused recurrent kernel (when importable), timed on the device, with
the bytes moved per second (the state read and written once, the inputs and outputs) and the
fraction of peak bandwidth. Compositions (a chain of kernels per step) are timed up to 16 steps,
so without the kernel the prefill row has no nuvec time."""
from __future__ import annotations

import numpy as np
from tinygrad import Device, Tensor, dtypes

from .. import fast
from ..kernels import compositions_only, kernels_enabled
from ..kernels import kernel_backend
from .common import COPIES, MAX_CALLS, Rotation, cuda_torch, l2_marker, optional_us, part_of, rate_cells, release_torch, \
    rotation, start_table, time_jit, torch_graph_seconds

COMPOSED_MAX_STEPS = 16


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


def time_fla(b, t, hk, hv, dk, dv, repeats: int, max_calls: int = MAX_CALLS) -> float | None:
    """flash-linear-attention's `fused_recurrent_gated_delta_rule` per call (rotated as `inputs`), or None."""
    torch = cuda_torch()
    if torch is None: return None
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    turn = rotation(moved_bytes(b, t, hk, hv, dk, dv), max_calls=max_calls)
    made = [dict(q=torch.nn.functional.normalize(torch.randn(b, t, hk, dk, device="cuda"), dim=-1).bfloat16(),
                 k=torch.nn.functional.normalize(torch.randn(b, t, hk, dk, device="cuda"), dim=-1).bfloat16(),
                 v=torch.randn(b, t, hv, dv, device="cuda").bfloat16(),
                 g=torch.empty(b, t, hv, device="cuda").uniform_(0.9, 1.0).log(),   # fla's decay is in log space
                 beta=torch.rand(b, t, hv, device="cuda"),
                 initial_state=0.1 * torch.randn(b, hv, dk, dv, device="cuda")) for _ in range(turn.sets)]

    def run():
        for i in range(turn.calls):
            fused_recurrent_gated_delta_rule(**made[i % turn.sets], scale=1.0, output_final_state=True)
    try:
        return torch_graph_seconds(run, turn.calls, repeats)
    except Exception as error:  # noqa: BLE001 - an fla version without grouped value heads, say
        print(f"flash-linear-attention failed: {error}", flush=True)
        return None


def run(args) -> list[str]:
    hk, hv, dk, dv = 16, 32, 128, 128
    grid = [(b, 1) for b in (1, 8, 64, 256)] + [(1, 512)]
    if args.quick: grid = [(1, 1), (8, 1)]
    if args.small: hk, hv, dk, dv, grid = 2, 4, 32, 32, [(1, 1), (2, 3)]
    grid = part_of(grid, args.part, args.batches)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    fla_seconds = {shape: time_fla(*shape, hk, hv, dk, dv, args.repeats, max_calls) for shape in grid}
    release_torch()
    lines, peak = start_table(
        f"Gated delta rule (Hk {hk}, Hv {hv}, Dk {dk}, Dv {dv}; bf16 q/k/v, float32 g, beta and state)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated inputs: TinyJit for ours, a CUDA graph "
        "for flash-linear-attention), bytes moved per second and share of peak",
        ["B", "T", "nuvec µs", "TB/s", "% peak", "composition µs", "fla µs", "vs fla"], max_calls)
    rng = np.random.default_rng(0)
    kernel = kernels_enabled() and kernel_backend(Device.DEFAULT) is not None
    for b, t in grid:
        moved = moved_bytes(b, t, hk, hv, dk, dv)
        turn = rotation(moved, max_calls=max_calls)  # fla's calls rotate alike
        calls = inputs(rng, b, t, hk, hv, dk, dv, turn)
        step = lambda *x: fast.gated_delta(*x)  # noqa: E731
        ours = time_jit(step, calls, args.repeats) if kernel or t <= COMPOSED_MAX_STEPS else None
        with compositions_only():
            composed = time_jit(step, calls, max(2, args.repeats // 2)) if t <= COMPOSED_MAX_STEPS else None
        fla = fla_seconds[(b, t)]
        row = f"| {b}{l2_marker(turn)} | {t} | " + (rate_cells(ours, moved, peak) if ours else "- | - | - |")
        row += " " + optional_us(composed) + " " + optional_us(fla)
        row += f" {fla / ours:.2f}x |" if ours and fla else " - |"
        print(row, flush=True)
        lines.append(row)
        del calls
    return lines
