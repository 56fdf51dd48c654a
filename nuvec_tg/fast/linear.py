"""Dense 16-bit (and float32) products: `linear(x, w, bias)`, `x · wᵀ + bias`, the convention of
PyTorch's and tinygrad's `Linear` (w `[out, in]`).

Numerics: the result dtype is MLX's promotion of x, w and bias; the products accumulate in float32
(float64 for float64), the bias is added in float32 and the result rounded once. The composition,
tinygrad's matmul accumulating in float32, is the definition and the backward; the kernels
(`kernels/linear.py`: gemv for up to 8 rows, gemm beyond) equal it within rounding.
"""
from __future__ import annotations

import math

from tinygrad import Tensor
from tinygrad.dtype import DType

from .. import kernels
from ..kernels import linear as linear_kernels
from ..tensor import check, check_floating, check_tensor, compute_dtype, promote_types


def _linear(x: Tensor, w: Tensor, bias: Tensor | None, dtype: DType) -> Tensor:
    """The composition (no checks): `x · wᵀ` in `dtype`, accumulated in float32 (float64 for
    float64), plus the bias in that precision, rounded once to `dtype`."""
    accumulate = compute_dtype(dtype)
    y = x.cast(dtype).matmul(w.cast(dtype).T, dtype=accumulate)
    if bias is not None: y = y + bias.cast(accumulate)
    return y.cast(dtype)


def _describe(x: Tensor, w: Tensor, bias: Tensor | None, rows: int, target: kernels.Target) -> str:
    """What NUVEC_DEBUG says of a call: its shapes and device, and the launch a kernel would take."""
    k, n = w.shape[1], w.shape[0]
    backend = target.backend
    description = f"{tuple(x.shape)} x {tuple(w.shape)}{' + bias' if bias is not None else ''} on {x.device}"
    if rows and k and n:
        if rows <= linear_kernels.MAX_ROWS: description += f" ({linear_kernels.gemv_plan(rows, k, n)})"
        elif backend is not None and linear_kernels.takes_wgmma(k, target):
            description += f" ({linear_kernels.wgmma_plan(rows, n, target.multiprocessors)})"
        elif backend is not None: description += f" ({linear_kernels.gemm_plan(rows, backend)})"
    return description


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x · wᵀ + bias` over x's last axis.

    x: `[..., K]`; w: `[N, K]`; bias: `[N]` or None; each float16, bfloat16, float32 or float64.
    Returns `[..., N]` in the dtype x, w and bias promote to (MLX's rule: float16 with bfloat16 is
    float32). The products accumulate in float32 (float64 for float64) and the bias is added before
    the one rounding. Gradients reach x, w and bias through the composition.

    On CUDA and METAL, up to 8 rows of x run the gemv kernel (each row with the bits of that row
    alone), more rows the gemm kernel on the matrix units (x and w of one 16-bit dtype; on Hopper,
    K a multiple of 8, its warpgroup products); the rest is tinygrad's matmul.
    """
    op = "linear"
    check_tensor(op, "x", x)
    check_tensor(op, "w", w)
    for what, t in (("x", x), ("w", w)) + ((("bias", check_tensor(op, "bias", bias)),) if bias is not None else ()):
        check_floating(op, what, t.dtype)
    check(w.ndim == 2, op, f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    check(x.ndim >= 1 and x.shape[-1] == w.shape[1], op,
          f"x's last dimension must be K = {w.shape[1]} for w of shape {tuple(w.shape)}, got shape {tuple(x.shape)}")
    if bias is not None:
        check(bias.ndim == 1 and bias.shape[0] == w.shape[0], op,
              f"bias must be 1-D with N = {w.shape[0]} elements, got shape {tuple(bias.shape)}")
    dtype = promote_types(x.dtype, w.dtype)
    if bias is not None: dtype = promote_types(dtype, bias.dtype)
    n, k = w.shape
    concrete = all(isinstance(size, int) for size in (*x.shape, n, k))
    rows = math.prod(x.shape[:-1]) if concrete else 0
    target = kernels.target(x.device)
    kernel, reason = linear_kernels.route(x.dtype, w.dtype, None if bias is None else bias.dtype, dtype, rows, k, n, target)
    if not concrete: reason = "a symbolic shape"
    backend = kernels.choose(op, _describe(x, w, bias, rows, target), x.device, kernel, lambda backend: reason)
    if backend is None: return _linear(x, w, bias, dtype)
    launch = {"gemv": linear_kernels.gemv, "gemm": linear_kernels.gemm, "gemm_wgmma": linear_kernels.gemm_wgmma}[kernel]
    y = launch(x.reshape(rows, k), w, bias, out_dtype=dtype, backend=backend,
               composition=lambda x, w, bias: _linear(x, w, bias, dtype))
    return y.reshape(*x.shape[:-1], n)
