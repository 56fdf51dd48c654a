"""The matrix-unit decode pass (`src/sdpa_decode_mma.h`) run on the CPU from its CUDA rendering
(`kernel_emulator`, whose mma follows the fragment layout the CUDA prelude documents): its
partials, merged in float64, against numpy attention, across the kernel's boundaries (rows past
a head's group, two row groups, key counts off the 16-key tile, empty blocks, causal rows, windows,
masks, slices of a longer cache, paged pools with hostile tables)."""
import zlib

import numpy as np
import pytest
from tinygrad import dtypes

from kernel_emulator import COMPILER, build
from nuvec_tg.kernels.attention import DecodeSpec

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")


def to_bits(x: np.ndarray, dtype) -> np.ndarray:
    """float64 -> the dtype's 16-bit patterns (bfloat16 rounded to nearest even)."""
    if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, dtype) -> np.ndarray:
    if dtype == dtypes.float16: return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def reference(q, k, v, scale, visible, bias):
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D|DV], visible/bias [B, Hq, Lq, Lk]; a row seeing no key is zeros."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale + bias
    scores = np.where(visible, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.where(visible, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
    total = weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", weights, v) / np.where(total > 0, total, 1)


def merged(part_acc, part_max, part_sum, rows, partials, dv):
    acc = part_acc.reshape(rows, partials, dv).astype(np.float64)
    top = part_max.reshape(rows, partials).astype(np.float64)
    sums = part_sum.reshape(rows, partials).astype(np.float64)
    best = top.max(1, keepdims=True)
    factor = np.where(np.isfinite(top), np.exp2(top - np.where(np.isfinite(best), best, 0)), 0)
    total = (sums * factor).sum(1)
    return (acc * factor[..., None]).sum(1) / np.where(total > 0, total, 1)[:, None]


CASES = {  # name: (B, Hq, Hkv, Lq, Lk, D, DV, blocks, warps, options)
    "gqa8": (2, 16, 2, 1, 77, 128, 128, 2, 2, {}),
    "gqa8_prefetch": (2, 16, 2, 1, 77, 128, 128, 2, 2, {"prefetch": True, "l2_ahead": 2}),
    "gqa4_lq4_causal": (1, 8, 2, 4, 50, 64, 64, 1, 2, {"causal": True}),
    "two_row_groups_f16": (1, 12, 1, 2, 40, 128, 128, 2, 1, {"causal": True, "dtype": dtypes.float16}),
    "rows6_d192": (1, 6, 2, 1, 33, 192, 128, 1, 2, {}),
    "empty_blocks": (1, 4, 1, 1, 20, 64, 64, 4, 2, {}),
    "eight_warps": (1, 8, 2, 1, 300, 128, 128, 2, 8, {"prefetch": True}),
    "one_stage_buffer": (1, 32, 2, 1, 200, 128, 128, 4, 4, {"prefetch": True}),  # 16 rows x 4 SIMD groups: one buffer
    "window": (1, 8, 1, 2, 70, 64, 64, 2, 2, {"causal": True, "window": 21}),
    "bool_mask": (2, 8, 2, 1, 45, 64, 64, 2, 1, {"mask": 1}),
    "additive_mask_f16": (1, 8, 2, 2, 37, 64, 64, 1, 2, {"mask": 2, "dtype": dtypes.float16}),
    "cache_slice": (2, 8, 2, 1, 29, 64, 64, 2, 2, {"slice": (5, 48)}),
    "paged_hostile": (2, 8, 2, 1, 0, 64, 64, 2, 2, {"paged": 8}),
    "paged_hostile_prefetch": (2, 8, 2, 1, 0, 64, 64, 4, 2, {"paged": 8, "prefetch": True, "l2_ahead": 3}),
}


def emulated_partials(name: str, blocks_per_group: int = 1):
    """The case's partials from the emulated kernel (each threadgroup taking `blocks_per_group`
    blocks in turn) and the float64 reference output."""
    b, hq, hkv, lq, lk, d, dv, blocks, warps, options = CASES[name]
    dtype = options.get("dtype", dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # hash() of a str changes per process
    scale = d ** -0.5
    q_bits = to_bits(rng.standard_normal((b, hq, lq, d)), dtype)
    causal = options.get("causal", False)
    window = options.get("window")
    mask_kind = options.get("mask", 0)
    page = options.get("paged", 0)
    ints: list[int] = []
    if page:
        pool_blocks, max_blocks = 7, 5
        k_pool = to_bits(rng.standard_normal((pool_blocks, hkv, page, d)) * 2, dtype)
        v_pool = to_bits(rng.standard_normal((pool_blocks, hkv, page, dv)), dtype)
        tables = rng.integers(-3, pool_blocks + 3, (b, max_blocks)).astype(np.int32)  # out of range: clamped
        lengths = np.array([max_blocks * page + 9, 13], dtype=np.int32)[:b]        # past the table: clamped
        ints = [max_blocks, pool_blocks]
        lk = max_blocks * page
        k_bits = np.zeros((b, hkv, lk, d), np.uint16)
        v_bits = np.zeros((b, hkv, lk, dv), np.uint16)
        for i in range(b):
            for key in range(lk):
                page_id = min(max(tables[i, key // page], 0), pool_blocks - 1)
                k_bits[i, :, key], v_bits[i, :, key] = k_pool[page_id, :, key % page], v_pool[page_id, :, key % page]
        k_len = np.minimum(np.maximum(lengths, 0), lk)
        k_arg, v_arg = k_pool, v_pool
    else:
        start, capacity = options.get("slice", (0, lk))
        k_cache = to_bits(rng.standard_normal((b, hkv, capacity, d)) * 2, dtype)
        v_cache = to_bits(rng.standard_normal((b, hkv, capacity, dv)), dtype)
        k_bits, v_bits = k_cache[:, :, start:start + lk], v_cache[:, :, start:start + lk]
        ints = [start, start, hkv * capacity * d, capacity * d, hkv * capacity * dv, capacity * dv]
        k_len = np.full(b, lk)
        k_arg, v_arg = k_cache, v_cache
    visible = np.zeros((b, hq, lq, lk), bool)
    for i in range(b):
        for row in range(lq):
            last = k_len[i] - lq + row
            keys = np.arange(lk)
            seen = keys < k_len[i]
            if causal or page: seen &= keys <= last
            if window is not None: seen &= keys > last - window
            visible[i, :, row] = seen
    bias = np.zeros((b, hq, lq, lk))
    ins = [q_bits, k_arg, v_arg]
    if mask_kind:
        shape = (b, 1, lq, lk)
        if mask_kind == 1:
            mask = rng.random(shape) < 0.7
            visible &= mask
            ins.append(mask.astype(np.uint8))
        else:
            mask_values = to_bits(rng.standard_normal(shape) * 3, dtype)
            bias = bias + from_bits(mask_values, dtype)
            ins.append(mask_values)
        ints += [1, lk, 0, lq * lk]  # key, query, head, batch strides
    if window is not None: ints.append(window)
    if not page: ints.append(lk)
    ints.append(blocks_per_group)
    if page: ins += [tables, lengths]
    ins.append(np.array(ints, dtype=np.int32))
    spec = DecodeSpec(dtype, d, dv, hq, hkv, lq, 2, blocks, causal, window is not None, mask_kind, False, page, scale,
                      "ints", warps, 2 if options.get("prefetch") else 1, True, options.get("l2_ahead", 0))
    first_pass, _ = spec.programs("cuda")
    rows = b * hq * lq
    part_acc = np.full(rows * spec.blocks * dv, np.nan, np.float32)
    part_max = np.full(rows * spec.blocks, np.nan, np.float32)
    part_sum = np.full(rows * spec.blocks, np.nan, np.float32)
    build(first_pass)([part_acc, part_max, part_sum] + ins, hkv * spec.row_groups(), warps * 32, b,
                               -(-blocks // blocks_per_group))
    want = reference(from_bits(q_bits, dtype), from_bits(k_bits, dtype), from_bits(v_bits, dtype), scale, visible, bias)
    return (part_acc, part_max, part_sum), want, dtype


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_matrix_pass_matches_numpy(name):
    (part_acc, part_max, part_sum), want, dtype = emulated_partials(name)
    b, hq, hkv, lq, lk, d, dv, blocks, warps, options = CASES[name]
    got = merged(part_acc, part_max, part_sum, b * hq * lq, blocks, dv).reshape(want.shape)
    tolerance = 1e-2 if dtype == dtypes.bfloat16 else 2e-3
    np.testing.assert_allclose(got, want, atol=tolerance * np.abs(want).max(), rtol=0)
    assert not np.isnan(part_acc).any()


@pytest.mark.parametrize("name, blocks_per_group", [("empty_blocks", 3), ("paged_hostile_prefetch", 4), ("window", 2),
                                                      ("eight_warps", 2), ("one_stage_buffer", 4)])
def test_emulated_blocks_in_turn_give_the_same_partials(name, blocks_per_group):
    """A threadgroup taking several blocks in turn (a large batch) writes each block's partial with
    the bits of a threadgroup of its own (so a batch item's bits do not depend on its batch)."""
    alone, _, _ = emulated_partials(name)
    in_turn, _, _ = emulated_partials(name, blocks_per_group)
    for a, t in zip(alone, in_turn): np.testing.assert_array_equal(a, t)
