"""Scaled dot-product attention: validated, planned (`fast.plan`), then run by the plan's route.

Numerics on every path: scores, softmax and the weighted sum of values in float32 (float64
stays float64), rounded once to the result dtype. `"causal"` is lower-right aligned (query `i`
sees keys `j <= i + Lk - Lq`); a window `w` keeps the `w` keys up to that one; sinks are per-head
logits, not scaled, that join the softmax denominator; a query that sees no key gets zeros.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes

from .. import kernels
from ..kernels.attention import decode_attention
from ..kernels.prefill import prefill_attention
from ..tensor import check, check_floating, check_number, check_tensor, compute_dtype, dtype_name, promote_types, zero_after
from .plan import AttentionCall, AttentionPlan, BlockedD512, ComposedBlocks, Tiled, Vector, block_bounds, plan_call, \
    validate_attention


def _block_mask(call: AttentionCall, mask: Tensor, start: int, end: int, lo: int, hi: int) -> Tensor:
    """An array mask's part for query rows `start..end` and keys `lo..hi`, as `[B, Hkv, rep, rows, keys]`."""
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    if mask.shape[2] != 1: mask = mask[:, :, start:end]
    if mask.shape[3] != 1: mask = mask[:, :, :, lo:hi]
    mask = mask.expand(call.batch, call.q_heads, end - start, hi - lo)
    return mask.reshape(call.batch, call.kv_heads, call.group, end - start, hi - lo)


def attend_block(call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, scale: float | Tensor, mask: Tensor | None,
                 sinks: Tensor | None, start: int, end: int) -> Tensor:
    """The composition for query rows `start..end` over the keys they can see.

    Returns `[B, Hq, end - start, Dv]` in `call.dtype`. K and V are read per key head: the
    grouped query heads are a `rep` axis of the queries, never a copy of K and V. `scale` may
    be a scalar tensor (to order this block after another, see `zero_after`).
    """
    b, hkv, rep, rows = call.batch, call.kv_heads, call.group, end - start
    lo, hi = call.key_range(start, end)
    if hi <= lo:
        return Tensor.zeros(b, call.q_heads, rows, call.v_head_dim, dtype=call.dtype, device=q.device)
    acc = compute_dtype(call.dtype)
    queries = q[:, :, start:end].cast(acc).reshape(b, hkv, rep, rows, call.head_dim)
    keys = k[:, :, lo:hi].cast(acc).unsqueeze(2)
    values = v[:, :, lo:hi].cast(acc).unsqueeze(2)
    scores = (queries @ keys.transpose(-1, -2)) * scale                         # [B, Hkv, rep, rows, keys]
    visible = None
    if call.mask == "causal":
        # Query row r sits at position start + r + Lk - Lq; key c at lo + c.
        query_positions = Tensor.arange(rows, dtype=dtypes.int32).reshape(rows, 1) + (start + call.k_len - call.q_len)
        key_positions = Tensor.arange(hi - lo, dtype=dtypes.int32).reshape(1, hi - lo) + lo
        visible = key_positions <= query_positions
        if call.window is not None:
            visible = visible & (key_positions > query_positions - call.window)
    elif mask is not None:
        part = _block_mask(call, mask, start, end, lo, hi)
        if part.dtype == dtypes.bool:
            visible = part
        else:
            scores = scores + part.cast(acc)
    if visible is not None:
        scores = visible.where(scores, float("-inf"))
    row_max = scores.max(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.cast(acc).reshape(1, hkv, rep, 1, 1)
        row_max = row_max.maximum(sink)
    row_max = (row_max == float("-inf")).where(0.0, row_max).detach()  # rows that see nothing
    weights = (scores - row_max).exp()
    denominator = weights.sum(-1, keepdim=True)
    if sinks is not None:
        denominator = denominator + (sink - row_max).exp()
    out = (weights @ values) / (denominator == 0).where(1.0, denominator)
    return out.reshape(b, call.q_heads, rows, call.v_head_dim).cast(call.dtype)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, *, mask: str | Tensor | None = None,
                                 sinks: Tensor | None = None, window: int | None = None,
                                 max_score_bytes: int | None = None) -> Tensor:
    """`softmax(scale * q kᵀ + mask) v` with grouped key heads, sinks, windows and a memory cap.

    q: `[B, Hq, Lq, D]`, k: `[B, Hkv, Lk, D]`, v: `[B, Hkv, Lk, Dv]`, `Hq` a multiple of `Hkv`
    (query head `h` reads key head `h // (Hq / Hkv)`); float dtypes, promoted together (MLX's
    rules) to the result dtype. scale: a number.
    mask: None, `"causal"` (lower-right aligned), a boolean tensor (true attends) or an additive
    float tensor whose dtype promotes to the result's, broadcastable to `[B, Hq, Lq, Lk]`.
    sinks: `[Hq]` logits that join the float32 softmax denominator (not scaled).
    window: with `"causal"`, keep the `window` keys up to each query's last (`>= Lk`: plain causal).
    max_score_bytes: a cap on the largest score-sized intermediate; the composition then runs in
    blocks of query rows (see `plan_attention`).
    Returns `[B, Hq, Lq, Dv]` in the result dtype; no queries give an empty result, no keys zeros.
    """
    op = "scaled_dot_product_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, name, t)
        check_floating(op, name, t.dtype)
    scale = check_number(op, "scale", scale)
    dtype = promote_types(promote_types(q.dtype, k.dtype), v.dtype)
    call = validate_attention(op, q.shape, k.shape, v.shape, dtype, mask, sinks, window, max_score_bytes)
    target = kernels.target(q.device)
    plan = plan_call(call, target, op)
    report_plan(op, f"{tuple(q.shape)} x {tuple(k.shape)} {dtype_name(dtype)}", q.device, plan)
    if 0 in (call.batch, call.q_heads, call.q_len, call.k_len):
        return Tensor.zeros(call.batch, call.q_heads, call.q_len, call.v_head_dim, dtype=dtype, device=q.device)
    array_mask = mask if isinstance(mask, Tensor) else None
    if isinstance(plan.kernel, Vector):
        return decode_attention(q, k, v, scale, plan.kernel, dtype=dtype, backend=target.backend,
                                causal=call.mask == "causal", window=call.window, mask=array_mask, sinks=sinks,
                                composition=lambda q, k, v, m, s: compose(call, q, k, v, scale, m, s, call.q_len))
    symbolic = [n for n in (*q.shape, *k.shape, *v.shape) if not isinstance(n, int)]
    check(not symbolic, op, "a symbolic size (a bound variable) runs only on the decode kernels (METAL or CUDA, "
                            f"at most 8 queries); this call's plan is {plan.kernel}")
    if isinstance(plan.kernel, Tiled):
        return prefill_attention(q, k, v, scale, plan.kernel, dtype=dtype, backend=target.backend,
                                 causal=call.mask == "causal", window=call.window, mask=array_mask, sinks=sinks,
                                 composition=lambda q, k, v, m, s: compose(call, q, k, v, scale, m, s, call.q_len))
    rows = plan.kernel.rows if isinstance(plan.kernel, (ComposedBlocks, BlockedD512)) else call.q_len
    return compose(call, q, k, v, scale, array_mask, sinks, rows)


