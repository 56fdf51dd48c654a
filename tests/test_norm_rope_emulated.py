"""The fused norm_rope kernel (`src/norm_rope.h`) on the CPU from its CUDA rendering
(`kernel_emulator`), against float64 numpy (the norm's roundings, then rope's: the contract's float32
angles, only the sine, cosine and rotation in float64) and, bit for bit, against the three passes
it replaces (the norm kernel, the rope kernel, the write) emulated alike. Both pair layouts at
every unit width, `dims < D`, `freqs`, `scale`, per-batch offsets, with and without a weight,
norm_rope_kv's values, every launch shape (8, 16 and 32 lanes a row, two pieces a lane, rows of
more than one SIMD group, single elements), mixed dtypes; into fresh outputs, caches at an
offset (rows outside skipped, offsets at both ends of int32) and pools (slots shuffled, negative,
past the pool, at both ends of int32; two rows naming one slot: the slot's pieces come from
either); nothing read or written outside the buffers; a row's bits equal to the row computed
alone."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
from tinygrad import dtypes
from tinygrad.dtype import DType

import test_norm_emulated as norm_emulated
import test_rope_emulated as rope_emulated
from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import Target
from nuvec_tg.kernels import rope as kernel
from nuvec_tg.kernels.program import metal_limit_reason
from reference import assert_rows_close, rope_reference, round_to

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
# The output's rounding and an intermediate one (the normalised rows, rounded before rope reads
# them, may round the other way from float64's at a tie), in units of the row's largest value.
TOLERANCE = {F32: 4e-6, F16: 2e-3, BF16: 1.6e-2}
EPS, V_EPS = 1e-6, 1e-5
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


@dataclass(frozen=True)
class Case:
    """A call: x of `shape` (`[B, H, T, D]` into a cache or pool) in `dtype`, normalised with a
    weight of `weight`'s dtype (None: not normalised), `dims` rotated at `offsets` (one, or one
    per batch item); with `values`, norm_rope_kv's values too. into: "fresh", "cache" (`places`
    positions) or "pool" (`places` blocks of `block_size`, `slots` flat over `[B, T]`), in
    `into_dtype` (default the rows' own)."""
    shape: tuple[int, ...]
    dims: int
    dtype: DType
    weight: DType | None
    traditional: bool = False
    offsets: tuple[int, ...] = (3,)
    scale: float = 1.0
    freqs: bool = False
    values: bool = False
    into: str = "fresh"
    places: int = 0
    block_size: int = 4
    slots: tuple[int, ...] = ()
    into_dtype: DType | None = None
    projection: tuple[int, int] | None = None   # x read in place from a [B, T, width] buffer: (width, x's first column)
    copied: DType | None = None                  # values copied from rows of their own in this dtype (VALUES 2)
    v_projection: tuple[int, int] | None = None  # those rows read in place from a [B, T, width] buffer

    @property
    def has_values(self) -> bool:
        return self.values or self.copied is not None

    @property
    def normed(self) -> DType:
        """The normalised rows' dtype: x's promoted with the weight's (float16 with bfloat16 is float32)."""
        return self.dtype if self.weight in (None, self.dtype) else F32

    def destination_shape(self) -> tuple[int, ...]:
        b, h, _, d = self.shape if self.into != "fresh" else (0, 0, 0, 0)
        if self.into == "cache": return (b, h, self.places, d)
        if self.into == "pool": return (self.places, h, self.block_size, d)
        return self.shape

    def destination_dtypes(self) -> tuple[DType, DType]:
        """The rotated rows' and the values' destination dtypes."""
        if self.into == "fresh": return self.normed, self.dtype
        return self.into_dtype or self.normed, self.into_dtype or self.dtype


CASES = {
    "fresh_halves_128_bf16": Case((2, 3, 5, 128), 128, BF16, BF16, offsets=(5,)),                          # 16 lanes
    "fresh_traditional_64_per_batch_f32": Case((2, 2, 3, 64), 64, F32, F32, True, (1, 40), 0.5),            # 8 lanes
    "fresh_dims_40_of_80_freqs_f16_f32_weight": Case((3, 2, 4, 80), 40, F16, F32, True, freqs=True),        # units of 4, a tail
    "fresh_single_elements_6_of_7_f32": Case((1, 3, 7), 6, F32, F32, True),                                 # pieces of 1
    "fresh_4_of_6_per_batch_bf16": Case((2, 4, 6), 4, BF16, BF16, offsets=(3, 9), scale=0.75),             # units of 2
    "fresh_rank_5_per_batch_f32": Case((2, 2, 3, 6, 16), 16, F32, F32, offsets=(1, 4), scale=0.5, freqs=True),
    "fresh_512_two_pieces_a_lane_bf16": Case((1, 2, 3, 512), 512, BF16, BF16),                              # 32 lanes, 2 pieces
    "fresh_1024_a_threadgroup_a_row_f16": Case((1, 2, 2, 1024), 256, F16, F16),                             # 64 lanes, GROUP_SUM
    "fresh_100_single_elements_a_threadgroup_f32": Case((1, 1, 3, 100), 100, F32, F32, True),              # 64 lanes of 1
    "fresh_no_weight_halves_bf16": Case((2, 2, 3, 64), 32, BF16, None),
    "kv_fresh_256_freqs_bf16": Case((1, 2, 3, 256), 128, BF16, BF16, freqs=True, values=True, offsets=(7,)),
    "kv_fresh_no_weight_f32": Case((2, 2, 3, 64), 64, F32, None, values=True),
    "cache_int_offset_bf16": Case((2, 3, 5, 64), 64, BF16, BF16, offsets=(9,), into="cache", places=16),
    "cache_rows_before_the_cache_f16": Case((1, 2, 5, 128), 128, F16, F16, True, (-2,), into="cache", places=6),
    "cache_rows_past_the_cache_f32": Case((1, 2, 5, 80), 64, F32, F32, offsets=(4,), into="cache", places=6),
    "cache_no_weight_bf16": Case((1, 2, 3, 64), 64, BF16, None, offsets=(2,), into="cache", places=8),
    "cache_kv_f32_into_bf16": Case((1, 2, 3, 128), 64, F32, F32, values=True, offsets=(1,), into="cache", places=5,
                                   into_dtype=BF16),
    "cache_kv_two_pieces_a_lane_bf16": Case((1, 1, 2, 512), 512, BF16, BF16, values=True, offsets=(3,), into="cache",
                                            places=8),
    "pool_shuffled_bf16": Case((2, 2, 3, 64), 64, BF16, BF16, offsets=(4, 11), into="pool", places=4,
                               slots=(5, 0, 13, 2, 9, 15)),
    "pool_hostile_slots_f16_into_f32": Case((2, 3, 3, 32), 32, F16, F16, True, (0, 6), into="pool", places=3,
                                            slots=(-1, 12, 4, INT32_MAX, INT32_MIN, 11), into_dtype=F32),
    "pool_slots_just_past_either_end_f32": Case((1, 2, 3, 32), 32, F32, F32, into="pool", places=3, slots=(-1, 12, 5)),
    "pool_a_threadgroup_a_row_f32": Case((1, 2, 3, 1024), 1024, F32, F32, offsets=(2,), into="pool", places=2,
                                         block_size=2, slots=(3, -5, 0)),
    # x's heads read in place from a projection's output [B, T, 96 or 40] (the rest of each row NaN)
    "pool_from_a_projection_bf16": Case((2, 2, 3, 16), 16, BF16, BF16, offsets=(4, 11), into="pool", places=4,
                                        slots=(5, 0, 13, 2, 9, 15), projection=(96, 40)),
    "fresh_from_a_projection_f32": Case((2, 3, 1, 8), 8, F32, F32, offsets=(2, 7), projection=(40, 12)),
    # a model's keys and values in one pass: the values copied beside the keys
    "cache_copied_values_bf16": Case((2, 2, 3, 128), 128, BF16, BF16, offsets=(5,), into="cache", places=8, copied=BF16),
    "cache_copied_f32_values_into_bf16": Case((1, 2, 4, 64), 64, F32, F32, True, (2,), into="cache", places=8,
                                              into_dtype=BF16, copied=F32),
    "pool_copied_values_of_a_projection_bf16": Case((2, 2, 3, 16), 16, BF16, BF16, offsets=(4, 11), into="pool", places=4,
                                                    slots=(5, -1, 13, 2, 99, 15), projection=(104, 40), copied=BF16,
                                                    v_projection=(104, 72)),
    "pool_copied_f16_values_single_elements_f32": Case((1, 2, 3, 7), 6, F32, F32, True, into="pool", places=2,
                                                       slots=(3, 0, 6), copied=F16),
}


def x_layout(case: Case, x: np.ndarray, projection: tuple[int, int] | None) -> tuple[np.ndarray, list[int]]:
    """Rows of x's shape as the kernel reads them (float64): themselves, or placed in a
    projection's output `[B, T, width]` of NaN at its columns `(width, first column)`; and the
    layout's runtime integers (heads, first element, the batch item's, head's and step's strides)."""
    shape = case.shape
    batch, steps, length = shape[0], shape[-2], shape[-1]
    heads = math.prod(shape[1:-2])
    if projection is None: return x, [heads, 0, heads * steps * length, steps * length, length]
    width, start = projection
    buffer = np.full((batch, steps, width), np.nan)
    buffer[:, :, start:start + heads * length] = x.transpose(0, 2, 1, 3).reshape(batch, steps, heads * length)
    return buffer, [heads, start, steps * width, length, width]


def inputs(case: Case, seed: int = 0):
    """x and the weight (float64, representable in their dtypes), the float32 inverse
    frequencies, and the destinations' values before the call (finite, for the rows kept)."""
    rng = np.random.default_rng(seed)
    x = round_to(rng.standard_normal(case.shape) * 2 + 0.25, case.dtype)
    weight = None if case.weight is None else round_to(rng.uniform(0.5, 1.5, case.shape[-1]), case.weight)
    inv_freq = rope_emulated.inverse_frequencies(case.dims, freqs=(1.0 + 3.0 * np.arange(case.dims // 2)) if case.freqs else None)
    rotated_dtype, values_dtype = case.destination_dtypes()
    before = (round_to(rng.uniform(-3, 3, case.destination_shape()), rotated_dtype),
              round_to(rng.uniform(-3, 3, case.destination_shape()), values_dtype))
    if case.copied is not None:   # the value rows ride along with x
        x = (x, round_to(rng.uniform(-3, 3, case.shape), case.copied))
    return x, weight, inv_freq, before


def split(case: Case, x):
    """x and the copied value rows (None without)."""
    return x if case.copied is not None else (x, None)


def write(case: Case, rows: np.ndarray, before: np.ndarray, dtype: DType) -> np.ndarray:
    """`rows` (x's shape) rounded to `dtype` where the case puts them: the fresh output, or a copy
    of `before` with each row at its cache position or pool slot (those outside skipped; of rows
    naming one slot the last)."""
    rows = round_to(rows, dtype)
    if case.into == "fresh": return rows
    out = before.copy()
    b, h, t, _ = case.shape
    for i, j in np.ndindex(b, t):
        if case.into == "cache":
            position = case.offsets[0] + j
            if 0 <= position < case.places: out[i, :, position] = rows[i, :, j]
        else:
            slot = case.slots[i * t + j]
            if 0 <= slot < case.places * case.block_size: out[slot // case.block_size, :, slot % case.block_size] = rows[i, :, j]
    return out


def reference(case: Case, x, weight, inv_freq, before):
    """float64 with the operations' roundings: the normalised rows (and weighted) in the rows'
    dtype, rotated by the contract's float32 angles and rounded to it, then written."""
    x, v_rows = split(case, x)
    y = x
    if weight is not None:
        y = round_to(round_to(x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS), case.normed) * weight, case.normed)
    rotated = round_to(rope_reference(y, case.dims, case.traditional, case.offsets, case.scale, inv_freq), case.normed)
    values = round_to(x / np.sqrt((x * x).mean(-1, keepdims=True) + V_EPS), case.dtype) if v_rows is None else v_rows
    rotated_dtype, values_dtype = case.destination_dtypes()
    return write(case, rotated, before[0], rotated_dtype), write(case, values, before[1], values_dtype)


def emulate(case: Case, x, weight, inv_freq, before, edit=None, queries=None):
    """The kernel as the plan launches it (its rendering changed by `edit`, for planted faults);
    returns the rotated rows' destination and the values' (None without values) as float64; with
    `queries` (`(q, q_weight, projection)`: q `[B, Hq, T, D]` in x's dtype, its weight in the
    weight's, read in place from a projection's output as x's `projection` says) the queries'
    fresh rows third."""
    rows, length = math.prod(case.shape[:-1]), case.shape[-1]
    launch = kernel.norm_rope_plan(length, case.dims)
    rotated_dtype, values_dtype = case.destination_dtypes()
    types = dict(x=case.dtype, normed=case.normed, rotated=rotated_dtype)
    if weight is not None: types["weight"] = case.weight
    x, v_rows = split(case, x)
    if case.has_values: types["values"] = values_dtype
    if case.copied is not None: types["values_in"] = case.copied
    if queries is not None: types["queries"] = case.normed
    program = kernel.norm_rope_program("cuda", types, case.into, case.traditional, case.scale, launch,
                                       eps=EPS if weight is not None else None, v_eps=V_EPS if case.values else None)
    if edit is not None: program = edit(program)
    poison = case.into == "fresh"  # fresh outputs start as NaN: a row not written shows
    source, layout = x_layout(case, x, case.projection)
    if v_rows is not None:
        v_source, v_layout = x_layout(case, v_rows, case.v_projection)
        layout = layout + v_layout
    buffers = {"rotated": to_bits(np.full(case.shape, np.nan) if poison else before[0], rotated_dtype),
               "values": to_bits(np.full(case.shape, np.nan) if poison else before[1], values_dtype),
               "x": to_bits(source, case.dtype), "inv_freq": inv_freq, "offsets": np.asarray(case.offsets, np.int32),
               "slots": np.asarray(case.slots, np.int32)}
    if v_rows is not None: buffers["v_rows"] = to_bits(v_source, case.copied)
    if weight is not None: buffers["weight"] = to_bits(weight, case.weight)
    heads = case.shape[1] if case.into == "pool" else 0
    places = case.places * (case.block_size if case.into == "pool" else 1)
    buffers["ints"] = np.array([length, case.dims // 2, case.shape[-2], rows // case.shape[0], rows, int(len(case.offsets) > 1),
                                places, heads, case.block_size if case.into == "pool" else 0, *layout], np.int32)
    groups = launch.groups(rows)
    if queries is not None:
        q, q_weight, q_projection = queries
        q_rows = math.prod(q.shape[:-1])
        q_source, q_layout = x_layout(dataclasses.replace(case, shape=q.shape), q, q_projection)
        buffers.update(queries=to_bits(np.full(q.shape, np.nan), case.normed), q_x=to_bits(q_source, case.dtype))
        if q_weight is not None: buffers["q_weight"] = to_bits(q_weight, case.weight)
        padding = [0] * (19 - len(buffers["ints"]))
        buffers["ints"] = np.array([*buffers["ints"], *padding, q_rows, q_rows // q.shape[0], *q_layout], np.int32)
        groups += launch.groups(q_rows)
    build(program)([np.ascontiguousarray(buffers[p.name]) for p in program.params], groups, launch.threads)
    results = (from_bits(buffers["rotated"], rotated_dtype), (from_bits(buffers["values"], values_dtype) if case.has_values else None))
    return results if queries is None else (*results, from_bits(buffers["queries"], case.normed))


def three_passes(case: Case, x, weight, inv_freq, before):
    """What the operations ran before the fused kernel, emulated: the norm kernel, the rope
    kernel, then the write (numpy); copied values written as they are."""
    x, v_rows = split(case, x)
    rows, length = math.prod(case.shape[:-1]), case.shape[-1]
    flat = x.reshape(rows, length)
    y = x
    if weight is not None:
        y = norm_emulated.emulate("rms", rows, length, case.dtype, case.weight, None, None, case.normed,
                                  {"x": flat, "weight": weight})[1].reshape(case.shape)
    rotated = rope_emulated.emulate(y, case.dims, case.traditional, case.normed, case.offsets, case.scale, inv_freq)
    values = v_rows if v_rows is not None else \
        norm_emulated.emulate("rms", rows, length, case.dtype, None, None, None, case.dtype, {"x": flat}, eps=V_EPS)[1].reshape(case.shape)
    rotated_dtype, values_dtype = case.destination_dtypes()
    return write(case, rotated, before[0], rotated_dtype), write(case, values, before[1], values_dtype)


def check_case(name, edit=None):
    """The case against float64 numpy (what the test below and the planted faults run)."""
    case = CASES[name]
    x, weight, inv_freq, before = inputs(case)
    got = emulate(case, x, weight, inv_freq, before, edit)
    want = reference(case, x, weight, inv_freq, before)
    assert_rows_close(f"{name} rotated", got[0], want[0], TOLERANCE[case.normed])
    if case.has_values: assert_rows_close(f"{name} values", got[1], want[1], TOLERANCE[case.dtype])
    return got


@pytest.mark.parametrize("name", CASES)
def test_emulated_norm_rope_matches_numpy_and_the_three_passes_bit_for_bit(name):
    case = CASES[name]
    got = check_case(name)
    x, weight, inv_freq, before = inputs(case)
    passes = three_passes(case, x, weight, inv_freq, before)
    np.testing.assert_array_equal(got[0], passes[0], err_msg=f"{name}: rotated rows against the three passes")
    if case.has_values: np.testing.assert_array_equal(got[1], passes[1], err_msg=f"{name}: values against rms_norm or copied")


def test_every_launch_shape_and_unit_width_is_covered():
    shapes = {(s.lanes, s.norm.per, s.norm.vec) for s in (kernel.norm_rope_plan(c.shape[-1], c.dims) for c in CASES.values())}
    assert {(8, 1, 8), (16, 1, 8), (32, 2, 8), (64, 2, 8), (8, 1, 1), (64, 2, 1)} <= shapes
    assert {kernel.norm_rope_plan(c.shape[-1], c.dims).rotation.vec for c in CASES.values()} == {8, 4, 2, 1}


@pytest.mark.parametrize("offset", [INT32_MAX, INT32_MAX - 2, INT32_MIN, -3, 6])
def test_cache_offsets_at_both_ends_of_int32_write_only_the_rows_inside(offset):
    """A tensor offset the operation cannot check: rows it puts outside the cache are skipped
    (nothing is written outside it: the emulator's bounds check), the rest at their positions,
    turned at the int32 position (wrapping, as the composition's add)."""
    case = Case((1, 2, 4, 64), 64, F32, F32, offsets=(offset,), into="cache", places=8)
    x, weight, inv_freq, before = inputs(case, seed=1)
    got, _ = emulate(case, x, weight, inv_freq, before)
    want, _ = reference(case, x, weight, inv_freq, before)
    assert_rows_close(f"offset {offset}", got, want, TOLERANCE[F32])
    kept = [p for p in range(8) if not 0 <= p - offset < 4]
    np.testing.assert_array_equal(got[:, :, kept], before[0][:, :, kept])


def test_two_rows_naming_one_slot_leave_the_slot_pieces_of_either():
    """The kernel's rows race for a shared slot (the composition's later row wins): each piece of
    the slot's row is one of the candidates' pieces, and every other slot is the contract's."""
    case = Case((2, 2, 3, 64), 64, BF16, BF16, into="pool", places=2, slots=(3, 3, 1, 6, 3, 0))
    x, weight, inv_freq, before = inputs(case, seed=2)
    got, _ = emulate(case, x, weight, inv_freq, before)
    want, _ = reference(case, x, weight, inv_freq, before)
    others = np.ones(got.shape[0] * got.shape[2], bool)
    others[3] = False
    pool_rows = lambda a: a.transpose(0, 2, 1, 3).reshape(-1, a.shape[1], a.shape[3])  # [slots, H, D]
    assert_rows_close("other slots", pool_rows(got)[others], pool_rows(want)[others], TOLERANCE[BF16])
    rows = reference(Case((2, 2, 3, 64), 64, BF16, BF16), x, weight, inv_freq, before)[0]  # the rows themselves
    candidates = np.stack([rows[0, :, 0], rows[0, :, 1], rows[1, :, 1]])   # [3, H, D]: the rows naming slot 3
    unit = kernel.norm_rope_plan(64, 64).rotation.vec                      # the pieces a lane writes
    slot = pool_rows(got)[3].reshape(2, -1, unit)
    pieces = candidates.reshape(3, 2, -1, unit)
    close = np.abs(slot[None] - pieces).max(-1) <= TOLERANCE[BF16] * np.abs(pieces).max((-1, -2), keepdims=True)[..., 0]
    assert close.any(0).all(), "a piece of slot 3 is none of its candidates'"


@pytest.mark.parametrize("into", ["fresh", "cache", "pool"])
def test_a_rows_bits_do_not_depend_on_the_other_rows(into):
    rng_slots = (2, 7, 0, 5, 1, 4, 3, 6, 9, 8, 11, 10)
    case = Case((4, 2, 3, 128), 96, BF16, BF16, offsets=(7,) if into != "fresh" else (7, 100, 3000, 5), into=into, places=16,
                slots=rng_slots, values=into == "cache")
    x, weight, inv_freq, before = inputs(case, seed=3)
    together = emulate(case, x, weight, inv_freq, before)
    alone_case = Case((1, 2, 3, 128), 96, BF16, BF16, offsets=case.offsets[2:3] if into == "fresh" else case.offsets, into=into,
                      places=16, slots=rng_slots[6:9], values=case.values)
    alone = emulate(alone_case, x[2:3], weight, inv_freq, tuple(b[:1] if into == "cache" else b for b in before))
    if into == "fresh": np.testing.assert_array_equal(together[0][2:3], alone[0])
    elif into == "cache":
        np.testing.assert_array_equal(together[0][2:3, :, 7:10], alone[0][:, :, 7:10])
        np.testing.assert_array_equal(together[1][2:3, :, 7:10], alone[1][:, :, 7:10])
    else:
        for slot in rng_slots[6:9]:
            np.testing.assert_array_equal(together[0][slot // 4, :, slot % 4], alone[0][slot // 4, :, slot % 4])


def test_the_plan_depends_on_the_sizes_only_and_its_threadgroups_fit():
    # a unit of 4 pairs for each of a row's 16 lanes (rope alone turns 8 pairs a thread)
    assert kernel.norm_rope_plan(128, 128) == kernel.FusedLaunch(kernel.norm_rows.plan(128), kernel.plan(128, 128, 16), 16, 16)
    assert kernel.plan(128, 128, 16).units == 16 and kernel.plan(128, 128).units == 8
    assert kernel.plan(80, 80, 16).vec == 2 and kernel.plan(6, 6, 32).vec == 1  # the narrowest that fits, if none gives enough
    assert [(s.lanes, s.rows) for s in map(lambda n: kernel.norm_rope_plan(n, n), (8, 64, 128, 256, 512, 520, 4096))] == \
        [(8, 32), (8, 32), (16, 16), (32, 8), (32, 8), (64, 1), (256, 1)]
    for length in (6, 64, 128, 256, 512, 1024, 4096, 8192):
        for dtype in (F32, BF16):
            shape = kernel.norm_rope_plan(length, length)
            fits = kernel.norm_rope_unsupported((dtype, dtype), 1, length, length, 0, Target("metal")) is None
            assert fits == (length * dtype.itemsize <= kernel.MAX_KEPT_BYTES), (length, dtype)
            assert metal_limit_reason(kernel.norm_rope_metal_resources(shape, dtype)) is None or not fits


# A model's queries beside its keys (`queries=`): the first threadgroups take q's rows into fresh
# outputs. (case, query heads, where q, x and the copied values sit in one projection's output
# [B, T, width]: (width, q's, x's and the values' first columns), or None: each contiguous.)
QUERY_CASES = {
    "cache_a_models_qkv_projection_bf16": (Case((2, 2, 3, 64), 64, BF16, BF16, offsets=(5,), into="cache", places=8,
                                                 copied=BF16, projection=(512, 256), v_projection=(512, 384)), 4, (512, 0)),
    "pool_no_weight_per_batch_hostile_slots_f32": (Case((2, 1, 3, 32), 32, F32, None, True, (4, 11), into="pool", places=4,
                                                        slots=(5, -1, 13, 2, 99, 15), copied=F32), 3, None),
    "cache_a_threadgroup_a_row_f16": (Case((1, 1, 2, 1024), 512, F16, F16, offsets=(1,), into="cache", places=4), 3, None),
    "cache_rows_not_filling_a_threadgroup_128_bf16_f32_weight": (Case((2, 1, 3, 128), 96, BF16, F32, offsets=(2,),
                                                                      into="cache", places=6), 5, None),
}


def query_inputs(case: Case, heads: int, projection: tuple[int, int] | None, seed: int = 7):
    """q `[B, heads, T, D]` in x's dtype, its weight (None where x's is), and where it is read."""
    rng = np.random.default_rng(seed)
    b, _, t, d = case.shape
    q = round_to(rng.standard_normal((b, heads, t, d)) * 3 - 0.5, case.dtype)
    q_weight = None if case.weight is None else round_to(rng.uniform(0.5, 1.5, d), case.weight)
    return q, q_weight, projection


def check_query_case(name, edit=None):
    """A QUERY_CASES call against float64 numpy: the queries' rows as norm_rope over q alone (at
    the keys' positions, per batch item in a pool), the keys and values as the case's own (what
    the test below and the planted faults run)."""
    case, heads, q_projection = QUERY_CASES[name]
    x, weight, inv_freq, before = inputs(case)
    q, q_weight, _ = query_inputs(case, heads, q_projection)
    got = emulate(case, x, weight, inv_freq, before, edit, queries=(q, q_weight, q_projection))
    want = reference(case, x, weight, inv_freq, before)
    assert_rows_close(f"{name} rotated", got[0], want[0], TOLERANCE[case.normed])
    if case.has_values: assert_rows_close(f"{name} values", got[1], want[1], TOLERANCE[case.dtype])
    fresh = Case(q.shape, case.dims, case.dtype, case.weight, case.traditional, case.offsets, case.scale, case.freqs)
    assert_rows_close(f"{name} queries", got[2], reference(fresh, q, q_weight, inv_freq, (None, None))[0], TOLERANCE[case.normed])
    return got


@pytest.mark.parametrize("name", QUERY_CASES)
def test_queries_beside_the_keys_equal_norm_rope_over_q_alone_bit_for_bit(name):
    """check_query_case, then bit for bit: the queries' rows against the fresh kernel over q
    alone, the keys and values against the call without queries (nothing of either written by
    the other's threadgroups)."""
    got = check_query_case(name)
    case, heads, q_projection = QUERY_CASES[name]
    x, weight, inv_freq, before = inputs(case)
    q, q_weight, _ = query_inputs(case, heads, q_projection)
    alone = emulate(case, x, weight, inv_freq, before)
    np.testing.assert_array_equal(got[0], alone[0], err_msg=f"{name}: keys beside queries against keys alone")
    if case.has_values: np.testing.assert_array_equal(got[1], alone[1], err_msg=f"{name}: values beside queries")
    fresh = Case(q.shape, case.dims, case.dtype, case.weight, case.traditional, case.offsets, case.scale, case.freqs)
    q_alone = emulate(fresh, q, q_weight, inv_freq, (None, None))[0]
    np.testing.assert_array_equal(got[2], q_alone, err_msg=f"{name}: queries against the fresh kernel over q alone")
