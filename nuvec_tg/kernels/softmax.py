"""The softmax family's kernels over the last axis (`src/softmax.h`): one threadgroup per row, its
threads striding over the row, the maximum and the sum of exponentials in float32. One source,
three families: `nuvec_softmax` (the row's probabilities, in x's dtype), `nuvec_logsumexp` (one
value a row, in x's dtype) and `nuvec_cross_entropy` (one float32 loss a row from the logits and
int32 targets)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import concrete, dtype_name
from . import Target
from .program import (CTYPES, Backward, Family, Param, Program, Resources, chunks, int32_indices, int_buffer, kernel_input,
                      launch, metal_limit_reason, threadgroup_array)

MAX_THREADS = 1024
# Bytes of a row a thread holds in registers (short rows), or reads per block of the online pass
# (long rows): 8 float32 elements, 16 of a 16-bit type (two 16-byte pieces). From the H100 sweep
# (tools/tune_rows.py --softmax, benchmarks/rows_h200.md): bf16 rows of 4096, softmax 24.3 µs at
# 256 threads x 16 against 30.6 at 512 x 8, logsumexp 15.4 against 19.1; 32 rows alike (2.5, 2.4).
ITEM_BYTES = 32
ITEMS = 8  # a float32 row's elements a thread
MAX_ITEMS = 16
VEC = 8  # elements of a piece (one 16-byte load of 16-bit rows) where the length is a multiple of it
MODES = {"softmax": 0, "logsumexp": 1, "cross_entropy": 2}
# A long row's last block reaches up to MAX_ITEMS * MAX_THREADS elements past its end: below this
# many elements in all, every index the kernel forms fits in int32.
INDEX_LIMIT = 2**31 - MAX_ITEMS * MAX_THREADS


@dataclass(frozen=True)
class Launch:
    """A row's threadgroup: `threads` threads; `looped` where the row is longer than their
    registers hold (`items` each), so it is read in blocks (the online maximum and sum); `vec`:
    elements a thread reads at once (consecutive: a piece)."""
    threads: int
    looped: bool
    vec: int = 1
    items: int = ITEMS  # elements a thread holds (short rows) or reads a block (long rows), a multiple of vec


def plan(length: int, itemsize: int = 4) -> Launch:
    """The launch of a row of `length` elements of `itemsize` bytes, from those alone (never the
    row count, so a row's bits do not depend on the batch): ITEM_BYTES of the row a thread (8
    float32 elements, 16 of a 16-bit type), one SIMD group at least, 1024 threads at most; a row
    longer than 1024 threads' loops; pieces of VEC elements where VEC divides the length (rows then
    start aligned to a piece), else single elements."""
    items = ITEM_BYTES // itemsize
    threads = min(MAX_THREADS, max(32, 32 * math.ceil(length / (items * 32))))
    return Launch(threads, length > threads * items, VEC if length % VEC == 0 else 1, items)


def unsupported(dtype: DType, rows: int, length: int, target: Target) -> str | None:
    """Why the kernels do not take a call on `target` (None when they do): `rows` rows of
    `length` elements of `dtype`, float16, bfloat16 or float32 (bfloat16 only where the target
    has it), nothing empty, every index within int32, and on Metal a threadgroup within an Apple
    GPU's limits."""
    if not isinstance(rows, int) or not isinstance(length, int): return "a symbolic shape"
    if rows == 0 or length == 0: return "an empty call"
    if concrete(dtype) not in CTYPES: return f"{dtype_name(dtype)} has no kernel (float16, bfloat16 and float32 do)"
    if rows * length > INDEX_LIMIT: return f"{rows} rows of {length} exceed int32 indexing"
    if (reason := target.lacks(bfloat=concrete(dtype) == dtypes.bfloat16)) is not None: return reason
    if target.backend == "metal" and (reason := metal_limit_reason(metal_resources(plan(length, concrete(dtype).itemsize)))) is not None:
        return f"its threadgroup would take {reason}"
    return None