def report_plan(op: str, description: str, device: str, plan: AttentionPlan) -> None:
    """Say under NUVEC_DEBUG which program runs an attention call, and why a composition does."""
    if not kernels.debugging(): return
    where = f"{op} {description} on {device}: {plan.kernel}"
    if isinstance(plan.kernel, Vector): kernels.debug(f"{where}, the decode kernels")
    elif isinstance(plan.kernel, Tiled): kernels.debug(f"{where}, the tiled kernel")
    else: kernels.debug(f"{where}, composition ({plan.reason if kernels.active_backend(device) else kernels.unavailable(device)})")


def compose_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None, sinks: Tensor | None) -> Tensor:
    """The uncapped composition of `q`, `k`, `v` (one dtype) under an array mask: what the paged
    attention's composition and backward run."""
    call = validate_attention("scaled_dot_product_attention", q.shape, k.shape, v.shape, q.dtype, mask, sinks, None, None)
    return compose(call, q, k, v, scale, mask, sinks, call.q_len)


def compose(call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None,
            sinks: Tensor | None, rows: int) -> Tensor:
    """The composition in blocks of `rows` query rows (all of them: one block)."""
    blocks: list[Tensor] = []
    for start, end in block_bounds(call.q_len, rows):
        # Each block's scores wait for the previous block's output: one block's scores live at a time.
        block_scale = scale if not blocks else zero_after(blocks[-1], compute_dtype(call.dtype)) + scale
        blocks.append(attend_block(call, q, k, v, block_scale, mask, sinks, start, end))
    return blocks[0] if len(blocks) == 1 else blocks[0].cat(*blocks[1:], dim=2)
