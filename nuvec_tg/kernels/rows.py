"""Row operations' kernels: the RMS norm (`src/rms_norm.h`), alone or fused with the residual add:
one threadgroup per row, its threads striding over the row, the sum of squares in float32."""
from __future__ import annotations

import math

from tinygrad.dtype import DType

from . import Target
from .program import CTYPES, Family, Param, Program, Resources, threadgroup_array

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
    defines = dict(TO=ctypes["y"], THREADS=threads, ADD=int(add), WEIGHT=int(weight), EPS=f"{float(eps)!r}f")
    if add: defines["TH"] = ctypes["h"]
    params = ([Param("h", "out", ctypes["h"])] if add else []) + [Param("y", "out", ctypes["y"]), Param("x", "in", ctypes["x"])]
    if add: params.append(Param("residual", "in", ctypes["residual"]))
    if weight: params.append(Param("weight", "in", ctypes["weight"]))
    params.append(Param("ints", "in", "int"))
    return RMS_NORM.program(backend, defines, params)