def metal_resources(shape: Launch) -> Resources:
    """The threadgroup on Metal: `shape.threads` threads and the SIMD groups' maxima and sums."""
    return Resources(shape.threads, 2 * threadgroup_array(shape.threads // 32, 4))


SOFTMAX = Family("nuvec_softmax", ("pieces.h", "softmax.h"), unsupported, plan)
LOGSUMEXP = Family("nuvec_logsumexp", ("pieces.h", "softmax.h"), unsupported, plan)
CROSS_ENTROPY = Family("nuvec_cross_entropy", ("pieces.h", "softmax.h"), unsupported, plan)
BY_MODE = {"softmax": SOFTMAX, "logsumexp": LOGSUMEXP, "cross_entropy": CROSS_ENTROPY}


def program(backend: str, mode: str, dtype: DType, shape: Launch) -> Program:
    """One specialisation: `mode` ("softmax", "logsumexp" or "cross_entropy") over rows of
    `dtype` (float16, bfloat16 or float32), launched as `shape` (`plan`)."""
    x = CTYPES[concrete(dtype)]
    out = "float" if mode == "cross_entropy" else x
    if shape.items % shape.vec or shape.items > 2 * MAX_ITEMS or shape.threads * shape.items > MAX_THREADS * MAX_ITEMS:
        raise ValueError(f"{mode}: {shape} (items a multiple of vec, at most {MAX_THREADS * MAX_ITEMS} elements a block)")
    defines: dict[str, object] = dict(MODE=MODES[mode], TX=x, TO=out, THREADS=shape.threads, ITEMS=shape.items, VEC=shape.vec,
                                      LOOPED=int(shape.looped))
    defines.update(chunks("X", shape.vec * concrete(dtype).itemsize, shape.vec * concrete(dtype).itemsize))
    out_bytes = shape.vec * (4 if mode == "cross_entropy" else concrete(dtype).itemsize)
    defines.update(chunks("Y", out_bytes, out_bytes))
    params = [Param("y", "out", out), Param("x", "in", x)]
    if mode == "cross_entropy": params.append(Param("targets", "in", "int"))
    params.append(Param("ints", "in", "int"))
    return BY_MODE[mode].program(backend, defines, params)


def _launch(mode: str, x: Tensor, targets: Tensor | None, backend: str, composition: Callable | None,
            launch_shape: Launch | None = None) -> Tensor:
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    launch_shape = launch_shape or plan(length, concrete(x.dtype).itemsize)
    kernel = program(backend, mode, x.dtype, launch_shape)
    ins = [kernel_input(x)]
    if targets is not None:
        targets = int32_indices(targets)
        if targets.device is None:  # a Python number's constant has no device and no buffer: give it both
            targets = Tensor.zeros(targets.shape, dtype=dtypes.int32, device=device) + targets
        ins.append(targets.to(device).contiguous())
    out_dtype = dtypes.float32 if mode == "cross_entropy" else concrete(x.dtype)
    out = Tensor.empty(*shape, dtype=out_dtype, device=device) if mode == "softmax" else \
        Tensor.empty(rows, dtype=out_dtype, device=device)
    backward = None
    if composition is not None:  # the composition's result in the shape of the buffer the kernel writes
        backward = Backward(mode, lambda *args: composition(*args).reshape(out.shape), tuple(ins), wrt=(0,))
    ins.append(int_buffer(device, (length, rows)))
    (y,) = launch(kernel, device, [out], ins, (rows, 1, 1), launch_shape.threads, backward=backward,
                  label=f"{backend} {mode} {rows}x{length}")
    return y if mode == "softmax" else y.reshape(shape[:-1])


def softmax_kernel(x: Tensor, *, backend: str, composition: Callable | None = None, shape: Launch | None = None) -> Tensor:
    """Softmax over the last axis. x: `[..., L]`, float16, bfloat16 or float32 (checked by the
    operation). Returns `[..., L]` in x's dtype. composition: `x -> softmax` from tensor
    operations, whose gradient is the kernel's backward. shape: the launch (default `plan`'s; the
    sweep's other launches, tools/tune_rows.py)."""
    return _launch("softmax", x, None, backend, composition, shape)


def logsumexp_kernel(x: Tensor, *, backend: str, composition: Callable | None = None, shape: Launch | None = None) -> Tensor:
    """Log-sum-exp over the last axis. x: `[..., L]`, float16, bfloat16 or float32. Returns `[...]`
    in x's dtype. composition: `x -> logsumexp` (any shape of `[...]`'s elements), the backward.
    shape: as softmax_kernel's."""
    return _launch("logsumexp", x, None, backend, composition, shape)


def cross_entropy_kernel(logits: Tensor, targets: Tensor, *, backend: str, composition: Callable | None = None) -> Tensor:
    """The cross-entropy loss per row. logits: `[..., C]`, float16, bfloat16 or float32; targets:
    integers of shape `[...]` (negative ones count from the end, others outside `-C..C-1` hit no
    class). Returns `[...]` float32. composition: `(logits, int32 targets) -> loss`, the backward
    (the targets get no gradient)."""
    return _launch("cross_entropy", logits, targets, backend, composition)
