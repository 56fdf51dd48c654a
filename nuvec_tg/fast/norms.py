"""Normalisations over the last axis: RMS norm, layer norm, and RMS norm fused with a residual add.

Numerics (MLX's): the input is cast to the result dtype (the input's promoted with the weight's
and bias's), normalised in float32 (float64 stays float64), rounded to the result dtype, and only
then multiplied by the weight and shifted by the bias in the result dtype.
"""
from __future__ import annotations

from tinygrad import Tensor
from tinygrad.dtype import DType

from .. import kernels
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


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) * weight`.

    x: `[..., D]`, any float dtype (or an integer one with a float weight).
    weight: `[D]` or None. eps: a finite number.
    Returns `[..., D]` in `promote(x.dtype, weight.dtype)`.
    """
    check_tensor("rms_norm", "x", x)
    dtype = _norm_dtype("rms_norm", x.shape, x.dtype, weight=weight)
    eps = check_number("rms_norm", "eps", eps)
    kernels.composition("rms_norm", f"{tuple(x.shape)} on {x.device}")
    y = _rms_normalized(x, dtype, eps)
    return y if weight is None else y * weight.cast(dtype)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.

    x: `[..., D]`. weight, bias: `[D]` or None (a missing weight is 1, a missing bias 0).
    The mean and then the centred (biased) variance are computed in float32.
    Returns `[..., D]` in the dtype `x`, `weight` and `bias` promote to.
    """
    check_tensor("layer_norm", "x", x)
    dtype = _norm_dtype("layer_norm", x.shape, x.dtype, weight=weight, bias=bias)
    eps = check_number("layer_norm", "eps", eps)
    kernels.composition("layer_norm", f"{tuple(x.shape)} on {x.device}")
    xf = x.cast(dtype).cast(compute_dtype(dtype))
    centred = xf - xf.mean(-1, keepdim=True)
    y = (centred * ((centred * centred).mean(-1, keepdim=True) + eps).rsqrt()).cast(dtype)
    if weight is not None: y = y * weight.cast(dtype)
    if bias is not None: y = y + bias.cast(dtype)
    return y


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
    _norm_dtype("add_rms_norm", shape, h_dtype, weight=weight)
    check_number("add_rms_norm", "eps", eps)
    kernels.composition("add_rms_norm", f"{shape} on {x.device}")
    h = x.cast(h_dtype) + residual.cast(h_dtype)
    return h, rms_norm(h, weight, eps)


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
    kernels.composition(op, f"{shape} on {h.device}")
    s = h.cast(s_dtype) + rms_norm(x, weight, eps).cast(s_dtype)
    if isinstance(scale, Tensor): s = s * scale.reshape(()).cast(s_dtype)
    elif scale is not None: s = s * scale
    return s, (None if next is None else rms_norm(s, next[0], next[1]))
