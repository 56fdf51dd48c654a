"""MLX's floating-point quantization modes, bit for bit (MLX 0.32.4): element and scale encodings.

| mode  | group | element | scale                                              |
|-------|-------|---------|----------------------------------------------------|
| mxfp4 | 32    | e2m1    | e8m0 (uint8)                                       |
| mxfp8 | 32    | e4m3    | e8m0 (uint8)                                       |
| nvfp4 | 16    | e2m1    | e4m3 (uint8), and an optional float32 global scale |

As MLX computes them, in the weight's dtype (every division one IEEE float32 division, then a
rounding to the dtype: `exact.divide`): a group's scale is `s = amax / 6` (e2m1) or `amax / 448`
(e4m3). e8m0 stores `ceil(log2 s) + 127`, the logarithm exact (wrapping to a byte; a zero group
stores 127, scale 1); MLX 0.32.1 rounded the logarithm to nearest instead, 0.32.4 takes the
ceiling, so that no element saturates. Elements are `w / 2^e` (e8m0) or `w / e4m3(s)`, encoded as
e2m1 by MLX's arg-min over its 16 values (the first at the least distance: ties to the smaller
magnitude; a negative value that rounds to zero, NaN and infinity are +0), or as e4m3 (fn)
nearest with ties to even, saturating at 448. nvfp4 with a global scale `g` stores
`e4m3(s * (2688 / g))` (2688 = 448 * 6) and elements `w / e4m3(...) * (2688 / g)`; dequantizing
multiplies by `g / 2688`. Codes pack as `pack_codes` does (e2m1 low nibble first, eight a word;
e4m3 four a word).
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from . import exact

# mode: (group size, element bits, element max, scale format)
FORMATS = {"mxfp4": (32, 4, 6.0, "e8m0"), "mxfp8": (32, 8, 448.0, "e8m0"), "nvfp4": (16, 4, 6.0, "e4m3")}
NVFP4_GLOBAL = 448.0 * 6.0  # 2688

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def rounded_to(x: Tensor, dtype: DType) -> Tensor:
    """`x` rounded to `dtype` and stored there (tinygrad would otherwise fold a cast down and
    back up and keep the unrounded value): MLX computes these steps in the weight's dtype."""
    return x.cast(dtype).contiguous() if dtype != dtypes.float32 else x.cast(dtypes.float32)


def _exponent(x: Tensor) -> Tensor:
    """floor(log2 x) of positive normal float32 values, exactly (from the bits), as int32."""
    return ((x.cast(dtypes.float32).bitcast(dtypes.uint32) >> 23) & 0xFF).cast(dtypes.int32) - 127


def encode_e2m1(x: Tensor) -> Tensor:
    """Values to e2m1 codes (uint32, sign bit 8) as MLX does: the first of the 16 table values
    (+0, 0.5, ..., 6, -0, -0.5, ..., -6) at the least float32 distance `|x - v|`. So ties go to the
    smaller magnitude, a negative value that rounds to zero is +0, NaN and infinity are +0, and so
    is a magnitude so large (nvfp4's, past 2^25) that the rounded distances tie. (mxfp4 measures
    the distances in the weight's dtype; its values, at most about 6, are exact there or win alike.)"""
    magnitude = exact.absolute(x.cast(dtypes.float32))
    # Past the first (positive) eight entries a negative entry's distance is the same magnitude's,
    # and +0 comes before all of them.
    best, code = magnitude, Tensor.zeros(*x.shape, dtype=dtypes.uint32, device=x.device)
    for index, value in enumerate(_E2M1_VALUES[1:], start=1):
        distance = (magnitude - value).abs()
        closer = distance < best
        best, code = closer.where(distance, best), closer.where(index, code)
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
    magnitude = exact.absolute(x.cast(dtypes.float32))
    exponent = _exponent(magnitude.maximum(2.0 ** -6))  # below 2^-6 the subnormal step 2^-9
    # Scaled by powers of two (exact) so that a step is one: rounding to an integer is e4m3's rounding.
    rounded = ((magnitude * exact.power_of_two(3 - exponent)).round() * exact.power_of_two(exponent - 3)).minimum(448.0)
    normal = rounded >= 2.0 ** -6
    rounded_exponent = _exponent(rounded.maximum(2.0 ** -6))
    mantissa = normal.where(rounded * exact.power_of_two(3 - rounded_exponent) - 8, rounded * 2.0 ** 9)
    code = (normal.where(rounded_exponent + 7, 0).cast(dtypes.uint32) << 3) + mantissa.round().cast(dtypes.uint32)
    negative = x.cast(dtypes.float32).bitcast(dtypes.uint32) >> 31 == 1
    return code + negative.cast(dtypes.uint32) * 128


