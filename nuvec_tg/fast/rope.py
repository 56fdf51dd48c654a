"""Rotary position embeddings.

The angle of feature pair `i` at sequence position `t` is `scale * (offset + t) * inv_freq[i]`,
computed in float32, with `inv_freq[i] = base ** (-2i / dims)` or `1 / freqs[i]` (`freqs` are
periods, as in MLX). The rotation itself also runs in float32 and is rounded once to the input
dtype. Pairs are `(i, i + dims/2)` (rotate-half, NeoX style) or, with `traditional`, adjacent
features `(2i, 2i + 1)`. Features past `dims` pass through unchanged.
"""
from __future__ import annotations

import math

from tinygrad import Tensor, dtypes

from ..tensor import check, check_floating, check_integer, check_number, check_tensor, compute_dtype

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_rope(x: Tensor, dims: int, base: float | None, scale: float, offset: int | Tensor,
                freqs: Tensor | None) -> None:
    op = "rope"
    check_tensor(op, "x", x)
    check(x.ndim >= 3, op, f"the input needs at least 3 dimensions [B, ..., T, D], got shape {tuple(x.shape)}")
    check_floating(op, "x", x.dtype)
    if isinstance(dims, bool) or not isinstance(dims, int):
        raise TypeError(f"{op}: dims must be an int, got {type(dims).__name__}")
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
    pair_index = Tensor.arange(dims // 2, dtype=dtypes.float32)
    return (pair_index * (-2.0 * math.log2(base) / dims)).exp2()


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
    half = dims // 2
    acc = compute_dtype(x.dtype)
    angles = (_positions(x, offset) * float(scale)).unsqueeze(-1) * _inverse_frequencies(dims, base, freqs, x.device)
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
