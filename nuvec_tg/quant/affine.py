"""MLX's affine quantization: formats, quantize, dequantize and the quantized matrix product.

Per group of `group_size` consecutive values of a row, in float32 (MLX's rule):

    scale = max((max - min) / (2^bits - 1), 1e-7), its sign chosen so that the larger-magnitude
            end of the group is the edge mapped to code 0 (scale < 0 when that end is the max)
    q0 = round(edge / scale); scale = edge / q0 and bias = edge when q0 != 0, else bias = 0
    code = clip(round((w - bias) / scale), 0, 2^bits - 1)

so the larger-magnitude end is exact and zero is exact (one bit: scale = max - min, bias = min,
as MLX does). Codes are packed as one
least-significant-bit-first stream per row in uint32 words (3, 5 and 6 bits straddle words);
scales and biases are stored in the weight's dtype. `w ≈ scale * code + bias`.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import check, check_floating, check_tensor, promote_types

GROUP_SIZES = (32, 64, 128)
BITS = (1, 2, 3, 4, 5, 6, 8)
MODES = ("affine",)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """Quantized weights: `weight` uint32 `[..., N, K * bits / 32]` packed codes, `scales` and
    `biases` `[..., N, K / group_size]` in the original dtype, and the format."""
    weight: Tensor
    scales: Tensor
    biases: Tensor | None
    mode: str = "affine"
    group_size: int = 64
    bits: int = 4

    @property
    def columns(self) -> int:
        """K: the unpacked row length."""
        return self.weight.shape[-1] * 32 // self.bits


def _check_format(op: str, mode: str, group_size: int, bits: int) -> None:
    check(mode in MODES, op, f"mode must be one of {', '.join(MODES)} (mxfp4, mxfp8 and nvfp4 have not landed), got {mode!r}")
    check(group_size in GROUP_SIZES, op, f"group_size must be 32, 64 or 128, got {group_size}")
    check(bits in BITS, op, f"bits must be one of {', '.join(map(str, BITS))}, got {bits}")


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Codes `[..., K]` (below 2^bits) as one LSB-first bit stream per row in uint32 words
    `[..., K * bits / 32]` (K * bits must be a multiple of 32)."""
    *lead, columns = codes.shape
    stream = (codes.cast(dtypes.uint32).unsqueeze(-1) >> Tensor.arange(bits, dtype=dtypes.uint32)) & 1
    stream = stream.reshape(*lead, columns * bits // 32, 32)
    return (stream << Tensor.arange(32, dtype=dtypes.uint32)).sum(-1, dtype=dtypes.uint32)


def unpack_codes(words: Tensor, bits: int) -> Tensor:
    """The inverse of `pack_codes`: uint32 words `[..., W]` to codes `[..., W * 32 / bits]` (uint32)."""
    *lead, count = words.shape
    stream = (words.cast(dtypes.uint32).unsqueeze(-1) >> Tensor.arange(32, dtype=dtypes.uint32)) & 1
    stream = stream.reshape(*lead, count * 32 // bits, bits)
    return (stream << Tensor.arange(bits, dtype=dtypes.uint32)).sum(-1, dtype=dtypes.uint32)


def quantize(w: Tensor, group_size: int = 64, bits: int = 4, mode: str = "affine") -> QuantizedWeight:
    """Quantize `w` `[..., N, K]` (a float dtype, K a multiple of `group_size`) row-group-wise.

    Returns a `QuantizedWeight` whose codes are packed uint32 and whose scales and biases are in
    w's dtype.
    """
    op = "quantize"
    check_tensor(op, "w", w)
    check_floating(op, "w", w.dtype)
    _check_format(op, mode, group_size, bits)
    check(w.ndim >= 2, op, f"w must have at least 2 dimensions, got shape {tuple(w.shape)}")
    check(w.shape[-1] % group_size == 0, op,
          f"the last dimension ({w.shape[-1]}) must be a multiple of the group size {group_size}")
    *lead, columns = w.shape
    groups = w.cast(dtypes.float32).reshape(*lead, columns // group_size, group_size)
    top, bottom = groups.max(-1, keepdim=True), groups.min(-1, keepdim=True)
    levels = 2 ** bits - 1
    scale = ((top - bottom) / levels).maximum(1e-7)
    if bits == 1:  # MLX's one-bit rule: the group's minimum and its range
        bias = bottom
    else:
        low_end = bottom.abs() > top.abs()
        scale = low_end.where(scale, -scale)
        edge = low_end.where(bottom, top)
        first = (edge / scale).round()
        snapped = first == 0
        scale = snapped.where(scale, edge / first)
        bias = snapped.where(0.0, edge)
    codes = ((groups - bias) / scale).round().clip(0, levels)
    packed = pack_codes(codes.reshape(*lead, columns).cast(dtypes.uint32), bits)
    return QuantizedWeight(packed, scale.squeeze(-1).cast(w.dtype), bias.squeeze(-1).cast(w.dtype), mode, group_size, bits)


def _check_weight(op: str, qw: QuantizedWeight) -> None:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{op}: expected a QuantizedWeight, got {type(qw).__name__}")
    _check_format(op, qw.mode, qw.group_size, qw.bits)
    check_tensor(op, "weight", qw.weight)
    check_tensor(op, "scales", qw.scales)
    if qw.weight.dtype != dtypes.uint32:
        raise TypeError(f"{op}: the packed weight must be uint32, got {qw.weight.dtype}")
    check_floating(op, "scales", qw.scales.dtype)
    check(qw.biases is not None, op, "affine weights need biases")
    check_tensor(op, "biases", qw.biases)
    check_floating(op, "biases", qw.biases.dtype)
    check(qw.weight.ndim >= 2, op, f"the packed weight must have at least 2 dimensions, got {tuple(qw.weight.shape)}")
    expected = (*qw.weight.shape[:-1], qw.weight.shape[-1] * 32 // qw.bits // qw.group_size)
    check(qw.weight.shape[-1] * 32 % (qw.bits * qw.group_size) == 0 and tuple(qw.scales.shape) == expected
          and tuple(qw.biases.shape) == expected, op,
          f"scales and biases must be {expected} for a packed weight {tuple(qw.weight.shape)} with group size "
          f"{qw.group_size} and {qw.bits} bits, got {tuple(qw.scales.shape)} and {tuple(qw.biases.shape)}")


def _dense(qw: QuantizedWeight, dtype: DType) -> Tensor:
    """`scale * code + bias` per group, `[..., N, K]` in `dtype` (computed in float32)."""
    codes = unpack_codes(qw.weight, qw.bits)
    *lead, columns = codes.shape
    grouped = codes.reshape(*lead, columns // qw.group_size, qw.group_size).cast(dtypes.float32)
    scales = qw.scales.cast(dtype).cast(dtypes.float32).unsqueeze(-1)
    biases = qw.biases.cast(dtype).cast(dtypes.float32).unsqueeze(-1)
    return (grouped * scales + biases).reshape(*lead, columns).cast(dtype)


def dequantize(qw: QuantizedWeight, dtype: DType | None = None) -> Tensor:
    """The dense weights `[..., N, K]` of `qw`, in `dtype` (default: the scales' dtype)."""
    op = "dequantize"
    _check_weight(op, qw)
    if dtype is not None: check_floating(op, "dtype", dtype)
    return _dense(qw, dtype or qw.scales.dtype)


def quantized_matmul(x: Tensor, qw: QuantizedWeight, transpose: bool = True) -> Tensor:
    """`x · wᵀ` (`transpose`, w `[..., N, K]`) or `x · w` (w `[..., K, N]`) for quantized `w`.

    x: `[..., M, K]` or `[K]`; batch axes broadcast. Returns `promote(x, scales)`. Gradients reach
    x, the scales and the biases (the packed codes are integers).
    """
    op = "quantized_matmul"
    check_tensor(op, "x", x)
    check_floating(op, "x", x.dtype)
    _check_weight(op, qw)
    rows, columns = qw.weight.shape[-2], qw.columns
    inner = columns if transpose else rows
    check(x.ndim >= 1 and x.shape[-1] == inner, op,
          f"x's last dimension must be {inner} for weights of {rows} x {columns} "
          f"({'transposed' if transpose else 'not transposed'}), got shape {tuple(x.shape)}")
    dtype = promote_types(x.dtype, qw.scales.dtype)
    dense = _dense(qw, dtype)
    return x.cast(dtype) @ (dense.transpose(-1, -2) if transpose else dense)
