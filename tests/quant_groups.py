"""The weights of the many-group MLX comparison (tests/test_quant_mlx.py), and the row digests that
stand in for MLX's outputs there.

scripts/make_mlx_vectors.py quantizes these weights with MLX and stores a digest of each row of its
outputs in tests/data/mlx_groups.npz; the test rebuilds the same weights here. They come from
PCG64's raw output (NumPy keeps its bit generators' streams fixed, not its distributions') and
exact arithmetic only, so that both sides build the same bits on any machine. The stored digest of
the weights themselves says when they are not.

Each group is one of several kinds, so that the quotients the quantizers round land on and beside
their ties: smooth values; integer grids whose range is a small multiple of an affine level count
(codes at exact halves), the same nudged by one unit in the last place (quotients an ulp from a
tie); e2m1 values and midpoints on a scale that e4m3 stores exactly; e4m3 midpoints under a
power-of-two scale; and constant, signed-zero, tiny (the 1e-7 floor), subnormal and large groups.
"""
from __future__ import annotations

import numpy as np

ROWS, GROUPS_PER_ROW = 1280, 8  # 10,240 groups per (group size, dtype)
DTYPES = ("float32", "float16", "bfloat16")
# The exponent range of a group's unit, per dtype: wide, yet inside float16's range for its values.
_UNIT_EXPONENTS = {"float32": (-40, 40), "float16": (-14, 4), "bfloat16": (-40, 40)}
_LARGEST_EXPONENT = {"float32": 125, "float16": 13, "bfloat16": 125}
_E2M1_TIES = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6])
_LEVELS = np.array([1, 3, 7, 15, 31, 63, 255])
KINDS = ("smooth", "grid", "nudged", "e2m1", "e4m3", "constant", "zero", "tiny", "subnormal", "large")


class _Raw:
    """Draws from PCG64's raw 64-bit output."""

    def __init__(self, seed: int):
        self.generator = np.random.PCG64(seed)

    def integers(self, shape, low: int, high: int) -> np.ndarray:
        """Integers in [low, high] (int64; a modulo's bias, which does not matter here)."""
        raw = self.generator.random_raw(int(np.prod(shape))).reshape(shape)
        return (raw % np.uint64(high - low + 1)).astype(np.int64) + low

    def signs(self, shape) -> np.ndarray:
        return 1.0 - 2.0 * self.integers(shape, 0, 1)


def _to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values to `dtype`'s bits (rounded to nearest even): uint32 for float32, else uint16."""
    if dtype == "float16": return values.astype(np.float16).view(np.uint16)
    bits = values.astype(np.float32).view(np.uint32)
    if dtype == "float32": return bits
    wide = bits.astype(np.uint64)
    return ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(np.uint16)


