"""Depthwise 1-D convolution, and the causal one of linear-attention layers with its rolling
state kept in a pool of slots."""
from __future__ import annotations

from tinygrad import Tensor, dtypes

from .. import kernels
from ..tensor import check, check_floating, check_int, check_integer, check_tensor, promote_types, put_rows, take_rows


def _convolve(x: Tensor, w: Tensor, stride: int, dilation: int, length: int) -> Tensor:
    """`out[n, l, c] = sum_k x[n, l * stride + k * dilation, c] * w[c, k, 0]` for `length` outputs."""
    taps = w.shape[1]
    span = (length - 1) * stride + 1
    out = None
    for tap in range(taps):
        start = tap * dilation
        term = x[:, start:start + span:stride] * w[:, tap, 0]
        out = term if out is None else out + term
    return out


def depthwise_conv1d(x: Tensor, w: Tensor, stride: int = 1, padding: int = 0, dilation: int = 1) -> Tensor:
    """Each channel convolved with its own filter (cross-correlation, as MLX's `conv1d` with
    `groups = C`).

    x: `[N, L, C]`; w: `[C, K, 1]`. Returns `[N, L_out, C]` in the promoted dtype, with
    `L_out = (L + 2 padding - dilation (K - 1) - 1) // stride + 1`.
    """
    op = "depthwise_conv1d"
    check_tensor(op, "x", x)
    check_tensor(op, "w", w)
    check_floating(op, "x", x.dtype)
    check_floating(op, "w", w.dtype)
    stride, padding, dilation = (check_int(op, n, v, s) for n, v, s in
                                 (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    check(x.ndim == 3 and w.ndim == 3 and w.shape[0] == x.shape[2] and w.shape[2] == 1 and w.shape[1] >= 1, op,
          f"x must be [N, L, C] and w [C, K, 1], got {tuple(x.shape)} and {tuple(w.shape)}")
    span = dilation * (w.shape[1] - 1) + 1
    padded = x.shape[1] + 2 * padding
    check(padded >= span, op, f"the padded input ({padded}) is shorter than the filter's span ({span})")
    kernels.composition(op, f"{tuple(x.shape)} on {x.device}")
    dtype = promote_types(x.dtype, w.dtype)
    x = x.cast(dtype).pad((None, (padding, padding), None)) if padding else x.cast(dtype)
    return _convolve(x, w.cast(dtype), stride, dilation, (padded - span) // stride + 1)


def causal_conv1d_slots(x: Tensor, w: Tensor, pool: Tensor, slots: Tensor, silu: bool = False) -> tuple[Tensor, Tensor]:
    """A causal depthwise convolution continuing each sequence from its state in a pool.

    x: `[B, L, C]` new inputs; w: `[C, K, 1]`; pool: `[P, K - 1, C]`, each slot a sequence's last
    `K - 1` inputs; slots: `[B]` integers. Sequence `b` convolves `pool[slots[b]]` followed by its
    inputs (then `silu` if asked) and leaves its last `K - 1` inputs in `pool[slots[b]]`. A slot
    outside `0..P-1` is skipped: its outputs are zeros and no pool row changes.
    Returns `(y [B, L, C], the updated pool)`, in x's dtype.
    """
    op = "causal_conv1d_slots"
    for name, t in (("x", x), ("w", w), ("pool", pool), ("slots", slots)): check_tensor(op, name, t)
    for name, t in (("x", x), ("w", w), ("pool", pool)): check_floating(op, name, t.dtype)
    check_integer(op, "slots", slots.dtype)
    taps = w.shape[1] if w.ndim == 3 else 0
    check(x.ndim == 3 and w.ndim == 3 and w.shape[0] == x.shape[2] and w.shape[2] == 1 and taps >= 1
          and pool.ndim == 3 and tuple(pool.shape[1:]) == (taps - 1, x.shape[2]) and tuple(slots.shape) == (x.shape[0],), op,
          f"x must be [B, L, C], w [C, K, 1], pool [slots, K - 1, C] and slots [B], got {tuple(x.shape)}, "
          f"{tuple(w.shape)}, {tuple(pool.shape)} and {tuple(slots.shape)}")
    kernels.composition(op, f"{tuple(x.shape)} on {x.device}")
    batch, length, _ = x.shape
    places = pool.shape[0]
    valid = ((slots >= 0) & (slots < places)).reshape(batch, 1, 1)
    if places and taps > 1:
        states = take_rows(pool, slots.cast(dtypes.int64).clip(0, places - 1).cast(dtypes.int32))
        states = valid.where(states.cast(x.dtype), 0.0)
    else:
        states = Tensor.zeros(batch, taps - 1, x.shape[2], dtype=x.dtype, device=x.device)
    sequence = states.cat(x, dim=1) if taps > 1 else x
    y = _convolve(sequence, w.cast(x.dtype), 1, 1, length)
    if silu: y = y.silu()
    y = valid.where(y, 0.0)
    kept = sequence[:, length:length + taps - 1]
    return y, put_rows(pool, kept, slots)
