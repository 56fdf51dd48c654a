"""Attention over a paged KV cache, and writes into one.

A paged cache is a pool `[blocks, Hkv, block_size, D]`; sequence `b` owns the blocks listed in
row `b` of a block table `[B, max_blocks]`, in order, and holds `lengths[b]` positions. Slot `s`
of the pool is block `s // block_size`, position `s % block_size`.

Hostile inputs are safe: table entries outside `0..blocks-1` are clamped, lengths are clamped to
the table's capacity, positions no query attends (another sequence's data, NaN) never reach the
result, and out-of-range slots are skipped.
"""
from __future__ import annotations

import math

from tinygrad import Tensor, dtypes

from .. import kernels
from ..kernels import paged as paged_kernel
from ..kernels.attention import decode_attention, paged_unsupported
from ..kernels.prefill import prefill_attention
from ..kernels.program import int32_indices, kernel_input
from ..tensor import check, check_floating, check_integer, check_number, check_tensor, dtype_name, promote_types, put_rows, take_rows
from .attention import compose_attention, report_plan
from .plan import AttentionPlan, Composed, Tiled, Vector, plan_call, validate_attention


def _check_pool(op: str, what: str, pool: Tensor) -> None:
    check_tensor(op, what, pool)
    check(pool.ndim == 4, op, f"{what} must be [blocks, Hkv, block_size, D], got shape {tuple(pool.shape)}")
    check_floating(op, what, pool.dtype)