def weights(group_size: int, dtype: str) -> np.ndarray:
    """The weights `[ROWS, GROUPS_PER_ROW * group_size]` for `group_size` and `dtype` (a name in
    DTYPES) as the dtype's bits: uint32 for float32, uint16 for float16 and bfloat16."""
    raw = _Raw(group_size * 1000 + DTYPES.index(dtype))
    groups, size = ROWS * GROUPS_PER_ROW, group_size
    kind = raw.integers(groups, 0, len(KINDS) - 1)
    low, high = _UNIT_EXPONENTS[dtype]
    unit = np.ldexp(1.0, raw.integers((groups, 1), low, high))
    values = np.zeros((groups, size))

    def fill(name: str, block: np.ndarray) -> None:
        values[kind == KINDS.index(name)] = block[kind == KINDS.index(name)]

    # Sums of four uniforms (near normal), some groups shifted to one sign.
    smooth = raw.integers((groups, size, 4), 0, 2 ** 20).sum(-1) / 2.0 ** 21 - 1
    fill("smooth", (smooth + raw.integers((groups, 1), -1, 1) * 1.5) * unit)
    # Integers over a range of m * levels (m = 1..8), both ends present: with m even, codes of
    # half-integer quotients.
    span = _LEVELS[raw.integers((groups, 1), 0, len(_LEVELS) - 1)] * raw.integers((groups, 1), 1, 8)
    start = raw.integers((groups, 1), -1, 0) * span + raw.integers((groups, 1), -4, 4)
    grid = start + raw.integers((groups, size), 0, 2 ** 20) % (span + 1)
    grid[:, 0], grid[:, 1] = start[:, 0], start[:, 0] + span[:, 0]
    grid_unit = np.ldexp(1.0, raw.integers((groups, 1), -8, 0)) * np.minimum(unit, 2.0 ** -4)
    fill("grid", grid * grid_unit)
    fill("nudged", grid * grid_unit)
    # e2m1 values and midpoints of a unit that e4m3 stores exactly (1 + j/8 times a power of two),
    # the largest magnitude six units: nvfp4's (and, for j = 0, mxfp4's) scale is the unit.
    e2m1_unit = (1 + raw.integers((groups, 1), 0, 7) / 8) * np.ldexp(1.0, raw.integers((groups, 1), -8, 2))
    table = _E2M1_TIES[raw.integers((groups, size), 0, len(_E2M1_TIES) - 1)] * raw.signs((groups, size))
    table[:, 0] = 6 * raw.signs(groups)
    fill("e2m1", table * e2m1_unit)
    # e4m3 midpoints (a fourth mantissa bit) under a largest magnitude of 448 units (scale = unit).
    e4m3 = (1 + (2 * raw.integers((groups, size), 0, 7) + 1) / 16) * np.ldexp(1.0, raw.integers((groups, size), -9, 7))
    e4m3 *= raw.signs((groups, size))
    e4m3[:, 0] = 448 * raw.signs(groups)
    fill("e4m3", e4m3 * np.ldexp(1.0, raw.integers((groups, 1), -6, 2)))
    fill("constant", np.broadcast_to(smooth[:, :1] * unit, (groups, size)))
    # Tiny: ranges about the affine scale's floor of 1e-7 times its levels.
    fill("tiny", smooth * np.ldexp(1.0, raw.integers((groups, 1), -26, -16)))
    fill("large", smooth * np.ldexp(1.0, _LARGEST_EXPONENT[dtype] - raw.integers((groups, 1), 0, 3)))
    bits = _to_bits(values, dtype)

    # Whole-bits kinds: signed zeros, subnormals (a random fraction field and sign); nudged grid
    # values move by one unit in the last place (zeros stay).
    width = 8 * bits.itemsize
    sign = (raw.integers((groups, size), 0, 1) << (width - 1)).astype(bits.dtype)
    fraction = raw.integers((groups, size), 0, (1 << {"float32": 23, "float16": 10, "bfloat16": 7}[dtype]) - 1)
    bits[kind == KINDS.index("zero")] = sign[kind == KINDS.index("zero")]
    subnormal = (sign | fraction.astype(bits.dtype))
    bits[kind == KINDS.index("subnormal")] = subnormal[kind == KINDS.index("subnormal")]
    magnitude = bits & ((1 << (width - 1)) - 1)
    nudge = np.where(magnitude > 1, raw.integers((groups, size), -1, 1), 0).astype(np.int64)
    nudged = (bits.astype(np.int64) + nudge).astype(bits.dtype)
    bits[kind == KINDS.index("nudged")] = nudged[kind == KINDS.index("nudged")]
    return bits.reshape(ROWS, GROUPS_PER_ROW * size)


def digest(*arrays: np.ndarray) -> np.ndarray:
    """One uint32 per row of `arrays` (each `[rows, n]`, of unsigned integers of at most 32 bits,
    in order): FNV-1a over the row's values, folded to 32 bits."""
    state = np.full(arrays[0].shape[0], 0xCBF29CE484222325, dtype=np.uint64)
    for array in arrays:
        for column in array.astype(np.uint64).T:
            state = (state ^ column) * np.uint64(0x100000001B3)
    return (state ^ (state >> np.uint64(32))).astype(np.uint32)


# Each float dtype's bits: (unsigned view, magnitude mask, infinity, the positive quiet NaN).
_NAN_BITS = {"float32": (np.uint32, 0x7FFFFFFF, 0x7F800000, 0x7FC00000), "float16": (np.uint16, 0x7FFF, 0x7C00, 0x7E00),
             "bfloat16": (np.uint16, 0x7FFF, 0x7F80, 0x7FC0)}


def canonical_nans(bits: np.ndarray, dtype_name: str) -> np.ndarray:
    """A float array's bits with every NaN made the dtype's positive quiet NaN: which NaN an invalid
    operation makes is the processor's (x86 sets the sign, ARM and NVIDIA GPUs do not), not MLX's
    nor ours, so the digests compare NaN where the other has NaN, not its bits."""
    view, magnitude, infinity, nan = _NAN_BITS[dtype_name]
    bits = np.asarray(bits).astype(view)
    return np.where((bits & magnitude) > infinity, view(nan), bits)

