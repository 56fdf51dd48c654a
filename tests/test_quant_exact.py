"""nuvec_tg.quant.exact against numpy's IEEE float32 arithmetic, on random bit patterns (every
exponent, subnormals, zeros, infinities, NaN) and on the values beside ties and powers of two."""
import math

import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg.quant import exact


def random_floats(rng: np.random.Generator, count: int) -> np.ndarray:
    """float32 values from uniformly random bits, with the special values among them."""
    bits = rng.integers(0, 2 ** 32, count, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x807FFFFF, 0x7F7FFFFF]
    return bits.view(np.float32)


def same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Equal bits, or both NaN (a NaN's sign and payload are the device's)."""
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def test_divide_rounds_as_ieee_division():
    rng = np.random.default_rng(0xD1)
    a, b = random_floats(rng, 200_000), random_floats(rng, 200_000)
    # Exponents close together (quotients near one, where a reciprocal's product misses most
    # often), subnormal operands, subnormal and overflowing quotients, and small integers (ties).
    close = rng.integers(0, 2 ** 23, (2, 50_000), dtype=np.uint32)
    a[8:50_008] = (close[0] | np.uint32(0x80 << 23)).view(np.float32)
    b[8:50_008] = (close[1] | np.uint32(0x7F << 23)).view(np.float32)
    a[50_008:60_008] = rng.integers(1, 2 ** 23, 10_000, dtype=np.uint32).view(np.float32)
    b[60_008:70_008] = -rng.integers(1, 2 ** 23, 10_000, dtype=np.uint32).view(np.float32)
    unit = (rng.integers(0, 2 ** 23, (2, 10_000), dtype=np.uint32) | np.uint32(127 << 23)).view(np.float32)  # [1, 2)
    a[70_008:80_008] = unit[0] * np.float32(2.0 ** -100) * np.where(np.arange(10_000) % 2, -1, 1).astype(np.float32)
    b[70_008:80_008] = unit[1] * np.float32(2.0 ** 40)
    a[90_008:100_008], b[90_008:100_008] = b[70_008:80_008] * np.float32(2.0 ** 60), a[70_008:80_008] * np.float32(2.0 ** 60)
    a[80_008:90_008] = rng.integers(-2000, 2000, 10_000).astype(np.float32) / np.float32(2)
    a[100_008:100_016], b[100_008:100_016] = [0, -0.0, 0, -0.0, 0, 0, -0.0, 1], [1e-45, 1e-45, -3e-39, 5.0, -np.inf, 0, np.nan, 1e-45]
    b[80_008:90_008] = rng.integers(1, 256, 10_000).astype(np.float32)
    with np.errstate(all="ignore"):
        want = a / b
    got = exact.divide(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy()
    wrong = np.flatnonzero(~same_bits(got, want))
    assert wrong.size == 0, [(a[i], b[i], got[i], want[i]) for i in wrong[:5]]
    # A number operand (MLX's divisions by 2^bits - 1, 6, 448 and into 2688).
    for divisor in (3.0, 15.0, 255.0, 6.0, 448.0):
        got = exact.divide(Tensor(a[80_008:90_008], device="CPU"), divisor).numpy()
        np.testing.assert_array_equal(got.view(np.uint32), (a[80_008:90_008] / np.float32(divisor)).view(np.uint32))
    scales = np.abs(random_floats(rng, 1000)[8:])
    scales = scales[np.isfinite(scales) & (scales > 0)]
    with np.errstate(all="ignore"):
        want = np.float32(2688) / scales
    assert same_bits(exact.divide(2688.0, Tensor(scales, device="CPU")).numpy(), want).all()


def test_rint_rounds_half_to_even_at_every_magnitude():
    rng = np.random.default_rng(0xD2)
    halves = np.arange(-3000, 3000, dtype=np.float32) * np.float32(0.5)
    x = np.concatenate([random_floats(rng, 100_000), halves, np.nextafter(halves, np.float32(np.inf)),
                        np.nextafter(halves, -np.float32(np.inf)), np.float32([8388607.5, 8388609, -8388609, 16777215])])
    with np.errstate(invalid="ignore"):
        want = np.rint(x)
    got = exact.rint(Tensor(x, device="CPU")).numpy()
    assert (same_bits(got, want) | (got == want)).all(), x[~(same_bits(got, want) | (got == want))][:5]


def test_powers_of_two_and_ceil_log2_from_the_bits():
    exponents = np.arange(-149, 129, dtype=np.int32)
    got = exact.power_of_two(Tensor(exponents, device="CPU")).numpy()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, np.ldexp(np.float64(1), exponents).astype(np.float32))
    # Powers of two and their neighbours, subnormals among them; ceil(log2 x) exactly (as float64).
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    x = np.concatenate([powers, np.nextafter(powers, np.float32(np.inf)), np.nextafter(powers[1:], np.float32(0)),
                        np.float32([3.0, 6.0, 1e-40, 3e38])])
    want = [math.ceil(math.log2(v)) for v in x.astype(np.float64)]
    np.testing.assert_array_equal(exact.ceil_log2(Tensor(x, device="CPU")).numpy(), want)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16])
def test_absolute_clears_the_sign_of_negative_zero(dtype):
    x = Tensor([-0.0, 0.0, -1.5, 2.0], device="CPU").cast(dtype).contiguous()
    bits = exact.absolute(x).bitcast(dtypes.uint32 if dtype == dtypes.float32 else dtypes.uint16).numpy()
    assert bits[0] == 0 and bits[1] == 0
    np.testing.assert_array_equal(exact.absolute(x).cast(dtypes.float32).numpy()[2:], [1.5, 2.0])
