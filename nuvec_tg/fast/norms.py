"""Normalisations over the last axis: RMS norm, layer norm, and RMS norm fused with a residual add.

Numerics (MLX's): the input is cast to the result dtype (the input's promoted with the weight's
and bias's), normalised in float32 (float64 stays float64), rounded to the result dtype, and only
then multiplied by the weight and shifted by the bias in the result dtype.
"""
from __future__ import annotations

import math

from tinygrad import Tensor
from tinygrad.dtype import DType

from .. import kernels
from ..kernels import rows as row_kernels
from ..tensor import (broadcast_shape, check, check_floating, check_number, check_tensor, check_weight,
                      compute_dtype, promote_types)


def _norm_dtype(op: str, shape: tuple[int, ...], dtype: DType, **params: Tensor | None) -> DType:
    """Check a normalisation's input shape and 1-D parameters; return the result dtype."""
    check(len(shape) >= 1, op, "the input needs at least one dimension, got shape ()")
    for what, param in params.items():
        if param is not None:
            dtype = promote_types(dtype, check_weight(op, what, param, shape[-1]).dtype)
    check_floating(op, "the input (promoted with its parameters)", dtype)
    return dtype


def _rms_normalized(x: Tensor, dtype: DType, eps: float) -> Tensor:
    """`x / sqrt(mean(x²) + eps)` over the last axis, computed in float32 and rounded to `dtype`."""
    xf = x.cast(dtype).cast(compute_dtype(dtype))
    return (xf * ((xf * xf).mean(-1, keepdim=True) + eps).rsqrt()).cast(dtype)


def _rms_norm(x: Tensor, weight: Tensor | None, dtype: DType, eps: float) -> Tensor:
    """The RMS norm's composition (no checks)."""
    y = _rms_normalized(x, dtype, eps)
    return y if weight is None else y * weight.cast(dtype)


def _layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, dtype: DType, eps: float) -> Tensor:
    """The layer norm's composition (no checks)."""
    xf = x.cast(dtype).cast(compute_dtype(dtype))
    centred = xf - xf.mean(-1, keepdim=True)
    y = (centred * ((centred * centred).mean(-1, keepdim=True) + eps).rsqrt()).cast(dtype)
    if weight is not None: y = y * weight.cast(dtype)
    if bias is not None: y = y + bias.cast(dtype)
    return y


