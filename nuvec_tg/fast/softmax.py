"""Softmax, log-sum-exp and cross-entropy, accumulated in float32.

`softmax` is precise (MLX's `precise=True`): for float16 and bfloat16 the maximum, the
exponentials and the sum are float32 and the result is the float32 softmax rounded once, bit for
bit. float64 stays float64.

Over the last axis, on METAL and CUDA, float16, bfloat16 and float32 calls run the row kernels
(`kernels/softmax.py`); every other call, and every gradient, is the composition here.
"""
from __future__ import annotations

import math

from tinygrad import Tensor, dtypes

from .. import kernels
from ..kernels import softmax as kernel
from ..tensor import check, check_floating, check_integer, check_tensor, compute_dtype, normalize_axis


def _softmax(x: Tensor, axis: int) -> Tensor:
    """Softmax of `x` along `axis` in `x`'s dtype (no checks, no casts)."""
    shifted = x - x.max(axis, keepdim=True).detach()
    exponentials = shifted.exp()
    return exponentials / exponentials.sum(axis, keepdim=True)


def _logsumexp(x: Tensor, axis: int) -> Tensor:
    """`log(sum(exp(x)))` along `axis` (kept) in `x`'s dtype; rows whose maximum is infinite give it."""
    row_max = x.max(axis, keepdim=True).detach()
    finite = (x - row_max).exp().sum(axis, keepdim=True).log() + row_max
    return (row_max.abs() == float("inf")).where(row_max, finite)


def _kernel_backend(op: str, x: Tensor, axis: int) -> str | None:
    """The backend whose row kernel runs `op` over `axis` of `x`, or None (the composition)."""
    def unsupported(backend: str) -> str | None:
        if axis != x.ndim - 1: return f"axis {axis} is not the last"
        return kernel.unsupported(x.dtype, math.prod(x.shape[:-1]), x.shape[-1], kernels.target(x.device))
    return kernels.choose(op, f"{tuple(x.shape)} on {x.device}", x.device, op, unsupported)


def _softmax_composition(x: Tensor, axis: int = -1) -> Tensor:
    """`_softmax` in float32 (float64 for float64), rounded once to x's dtype."""
    return _softmax(x.cast(compute_dtype(x.dtype)), axis).cast(x.dtype)


def _logsumexp_composition(x: Tensor, axis: int = -1) -> Tensor:
    """`_logsumexp` in float32 (float64 for float64), `axis` kept, in x's dtype."""
    return _logsumexp(x.cast(compute_dtype(x.dtype)), axis).cast(x.dtype)


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """The loss per row in float32 (float64 for float64 logits), targets of any integer dtype."""
    classes = logits.shape[-1]
    logits = logits.cast(compute_dtype(logits.dtype))
    targets = targets.to(logits.device).cast(dtypes.int64)
    targets = (targets < 0).where(targets + classes, targets)
    hit = targets.unsqueeze(-1) == Tensor.arange(classes, dtype=dtypes.int64)
    target_logit = hit.where(logits, 0.0).sum(-1)
    return _logsumexp(logits, -1).squeeze(-1) - target_logit


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """`exp(x) / sum(exp(x))` along `axis`.

    x: any shape with at least one dimension, float16, bfloat16, float32 or float64.
    Returns `x`'s shape and dtype; half-precision results are the float32 softmax rounded once.
    """
    check_tensor("softmax", "x", x)
    check(x.ndim >= 1, "softmax", "the input needs at least one dimension, got shape ()")
    check_floating("softmax", "x", x.dtype)
    axis = normalize_axis("softmax", axis, x.ndim)
    backend = _kernel_backend("softmax", x, axis)
    if backend is not None: return kernel.softmax_kernel(x, backend=backend, composition=_softmax_composition)
    return _softmax_composition(x, axis)


def logsumexp(x: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """`log(sum(exp(x)))` along `axis`, accumulated in float32.

    x: at least one dimension, a float dtype. A row of `-inf` gives `-inf`; a row containing
    `+inf` gives `+inf`. Returns `x`'s dtype, with `axis` removed (or kept as 1 with `keepdims`).
    """
    check_tensor("logsumexp", "x", x)
    check(x.ndim >= 1, "logsumexp", "the input needs at least one dimension, got shape ()")
    check_floating("logsumexp", "x", x.dtype)
    axis = normalize_axis("logsumexp", axis, x.ndim)
    backend = _kernel_backend("logsumexp", x, axis)
    if backend is not None:
        out = kernel.logsumexp_kernel(x, backend=backend, composition=_logsumexp_composition)
        return out.unsqueeze(-1) if keepdims else out
    out = _logsumexp_composition(x, axis)
    return out if keepdims else out.squeeze(axis)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-row cross-entropy loss `logsumexp(logits) - logits[target]`, in float32.

    logits: `[..., C]`, a float dtype. targets: integer class indices of shape `[...]`; a
    negative target counts from the end (`-1` is class `C - 1`). A target outside `-C..C-1` hits
    no class (its loss is the row's log-sum-exp). Returns `[...]` float32 (float64 for float64
    logits). The targets get no gradient.
    """
    op = "cross_entropy"
    check_tensor(op, "logits", logits)
    check_tensor(op, "targets", targets)
    check(logits.ndim >= 1 and tuple(targets.shape) == tuple(logits.shape[:-1]), op,
          f"targets of shape {tuple(targets.shape)} do not match logits of shape {tuple(logits.shape)}")
    check_floating(op, "logits", logits.dtype)
    check_integer(op, "targets", targets.dtype)
    backend = _kernel_backend(op, logits, logits.ndim - 1)
    if backend is not None: return kernel.cross_entropy_kernel(logits, targets, backend=backend, composition=_cross_entropy)
    return _cross_entropy(logits, targets)
