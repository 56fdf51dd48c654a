"""Row operations' kernels. The RMS norm (`src/rms_norm.h`), alone or fused with the residual add:
one threadgroup per row, its threads striding over the row, the sum of squares in float32."""
from __future__ import annotations

import math
from typing import Callable

from tinygrad import Tensor
from tinygrad.dtype import DType

from . import Target
from .program import CTYPES, Backward, Family, Param, Program, Resources, int_buffer, launch, threadgroup_array

MAX_THREADS = 1024


def plan(length: int) -> int:
    """The threads of a row's threadgroup from its length alone (never the row count, so a row's
    bits do not depend on the batch): about 8 elements a thread, one SIMD group at least, 1024 at
    most (a longer row loops)."""
    return min(MAX_THREADS, max(32, 32 * math.ceil(length / (8 * 32))))


def unsupported(types: tuple[DType, ...], rows: int, length: int, target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): float16, bfloat16 or
    float32 everywhere, bfloat16 only where the target has it, nothing empty, rows and elements
    indexable by int32."""
    if rows == 0 or length == 0: return "an empty call"
    if any(t not in CTYPES for t in types): return "a float64 input or weight"
    if rows * length >= 2 ** 31: return f"{rows} rows of {length} exceed int32 indexing"
    return target.lacks(bfloat=any(CTYPES[t] == "bfloat" for t in types))


def metal_resources(threads: int) -> Resources:
    """The threadgroup on Metal: `threads` threads and the SIMD groups' partial sums."""
    return Resources(threads, threadgroup_array(threads // 32, 4))


RMS_NORM = Family("nuvec_rms_norm", ("rms_norm.h",), unsupported, plan)


def rms_norm_program(backend: str, types: dict[str, DType], eps: float, threads: int) -> Program:
    """One specialisation. types: the dtypes of `x`, `y` and, where present, `residual` and `h`
    (the fused add), `weight`. eps: a float32 literal in the text (one program per eps)."""
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    add, weight = "residual" in types, "weight" in types
    defines = dict(TX=ctypes["x"], TO=ctypes["y"], THREADS=threads, ADD=int(add), WEIGHT=int(weight), EPS=f"{float(eps)!r}f")
    if add: defines.update(TR=ctypes["residual"], TH=ctypes["h"])
    if weight: defines["TW"] = ctypes["weight"]
    params = ([Param("h", "out", ctypes["h"])] if add else []) + [Param("y", "out", ctypes["y"]), Param("x", "in", ctypes["x"])]
    if add: params.append(Param("residual", "in", ctypes["residual"]))
    if weight: params.append(Param("weight", "in", ctypes["weight"]))
    params.append(Param("ints", "in", "int"))
    return RMS_NORM.program(backend, defines, params)


def rms_norm_kernel(x: Tensor, weight: Tensor | None, eps: float, out_dtype: DType, *, backend: str,
                    residual: Tensor | None = None, h_dtype: DType | None = None,
                    composition: Callable | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Launch the norm over `x`'s last axis (shapes and dtypes checked by the operation; `x` and
    `residual` already of one shape). Returns `y` in `out_dtype`, or with `residual` `(h, y)`, `h`
    in `h_dtype`. composition: the operation from tensor operations on the same arguments, its
    backward."""
    shape, length = x.shape, x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    types = dict(x=x.dtype, y=out_dtype)
    ins = [x.contiguous()]
    if residual is not None:
        types.update(residual=residual.dtype, h=h_dtype)
        ins.append(residual.contiguous())
    if weight is not None:
        types["weight"] = weight.dtype
        ins.append(weight.contiguous())
    threads = plan(length)
    program = rms_norm_program(backend, types, eps, threads)
    outs = ([Tensor.empty(*shape, dtype=h_dtype, device=device)] if residual is not None else []) + \
        [Tensor.empty(*shape, dtype=out_dtype, device=device)]
    backward = None if composition is None else Backward("rms_norm", composition, tuple(ins), wrt=tuple(range(len(ins))))
    ins.append(int_buffer(device, (length, rows)))
    results = launch(program, device, outs, ins, (rows, 1, 1), threads, backward=backward,
                     label=f"{backend} rms_norm{' add' if residual is not None else ''} {rows}x{length}")
    return tuple(results) if residual is not None else results[0]