def _gather_sequences(pool: Tensor, block_ids: Tensor) -> Tensor:
    """Each sequence's blocks in table order: `[B, Hkv, max_blocks * block_size, D]`."""
    batch, max_blocks = block_ids.shape
    _, heads, block_size, head_dim = pool.shape
    gathered = take_rows(pool, block_ids)                                  # [B, M, Hkv, bs, D]
    return gathered.permute(0, 2, 1, 3, 4).reshape(batch, heads, max_blocks * block_size, head_dim)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, lengths: Tensor, scale: float,
                    *, sinks: Tensor | None = None, window: int | None = None) -> Tensor:
    """Causal attention of each sequence's last `Lq` positions over its paged keys and values.

    q: `[B, Hq, Lq, D]`; k_cache, v_cache: `[blocks, Hkv, block_size, D]` (`Hq` a multiple of
    `Hkv`); block_tables: `[B, max_blocks]` integers; lengths: `[B]` integers. Query `l` of
    sequence `b` sees positions `< lengths[b] - Lq + l + 1`, and with `window` only the `window`
    positions up to that one. sinks: `[Hq]`. Returns `[B, Hq, Lq, D]` in the promoted dtype.
    """
    op = "paged_attention"
    check_tensor(op, "q", q)
    check(q.ndim == 4, op, f"q must be [B, Hq, Lq, D], got shape {tuple(q.shape)}")
    check_floating(op, "q", q.dtype)
    _check_pool(op, "k_cache", k_cache)
    _check_pool(op, "v_cache", v_cache)
    check(tuple(k_cache.shape) == tuple(v_cache.shape), op,
          f"the caches must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    batch, q_heads, q_len, head_dim = q.shape
    blocks, kv_heads, block_size, cache_dim = k_cache.shape
    check(cache_dim == head_dim and kv_heads > 0 and q_heads % kv_heads == 0, op,
          f"q's heads ({q_heads}) must be a multiple of the caches' ({kv_heads}), with head size {head_dim}, "
          f"got caches of shape {tuple(k_cache.shape)}")
    check(blocks > 0, op, "the caches hold no blocks")
    check_tensor(op, "block_tables", block_tables)
    check(block_tables.ndim == 2 and block_tables.shape[0] == batch, op,
          f"block_tables must be [{batch}, max_blocks], got shape {tuple(block_tables.shape)}")
    check_integer(op, "block_tables", block_tables.dtype)
    check_tensor(op, "lengths", lengths)
    check(tuple(lengths.shape) == (batch,), op, f"lengths must be [{batch}], got shape {tuple(lengths.shape)}")
    check_integer(op, "lengths", lengths.dtype)
    check_number(op, "scale", scale)
    dtype = promote_types(promote_types(q.dtype, k_cache.dtype), v_cache.dtype)
    capacity = block_tables.shape[1] * block_size
    cache_shape = (batch, kv_heads, capacity, head_dim)
    call = validate_attention(op, q.shape, cache_shape, cache_shape, dtype, "causal", sinks, window, None)

    # The kernels clamp table entries and lengths themselves (as the composition's clamps below):
    # they read them as int32, where a wider value stays outside the same side of the range.
    given_tables, given_lengths = block_tables, lengths
    def clamped() -> tuple[Tensor, Tensor]:
        return (given_tables.cast(dtypes.int64).clip(0, blocks - 1).cast(dtypes.int32),
                given_lengths.cast(dtypes.int64).clip(0, capacity).cast(dtypes.int32))
    target = kernels.target(q.device)
    plan = plan_call(call, target, op)
    if isinstance(plan.kernel, Vector) and (reason := paged_unsupported(head_dim, block_size)) is not None:
        plan = AttentionPlan(Composed(), 0, 0, False, reason)
    report_plan(op, f"{tuple(q.shape)} over {tuple(k_cache.shape)} pages {dtype_name(dtype)}", q.device, plan)
    def composition(q, k_pool, v_pool, _mask, sinks):
        return _paged_composition(q, k_pool, v_pool, *clamped(), scale, sinks, window)
    if isinstance(plan.kernel, (Vector, Tiled)):
        paged = (int32_indices(block_tables), int32_indices(lengths), block_size)
        run = decode_attention if isinstance(plan.kernel, Vector) else prefill_attention
        return run(q, k_cache, v_cache, scale, plan.kernel, dtype=dtype, backend=target.backend, causal=True,
                   window=call.window, mask=None, sinks=sinks, paged=paged, composition=composition)
    return _paged_composition(q.cast(dtype), k_cache.cast(dtype), v_cache.cast(dtype), *clamped(), scale, sinks, window)


def _paged_composition(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_ids: Tensor, lengths: Tensor, scale: float,
                       sinks: Tensor | None, window: int | None) -> Tensor:
    """Every listed block gathered, then attention under a mask of each sequence's positions.
    `block_ids` are clamped to the pool, `lengths` to the table's capacity."""
    batch, q_len = q.shape[0], q.shape[2]
    keys, values = _gather_sequences(k_cache, block_ids), _gather_sequences(v_cache, block_ids)
    capacity = keys.shape[2]
    lengths = lengths.reshape(batch, 1, 1, 1)
    positions = Tensor.arange(capacity, dtype=dtypes.int32).reshape(1, 1, 1, capacity)
    ends = lengths - (q_len - 1) + Tensor.arange(q_len, dtype=dtypes.int32).reshape(1, 1, q_len, 1)
    visible = positions < ends                                              # [B, 1, Lq, capacity]
    live = positions < lengths                                              # seen by some query
    if window is not None:
        visible = visible & (positions >= ends - window)
        live = live & (positions >= lengths - (q_len + window - 1))
    # Masked scores are replaced, never added to, so NaN keys outside the mask stay out; values
    # no query attends are zeroed so that a zero weight never meets a NaN.
    values = live.reshape(batch, 1, capacity, 1).where(values, 0.0)
    return compose_attention(q, keys, values, scale, visible, sinks)


def paged_write(cache: Tensor, new: Tensor, slots: Tensor) -> Tensor:
    """`cache` with the rows of `new` written at `slots`.

    cache: `[blocks, Hkv, block_size, D]`; new: `[T, Hkv, D]` or `[B, T, Hkv, D]`; slots: integers
    of `new`'s leading shape. Slot `s` is block `s // block_size`, position `s % block_size`; slots
    outside `0..blocks*block_size-1` are skipped; when two rows name one slot the later row wins.
    Returns the updated cache (the caller reads through it; `.clone()` keeps old values). On METAL
    and CUDA one kernel writes the rows into `cache`'s buffer in place (when `cache` is a realized
    buffer; otherwise a copy of it) and runs at once; rows naming one slot then race (the slot
    holds pieces of either), where the composition keeps the later row.
    """
    op = "paged_write"
    _check_pool(op, "cache", cache)
    check_tensor(op, "new", new)
    check_tensor(op, "slots", slots)
    blocks, heads, block_size, head_dim = cache.shape
    check(new.ndim in (3, 4) and tuple(new.shape[-2:]) == (heads, head_dim), op,
          f"new must be [T, {heads}, {head_dim}] or [B, T, {heads}, {head_dim}], got shape {tuple(new.shape)}")
    check(tuple(slots.shape) == tuple(new.shape[:-2]), op,
          f"slots must have new's leading shape {tuple(new.shape[:-2])}, got {tuple(slots.shape)}")
    check_integer(op, "slots", slots.dtype)
    check_floating(op, "new", new.dtype)
    count = slots.numel()
    backend = kernels.choose(op, f"{tuple(new.shape)} into {tuple(cache.shape)} on {cache.device}", cache.device, "paged_write",
                             lambda backend: paged_kernel.unsupported((new.dtype, cache.dtype), count * heads, head_dim,
                                                                      blocks * block_size, kernels.target(cache.device)))
    if backend is not None:
        return paged_kernel.paged_write_kernel(cache, new.reshape(count, heads, head_dim), slots.reshape(-1), backend=backend)
    rows = cache.permute(0, 2, 1, 3).reshape(blocks * block_size, heads, head_dim)
    rows = put_rows(rows, new.reshape(-1, heads, head_dim), slots.reshape(-1))
    return rows.reshape(blocks, block_size, heads, head_dim).permute(0, 2, 1, 3)


def take(x: Tensor, indices: Tensor) -> Tensor:
    """Rows of `x` by index along its first axis (MLX's `take(x, indices, axis=0)`, PyTorch's
    `x[indices]`): an embedding lookup, a pool's rows.

    x: `[rows, ...]` of any dtype; indices: integers of any shape. Returns `[*indices.shape,
    *x.shape[1:]]` in x's dtype; an index outside `0..rows-1` (negative too: no wrapping) gives a
    row of zeros. On METAL and CUDA, where x is a buffer, one kernel copies the rows named as their
    bits (tinygrad's indexing compares every row with the index, reading all of x); gradients reach
    x through the composition.
    """
    op = "take"
    check_tensor(op, "x", x)
    check_tensor(op, "indices", indices)
    check(x.ndim >= 1, op, "x needs at least one dimension")
    check_integer(op, "indices", indices.dtype)
    rows = x.shape[0]
    row_bytes = math.prod(x.shape[1:]) * x.dtype.itemsize
    count = math.prod(indices.shape)

    def unsupported(backend: str) -> str | None:
        if not all(isinstance(n, int) for n in (*x.shape, *indices.shape)): return "a symbolic shape"
        if kernel_input(x) is not x: return "x is not a buffer (its rows would be computed first)"
        return paged_kernel.take_unsupported(row_bytes, count, rows, kernels.target(x.device))
    backend = kernels.choose(op, f"{count} of {tuple(x.shape)} on {x.device}", x.device, "take", unsupported)

    def composition(source: Tensor) -> Tensor:
        inside = (indices >= 0).where(indices, rows)   # tinygrad's indexing wraps negative indices: send them past the end
        return take_rows(source, inside)
    if backend is None: return composition(x)
    return paged_kernel.take_kernel(x, indices, backend=backend, composition=composition)