def _kernel_backend(op: str, kernel: str, x: Tensor, shape: tuple, types: tuple[DType, ...]) -> str | None:
    """The backend whose norm kernel runs `op` over rows of `shape` (or None: the composition),
    saying under NUVEC_DEBUG which, with the launch."""
    concrete = all(isinstance(size, int) for size in shape)
    rows, length = (math.prod(shape[:-1]), shape[-1]) if concrete else (0, 0)
    description = f"{shape} on {x.device}"
    if concrete and rows and length:
        launch = row_kernels.plan(length)
        description += (f" ({launch.threads} threads a row, pieces of {launch.vec}, "
                        + (f"{launch.per} held a thread)" if launch.cached else "the row read again each pass)"))

    def unsupported(backend: str) -> str | None:
        if not concrete: return "a symbolic shape"
        return row_kernels.unsupported(types, rows, length, kernels.target(x.device))
    return kernels.choose(op, description, x.device, kernel, unsupported)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) * weight`.

    x: `[..., D]`, any float dtype (or an integer one with a float weight).
    weight: `[D]` or None. eps: a finite number.
    Returns `[..., D]` in `promote(x.dtype, weight.dtype)`.
    """
    check_tensor("rms_norm", "x", x)
    dtype = _norm_dtype("rms_norm", x.shape, x.dtype, weight=weight)
    eps = check_number("rms_norm", "eps", eps)
    types = (x.dtype, dtype) + (() if weight is None else (weight.dtype,))
    backend = _kernel_backend("rms_norm", "rms_norm", x, tuple(x.shape), types)
    if backend is not None:
        return row_kernels.norm_kernel("rms", x, eps, dtype, backend=backend, weight=weight,
                                       composition=lambda x, *w: _rms_norm(x, w[0] if w else None, dtype, eps))
    return _rms_norm(x, weight, dtype, eps)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.

    x: `[..., D]`. weight, bias: `[D]` or None (a missing weight is 1, a missing bias 0).
    The mean and then the centred (biased) variance are computed in float32.
    Returns `[..., D]` in the dtype `x`, `weight` and `bias` promote to.
    """
    check_tensor("layer_norm", "x", x)
    dtype = _norm_dtype("layer_norm", x.shape, x.dtype, weight=weight, bias=bias)
    eps = check_number("layer_norm", "eps", eps)
    types = (x.dtype, dtype) + tuple(p.dtype for p in (weight, bias) if p is not None)
    backend = _kernel_backend("layer_norm", "layer_norm", x, tuple(x.shape), types)
    if backend is not None:
        def composition(x: Tensor, *params: Tensor) -> Tensor:
            given = iter(params)
            return _layer_norm(x, None if weight is None else next(given), None if bias is None else next(given), dtype, eps)
        return row_kernels.norm_kernel("layer", x, eps, dtype, backend=backend, weight=weight, bias=bias,
                                       composition=composition)
    return _layer_norm(x, weight, bias, dtype, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None,
                 eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """The residual stream and its RMS norm: `h = x + residual`, `y = rms_norm(h, weight, eps)`.

    x, residual: shapes that broadcast together; `h` takes their promoted dtype and `y` the dtype
    of `h` promoted with the weight's. Equal bit for bit to adding, then calling `rms_norm`.
    Returns `(h, y)`.
    """
    check_tensor("add_rms_norm", "x", x)
    check_tensor("add_rms_norm", "residual", residual)
    shape = broadcast_shape("add_rms_norm", x.shape, residual.shape)
    h_dtype = promote_types(x.dtype, residual.dtype)
    dtype = _norm_dtype("add_rms_norm", shape, h_dtype, weight=weight)
    eps = check_number("add_rms_norm", "eps", eps)
    types = (x.dtype, residual.dtype, h_dtype, dtype) + (() if weight is None else (weight.dtype,))
    backend = _kernel_backend("add_rms_norm", "rms_norm", x, shape, types)
    if backend is not None:
        def composition(x: Tensor, residual: Tensor, *w: Tensor) -> tuple[Tensor, Tensor]:
            h = x.cast(h_dtype) + residual.cast(h_dtype)
            return h, _rms_norm(h, w[0] if w else None, dtype, eps)
        return row_kernels.norm_kernel("rms", x.expand(shape), eps, dtype, backend=backend, weight=weight,
                                       residual=residual.expand(shape), h_dtype=h_dtype, composition=composition)
    h = x.cast(h_dtype) + residual.cast(h_dtype)
    return h, _rms_norm(h, weight, dtype, eps)


def residual_rms_norm(h: Tensor, x: Tensor, weight: Tensor, eps: float, scale: Tensor | float | None = None,
                      next: tuple[Tensor, float] | None = None) -> tuple[Tensor, Tensor | None]:
    """A residual add of a normalised branch, optionally scaled and normalised again.

    `s = (h + rms_norm(x, weight, eps)) * scale` and, with `next = (weight2, eps2)`,
    `y = rms_norm(s, weight2, eps2)` (Gemma-style sandwich norms).
    h, x: shapes that broadcast together, `[..., D]` after broadcasting. weight: `[D]`.
    scale: None, a number, or a tensor of one element. Dtypes promote as MLX's operations do.
    Returns `(s, y)`, `y` None without `next`.
    """
    op = "residual_rms_norm"
    check_tensor(op, "h", h)
    check_tensor(op, "x", x)
    check(weight is not None, op, "weight is required")
    shape = broadcast_shape(op, h.shape, x.shape)
    normed_dtype = _norm_dtype(op, x.shape, x.dtype, weight=weight)
    check_number(op, "eps", eps)
    s_dtype = promote_types(h.dtype, normed_dtype)
    if isinstance(scale, Tensor):
        check(scale.numel() == 1, op, f"scale must have one element, got shape {tuple(scale.shape)}")
        s_dtype = promote_types(s_dtype, scale.dtype)
    elif scale is not None:
        check_number(op, "scale", scale)
    if next is not None:
        check(isinstance(next, tuple) and len(next) == 2, op, "next must be a (weight, eps) pair")
        _norm_dtype(op, shape, s_dtype, next_weight=next[0])
        check_number(op, "next eps", next[1])
    y_dtype = None if next is None else promote_types(s_dtype, next[0].dtype)
    types = (h.dtype, x.dtype, weight.dtype, normed_dtype, s_dtype) + \
        (() if not isinstance(scale, Tensor) else (scale.dtype,)) + (() if next is None else (next[0].dtype, y_dtype))
    backend = _kernel_backend(op, "residual_norm", x, shape, types)
    if backend is not None:
        def composition(h: Tensor, x: Tensor, weight: Tensor, *rest: Tensor):
            rest = list(rest)
            given_scale = rest.pop(0).reshape(()) if isinstance(scale, Tensor) else scale
            given_next = None if next is None else (rest.pop(0), next[1])
            s, y = _residual_rms_norm(h, x, weight, eps, normed_dtype, s_dtype, given_scale, given_next)
            return s if next is None else (s, y)
        return row_kernels.residual_norm_kernel(h.expand(shape), x.expand(shape), weight, eps, normed_dtype, s_dtype,
                                                backend=backend, scale=scale,
                                                next=None if next is None else (next[0], next[1], y_dtype),
                                                composition=composition)
    return _residual_rms_norm(h, x, weight, eps, normed_dtype, s_dtype, scale, next)


def _residual_rms_norm(h: Tensor, x: Tensor, weight: Tensor, eps: float, normed_dtype: DType, s_dtype: DType,
                       scale: Tensor | float | None, next: tuple[Tensor, float] | None) -> tuple[Tensor, Tensor | None]:
    """`residual_rms_norm`'s composition (no checks)."""
    s = h.cast(s_dtype) + _rms_norm(x, weight, normed_dtype, eps).cast(s_dtype)
    if isinstance(scale, Tensor): s = s * scale.reshape(()).cast(s_dtype)
    elif scale is not None: s = s * scale
    if next is None: return s, None
    return s, _rms_norm(s, next[0], promote_types(s_dtype, next[0].dtype), next[1])
