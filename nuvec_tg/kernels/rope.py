"""The rotary embedding's kernels. `src/rope.h`: rows of `length` features, each thread taking one
unit of a row (VEC pairs rotated, or a piece of the features past `dims` copied), 256 threads a
threadgroup over every row's units in turn; the angles and the rotation in float32, the sine and
cosine the dialect's precise `sin_cos` (`src/rotation.h`). `src/norm_rope.h`: the RMS norm and the
rotation in one pass, each row read as the norm kernel reads it (its sum has that kernel's bits)
and turned in rope's units from threadgroup memory, written into fresh outputs, a cache or a
paged pool."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import concrete, dtype_name
from . import Target
from . import rows as norm_rows
from .program import (CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, kernel_input, launch, metal_limit_reason,
                      strided_view, threadgroup_array)

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


def plan(length: int, dims: int, min_units: int = 1) -> Launch:
    """The launch for rows of `length` features, `dims` of them rotated, from these sizes alone (no
    unit's arithmetic depends on the row count): the widest piece of 8, 4, 2 or 1 elements that
    divides both `dims / 2` and `length` (so every piece is aligned to its size) and leaves a row
    at least `min_units` units where a narrower one can (norm_rope: a unit for each of a row's
    lanes, so that none idles through the sines and cosines), 256 threads a threadgroup. A pair's
    arithmetic is the same in a unit of any width."""
    half = dims // 2
    fits = [w for w in WIDTHS if half % w == 0 and length % w == 0]
    vec = next((w for w in fits if half // w + (length - dims) // w >= min_units), fits[-1])
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
    ins = [kernel_input(x), kernel_input(inv_freq)]
    out = Tensor.empty(*shape, dtype=x.dtype, device=device)
    backward = None if composition is None else Backward("rope", composition, tuple(ins), wrt=(0, 1))
    per_batch = int(offsets.numel() > 1)
    ins += [offsets, int_buffer(device, (length, dims // 2, shape[-2], rows // shape[0], rows, per_batch))]
    (y,) = launch(kernel, device, [out], ins, (launch_shape.groups(rows), 1, 1), launch_shape.threads, backward=backward,
                  label=f"{backend} rope {rows}x{length} dims {dims}")
    return y


# ---- norm_rope: the RMS norm, the rotation and the write in one pass (src/norm_rope.h) ----------

@dataclass(frozen=True)
class RowLayout:
    """Where the rows of `x` `[B, ..., T, D]` lie in the buffer a kernel reads: `ints` (the rows a
    batch item has per step, the first element, and the batch item's, the middle index's and the
    step's element strides), and `rows(source)`, x from that buffer."""
    ints: tuple[int, int, int, int, int]
    rows: Callable[[Tensor], Tensor]


def row_layout(x: Tensor, vec: int, in_place: bool = True) -> tuple[Tensor, RowLayout]:
    """What a row kernel reads for x `[B, ..., T, D]` (pieces of `vec` elements): with `in_place`,
    where x is a strided view of a buffer whose rows are consecutive and every stride and the
    offset a multiple of `vec` (the heads of a projection's output: q, k and v of a fused
    product), that buffer; otherwise x itself, made contiguous where it is not (a copy). A
    gradient through the buffer read in place reaches the buffer, not the view: where a backward
    must reach x, `in_place` is off."""
    shape = tuple(x.shape)
    batch, steps, length = shape[0], shape[-2], shape[-1]
    middle = math.prod(shape[1:-2])
    view = None
    if in_place and all(isinstance(n, int) for n in shape) and kernel_input(x) is not x:   # a view that would be copied
        view = strided_view(x.reshape(batch, middle, steps, length))
    if view is not None and view.strides[3] == 1 and all(n % vec == 0 for n in (view.offset, *view.strides[:3])):
        return view.base, RowLayout((middle, view.offset, *view.strides[:3]), lambda base: view.of(base).reshape(shape))
    source = kernel_input(x)
    return source, RowLayout((middle, 0, middle * steps * length, steps * length, length), lambda source: source)

FUSED_THREADS = 256      # threads a threadgroup of rows of one SIMD group or less
MIN_LANES = 8            # lanes a row at least: at most 4 rows a SIMD group, a SIMD sum each
MAX_KEPT_BYTES = 16384   # a threadgroup's rows in threadgroup memory: rows of up to 8192 16-bit or 4096 float32 elements
DESTINATIONS = ("fresh", "cache", "pool")


@dataclass(frozen=True)
class FusedLaunch:
    """norm_rope's launch: a row read and summed as the norm kernel's launch `norm` reads it, then
    turned in rope's units (`rotation`); `lanes` threads a row, `rows` rows a threadgroup."""
    norm: norm_rows.Launch
    rotation: Launch
    lanes: int
    rows: int

    @property
    def threads(self) -> int:
        return self.lanes * self.rows

    @property
    def held(self) -> int:
        """Elements of threadgroup memory a row takes: a place for each piece its lanes can hold
        (the row's length or more)."""
        return self.lanes * self.norm.per * self.norm.vec

    def groups(self, rows: int) -> int:
        """Threadgroups for `rows` rows."""
        return -(-rows // self.rows)


def norm_rope_plan(length: int, dims: int) -> FusedLaunch:
    """The launch for rows of `length` features, `dims` of them rotated, from these sizes alone: the
    norm kernel's pieces on the norm kernel's lanes (`rows.plan`), so that a row's sum has its bits.
    A row of more than one SIMD group is a threadgroup, as in that kernel; a shorter one takes the
    fewest lanes that hold its pieces (a power of two, 8 to 32), 256 threads a threadgroup of such
    rows. The rotation takes rope's units (`plan`), as many as the row has lanes where the widths
    allow."""
    norm = norm_rows.plan(length)
    if norm.threads > 32: return FusedLaunch(norm, plan(length, dims, norm.threads), norm.threads, 1)
    pieces = -(-length // norm.vec)
    lanes = 32 if norm.per > 1 else min(32, max(MIN_LANES, 1 << (pieces - 1).bit_length()))
    return FusedLaunch(norm, plan(length, dims, lanes), lanes, FUSED_THREADS // lanes)


def describe_norm_rope(shape: FusedLaunch) -> str:
    """The launch in words, for NUVEC_DEBUG."""
    return (f"{shape.rows} rows of {shape.lanes} threads a threadgroup, pieces of {shape.norm.vec}, "
            f"{shape.rotation.vec} pairs a unit")


def norm_rope_metal_resources(shape: FusedLaunch, normed: DType) -> Resources:
    """The threadgroup on Metal: its threads, its rows in the normalised rows' dtype `normed`, and
    the SIMD groups' partial sums of a row of more than one SIMD group."""
    kept = threadgroup_array(shape.rows * shape.held, concrete(normed).itemsize)
    return Resources(shape.threads, kept + (threadgroup_array(shape.threads // 32, 4) if shape.lanes > 32 else 0))


def norm_rope_unsupported(types: tuple[DType, ...], rows: int, length: int, dims: int, places: int,
                          target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): `rows` rows of
    `length` features, `dims` of them rotated, into a destination of `places` rows a head (0:
    fresh outputs); `types` every dtype read or written, the normalised rows' second (what
    threadgroup memory holds): float16, bfloat16 or float32 (bfloat16 only where the target has
    it), nothing empty, x's elements and the destination's rows within int32, a threadgroup's rows
    within 16 KB of threadgroup memory (and the threadgroup within an Apple GPU's limits)."""
    if rows == 0 or length == 0: return "an empty call"
    if any(concrete(t) not in CTYPES for t in types): return "a float64 input or destination"
    if rows * length >= 2**31 or places >= 2**31: return f"{rows} rows of {length} exceed int32 indexing"
    shape = norm_rope_plan(length, dims)
    kept = shape.rows * shape.held * concrete(types[1]).itemsize
    if kept > MAX_KEPT_BYTES: return f"rows of {length} take {kept} bytes of threadgroup memory (at most {MAX_KEPT_BYTES})"
    if (reason := target.lacks(bfloat=any(concrete(t) == dtypes.bfloat16 for t in types))) is not None: return reason
    if target.backend == "metal" and (reason := metal_limit_reason(norm_rope_metal_resources(shape, types[1]))) is not None:
        return f"its threadgroup would take {reason}"
    return None


NORM_ROPE = Family("nuvec_norm_rope", ("pieces.h", "rotation.h", "norm_rope.h"), norm_rope_unsupported, norm_rope_plan)


def norm_rope_program(backend: str, types: dict[str, DType], destination: str, traditional: bool, scale: float,
                      shape: FusedLaunch, *, eps: float | None = None, v_eps: float | None = None) -> Program:
    """One specialisation. types: the dtypes of `x`, `normed` (the normalised rows, rope's input),
    `rotated` (its destination's), and where present `weight` (normalising, with `eps`),
    `values` (the values' destination's): with `v_eps` x's own norm, or with `values_in` (the
    source rows' dtype, into a cache or pool only) copied from rows of their own, and `queries`
    (the dtype of fresh outputs for rows of a second input of x's dtype, normalised with a weight
    of the weight's dtype and eps, turned alike: a model's queries beside its keys). destination:
    "fresh", "cache" or "pool". scale, eps, v_eps: float32 literals in the text (one program per
    value). shape: the launch (`norm_rope_plan`)."""
    if destination not in DESTINATIONS: raise ValueError(f"norm_rope_program: unknown destination {destination!r}")
    copied = "values_in" in types
    if ("weight" in types) != (eps is not None) or ("values" in types) != (v_eps is not None or copied) or \
            (copied and (v_eps is not None or destination == "fresh")):
        raise ValueError("norm_rope_program: a weight comes with eps, values with v_eps or copied rows (into a cache or pool)")
    queries = "queries" in types
    if queries and (destination == "fresh" or v_eps is not None):
        raise ValueError("norm_rope_program: queries go beside keys written into a cache or pool, without normalised values")
    ctypes = {key: CTYPES[concrete(dtype)] for key, dtype in types.items()}
    vec, unit = shape.norm.vec, shape.rotation.vec
    defines: dict[str, object] = dict(
        TX=ctypes["x"], TO=ctypes["normed"], TK=ctypes["rotated"], NORM=int("weight" in types),
        VALUES=2 if copied else int("values" in types), DEST=DESTINATIONS.index(destination), TRADITIONAL=int(traditional),
        SCALE=float_literal(scale), VEC=vec, PER=shape.norm.per, LANES=shape.lanes, ROWS=shape.rows, THREADS=shape.threads,
        HELD=shape.held, UNIT=unit, QUERIES=int(queries))
    for name, prefix, width in (("x", "X", vec), ("weight", "W", vec), ("values", "V", vec), ("values_in", "VI", vec),
                                ("rotated", "K", unit), ("queries", "Q", unit)):
        if name not in types: continue
        if name in ("weight", "values", "values_in", "queries"): defines[f"T{prefix}"] = ctypes[name]
        piece = width * concrete(types[name]).itemsize
        defines.update(chunks(prefix, piece, piece))
    if eps is not None: defines["EPS"] = float_literal(eps)
    if v_eps is not None: defines["V_EPS"] = float_literal(v_eps)
    params = [Param("rotated", "out", ctypes["rotated"])] + ([Param("values", "out", ctypes["values"])] if "values" in types else [])
    params += [Param("queries", "out", ctypes["queries"])] if queries else []
    params += [Param("x", "in", ctypes["x"])] + ([Param("weight", "in", ctypes["weight"])] if "weight" in types else [])
    params += [Param("v_rows", "in", ctypes["values_in"])] if copied else []
    params += [Param("q_x", "in", ctypes["x"])] + ([Param("q_weight", "in", ctypes["weight"])] if "weight" in types else []) \
        if queries else []
    params += [Param("inv_freq", "in", "float"), Param("offsets", "in", "int")]
    params += [Param("slots", "in", "int")] if destination == "pool" else []
    params.append(Param("ints", "in", "int"))
    return NORM_ROPE.program(backend, defines, params)


def norm_rope_kernel(x: Tensor, dims: int, inv_freq: Tensor, offsets: Tensor, *, backend: str, traditional: bool, scale: float,
                     normed_dtype: DType, weight: Tensor | None = None, eps: float | None = None, v_eps: float | None = None,
                     into: tuple[Tensor, ...] = (), slots: Tensor | None = None, values: Tensor | None = None,
                     queries: tuple[Tensor, Tensor | None] | None = None,
                     composition: Callable[..., Tensor | tuple[Tensor, Tensor]] | None = None) -> Tensor | tuple[Tensor, ...]:
    """Normalise and rotate the first `dims` features of `x`'s rows in one pass (checked by the
    operation), into fresh outputs or in place.

    x: `[B, ..., T, D]` (`[B, H, T, D]` with `into`), float16, bfloat16 or float32. weight: `[D]`
    with its `eps`, or None (no normalisation). normed_dtype: the normalised rows' dtype (x's
    promoted with the weight's). v_eps: with it, the values `rms_norm(x, None, v_eps)` too; or
    values: rows of x's shape written as they are beside x's (into a cache or pool: `into` has both).
    inv_freq: `[dims / 2]` float32. offsets: int32, one element, or `B` for fresh outputs.
    into: () for fresh outputs, or the buffers written in place, rotated rows first, then values:
    caches `[B, H, S, D]` (row t at position `offsets[0] + t`, skipped outside the cache), or with
    `slots` (`[B, T]` int32) a pool `[blocks, H, block_size, D]` (out-of-range slots skipped).
    queries: with `into`, `(q, q_weight)`: rows `[B, Hq, T, D]` of x's dtype normalised with
    q_weight (None exactly where weight is None; the weight's dtype and eps) and turned at the
    same positions in the same launch, into fresh outputs returned first (normed_dtype).
    Returns the rotated rows (`[B, ..., T, D]` in normed_dtype) and with v_eps the values (x's
    dtype), or the updated buffers (after the queries' rows). composition: `(x, weight if given, inv_freq) -> what the call
    returns` from tensor operations, the backward of fresh outputs (buffers updated in place have
    none, as the gated delta kernel's slot pool).
    """
    shape, length = tuple(x.shape), x.shape[-1]
    rows = math.prod(shape[:-1])
    device = x.device
    launch_shape = norm_rope_plan(length, dims)
    destination = "pool" if slots is not None else "cache" if into else "fresh"
    types = dict(x=x.dtype, normed=normed_dtype, rotated=into[0].dtype if into else normed_dtype)
    if weight is not None: types["weight"] = weight.dtype
    if v_eps is not None or values is not None: types["values"] = into[1].dtype if into else x.dtype
    if values is not None: types["values_in"] = values.dtype
    if queries is not None: types["queries"] = normed_dtype
    kernel = norm_rope_program(backend, types, destination, traditional, scale, launch_shape,
                               eps=None if weight is None else eps, v_eps=v_eps)
    # x read in place where it is a strided view of a buffer, unless a backward must reach x itself
    source, layout = row_layout(x, launch_shape.norm.vec, in_place=bool(into) or composition is None)
    ins = [source] + ([] if weight is None else [kernel_input(weight)])
    value_ints: tuple[int, ...] = ()
    if values is not None:
        value_source, value_layout = row_layout(values, launch_shape.norm.vec)
        ins.append(value_source)
        value_ints = value_layout.ints
    query_ints: tuple[int, ...] = ()
    query_rows = 0
    if queries is not None:
        q, q_weight = queries
        query_rows = math.prod(q.shape[:-1])
        query_source, query_layout = row_layout(q, launch_shape.norm.vec)
        ins += [query_source] + ([] if q_weight is None else [kernel_input(q_weight)])
        query_ints = (0,) * (5 - len(value_ints)) + (query_rows, query_rows // q.shape[0], *query_layout.ints)
    ins.append(kernel_input(inv_freq))
    backward = None
    if into:
        outs = [buffer.contiguous() for buffer in into]  # a realized buffer (or a prefix view of one) is itself
        if queries is not None: outs.append(Tensor.empty(*queries[0].shape, dtype=normed_dtype, device=device))
    else:
        # With values the rotated rows' buffer has a leading axis of one: a gradient reaching only
        # one of the two outputs is told apart by its shape (`program.Backward`).
        outs = [Tensor.empty(*((1,) if v_eps is not None else ()), *shape, dtype=normed_dtype, device=device)]
        if v_eps is not None: outs.append(Tensor.empty(*shape, dtype=x.dtype, device=device))
        if composition is not None:
            def differentiable(source: Tensor, *args: Tensor) -> Tensor | tuple[Tensor, Tensor]:
                result = composition(layout.rows(source), *args)
                return (result[0].reshape(1, *shape), result[1]) if v_eps is not None else result
            backward = Backward("norm_rope", differentiable, tuple(ins), wrt=tuple(range(len(ins))))
    ins.append(offsets)
    if slots is not None: ins.append(slots)
    places, heads, block_size = 0, 0, 0
    if destination == "cache": places = into[0].shape[2]
    if destination == "pool": places, heads, block_size = into[0].shape[0] * into[0].shape[2], into[0].shape[1], into[0].shape[2]
    ins.append(int_buffer(device, (length, dims // 2, shape[-2], rows // shape[0], rows, int(offsets.numel() > 1), places, heads,
                                   block_size, *layout.ints, *value_ints, *query_ints)))
    label = f"{backend} norm_rope {rows}x{length} dims {dims} into {destination}" + \
        (" with values" if v_eps is not None else " with copied values" if values is not None else "") + \
        (f" and {query_rows} query rows" if queries is not None else "")
    groups = launch_shape.groups(rows) + (launch_shape.groups(query_rows) if queries is not None else 0)
    results = launch(kernel, device, outs, ins, (groups, 1, 1), launch_shape.threads, backward=backward, label=label,
                     in_place=bool(into))
    if queries is not None: return (results[-1], *results[:-1])
    if into: return results[0] if len(results) == 1 else (results[0], results[1])
    return (results[0].reshape(shape), results[1]) if v_eps is not None else results[0]
