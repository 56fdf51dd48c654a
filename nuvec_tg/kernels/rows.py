"""Row operations' kernels: the RMS norm, alone or fused with the residual add, and the layer norm
(`src/norm.h`), and the residual add of a normalised branch normalised again (`src/residual_norm.h`,
Gemma's sandwich norms): one threadgroup per row, its threads taking pieces of 8 consecutive elements (16
bytes of a 16-bit row), kept in registers from the load to the store where the row fits, the sums
in float32."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor
from tinygrad.dtype import DType

from . import Target
from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, kernel_input, launch, threadgroup_array

MAX_THREADS = 1024
VEC = 8          # elements of a piece where the row length allows (a multiple of VEC)
MAX_HELD = 4     # pieces a thread keeps in registers; longer rows are read again for each pass


@dataclass(frozen=True)
class Launch:
    """A row's threadgroup: `threads` threads, pieces of `vec` elements, each thread holding
    `per` pieces in registers (`cached`) or looping over the row (not `cached`)."""
    threads: int
    vec: int
    per: int
    cached: bool


def plan(length: int) -> Launch:
    """The launch for rows of `length` elements, from the length alone (never the row count, so a
    row's bits do not depend on the batch): pieces of 8 where the length is a multiple of 8 (else
    single elements), about two pieces a thread (one SIMD group at least, 1024 threads at most),
    held in registers up to four pieces a thread, looping beyond (65536-element rows)."""
    vec = VEC if length % VEC == 0 else 1
    pieces = math.ceil(length / vec)
    threads = min(MAX_THREADS, max(32, 32 * math.ceil(pieces / 64)))
    per = math.ceil(pieces / threads)
    return Launch(threads, vec, min(per, MAX_HELD), per <= MAX_HELD)


def unsupported(types: tuple[DType, ...], rows: int, length: int, target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): float16, bfloat16 or
    float32 everywhere, bfloat16 only where the target has it, nothing empty, rows and elements
    indexable by int32."""
    if rows == 0 or length == 0: return "an empty call"
    if any(t not in CTYPES for t in types): return "a float64 or integer input or parameter"
    if rows * length >= 2 ** 31: return f"{rows} rows of {length} exceed int32 indexing"
    return target.lacks(bfloat=any(CTYPES[t] == "bfloat" for t in types))


