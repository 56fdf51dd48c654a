"""The gated delta rule's kernel (`src/gated_delta.h`): a SIMD group per few value rows of a
head's state, the rows in registers for the whole time loop. Three variants: the final state,
every step's state (rounded to a storage dtype), and a slot pool read and written in place."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from . import Target
from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, launch, metal_limit_reason

_ROUND = {dtypes.float16: "round_half(x)", dtypes.bfloat16: "round_bfloat(x)", dtypes.float32: "(x)"}


@dataclass(frozen=True)
class Launch:
    """A threadgroup of `warps` SIMD groups, each serving `rows` value rows of a head's state."""
    warps: int
    rows: int


def plan(steps: int) -> Launch:
    """The launch for a call of `steps` steps: a decode step (few steps) reads the key and query
    once for four rows (2 x 4); a prefill runs more SIMD groups, each with a shorter chain per step
    (4 x 1). From the H200 sweep (`tools/tune_gated_delta.py`, `benchmarks/gated_delta_h200.md`).
    A row's arithmetic is the same in every launch, so its bits are too."""
    return Launch(2, 4) if steps <= 16 else Launch(4, 1)


def unsupported(types: tuple[DType, ...], batch: int, steps: int, value_heads: int, key_dim: int, value_dim: int,
                target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): float16, bfloat16 or
    float32 everywhere (`types`: the inputs', the state's and the steps' storage), bfloat16 only
    where the target has bfloat, Dk a multiple of 32, nothing empty (an empty call is the
    composition's), and on Metal a threadgroup within an Apple GPU's limits."""
    if 0 in (batch, steps, value_heads, value_dim): return "an empty call"
    if key_dim % 32: return f"Dk {key_dim} is not a multiple of 32"
    if any(t not in CTYPES for t in types): return "a float64 input, state or storage"
    if (reason := target.lacks(bfloat=dtypes.bfloat16 in types)) is not None: return reason
    if target.backend == "metal" and (reason := metal_limit_reason(metal_resources(plan(steps)))) is not None:
        return f"its threadgroup would take {reason}"
    return None


def metal_resources(shape: Launch) -> Resources:
    """The kernel's threadgroup on Metal for a launch shape: `shape.warps` SIMD groups and no
    threadgroup memory (each SIMD group's rows live in its registers)."""
    return Resources(32 * shape.warps, 0)


GATED_DELTA = Family("nuvec_gated_delta", ("gated_delta.h",), unsupported, plan)


def program(backend: str, types: dict[str, DType], mode: str, dk: int, dv: int, hk: int, hv: int, shape: Launch) -> Program:
    """One specialisation. types: the dtypes of `q`, `k`, `v`, `g`, `beta`, `state` (or the pool)
    and `storage` (the steps' storage; the state's dtype otherwise); mode: "final", "steps" or
    "slots"; shape: the launch (`plan`)."""
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    defines = dict(TQ=ctypes["q"], TK=ctypes["k"], TV=ctypes["v"], TG=ctypes["g"], TB=ctypes["beta"], TS=ctypes["state"],
                   TO=ctypes["storage"], DK=dk, DV=dv, HK=hk, HV=hv, EK=dk // 32, WARPS=shape.warps, ROWS=shape.rows,
                   STATE_OUT=int(mode == "final"), STEPS_OUT=int(mode == "steps"), SLOTS=int(mode == "slots"))
    defines["ROUND_STORAGE(x)"] = _ROUND[types["storage"]]
    for which, key in (("S", "state"), ("O", "storage"), ("K", "k"), ("Q", "q")):
        defines.update(chunks(which, dk * types[key].itemsize, dk // 32 * types[key].itemsize))
    if mode == "slots":
        params = [Param("y", "out", ctypes["q"]), Param("pool", "out", ctypes["state"])]
    else:
        params = [Param("y", "out", ctypes["q"]), Param("state_out", "out", ctypes["state"]) if mode == "final" else
                  Param("states", "out", ctypes["storage"])]
    params += [Param(name, "in", ctypes[name]) for name in ("q", "k", "v", "g", "beta")]
    params += [Param("slots", "in", "int")] if mode == "slots" else [Param("state_in", "in", ctypes["state"])]
    params.append(Param("ints", "in", "int"))
    return GATED_DELTA.program(backend, defines, params)


def gated_delta_kernel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, *, backend: str,
                       storage: DType | None = None, slots: Tensor | None = None, composition: Callable | None = None,
                       shape: Launch | None = None) -> tuple[Tensor, Tensor]:
    """Launch the rule. Shapes as `fast.gated_delta` (validated there); `state` is the `[B, Hv,
    Dv, Dk]` state, or with `slots` the `[P, Hv, Dv, Dk]` pool (updated in place). Returns `(y,
    final state)`, `(y, states [B, T, Hv, Dv, Dk] in storage)` with `storage`, or `(y, pool)`.
    composition: the same rule from tensor operations, `(q, k, v, g, beta, state) -> (y, second
    output)`, whose gradient is the kernel's backward (the slot pool, updated in place, has none).
    shape: the launch (default `plan(T)`; tuning passes others, which change no bit)."""
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    device = q.device
    mode = "slots" if slots is not None else "steps" if storage is not None else "final"
    out_storage = storage if storage is not None else state.dtype
    types = dict(q=q.dtype, k=k.dtype, v=v.dtype, g=g.dtype, beta=beta.dtype, state=state.dtype, storage=out_storage)
    shape = shape or plan(steps)
    kernel = program(backend, types, mode, dk, dv, hk, hv, shape)
    y = Tensor.empty(b, steps, hv, dv, dtype=q.dtype, device=device)
    ins = [q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()]
    if mode == "slots":
        outs = [y, state]
        ins.append(slots.cast(dtypes.int32).contiguous())
        runtime = (steps, state.shape[0])
    else:
        outs = [y, Tensor.empty(b, hv, dv, dk, dtype=state.dtype, device=device) if mode == "final" else
                Tensor.empty(b, steps, hv, dv, dk, dtype=out_storage, device=device)]
        ins.append(state.contiguous())
        runtime = (steps,)
    backward = None
    if composition is not None and mode != "slots":
        backward = Backward("gated_delta", composition, tuple(ins), wrt=tuple(range(6)))
    ins.append(int_buffer(device, runtime))
    grid = (math.ceil(dv / (shape.warps * shape.rows)), hv, b)
    return tuple(launch(kernel, device, outs, ins, grid, 32 * shape.warps, backward=backward, in_place=mode == "slots",
                        label=f"{backend} gated_delta {mode} Dk{dk} Dv{dv} Hk{hk} Hv{hv}"))
