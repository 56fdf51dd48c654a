"""Rotary position embeddings, and RoPE fused with RMS norm and a KV-cache write (`norm_rope`).

The angle of feature pair `i` at sequence position `t` is `scale * (offset + t) * inv_freq[i]`,
computed in float32, with `inv_freq[i] = base ** (-2i / dims)` or `1 / freqs[i]` (`freqs` are
periods, as in MLX). The rotation itself also runs in float32 and is rounded once to the input
dtype. Pairs are `(i, i + dims/2)` (rotate-half, NeoX style) or, with `traditional`, adjacent
features `(2i, 2i + 1)`. Features past `dims` pass through unchanged.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType
from tinygrad.uop.ops import Ops

from .. import kernels
from ..kernels import rope as rope_kernel
from ..kernels.program import int32_indices, int_buffer
from ..tensor import (check, check_floating, check_int, check_integer, check_number, check_tensor, check_weight, compute_dtype,
                      promote_types)
from .norms import _rms_norm, rms_norm
from .paged import paged_write

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_rope(x: Tensor, dims: int, base: float | None, scale: float, offset: int | Tensor,
                freqs: Tensor | None, *, op: str = "rope", dtype: DType | None = None) -> None:
    """rope's arguments, as `op` names them; dtype: the rotated rows' (x's, or norm_rope's
    normalised rows')."""
    check_tensor(op, "x", x)
    check(x.ndim >= 3, op, f"the input needs at least 3 dimensions [B, ..., T, D], got shape {tuple(x.shape)}")
    check_floating(op, "x", x.dtype if dtype is None else dtype)
    check_int(op, "dims", dims)
    check(dims > 0 and dims % 2 == 0 and dims <= x.shape[-1], op,
          f"dims must be even, positive and at most {x.shape[-1]}, got {dims}")
    check_number(op, "scale", scale)
    check((base is None) != (freqs is None), op, "exactly one of base and freqs must be given (pass base=None with freqs)")
    if base is not None:
        check(check_number(op, "base", base) > 0, op, f"base must be positive, got {base}")
    else:
        check_tensor(op, "freqs", freqs)
        check(freqs.ndim == 1 and freqs.shape[0] == dims // 2, op,
              f"freqs must be 1-D with {dims // 2} elements, got shape {tuple(freqs.shape)}")
        check_floating(op, "freqs", freqs.dtype)
    if isinstance(offset, Tensor):
        check_integer(op, "offset", offset.dtype)
        check(offset.ndim <= 1 and offset.numel() in (1, x.shape[0]), op,
              f"offset must be a scalar or have {x.shape[0]} elements, got shape {tuple(offset.shape)}")
    elif isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"{op}: offset must be an int or an integer tensor, got {type(offset).__name__}")
    else:
        check(_INT32_MIN <= offset and offset + x.shape[-2] - 1 <= _INT32_MAX, op,
              f"positions from offset {offset} do not fit in int32")


def _positions(x: Tensor, offset: int | Tensor) -> Tensor:
    """Float32 positions `offset + t`, shaped to broadcast against `x`'s `[B, ..., T]`."""
    length = x.shape[-2]
    steps = Tensor.arange(length, dtype=dtypes.int32)
    if not isinstance(offset, Tensor):
        return (steps + offset).cast(dtypes.float32)
    offset = offset.to(x.device).cast(dtypes.int32)
    if offset.numel() == 1:
        return (steps + offset.reshape(())).cast(dtypes.float32)
    per_batch = offset.reshape((x.shape[0],) + (1,) * (x.ndim - 2))
    return (per_batch + steps).cast(dtypes.float32)