def metal_resources(shape: Launch) -> Resources:
    """The threadgroup on Metal: its threads and the SIMD groups' partial sums."""
    return Resources(shape.threads, threadgroup_array(shape.threads // 32, 4))


RMS_NORM = Family("nuvec_rms_norm", ("pieces.h", "norm.h"), unsupported, plan)
LAYER_NORM = Family("nuvec_layer_norm", ("pieces.h", "norm.h"), unsupported, plan)
RESIDUAL_NORM = Family("nuvec_residual_norm", ("pieces.h", "residual_norm.h"), unsupported, plan)

# Each buffer's define prefix in norm.h, in the parameters' order.
_BUFFERS = {"h": "H", "y": "O", "x": "X", "residual": "R", "weight": "W", "bias": "B"}


def norm_program(backend: str, kind: str, types: dict[str, DType], eps: float, shape: Launch) -> Program:
    """One specialisation. kind: "rms" or "layer". types: the dtypes of `x`, `y` and, where
    present, `residual` and `h` (the fused add; "rms" only), `weight`, `bias` ("layer" only).
    eps: a float32 literal in the text (one program per eps). shape: the launch (`plan`)."""
    if kind not in ("rms", "layer"): raise ValueError(f"norm_program: unknown kind {kind!r}")
    if ("residual" in types and kind != "rms") or ("bias" in types and kind != "layer"):
        raise ValueError(f"norm_program: a {kind} norm takes no {'residual' if 'residual' in types else 'bias'}")
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    defines: dict[str, object] = dict(LAYER=int(kind == "layer"), ADD=int("residual" in types), WEIGHT=int("weight" in types),
                                      BIAS=int("bias" in types), THREADS=shape.threads, VEC=shape.vec, PER=shape.per,
                                      CACHED=int(shape.cached), EPS=f"{float(eps)!r}f")
    params = []
    for name, prefix in _BUFFERS.items():
        if name not in types: continue
        defines[f"T{prefix}" if prefix != "O" else "TO"] = ctypes[name]
        itemsize = types[name].itemsize
        defines.update(chunks(prefix, shape.vec * itemsize, shape.vec * itemsize))
        params.append(Param(name, "out" if name in ("h", "y") else "in", ctypes[name]))
    params.append(Param("ints", "in", "int"))
    return (RMS_NORM if kind == "rms" else LAYER_NORM).program(backend, defines, params)


def norm_kernel(kind: str, x: Tensor, eps: float, out_dtype: DType, *, backend: str, weight: Tensor | None = None,
                bias: Tensor | None = None, residual: Tensor | None = None, h_dtype: DType | None = None,
                composition: Callable | None = None, shape: Launch | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Launch a norm over `x`'s last axis (shapes and dtypes checked by the operation; `x` and
    `residual` of one shape, `weight` and `bias` `[D]`). Returns `y` in `out_dtype`, or with
    `residual` `(h, y)`, `h = x + residual` in `h_dtype`. composition: the operation from tensor
    operations on the same arguments (x, residual, weight, bias: those given, in that order),
    returning what the call returns, its backward. shape: the launch (default `plan(D)`; tuning
    passes others)."""
    launch_shape = shape or plan(x.shape[-1])
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    types, ins = dict(x=x.dtype, y=out_dtype), [kernel_input(x)]
    for name, given in (("residual", residual), ("weight", weight), ("bias", bias)):
        if given is None: continue
        types[name] = given.dtype
        ins.append(kernel_input(given))
    if residual is not None: types["h"] = h_dtype
    program = norm_program(backend, kind, types, eps, launch_shape)
    # h's buffer has one more (leading) axis than y's: a gradient reaching only one of the two is
    # then told apart by its shape (`program.Backward`).
    outs = ([Tensor.empty(1, *shape, dtype=h_dtype, device=device)] if residual is not None else []) + \
        [Tensor.empty(*shape, dtype=out_dtype, device=device)]
    backward = None
    if composition is not None:
        def differentiable(*args: Tensor) -> Tensor | tuple[Tensor, Tensor]:
            result = composition(*args)
            return (result[0].reshape(1, *shape), result[1]) if residual is not None else result
        backward = Backward(f"{kind}_norm", differentiable, tuple(ins), wrt=tuple(range(len(ins))))
    ins.append(int_buffer(device, (length, rows)))
    label = f"{backend} {kind}_norm{' add' if residual is not None else ''} {rows}x{length}"
    results = launch(program, device, outs, ins, (rows, 1, 1), launch_shape.threads, backward=backward, label=label)
    return (results[0].reshape(shape), results[1]) if residual is not None else results[0]


# residual_norm.h's buffers and their define prefixes, in the parameters' order.
_RESIDUAL_BUFFERS = {"s": "S", "y": "O", "x": "X", "h": "H", "weight": "W", "scale": "C", "next_weight": "V"}


def residual_norm_program(backend: str, types: dict[str, DType], eps: float, shape: Launch, *,
                          scale: float | None = None, next_eps: float | None = None) -> Program:
    """One specialisation of `s = (h + rms_norm(x, weight, eps)) * scale`, `y = rms_norm(s,
    next_weight, next_eps)`. types: the dtypes of `x`, `h`, `weight`, `normed` (the branch's
    result, no buffer), `s`, and where present `scale` (a one-element tensor), `y` and
    `next_weight` (with `next_eps`). scale: a number written into the text (one program per
    value; None without, or with a `scale` tensor). eps, next_eps: float32 literals."""
    if ("y" in types) != ("next_weight" in types) or ("y" in types) != (next_eps is not None):
        raise ValueError("residual_norm_program: y, next_weight and next_eps come together")
    if scale is not None and "scale" in types:
        raise ValueError("residual_norm_program: a scale is a number or a tensor, not both")
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    scale_kind = 2 if "scale" in types else 1 if scale is not None else 0
    defines: dict[str, object] = dict(TN=ctypes["normed"], SCALE=scale_kind, NEXT=int("y" in types), THREADS=shape.threads,
                                      VEC=shape.vec, PER=shape.per, CACHED=int(shape.cached), EPS=f"{float(eps)!r}f")
    if scale is not None: defines["SCALE_VALUE"] = f"{float(scale)!r}f"
    if next_eps is not None: defines["NEXT_EPS"] = f"{float(next_eps)!r}f"
    params = []
    for name, prefix in _RESIDUAL_BUFFERS.items():
        if name not in types: continue
        defines[f"T{prefix}"] = ctypes[name]
        if name != "scale":
            defines.update(chunks(prefix, shape.vec * types[name].itemsize, shape.vec * types[name].itemsize))
        params.append(Param(name, "out" if name in ("s", "y") else "in", ctypes[name]))
    params.append(Param("ints", "in", "int"))
    return RESIDUAL_NORM.program(backend, defines, params)


def residual_norm_kernel(h: Tensor, x: Tensor, weight: Tensor, eps: float, normed_dtype: DType, s_dtype: DType, *,
                         backend: str, scale: Tensor | float | None = None,
                         next: tuple[Tensor, float, DType] | None = None,
                         composition: Callable | None = None) -> tuple[Tensor, Tensor | None]:
    """Launch `fast.residual_rms_norm` (checked there; `h` and `x` of one shape `[..., D]`,
    `weight` `[D]`). scale: None, a number or a one-element tensor. next: `(weight2, eps2, y's
    dtype)` or None. Returns `(s, y)`, `y` None without `next`. composition: the operation from
    tensor operations on the tensors read (h, x, weight, then the scale tensor and next weight
    where given), returning `(s, y)` (`s` alone without `next`), its backward."""
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    launch_shape = plan(length)
    types = dict(x=x.dtype, h=h.dtype, weight=weight.dtype, normed=normed_dtype, s=s_dtype)
    ins = [kernel_input(x), kernel_input(h), kernel_input(weight)]
    if isinstance(scale, Tensor):
        types["scale"] = scale.dtype
        ins.append(scale.reshape(1).contiguous())
    if next is not None:
        types.update(y=next[2], next_weight=next[0].dtype)
        ins.append(kernel_input(next[0]))
    program = residual_norm_program(backend, types, eps, launch_shape, scale=None if isinstance(scale, Tensor) else scale,
                                    next_eps=None if next is None else next[1])
    # With y, s's buffer has one more (leading) axis: a gradient reaching only one of the two is
    # then told apart by its shape (`program.Backward`).
    outs = [Tensor.empty(*((1,) if next is not None else ()), *shape, dtype=s_dtype, device=device)]
    if next is not None: outs.append(Tensor.empty(*shape, dtype=next[2], device=device))
    backward = None
    if composition is not None:
        def differentiable(x: Tensor, h: Tensor, *rest: Tensor) -> Tensor | tuple[Tensor, Tensor]:
            result = composition(h, x, *rest)
            return (result[0].reshape(1, *shape), result[1]) if next is not None else result
        backward = Backward("residual_rms_norm", differentiable, tuple(ins), wrt=tuple(range(len(ins))))
    ins.append(int_buffer(device, (length, rows)))
    label = f"{backend} residual_norm{' next' if next is not None else ''} {rows}x{length}"
    results = launch(program, device, outs, ins, (rows, 1, 1), launch_shape.threads, backward=backward, label=label)
    return (results[0].reshape(shape), results[1]) if next is not None else (results[0], None)
