"""Mixture-of-experts routing and the weighted sum of the experts' outputs."""
from __future__ import annotations

from tinygrad import Tensor, dtypes

from .. import kernels
from ..tensor import check, check_floating, check_int, check_tensor, promote_types


def moe_route(probs: Tensor, k: int, normalize: bool = False) -> tuple[Tensor, Tensor]:
    """The `k` most probable experts of each row.

    probs: `[..., E]`, a float dtype; k: `1..E`. Returns `(indices, scores)`, both `[..., k]`:
    the experts' indices as uint32 in ascending order of probability (ties in ascending index:
    a stable order, as the last `k` of a stable ascending sort), and their probabilities, divided
    by their sum when `normalize`.
    """
    op = "moe_route"
    check_tensor(op, "probs", probs)
    check(probs.ndim >= 1, op, "probs needs at least one dimension, got shape ()")
    check_floating(op, "probs", probs.dtype)
    experts = probs.shape[-1]
    check_int(op, "k", k)
    check(1 <= k <= experts, op, f"k must be in 1..={experts} for probabilities of shape {tuple(probs.shape)}")
    kernels.composition(op, f"{tuple(probs.shape)} on {probs.device}")
    # Each expert's place in the stable ascending order: how many come before it.
    mine, other = probs.unsqueeze(-1), probs.unsqueeze(-2)                      # [..., E, 1], [..., 1, E]
    index = Tensor.arange(experts, dtype=dtypes.int32)
    earlier = (other < mine) | ((other == mine) & (index.reshape(1, experts) < index.reshape(experts, 1)))
    place = earlier.cast(dtypes.int32).sum(-1)                                   # [..., E]
    # Output m holds the expert whose place is E - k + m.
    chosen = place.unsqueeze(-2) == (Tensor.arange(k, dtype=dtypes.int32) + (experts - k)).reshape(k, 1)  # [..., k, E]
    indices = chosen.where(index.reshape(1, experts), 0).sum(-1)
    scores = chosen.where(probs.unsqueeze(-2), 0.0).sum(-1)
    if normalize: scores = scores / scores.sum(-1, keepdim=True)
    return indices.cast(dtypes.uint32), scores.cast(probs.dtype)


def weighted_sum(x: Tensor, w: Tensor) -> Tensor:
    """`sum_k x[..., k, :] * w[..., k]`: experts' outputs `[..., k, D]` combined by their weights
    `[..., k]`. Returns `[..., D]` in the promoted dtype."""
    op = "weighted_sum"
    check_tensor(op, "x", x)
    check_tensor(op, "w", w)
    check_floating(op, "x", x.dtype)
    check_floating(op, "w", w.dtype)
    check(x.ndim >= 2 and tuple(w.shape) == tuple(x.shape[:-1]), op,
          f"x must be [..., k, D] and w [..., k], got {tuple(x.shape)} and {tuple(w.shape)}")
    kernels.composition(op, f"{tuple(x.shape)} on {x.device}")
    dtype = promote_types(x.dtype, w.dtype)
    return (x.cast(dtype) * w.cast(dtype).unsqueeze(-1)).sum(-2)
