"""The gated delta rule's kernel (`src/gated_delta.h`): a SIMD group per few value rows of a
head's state, the rows in registers for the whole time loop. Three variants: the final state,
every step's state (rounded to a storage dtype), and a slot pool read and written in place."""
from __future__ import annotations

import hashlib
import math

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .program import CTYPES, Param, chunks, int_buffer, launch, prelude, specialise

_ROUND = {dtypes.float16: "round_half(x)", dtypes.bfloat16: "round_bfloat(x)", dtypes.float32: "(x)"}

LAUNCH: tuple[int, int] | None = None  # (SIMD groups, rows per SIMD group) for every call: a sweep sets it


def launch_shape(steps: int) -> tuple[int, int]:
    """(SIMD groups per threadgroup, value rows per SIMD group) for a call of `steps` steps.

    From the H200 sweep (`scripts/tune_gated_delta.py`, Qwen3.5-9B sizes, float32 state): a decode
    step runs best with 2 x 4, the key and query read once for four rows and more of the state in
    flight per SIMD group (B = 8: 9.1 µs against 10.1 for 4 x 1; B = 256: 260 against 301); the
    512-token prefill with 4 x 1, more SIMD groups each with a shorter chain per step (B = 1:
    344 µs against 387). A row's arithmetic is the same in every shape, so the bits are too."""
    if LAUNCH is not None: return LAUNCH
    return (2, 4) if steps <= 16 else (4, 1)


def supported(*tensors: Tensor, key_dim: int, storage: DType | None = None) -> bool:
    """Whether the kernel takes these inputs: float16/bfloat16/float32 everywhere, Dk a multiple of 32."""
    return key_dim % 32 == 0 and all(t.dtype in CTYPES for t in tensors) and (storage is None or storage in CTYPES)


def _backward(composition, output_shapes: tuple[tuple[int, ...], tuple[int, ...]]):
    """The kernel call's backward: the gradient of `composition(q, k, v, g, beta, state) -> (y,
    second output)` on detached copies of the call's inputs (arguments 2..7).

    tinygrad passes only the outputs' gradients that exist, so each is matched to its output by
    shape; when the two outputs have one shape and only one gradient exists, that is ambiguous
    and raises."""
    def grad_fxn(*args, call=None):
        *grads, call = args if call is None else (*args, call)
        q, k, v, g, beta, state = (Tensor(call.src[1 + i]).detach() for i in range(2, 8))
        outputs = composition(q, k, v, g, beta, state)
        if len(grads) == 1 and output_shapes[0] == output_shapes[1]:
            raise ValueError("gated_delta: a gradient of one output of the kernel whose outputs share a shape is ambiguous; "
                             "run with nuvec_tg.kernels.compositions_only()")
        loss = None
        for grad in grads:
            index = 0 if tuple(grad.shape) == output_shapes[0] else 1
            term = (outputs[index].cast(dtypes.float32) * Tensor(grad).cast(dtypes.float32)).sum()
            loss = term if loss is None else loss + term
        targets = [q, k, v, g, beta, state]
        result: list = [None] * (len(call.src) - 1)
        for index, grad in zip(range(2, 8), loss.gradient(*targets)):
            result[index] = grad.cast(targets[index - 2].dtype).uop
        return tuple(result)
    return grad_fxn


def program(backend: str, types: dict[str, DType], mode: str, dk: int, dv: int, hk: int, hv: int,
            warps: int, rows: int) -> tuple[str, str, list[Param]]:
    """The kernel's name, text (without the prelude) and parameters for one specialisation.

    types: the dtypes of `q`, `k`, `v`, `g`, `beta`, `state` (or the pool) and `storage` (the
    steps' storage; the state's dtype otherwise); mode: "final", "steps" or "slots"; warps, rows:
    the launch shape (`launch_shape`)."""
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    defines = dict(TQ=ctypes["q"], TK=ctypes["k"], TV=ctypes["v"], TG=ctypes["g"], TB=ctypes["beta"], TS=ctypes["state"],
                   TO=ctypes["storage"], DK=dk, DV=dv, HK=hk, HV=hv, EK=dk // 32, WARPS=warps, ROWS=rows,
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
    text = specialise(backend, "nuvec_gated_delta", "gated_delta.h", defines, params)
    name = f"nuvec_gated_delta_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return name, text.replace("nuvec_gated_delta(", f"{name}("), params


def gated_delta_kernel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, *, backend: str,
                       storage: DType | None = None, slots: Tensor | None = None, composition=None) -> tuple[Tensor, Tensor]:
    """Launch the rule. Shapes as `fast.gated_delta` (validated there); `state` is the `[B, Hv,
    Dv, Dk]` state, or with `slots` the `[P, Hv, Dv, Dk]` pool (updated in place). Returns `(y,
    final state)`, `(y, states [B, T, Hv, Dv, Dk] in storage)` with `storage`, or `(y, pool)`.
    composition: the same rule from tensor operations, `(q, k, v, g, beta, state) -> (y, second
    output)`, whose gradient is the kernel's backward (the slot pool, updated in place, has none)."""
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    device = q.device
    mode = "slots" if slots is not None else "steps" if storage is not None else "final"
    out_storage = storage if storage is not None else state.dtype
    types = dict(q=q.dtype, k=k.dtype, v=v.dtype, g=g.dtype, beta=beta.dtype, state=state.dtype, storage=out_storage)
    warps, rows = launch_shape(steps)
    name, text, _ = program(backend, types, mode, dk, dv, hk, hv, warps, rows)
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
    ins.append(int_buffer(device, runtime))
    grid = (math.ceil(dv / (warps * rows)), hv, b)
    backward = None
    if composition is not None and mode != "slots":
        backward = _backward(composition, (tuple(outs[0].shape), tuple(outs[1].shape)))
    return tuple(launch(name, prelude(backend) + text, device, outs, ins, [], grid, (32 * warps, 1, 1), grad_fxn=backward,
                        label=f"{backend} gated_delta {mode} Dk{dk} Dv{dv} Hk{hk} Hv{hv}", in_place=mode == "slots"))
