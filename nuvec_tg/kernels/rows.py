"""Row operations' kernels: the RMS norm, alone or fused with the residual add, and the layer norm
(`src/norm.h`): one threadgroup per row, its threads taking pieces of 8 consecutive elements (16
bytes of a 16-bit row), kept in registers from the load to the store where the row fits, the sums
in float32."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor
from tinygrad.dtype import DType

from . import Target
from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, launch, threadgroup_array

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
                composition: Callable | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Launch a norm over `x`'s last axis (shapes and dtypes checked by the operation; `x` and
    `residual` of one shape, `weight` and `bias` `[D]`). Returns `y` in `out_dtype`, or with
    `residual` `(h, y)`, `h = x + residual` in `h_dtype`. composition: the operation from tensor
    operations on the same arguments (x, residual, weight, bias: those given, in that order),
    returning what the call returns, its backward."""
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    launch_shape = plan(length)
    types, ins = dict(x=x.dtype, y=out_dtype), [x.contiguous()]
    for name, given in (("residual", residual), ("weight", weight), ("bias", bias)):
        if given is None: continue
        types[name] = given.dtype
        ins.append(given.contiguous())
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
