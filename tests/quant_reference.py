"""Quantized weights decoded directly in numpy, for the product kernels' tests: the codes from their
LSB-first bit stream of little-endian uint32 words, e2m1 and e4m3 elements, e8m0 and e4m3 scales."""
import numpy as np

from reference import values

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def unpack(words: np.ndarray, bits: int, columns: int) -> np.ndarray:
    """The first `columns` codes of `bits` bits in each row of uint32 `words [..., W]`."""
    stream = (words.astype(np.uint64)[..., None] >> np.arange(32, dtype=np.uint64)) & 1     # [..., W, 32]
    stream = stream.reshape(*words.shape[:-1], -1)[..., :columns * bits]
    return (stream.reshape(*words.shape[:-1], columns, bits) << np.arange(bits, dtype=np.uint64)).sum(-1).astype(np.int64)


def e2m1(codes: np.ndarray) -> np.ndarray:
    """e2m1 codes (sign in bit 3) to values."""
    return np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]


def e4m3(codes: np.ndarray) -> np.ndarray:
    """e4m3 (fn) codes to values: exponent bias 7, subnormal steps of 2^-9 (no NaN in these tests)."""
    field, mantissa = (codes >> 3) & 0xF, codes & 7
    magnitude = np.where(field > 0, (1 + mantissa / 8) * 2.0 ** (field - 7), mantissa * 2.0 ** -9)
    return np.where(codes & 0x80, -magnitude, magnitude)


def dequantized(qw) -> np.ndarray:
    """The weights `[..., N, K]` of a `QuantizedWeight` in float64 (a global scale is not applied)."""
    words = qw.weight.numpy()
    codes = unpack(words, qw.bits, words.shape[-1] * 32 // qw.bits)
    if qw.mode == "affine":
        scales, biases = values(qw.scales), values(qw.biases)
    else:
        scale_codes = qw.scales.numpy().astype(np.int64)
        scales = e4m3(scale_codes) if qw.mode == "nvfp4" else 2.0 ** (scale_codes - 127)
        biases = np.zeros_like(scales)
        codes = e2m1(codes) if qw.bits == 4 else e4m3(codes)
    spread = lambda per_group: np.repeat(per_group, qw.group_size, axis=-1)  # noqa: E731
    return codes * spread(scales) + spread(biases)
