"""Float32 arithmetic that tinygrad would otherwise round differently from MLX, exactly, on every device.

tinygrad lowers `a / b` to `a * (1 / b)`, two roundings, and folds a division by a constant into
a product with a rounded reciprocal; MLX divides (one IEEE rounding), and where a quotient is then
rounded to an integer or stored, that last bit decides codes and scales. `divide` is the IEEE
quotient from integer arithmetic only (no float64, which METAL lacks, and no float step that a
compiler could contract or reassociate), so it is the same on CPU, CUDA and METAL.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes

_INFINITY = 0x7F800000


def _significand(magnitude: Tensor) -> tuple[Tensor, Tensor]:
    """The float32 values of uint32 bits `magnitude` (sign bit clear, finite, nonzero) as
    `m * 2^(e - 23)`: the significand `m` in [2^23, 2^24) (uint64) and the exponent `e` (int32),
    subnormals normalized."""
    subnormal = magnitude < 0x800000
    # A subnormal's bits are an integer below 2^23: as a float32 it is exact and normal, with the
    # subnormal's significand (x = bits * 2^-149).
    source = subnormal.where(magnitude.cast(dtypes.float32).bitcast(dtypes.uint32), magnitude)
    significand = ((source & 0x7FFFFF) | 0x800000).cast(dtypes.uint64)
    return significand, (source >> 23).cast(dtypes.int32) - subnormal.where(127 + 149, 127)


def divide(a: Tensor | float, b: Tensor | float) -> Tensor:
    """`a / b` in float32, rounded once to nearest even as IEEE division (and MLX) rounds it,
    subnormal quotients included; `a`, `b` broadcast and are taken as float32. A zero `a` over a
    finite nonzero `b` is a signed zero; a zero `b` and infinities and NaNs in either operand give
    tinygrad's own quotient (the same special values)."""
    if not isinstance(a, Tensor): a = b.full_like(a, dtype=dtypes.float32)
    if not isinstance(b, Tensor): b = a.full_like(b, dtype=dtypes.float32)
    a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
    ua, ub = a.bitcast(dtypes.uint32), b.bitcast(dtypes.uint32)
    magnitude_a, magnitude_b = ua & 0x7FFFFFFF, ub & 0x7FFFFFFF
    special = (magnitude_a >= _INFINITY) | (magnitude_b == 0) | (magnitude_b >= _INFINITY)
    ma, ea = _significand(magnitude_a)
    mb, eb = _significand(magnitude_b)
    # a / b = (ma / mb) * 2^(ea - eb): the integer quotient of ma * 2^25 has 25 or 26 bits, at
    # least one below the 24 kept; a remainder is a last (sticky) bit below them all.
    dividend = ma << 25
    quotient = dividend // mb
    quotient = (quotient << 1) | (quotient * mb != dividend).cast(dtypes.uint64)
    wide = (quotient >> 26).cast(dtypes.int32)
    exponent = ea - eb - 1 + wide  # of the kept bits' leading one, for a normal result
    # Below the normal range the kept bits start at 2^-149: drop that many more (at most 28: past
    # that nothing is kept and the rest, below half of 2^-149, rounds to zero as at 28).
    dropped = (2 + wide + (-126 - exponent).maximum(0)).minimum(28).cast(dtypes.uint64)
    kept = (quotient + (quotient.ones_like() << (dropped - 1)) - 1 + ((quotient >> dropped) & 1)) >> dropped  # to nearest even
    # The biased exponent field is one below its value here and the kept bits' leading one adds
    # the one (none for a subnormal); rounding up to 2^24 carries into the exponent, up to infinity.
    field = (exponent.maximum(-126) + 126).cast(dtypes.uint64) << 23
    magnitude = (exponent > 127).where(_INFINITY, field + kept).cast(dtypes.uint32)
    magnitude = (magnitude_a == 0).where(0, magnitude)  # (tinygrad's 0 * (1 / b) is NaN for a subnormal b)
    quotient_value = (magnitude | ((ua ^ ub) & 0x80000000)).bitcast(dtypes.float32)
    return special.where(a / b, quotient_value)


def power_of_two(exponent: Tensor) -> Tensor:
    """`2^exponent` in float32 for int32 exponents in [-149, 128] (128 gives infinity), built from
    its bits: exact on every device (tinygrad's exp2 is a polynomial or the device's own)."""
    subnormal = Tensor.ones_like(exponent).cast(dtypes.uint32) << (exponent + 149).clip(0, 22).cast(dtypes.uint32)
    bits = (exponent >= -126).where((exponent + 127).maximum(1).cast(dtypes.uint32) << 23, subnormal)
    return bits.bitcast(dtypes.float32)


def ceil_log2(x: Tensor) -> Tensor:
    """`ceil(log2 x)` (int32) of positive finite values, exactly, from the float32 bits (a float
    logarithm rounds `log2(2^k (1 + 2^-23))` to k once k is past 3)."""
    significand, exponent = _significand(x.cast(dtypes.float32).bitcast(dtypes.uint32) & 0x7FFFFFFF)
    return exponent + (significand != 1 << 23).cast(dtypes.int32)


def rint(x: Tensor) -> Tensor:
    """`x` rounded to an integer, ties to even, as C's `rint` (tinygrad's `round` adds or takes
    0.5 first, which itself rounds from 2^23 up, where every float32 is an integer already)."""
    return (absolute(x) >= 2.0 ** 23).where(x, x.round())


def absolute(x: Tensor) -> Tensor:
    """`|x|` with its sign bit cleared, as MLX's abs (tinygrad's `x * sign(x)` keeps -0.0's sign)."""
    unsigned = {2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[x.dtype.itemsize]
    return (x.bitcast(unsigned) & ((1 << (8 * x.dtype.itemsize - 1)) - 1)).bitcast(x.dtype)
