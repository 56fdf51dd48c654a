"""The rotary embedding's kernel (`src/rope.h`): rows of `length` features, each thread taking one
unit of a row (VEC pairs rotated, or a piece of the features past `dims` copied), 256 threads a
threadgroup over every row's units in turn; the angles and the rotation in float32, the sine and
cosine the dialect's precise `sin_cos`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import concrete, dtype_name
from . import Target
from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, launch

THREADS = 256
WIDTHS = (8, 4, 2, 1)   # pairs a unit rotates (elements a piece holds): the widest that fits


@dataclass(frozen=True)
class Launch:
    """A call's launch: `threads` a threadgroup, each thread one unit of a row; `vec` pairs a
    rotating unit takes (and elements a piece holds); `rotating` units of a row rotate, `units`
    in all (the rest copy the features past dims)."""
    threads: int
    vec: int
    rotating: int
    units: int

    def groups(self, rows: int) -> int:
        """Threadgroups for `rows` rows."""
        return -(-rows * self.units // self.threads)


def plan(length: int, dims: int) -> Launch:
    """The launch for rows of `length` features, `dims` of them rotated, from these sizes alone (no
    unit's arithmetic depends on the row count): the widest piece of 8, 4, 2 or 1 elements that
    divides both `dims / 2` and `length` (so every piece is aligned to its size), 256 threads a
    threadgroup."""
    half = dims // 2
    vec = next(w for w in WIDTHS if half % w == 0 and length % w == 0)
    rotating = half // vec
    return Launch(THREADS, vec, rotating, rotating + (length - dims) // vec)


def describe(shape: Launch) -> str:
    """The launch in words, for NUVEC_DEBUG."""
    return f"{shape.threads} threads a threadgroup, {shape.vec} pairs a thread, {shape.units} threads a row"


def unsupported(dtype: DType, rows: int, length: int, dims: int, target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): `rows` rows of
    `length` features of `dtype`, `dims` of them rotated: float16, bfloat16 or float32 (bfloat16
    only where the target has it), nothing empty, every unit's index within int32."""
    if not all(isinstance(n, int) for n in (rows, length)): return "a symbolic shape"
    if rows == 0 or length == 0: return "an empty call"
    if concrete(dtype) not in CTYPES: return f"{dtype_name(dtype)} has no kernel (float16, bfloat16 and float32 do)"
    if rows * plan(length, dims).units + THREADS >= 2**31: return f"{rows} rows of {length} exceed int32 indexing"
    return target.lacks(bfloat=concrete(dtype) == dtypes.bfloat16)


def metal_resources(shape: Launch) -> Resources:
    """The threadgroup on Metal: its threads, no threadgroup memory."""
    return Resources(shape.threads, 0)


ROPE = Family("nuvec_rope", ("pieces.h", "rotation.h", "rope.h"), unsupported, plan)


def float_literal(value: float) -> str:
    """`value` rounded to float32, as a float literal of that float32 exactly (the shortest
    decimal of a float32 reads back as it)."""
    return f"{float(np.float32(value))!r}f"


def program(backend: str, dtype: DType, traditional: bool, scale: float, shape: Launch) -> Program:
    """One specialisation: rows of `dtype` (x's and y's), adjacent pairs with `traditional`, the
    positions' `scale` (a float32 literal in the text: one program per scale), launched as
    `shape` (`plan`)."""
    x = CTYPES[concrete(dtype)]
    piece = shape.vec * concrete(dtype).itemsize
    defines = dict(TX=x, VEC=shape.vec, TRADITIONAL=int(traditional), THREADS=shape.threads, SCALE=float_literal(scale),
                   **chunks("X", piece, piece))
    params = [Param("y", "out", x), Param("x", "in", x), Param("inv_freq", "in", "float"), Param("offsets", "in", "int"),
              Param("ints", "in", "int")]
    return ROPE.program(backend, defines, params)


def rope_kernel(x: Tensor, dims: int, inv_freq: Tensor, offsets: Tensor, *, traditional: bool, scale: float, backend: str,
                composition: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
    """Rotate the first `dims` features of `x`'s rows (checked by the operation).

    x: `[B, ..., T, D]`, float16, bfloat16 or float32. inv_freq: `[dims / 2]` float32.
    offsets: int32, one element or `B` (each batch item's position of row 0). Returns `x`'s
    shape and dtype. composition: `(x, inv_freq) -> rope` from tensor operations (with these
    offsets), the backward: gradients reach x and, through inv_freq, the frequencies.
    """
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    launch_shape = plan(length, dims)
    kernel = program(backend, x.dtype, traditional, scale, launch_shape)
    ins = [x.contiguous(), inv_freq.contiguous()]
    out = Tensor.empty(*shape, dtype=x.dtype, device=device)
    backward = None if composition is None else Backward("rope", composition, tuple(ins), wrt=(0, 1))
    per_batch = int(offsets.numel() > 1)
    ins += [offsets, int_buffer(device, (length, dims // 2, shape[-2], rows // shape[0], rows, per_batch))]
    (y,) = launch(kernel, device, [out], ins, (launch_shape.groups(rows), 1, 1), launch_shape.threads, backward=backward,
                  label=f"{backend} rope {rows}x{length} dims {dims}")
    return y