def decode_e4m3(code: Tensor) -> Tensor:
    """e4m3 (fn) codes to float32."""
    code = code.cast(dtypes.int32)
    field, mantissa = (code >> 3) & 0xF, (code & 7).cast(dtypes.float32)
    normal = (field > 0).where((mantissa * 0.125 + 1) * exact.power_of_two(field - 7), mantissa * 2.0 ** -9)
    return (code >= 128).where(-normal, normal)


def quantize_groups(groups: Tensor, mode: str, global_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    """Groups `[..., G, group]` (in the weight's dtype) to (element codes `[..., G, group]`, uint8,
    scale codes `[..., G]`, uint32). global_scale: float32, broadcastable to `[..., G]`.
    Every division is MLX's: one IEEE float32 rounding (`exact.divide`), then the weight's dtype's."""
    _, bits, element_max, scale_format = FORMATS[mode]
    dtype = groups.dtype
    # The largest magnitude in float32: exactly the dtype's (tinygrad emulates bfloat16 op by op on some devices).
    amax = exact.absolute(groups.cast(dtypes.float32)).max(-1)
    scale = rounded_to(exact.divide(amax, element_max), dtype).cast(dtypes.float32)
    if scale_format == "e8m0":
        exponent = (scale == 0).where(0, exact.ceil_log2(scale))
        scale_codes, divisor = ((exponent + 127) & 0xFF).cast(dtypes.uint32), exact.power_of_two(exponent)
    else:
        encode = 1.0 if global_scale is None else exact.divide(NVFP4_GLOBAL, global_scale)
        scale_codes = encode_e4m3(scale * encode)
        divisor = decode_e4m3(scale_codes)
    # Stored once per group, not worked out again for each element.
    stored = scale_codes.stack(divisor.bitcast(dtypes.uint32), dim=-1).contiguous()
    scale_codes, divisor = stored[..., 0], stored[..., 1].bitcast(dtypes.float32)
    values = rounded_to(exact.divide(groups, divisor.unsqueeze(-1)), dtype)
    if scale_format == "e4m3": values = values.cast(dtypes.float32) * (encode if global_scale is None else encode.unsqueeze(-1))
    # Stored, so that packing does not encode each code again for each of its bits.
    codes = (encode_e2m1(values) if bits == 4 else encode_e4m3(values)).cast(dtypes.uint8).contiguous()
    return codes, scale_codes


def dequantize_groups(codes: Tensor, scale_codes: Tensor, mode: str, global_scale: Tensor | None,
                      dtype: DType) -> Tensor:
    """The values `[..., G, group]` (float32, each a product MLX rounds once to `dtype`) of
    element codes and scale codes `[..., G]`. global_scale: float32, broadcastable to `[..., G]`.
    A zero code times an infinite e8m0 scale is NaN, in the bits the device makes (as MLX's is)."""
    _, bits, _, scale_format = FORMATS[mode]
    if scale_format == "e8m0":
        scale = rounded_to(exact.power_of_two(scale_codes.cast(dtypes.int32) - 127), dtype).cast(dtypes.float32)
    else:
        scale = decode_e4m3(scale_codes)
        if global_scale is not None: scale = scale * exact.divide(global_scale, NVFP4_GLOBAL)
    return (decode_e2m1(codes) if bits == 4 else decode_e4m3(codes)) * scale.unsqueeze(-1)