def _inverse_frequencies(dims: int, base: float | None, freqs: Tensor | None, device: str) -> Tensor:
    """`[dims/2]` float32 inverse frequencies: `1 / freqs`, or `base ** (-2i / dims)` as
    `exp2(-i * (2 log2(base) / dims))` (MLX's kernel's form), built from constants so that no
    buffer is made per call (a buffer made from host memory inside TinyJit would be captured)."""
    if freqs is not None:
        return 1.0 / freqs.to(device).cast(dtypes.float32)
    # on `device` (a bare arange is a constant of no device: realized, it stays one, and reads on the CPU)
    pair_index = Tensor.full((dims // 2,), 0.0, dtype=dtypes.float32, device=device) + Tensor.arange(dims // 2, dtype=dtypes.float32)
    return (pair_index * (-2.0 * math.log2(base) / dims)).exp2()


@functools.lru_cache(maxsize=64)
def _base_frequencies(device: str, dims: int, base: float) -> Tensor:
    """`_inverse_frequencies` of a base, realized once per device (the kernel's input): a call then
    runs no kernel for them. Made from constants on the device, not copied from host memory."""
    return _inverse_frequencies(dims, base, None, device).contiguous().realize()


def _offsets(x: Tensor, offset: int | Tensor) -> Tensor:
    """The kernel's int32 offsets: one element, or one per batch item."""
    if not isinstance(offset, Tensor): return int_buffer(x.device, (offset,))
    if offset.uop.base.op is Ops.CONST:  # a 0-d tensor of a number is a constant, no buffer: its value is known here
        return int_buffer(x.device, ((int(offset.uop.base.arg) + 2**31) % 2**32 - 2**31,))  # wrapped to int32, as the cast
    return offset.to(x.device).cast(dtypes.int32).reshape(-1).contiguous()


def _rope(x: Tensor, dims: int, traditional: bool, scale: float, offset: int | Tensor, inv_freq: Tensor) -> Tensor:
    """rope's composition from its `[dims/2]` float32 inverse frequencies (no checks)."""
    half = dims // 2
    acc = compute_dtype(x.dtype)
    angles = (_positions(x, offset) * float(scale)).unsqueeze(-1) * inv_freq
    cos, sin = angles.cos().cast(acc), angles.sin().cast(acc)
    rotated = x[..., :dims].cast(acc)
    if traditional:
        pairs = rotated.reshape(*x.shape[:-1], half, 2)
        first, second = pairs[..., 0], pairs[..., 1]
    else:
        first, second = rotated[..., :half], rotated[..., half:]
    new_first, new_second = first * cos - second * sin, first * sin + second * cos
    if traditional:
        rotated = new_first.unsqueeze(-1).cat(new_second.unsqueeze(-1), dim=-1).reshape(*x.shape[:-1], dims)
    else:
        rotated = new_first.cat(new_second, dim=-1)
    rotated = rotated.cast(x.dtype)
    return rotated if dims == x.shape[-1] else rotated.cat(x[..., dims:], dim=-1)


def _kernel_frequencies(dims: int, base: float | None, freqs: Tensor | None, device: str) -> Tensor:
    """The kernels' `[dims/2]` float32 inverse frequencies: a base's realized once per device."""
    if freqs is not None: return _inverse_frequencies(dims, None, freqs, device)
    return _base_frequencies(device, dims, float(base))


def _kernel_backend(op: str, x: Tensor, dims: int, fused: tuple[tuple[DType, ...], int] | None = None) -> str | None:
    """The backend whose kernel runs `op` over `x`'s rows (or None: the composition), saying under
    NUVEC_DEBUG which, with the launch: the rope kernel, or with `fused` the norm_rope kernel
    (`fused`: every dtype it reads or writes, the normalised rows' second, and the destination's
    rows a head, 0 for fresh outputs)."""
    shape = tuple(x.shape)
    concrete = all(isinstance(size, int) for size in shape)
    rows, length = (math.prod(shape[:-1]), shape[-1]) if concrete else (0, 0)
    description = f"{shape} on {x.device}"
    if rows and length:
        launch = rope_kernel.describe(rope_kernel.plan(length, dims)) if fused is None else \
            rope_kernel.describe_norm_rope(rope_kernel.norm_rope_plan(length, dims))
        description += f" ({launch})"

    def unsupported(backend: str) -> str | None:
        if not concrete: return "a symbolic shape"
        if fused is None: return rope_kernel.unsupported(x.dtype, rows, length, dims, kernels.target(x.device))
        return rope_kernel.norm_rope_unsupported(fused[0], rows, length, dims, fused[1], kernels.target(x.device))
    return kernels.choose(op, description, x.device, "rope" if fused is None else "norm_rope", unsupported)


def rope(x: Tensor, dims: int, *, traditional: bool = False, base: float | None = 10000.0, scale: float = 1.0,
         offset: int | Tensor = 0, freqs: Tensor | None = None) -> Tensor:
    """Rotary position embedding of the first `dims` features of `x`.

    x: `[B, ..., T, D]` (rank >= 3, sequence on axis -2), float16, bfloat16, float32 or float64.
    dims: even, at most `D`. traditional: rotate adjacent pairs instead of the two halves.
    base: the frequency base; exactly one of `base` and `freqs` (pass `base=None` with `freqs`).
    scale: multiplies the positions. offset: the position of row 0, an int or an integer tensor
    with one element or `B` elements (one per batch item). freqs: `[dims/2]` periods.
    Returns a tensor of `x`'s shape and dtype.
    """
    _check_rope(x, dims, base, scale, offset, freqs)
    scale = float(scale)
    backend = _kernel_backend("rope", x, dims)
    if backend is None: return _rope(x, dims, traditional, scale, offset, _inverse_frequencies(dims, base, freqs, x.device))
    inv_freq = _kernel_frequencies(dims, base, freqs, x.device)
    return rope_kernel.rope_kernel(x, dims, inv_freq, _offsets(x, offset), traditional=traditional, scale=scale, backend=backend,
                                   composition=lambda x, inv_freq: _rope(x, dims, traditional, scale, offset, inv_freq))


@dataclass(frozen=True, eq=False)
class Rotation:
    """`rope`'s parameters, for the `norm_rope` family: `dims` rotated features, `traditional`
    pairs, exactly one of `base` and `freqs` (`[dims/2]` periods), and the position `scale`."""
    dims: int
    traditional: bool = False
    base: float | None = 10000.0
    scale: float = 1.0
    freqs: Tensor | None = None

    def apply(self, x: Tensor, offset: int | Tensor) -> Tensor:
        """`rope(x, ...)` with these parameters at `offset`."""
        return rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale, offset=offset,
                    freqs=self.freqs)


def _check_rotation(op: str, rotation: Rotation) -> None:
    if not isinstance(rotation, Rotation):
        raise TypeError(f"{op}: rotation must be a fast.Rotation, got {type(rotation).__name__}")


def _check_norm(op: str, x: Tensor, weight: Tensor | None, eps: float) -> DType:
    """The normalised rows' dtype: x's promoted with the weight's, or x's without a weight (which
    normalises nothing)."""
    if weight is None: return x.dtype
    check_weight(op, "weight", weight, x.shape[-1])
    check_number(op, "eps", eps)
    return promote_types(x.dtype, weight.dtype)


def _normalized(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """`rms_norm(x, weight, eps)`, or `x` itself without a weight (no normalisation)."""
    return x if weight is None else rms_norm(x, weight, eps)


def _check_offset_fits(op: str, x: Tensor, offset: int | Tensor, cache: Tensor | None, what: str) -> None:
    """A `[B, H, S, D]` cache that can take `x`'s `L` rows at `offset` (an int that fits, or a
    one-element integer tensor)."""
    if cache is None: return
    check_tensor(op, what, cache)
    shape = tuple(x.shape)
    fits = cache.ndim == 4 and x.ndim == 4 and tuple(cache.shape[:2]) == shape[:2] and cache.shape[3] == shape[3]
    if fits and not isinstance(offset, Tensor):
        fits = 0 <= offset and offset + shape[2] <= cache.shape[2]
    check(fits, op, f"a {what} of shape {tuple(cache.shape)} cannot take {shape} at position {offset}")
    if isinstance(offset, Tensor):
        check(offset.numel() == 1, op, f"with a {what} the offset must be an int or a one-element tensor, got shape "
              f"{tuple(offset.shape)}")
    check_floating(op, what, cache.dtype)


def _write_rows(cache: Tensor, rows: Tensor, offset: int | Tensor) -> Tensor:
    """`cache` `[B, H, S, D]` with `rows` `[B, H, L, D]` at positions `offset..offset+L-1`.

    A tensor offset (one element) writes by comparison, so a position it puts outside the cache
    is skipped; an int offset is checked beforehand."""
    rows = rows.cast(cache.dtype)
    length, capacity = rows.shape[2], cache.shape[2]
    if not isinstance(offset, Tensor):
        return cache[:, :, :offset].cat(rows, cache[:, :, offset + length:], dim=2)
    index = Tensor.arange(capacity, dtype=dtypes.int32) - offset.reshape(()).cast(dtypes.int32)
    inside = (index >= 0) & (index < length)
    picked = rows[:, :, index.clip(0, length - 1)] if length > 1 else rows.expand(*rows.shape[:2], capacity, rows.shape[3])
    return inside.reshape(1, 1, capacity, 1).where(picked, cache)


def _fused(op: str, x: Tensor, weight: Tensor | None, eps: float, normed_dtype: DType, rotation: Rotation,
           offset: int | Tensor, *, v_eps: float | None = None, into: tuple[Tensor, ...] = (),
           slots: Tensor | None = None, values: Tensor | None = None,
           queries: tuple[Tensor, Tensor | None] | None = None) -> Tensor | tuple[Tensor, ...] | None:
    """The norm_rope kernel's call where it takes `op` (None where it does not: the caller runs
    the composition): the norm (with a weight), the rotation at `offset` and, with `v_eps`, the
    values `rms_norm(x, None, v_eps)` (or `values` copied as they are, into `into`'s second),
    into fresh outputs or in place into `into` (caches, or a pool at `slots`); with `queries`
    (`(q, q_weight)`, beside `into`) q's rows too, returned first. Fresh outputs differentiate
    through the composition; a call that updates buffers in place has no backward (the design's
    rule for in-place pools), its queries' rows included. Queries the launch cannot share (of
    another dtype than x's or the weight's, normalised where x is not, or past int32) are not
    taken."""
    dims = rotation.dims
    if queries is not None:
        q, q_weight = queries
        if q.dtype != x.dtype or (q_weight is None) != (weight is None) or \
                (q_weight is not None and q_weight.dtype != weight.dtype) or \
                not all(isinstance(n, int) for n in q.shape) or math.prod(q.shape) >= 2**31:
            return None
    types = (x.dtype, normed_dtype) + (() if weight is None else (weight.dtype,)) + tuple(t.dtype for t in into) + \
        (() if values is None else (values.dtype,))
    places = 0 if not into else into[0].shape[0] * into[0].shape[2] if slots is not None else into[0].shape[2]
    backend = _kernel_backend(op, x, dims, fused=(types, places))
    if backend is None: return None
    scale = float(rotation.scale)

    def composition(x: Tensor, *rest: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        *given, inv_freq = rest
        normed = x if weight is None else _rms_norm(x, given[0], normed_dtype, eps)
        rotated = _rope(normed, dims, rotation.traditional, scale, offset, inv_freq)
        return rotated if v_eps is None else (rotated, _rms_norm(x, None, x.dtype, v_eps))
    inv_freq = _kernel_frequencies(dims, rotation.base, rotation.freqs, x.device)
    return rope_kernel.norm_rope_kernel(
        x, dims, inv_freq, _offsets(x, offset), backend=backend, traditional=rotation.traditional, scale=scale,
        normed_dtype=normed_dtype, weight=weight, eps=None if weight is None else float(eps), v_eps=v_eps, into=into,
        slots=None if slots is None else int32_indices(slots).to(x.device).reshape(-1).contiguous(), values=values,
        queries=queries, composition=None if into else composition)


def _check_values(op: str, x: Tensor, values: Tensor | None, destination: Tensor | None, what: str, given: Tensor | None) -> None:
    """Values to write beside the keys: given with their destination (and the keys'), x's shape, a float dtype."""
    check((values is None) == (destination is None), op, f"values and {what} go together")
    if values is None: return
    check(given is not None, op, "values need the keys' destination too")
    check_tensor(op, "values", values)
    check(tuple(values.shape) == tuple(x.shape), op, f"values must have x's shape {tuple(x.shape)}, got {tuple(values.shape)}")
    check_floating(op, "values", values.dtype)
    check_tensor(op, what, destination)
    check(tuple(destination.shape) == tuple(given.shape), op,
          f"{what} must have the keys' destination's shape {tuple(given.shape)}, got {tuple(destination.shape)}")
    check_floating(op, what, destination.dtype)


def _check_queries(op: str, x: Tensor, queries: tuple[Tensor, Tensor | None] | None, eps: float, rotation: Rotation,
                   destination: Tensor | None, what: str) -> None:
    """Queries `(q, q_weight)` beside keys x written into `destination`: q `[B, Hq, L, D]` with
    x's B, L and D, and a weight q's norm takes (or None)."""
    if queries is None: return
    if not isinstance(queries, tuple) or len(queries) != 2:
        raise TypeError(f"{op}: queries must be a tuple (q, q_weight), got {type(queries).__name__}")
    check(destination is not None, op, f"queries go beside keys written into a {what}")
    q, q_weight = queries
    check_tensor(op, "q", q)
    check(q.ndim == 4 and x.ndim == 4 and (q.shape[0], q.shape[2], q.shape[3]) == (x.shape[0], x.shape[2], x.shape[3]), op,
          f"q must be [{x.shape[0]}, Hq, {x.shape[2]}, {x.shape[3]}] beside x of shape {tuple(x.shape)}, got {tuple(q.shape)}")
    _check_rope(q, rotation.dims, rotation.base, rotation.scale, 0, rotation.freqs, op=op,
                dtype=_check_norm(op, q, q_weight, eps))


def _queries_apart(queries: tuple[Tensor, Tensor | None], eps: float, rotation: Rotation, offset: int | Tensor,
                   written: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
    """`norm_rope(q, q_weight, ...)` at `offset` (a scalar or one per batch item) in a call of its
    own, before the keys' `written` destinations."""
    q, q_weight = queries
    return (norm_rope(q, q_weight, eps, rotation, offset), *(written if isinstance(written, tuple) else (written,)))


def norm_rope(x: Tensor, weight: Tensor | None, eps: float, rotation: Rotation, offset: int | Tensor = 0,
              cache: Tensor | None = None, values: Tensor | None = None, values_cache: Tensor | None = None, *,
              queries: tuple[Tensor, Tensor | None] | None = None) -> Tensor | tuple[Tensor, ...]:
    """RMS-normalise each head's rows, rotate them, and optionally write them into a cache.

    x: `[B, H, L, D]` (or any rank >= 3 without a cache). weight: `[D]`, or None for no
    normalisation. rotation: a `Rotation`. offset: the position of row 0 (an int, or an integer
    tensor of one element; without a cache also one per batch item). cache: `[B, H, S, D]` with
    `S >= offset + L` for an int offset; a tensor offset's rows outside the cache are skipped.
    Returns the rotated rows `[B, H, L, D]` (x's dtype promoted with the weight's), or with a
    cache the cache with them at `offset..offset+L-1` (read through the result: `docs/design.md`,
    the in-place contract). values, values_cache: rows of x's shape and a cache of the cache's
    shape, given with a cache: the values written as they are at the same positions (a model's
    keys and values in one pass); returns both caches. queries: `(q, q_weight)`, given with a
    cache: q `[B, Hq, L, D]` (a model's queries beside its keys x) normalised with q_weight (or
    None) and the same eps, rotated at the same positions, returned first: `(q_rotated, cache)`
    or `(q_rotated, cache, values_cache)`. On METAL and CUDA one kernel reads each row once and
    writes it once, the caches in place, and takes the queries' rows in the same launch where
    their dtypes are the keys'. That launch, updating the caches in place, has no backward, for
    the queries' rows too: to differentiate through q, rotate it in a call of its own.
    """
    op = "norm_rope"
    check_tensor(op, "x", x)
    _check_rotation(op, rotation)
    normed_dtype = _check_norm(op, x, weight, eps)
    _check_rope(x, rotation.dims, rotation.base, rotation.scale, offset, rotation.freqs, op=op, dtype=normed_dtype)
    _check_offset_fits(op, x, offset, cache, "cache")
    _check_values(op, x, values, values_cache, "values_cache", cache)
    _check_queries(op, x, queries, eps, rotation, cache, "cache")
    if weight is None and cache is None: return rotation.apply(x, offset)  # the rotation alone
    into = () if cache is None else (cache,) if values is None else (cache, values_cache)
    fused = _fused(op, x, weight, eps, normed_dtype, rotation, offset, into=into, values=values, queries=queries)
    if fused is not None: return fused
    if queries is not None:
        return _queries_apart(queries, eps, rotation, offset, norm_rope(x, weight, eps, rotation, offset, cache, values, values_cache))
    rotated = rotation.apply(_normalized(x, weight, eps), offset)
    if cache is None: return rotated
    written = _write_rows(cache, rotated, offset)
    return written if values is None else (written, _write_rows(values_cache, values, offset))


def norm_rope_at(x: Tensor, weight: Tensor | None, eps: float, rotation: Rotation, positions: Tensor,
                 pool: Tensor | None = None, slots: Tensor | None = None, values: Tensor | None = None,
                 values_pool: Tensor | None = None, *,
                 queries: tuple[Tensor, Tensor | None] | None = None) -> Tensor | tuple[Tensor, ...]:
    """`norm_rope` with a start position per sequence, optionally written into a paged pool.

    x: `[B, H, L, D]`; positions: `[B]` integers (row `l` of sequence `b` is at
    `positions[b] + l`). pool: `[blocks, H, block_size, D]` and slots: `[B, L]` integers, given
    together: row `l` of sequence `b` goes to slot `slots[b, l]` (out-of-range slots skipped; of
    rows naming one slot the composition keeps the later, while the kernel's rows race, so the
    slot holds pieces of either). Returns the rotated rows, or the updated pool (on METAL and
    CUDA written in place). values, values_pool: rows of x's shape and a pool of the pool's shape,
    given with a pool: the values written as they are at the same slots (`paged_write`); returns
    both pools. queries: `(q, q_weight)`, given with a pool, as `norm_rope`'s: returned first.
    """
    op = "norm_rope_at"
    check_tensor(op, "x", x)
    _check_rotation(op, rotation)
    check_tensor(op, "positions", positions)
    check(x.ndim == 4, op, f"x must be [B, H, L, D], got shape {tuple(x.shape)}")
    check(tuple(positions.shape) == (x.shape[0],), op, f"positions must be [{x.shape[0]}], got shape {tuple(positions.shape)}")
    check((pool is None) == (slots is None), op, "pool and slots go together")
    if pool is not None:
        check_tensor(op, "pool", pool)
        check_tensor(op, "slots", slots)
        check(pool.ndim == 4 and pool.shape[1] == x.shape[1] and pool.shape[3] == x.shape[3], op,
              f"pool must be [blocks, {x.shape[1]}, block_size, {x.shape[3]}], got shape {tuple(pool.shape)}")
        check(tuple(slots.shape) == (x.shape[0], x.shape[2]), op,
              f"slots must be [{x.shape[0]}, {x.shape[2]}], got shape {tuple(slots.shape)}")
        check_integer(op, "slots", slots.dtype)
        check_floating(op, "pool", pool.dtype)
    normed_dtype = _check_norm(op, x, weight, eps)
    _check_rope(x, rotation.dims, rotation.base, rotation.scale, positions, rotation.freqs, op=op, dtype=normed_dtype)
    _check_values(op, x, values, values_pool, "values_pool", pool)
    _check_queries(op, x, queries, eps, rotation, pool, "pool")
    if weight is None and pool is None: return rotation.apply(x, positions)  # the rotation alone
    into = () if pool is None else (pool,) if values is None else (pool, values_pool)
    fused = _fused(op, x, weight, eps, normed_dtype, rotation, positions, into=into, slots=slots, values=values,
                   queries=queries)
    if fused is not None: return fused
    if queries is not None:
        return _queries_apart(queries, eps, rotation, positions,
                              norm_rope_at(x, weight, eps, rotation, positions, pool, slots, values, values_pool))
    rotated = rotation.apply(_normalized(x, weight, eps), positions)
    if pool is None: return rotated
    written = paged_write(pool, rotated.transpose(1, 2), slots)
    return written if values is None else (written, paged_write(values_pool, values.transpose(1, 2), slots))


def norm_rope_kv(x: Tensor, weight: Tensor | None, eps: float, v_eps: float, rotation: Rotation,
                 offset: int | Tensor = 0, k_cache: Tensor | None = None,
                 v_cache: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Keys and values from one projection (K = V attention, Gemma-style).

    `k = norm_rope(x, weight, eps, rotation, offset)` and `v = rms_norm(x, None, v_eps)`; with
    caches (both `[B, H, S, D]`, given together) each is written at `offset..offset+L-1` and the
    updated caches are returned. x: `[B, H, L, D]`. Returns `(k, v)`. On METAL and CUDA one
    kernel reads x once and writes both, the caches in place.
    """
    op = "norm_rope_kv"
    check_tensor(op, "x", x)
    _check_rotation(op, rotation)
    check((k_cache is None) == (v_cache is None), op, "k_cache and v_cache go together")
    normed_dtype = _check_norm(op, x, weight, eps)
    _check_rope(x, rotation.dims, rotation.base, rotation.scale, offset, rotation.freqs, op=op, dtype=normed_dtype)
    check_floating(op, "x", x.dtype)  # the values are x's own norm
    _check_offset_fits(op, x, offset, k_cache, "k_cache")
    _check_offset_fits(op, x, offset, v_cache, "v_cache")
    v_eps = check_number(op, "v_eps", v_eps)
    fused = _fused(op, x, weight, eps, normed_dtype, rotation, offset, v_eps=v_eps,
                   into=() if k_cache is None else (k_cache, v_cache))
    if fused is not None: return fused
    keys = rotation.apply(_normalized(x, weight, eps), offset)
    values = rms_norm(x, None, v_eps)
    if k_cache is None: return keys, values
    return _write_rows(k_cache, keys, offset), _write_rows(v_cache, values, offset)
