"""Rows moved by index. The paged pool's write kernel (`src/paged_write.h`): rows copied into
their slots of a `[blocks, H, block_size, D]` pool in place, one thread a piece of up to 16 bytes,
256 threads a threadgroup over every row's pieces in turn — what `fast.paged_write` runs on METAL
and CUDA (its composition rewrites the whole pool). The row gather (`src/take_rows.h`): rows of a
buffer by index, copied as their bits a chunk of up to 16 bytes a thread — what `fast.take` runs
there (tinygrad's indexing reads every row to pick one)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import concrete, dtype_name
from . import Target
from .program import (CHUNK_TYPES, CTYPES, Backward, Family, Param, Program, Resources, chunks, int32_indices, int_buffer,
                      kernel_input, launch, strided_view)

THREADS = 256
PIECE_BYTES = 16


@dataclass(frozen=True)
class Launch:
    """A call's launch: `threads` a threadgroup, each thread one piece of `vec` elements of a row."""
    threads: int
    vec: int

    def groups(self, rows: int, length: int) -> int:
        """Threadgroups for `rows` rows of `length` elements."""
        return -(-rows * (length // self.vec) // self.threads)


def plan(length: int, itemsize: int) -> Launch:
    """The launch for rows of `length` elements of at most `itemsize` bytes (the source's or the
    pool's, the wider): the most elements of 8, 4, 2 or 1 that divide the length and fit 16 bytes,
    256 threads a threadgroup (no piece's work depends on the row count)."""
    vec = next(w for w in (8, 4, 2, 1) if length % w == 0 and w * itemsize <= PIECE_BYTES)
    return Launch(THREADS, vec)


def unsupported(types: tuple[DType, ...], rows: int, length: int, places: int, target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): `rows` source rows
    (slots times heads) of `length` elements into a pool of `places` slots; `types` the source's
    and the pool's: float16, bfloat16 or float32 (bfloat16 only where the target has it), nothing
    empty, every piece's index and every slot within int32."""
    if rows == 0 or length == 0 or places == 0: return "an empty call"
    if any(concrete(t) not in CTYPES for t in types): return "a float64 source or pool"
    if rows * length + THREADS >= 2**31 or places >= 2**31: return f"{rows} rows of {length} into {places} slots exceed int32 indexing"
    return target.lacks(bfloat=any(concrete(t) == dtypes.bfloat16 for t in types))


def metal_resources(shape: Launch) -> Resources:
    """The threadgroup on Metal: its threads, no threadgroup memory."""
    return Resources(shape.threads, 0)


PAGED_WRITE = Family("nuvec_paged_write", ("pieces.h", "paged_write.h"), unsupported, plan)


def program(backend: str, source: DType, pool: DType, shape: Launch) -> Program:
    """One specialisation: rows of `source` dtype into a pool of `pool` dtype, launched as `shape`."""
    ts, tp = CTYPES[concrete(source)], CTYPES[concrete(pool)]
    defines: dict[str, object] = dict(TS=ts, TP=tp, VEC=shape.vec, THREADS=shape.threads)
    defines.update(chunks("S", shape.vec * concrete(source).itemsize, shape.vec * concrete(source).itemsize))
    defines.update(chunks("P", shape.vec * concrete(pool).itemsize, shape.vec * concrete(pool).itemsize))
    params = [Param("pool", "out", tp), Param("source", "in", ts), Param("slots", "in", "int"), Param("ints", "in", "int")]
    return PAGED_WRITE.program(backend, defines, params)


def describe(shape: Launch, source: DType, pool: DType) -> str:
    """The launch in words, for NUVEC_DEBUG."""
    return f"{dtype_name(source)} rows into a {dtype_name(pool)} pool, {shape.vec} elements a thread"


def paged_write_kernel(pool: Tensor, rows: Tensor, slots: Tensor, *, backend: str) -> Tensor:
    """Write `rows` into `pool` at `slots`, in place (checked by the operation).

    pool: `[blocks, H, block_size, D]`; rows: `[N, H, D]` (a strided view of a buffer, such as the
    value heads of a fused projection's output, read in place); slots: `[N]` integers (outside
    `0..blocks * block_size - 1`: skipped). Returns the pool, updated (its buffer, written now)."""
    blocks, heads, block_size, length = pool.shape
    count = rows.shape[0]
    shape = plan(length, max(concrete(rows.dtype).itemsize, concrete(pool.dtype).itemsize))
    kernel = program(backend, rows.dtype, pool.dtype, shape)
    source, layout = kernel_input(rows), (0, heads * length, length)
    view = strided_view(rows) if source is not rows else None   # a view that would be copied: read in place where it can be
    if view is not None and view.strides[2] == 1 and all(n % shape.vec == 0 for n in (view.offset, *view.strides[:2])):
        source, layout = view.base, (view.offset, *view.strides[:2])
    ints = int_buffer(pool.device, (length, count * heads, heads, block_size, blocks * block_size, *layout))
    ins = [source, int32_indices(slots).contiguous(), ints]
    (written,) = launch(kernel, pool.device, [pool.contiguous()], ins, (shape.groups(count * heads, length), 1, 1), shape.threads,
                        label=f"{backend} paged_write {count}x{heads}x{length} into {math.prod(pool.shape[:3])} rows",
                        in_place=True)
    return written


# ---- take: rows gathered by index (src/take_rows.h) ---------------------------------------------

# A chunk of zeros of each chunk type, in both dialects' brace initialisation.
_ZEROS = {16: "uint4{0u, 0u, 0u, 0u}", 8: "uint2{0u, 0u}", 4: "0u", 2: "(ushort)0"}


def take_plan(row_bytes: int) -> int:
    """Bytes a thread copies: the widest of 16, 8, 4 and 2 dividing a row's bytes (so every chunk
    is aligned), from the row's size alone."""
    return next(width for width in (16, 8, 4, 2) if row_bytes % width == 0)


def take_unsupported(row_bytes: int, count: int, rows: int, target: Target) -> str | None:
    """Why the gather kernel does not take a call on `target` (None when it does): `count` rows of
    `row_bytes` bytes picked from `rows`: nothing empty, rows of a whole number of 2-byte chunks,
    every chunk's index within int32."""
    if count == 0 or rows == 0 or row_bytes == 0: return "an empty call"
    if row_bytes % 2: return f"rows of {row_bytes} bytes (the kernel copies chunks of 2 bytes or more)"
    if count * (row_bytes // take_plan(row_bytes)) + THREADS >= 2**31 or rows >= 2**31:
        return f"{count} rows of {row_bytes} bytes from {rows} exceed int32 indexing"
    return target.lacks()


TAKE_ROWS = Family("nuvec_take_rows", ("take_rows.h",), take_unsupported, take_plan)


def take_program(backend: str, chunk_bytes: int) -> Program:
    """The gather of rows copied in chunks of `chunk_bytes` bytes (`take_plan`)."""
    chunk = CHUNK_TYPES[chunk_bytes]
    params = [Param("y", "out", chunk), Param("x", "in", chunk), Param("indices", "in", "int"), Param("ints", "in", "int")]
    return TAKE_ROWS.program(backend, dict(CHUNK=chunk, ZERO=_ZEROS[chunk_bytes], THREADS=THREADS), params)


def take_kernel(x: Tensor, indices: Tensor, *, backend: str, composition=None) -> Tensor:
    """Rows `indices` of `x` `[rows, ...]` (a buffer, read in place), zeros for an index outside
    (checked by the operation). indices: integers of any shape. Returns `[*indices.shape,
    *x.shape[1:]]` in x's dtype. composition: `x -> rows` from tensor operations (these indices),
    the backward."""
    rows, count = x.shape[0], math.prod(indices.shape)
    row_bytes = math.prod(x.shape[1:]) * x.dtype.itemsize
    width = take_plan(row_bytes)
    source = kernel_input(x)
    backward = None if composition is None else Backward("take", composition, (source,), wrt=(0,))
    ins = [source, int32_indices(indices).reshape(-1).contiguous(), int_buffer(x.device, (row_bytes // width, count, rows))]
    y = Tensor.empty(*indices.shape, *x.shape[1:], dtype=x.dtype, device=x.device)
    groups = -(-count * (row_bytes // width) // THREADS)
    return launch(take_program(backend, width), x.device, [y], ins, (groups, 1, 1), THREADS, backward=backward,
                  label=f"{backend} take {count} of {rows} rows of {row_bytes} bytes")[0]
