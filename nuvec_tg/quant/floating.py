"""MLX's floating-point quantization modes, bit for bit (MLX 0.32.4): element and scale encodings.

| mode  | group | element | scale                                              |
|-------|-------|---------|----------------------------------------------------|
| mxfp4 | 32    | e2m1    | e8m0 (uint8)                                       |
| mxfp8 | 32    | e4m3    | e8m0 (uint8)                                       |
| nvfp4 | 16    | e2m1    | e4m3 (uint8), and an optional float32 global scale |

As MLX computes them, in the weight's dtype: a group's scale is `s = amax / 6` (e2m1) or
`amax / 448` (e4m3). e8m0 stores `ceil(log2 s) + 127` (wrapping to a byte; a zero group stores
127, scale 1); MLX 0.32.1 rounded the logarithm to nearest instead, 0.32.4 takes the ceiling, so
that no element saturates. Elements are `w / 2^e` (e8m0) or `w / e4m3(s)`, encoded as e2m1 by
the nearest of its 16 values, ties to the lower code (MLX's arg-min over the table: to the
smaller magnitude; a negative value that rounds to zero, NaN and infinity are +0), or as e4m3 (fn) nearest with
ties to even, saturating at 448. nvfp4 with a global scale `g` stores `e4m3(s * 2688 / g)` (2688 =
448 * 6) and elements `w / e4m3(...) * 2688 / g`; dequantizing multiplies by `g / 2688`. Codes pack
as `pack_codes` does (e2m1 low nibble first, eight a word; e4m3 four a word).
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

# mode: (group size, element bits, element max, scale format)
FORMATS = {"mxfp4": (32, 4, 6.0, "e8m0"), "mxfp8": (32, 8, 448.0, "e8m0"), "nvfp4": (16, 4, 6.0, "e4m3")}
NVFP4_GLOBAL = 448.0 * 6.0  # 2688

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # a magnitude above one moves up a code


def rounded_to(x: Tensor, dtype: DType) -> Tensor:
    """`x` rounded to `dtype` and stored there (tinygrad would otherwise fold a cast down and
    back up and keep the unrounded value): MLX computes these steps in the weight's dtype."""
    return x.cast(dtype).contiguous() if dtype != dtypes.float32 else x.cast(dtypes.float32)


def _exponent(x: Tensor) -> Tensor:
    """floor(log2 x) of positive normal float32 values, exactly (from the bits), as int32."""
    return ((x.cast(dtypes.float32).bitcast(dtypes.uint32) >> 23) & 0xFF).cast(dtypes.int32) - 127


def encode_e2m1(x: Tensor) -> Tensor:
    """Values to e2m1 codes (uint32, sign bit 8) as MLX does: the nearest of the 16 values, ties
    to the smaller magnitude, saturating at 6; a negative value that rounds to zero is +0."""
    magnitude = x.abs().cast(dtypes.float32)
    code = Tensor.zeros(*x.shape, dtype=dtypes.uint32, device=x.device)
    for midpoint in _E2M1_MIDPOINTS:
        code = code + (magnitude > midpoint).cast(dtypes.uint32)
    code = (magnitude == float("inf")).where(0, code)  # MLX's arg-min over infinite distances: the first, +0
    return code + ((x < 0) & (code > 0)).cast(dtypes.uint32) * 8


def decode_e2m1(code: Tensor) -> Tensor:
    """e2m1 codes to float32."""
    code = code.cast(dtypes.int32)
    magnitude = Tensor.zeros(*code.shape, dtype=dtypes.float32, device=code.device)
    for index, value in enumerate(_E2M1_VALUES[1:], start=1):
        magnitude = ((code & 7) == index).where(value, magnitude)
    return (code >= 8).where(-magnitude, magnitude)


def encode_e4m3(x: Tensor) -> Tensor:
    """Values to e4m3 (fn) codes (uint32): nearest, ties to even, saturating at 448."""
    magnitude = x.abs().cast(dtypes.float32)
    exponent = _exponent(magnitude.maximum(2.0 ** -6))  # below 2^-6 the subnormal step 2^-9
    step = (exponent - 3).cast(dtypes.float32).exp2()
    rounded = ((magnitude / step).round() * step).minimum(448.0)
    normal = rounded >= 2.0 ** -6
    rounded_exponent = _exponent(rounded.maximum(2.0 ** -6))
    mantissa = normal.where(rounded / rounded_exponent.cast(dtypes.float32).exp2() * 8 - 8, rounded * 2.0 ** 9)
    code = (normal.where(rounded_exponent + 7, 0).cast(dtypes.uint32) << 3) + mantissa.round().cast(dtypes.uint32)
    negative = x.cast(dtypes.float32).bitcast(dtypes.uint32) >> 31 == 1
    return code + negative.cast(dtypes.uint32) * 128


def decode_e4m3(code: Tensor) -> Tensor:
    """e4m3 (fn) codes to float32."""
    code = code.cast(dtypes.int32)
    field, mantissa = (code >> 3) & 0xF, (code & 7).cast(dtypes.float32)
    normal = (field > 0).where((mantissa / 8 + 1) * (field - 7).cast(dtypes.float32).exp2(), mantissa * 2.0 ** -9)
    return (code >= 128).where(-normal, normal)


def quantize_groups(groups: Tensor, mode: str, global_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    """Groups `[..., G, group]` (in the weight's dtype) to (element codes `[..., G, group]`,
    scale codes `[..., G]`), both uint32. global_scale: float32, broadcastable to `[..., G]`."""
    _, bits, element_max, scale_format = FORMATS[mode]
    dtype = groups.dtype
    scale = rounded_to(groups.abs().max(-1).cast(dtypes.float32) / element_max, dtype)
    if scale_format == "e8m0":
        exponent = (scale == 0).where(0.0, scale.cast(dtypes.float32).log2().ceil())
        scale_codes = ((exponent.cast(dtypes.int32) + 127) & 0xFF).cast(dtypes.uint32)
        values = rounded_to(groups.cast(dtypes.float32) / exponent.exp2().unsqueeze(-1), dtype)
    else:
        encode = 1.0 if global_scale is None else NVFP4_GLOBAL / global_scale.cast(dtypes.float32)
        scale_codes = encode_e4m3(scale.cast(dtypes.float32) * encode)
        divided = rounded_to(groups.cast(dtypes.float32) / decode_e4m3(scale_codes).unsqueeze(-1), dtype)
        values = divided.cast(dtypes.float32) * (encode if global_scale is None else encode.unsqueeze(-1))
    codes = encode_e2m1(values) if bits == 4 else encode_e4m3(values)
    return codes, scale_codes


def dequantize_groups(codes: Tensor, scale_codes: Tensor, mode: str, global_scale: Tensor | None,
                      dtype: DType) -> Tensor:
    """The values `[..., G, group]` (float32, each a product MLX rounds once to `dtype`) of
    element codes and scale codes `[..., G]`. global_scale: float32, broadcastable to `[..., G]`."""
    _, bits, _, scale_format = FORMATS[mode]
    if scale_format == "e8m0":
        scale = rounded_to((scale_codes.cast(dtypes.float32) - 127).exp2(), dtype).cast(dtypes.float32)
    else:
        scale = decode_e4m3(scale_codes)
        if global_scale is not None: scale = scale * (global_scale.cast(dtypes.float32) / NVFP4_GLOBAL)
    values = decode_e2m1(codes) if bits == 4 else decode_e4m3(codes)
    return values * scale.unsqueeze(-1)
