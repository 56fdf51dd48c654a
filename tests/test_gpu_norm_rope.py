"""The fused norm_rope kernel (`kernels/rope.py`, `src/norm_rope.h`) on a GPU (METAL or CUDA) against
float64 numpy, the composition on the same device, and bit for bit the three passes it replaces
(the norm kernel, the rope kernel, then the write): norm_rope, norm_rope_at and norm_rope_kv into
fresh outputs at every launch shape (8, 16 and 32 lanes a row, two pieces a lane, a threadgroup
a row, single elements), both pair layouts, `dims < D`, `freqs`, ranks 3 to 5, with and without a
weight, mixed dtypes; into caches at an int offset and at tensor offsets that put rows outside
(at both ends of int32 too); into pools at shuffled and hostile slots (negative, past the pool,
int64 beyond int32; two rows naming one slot leave it one of theirs, piece by piece); gradients
(the composition's) of the fresh forms; a row's bits equal to the row computed alone; a jitted
decode step into a cache at a bound Variable's position; rows too long for the kernel and
float64 stay the composition. Every call meant for the kernel asserts that it launched
(`expect_launches`).

numpy's angles are the contract's float32 ones from the device's own float32 inverse
frequencies; the norm is float64, rounded where the operation rounds (the normalised rows, the
weighted rows, the rotated rows), so numpy and the kernel may differ by a rounding of the
normalised rows at a tie as well as the output's: the tolerance allows two."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.fast.rope import _base_frequencies
from nuvec_tg.kernels import compositions_only
from reference import (DTYPES, assert_rows_close, expect_launches, gradients, random, rope_reference, round_to, values)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
NORM_ROPE = "nuvec_norm_rope"
F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
EPS, V_EPS = 1e-6, 1e-5
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
BASE = 10000.0
# Against numpy: the output's rounding and one of the normalised rows (at a tie), of the row's largest value.
TOLERANCE = {F32: 1e-4, F16: 3e-3, BF16: 2e-2}
# Against the composition on the device, whose own roundings differ as much again.
COMPOSED = {dtype: 2 * tol for dtype, tol in TOLERANCE.items()}

# (shape, dims, traditional, per-batch offsets, freqs): each launch shape and unit width.
CASES = [
    ((2, 8, 33, 128), 128, False, False, False),   # 16 lanes a row, 16 rows a threadgroup
    ((64, 8, 1, 128), 128, True, True, False),     # a decode step: one row a sequence, each at its own position
    ((1, 32, 300, 64), 64, False, False, True),    # 8 lanes
    ((3, 4, 5, 80), 40, True, True, True),         # units of 4, the tail copied
    ((2, 2, 3, 512), 256, False, True, False),     # two pieces a lane
    ((1, 3, 4, 1024), 1024, True, False, False),   # a threadgroup a row
    ((2, 3, 7), 6, True, False, False),            # single elements, rank 3
    ((2, 2, 3, 6, 16), 16, False, True, True),     # rank 5
]


def periods(dims):
    return (1.0 + 3.0 * np.arange(dims // 2)).astype(np.float32)


def device_inverse_frequencies(dims, freqs=None):
    """The float32 inverse frequencies the kernel reads, as the device computes them."""
    if freqs is None: return _base_frequencies(gpu, dims, BASE).numpy()
    return (1.0 / Tensor(freqs, device=gpu)).numpy()


def rotation_of(dims, traditional=False, fv=None, scale=1.0):
    return fast.Rotation(dims, traditional, None if fv is not None else BASE, scale, None if fv is None else Tensor(fv, device=gpu))


def normed_dtype(x_dtype, w_dtype):
    return x_dtype if w_dtype in (None, x_dtype) else F32


def numpy_rows(xv, wv, dtype, rotation, offsets, fv=None):
    """float64: the norm rounded to `dtype` (then weighted, rounded), rotated by the contract's
    float32 angles, rounded to `dtype`."""
    y = xv
    if wv is not None:
        y = round_to(round_to(xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + EPS), dtype) * wv, dtype)
    inv_freq = device_inverse_frequencies(rotation.dims, fv)
    return round_to(rope_reference(y, rotation.dims, rotation.traditional, offsets, rotation.scale, inv_freq), dtype)


def three_passes(x, w, rotation, offset):
    """What the operations ran before the fused kernel: the norm kernel, then the rope kernel."""
    with expect_launches(gpu, "nuvec_rope"):
        return rotation.apply(x if w is None else fast.rms_norm(x, w, EPS), offset).realize()


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def written(before, rows, offset=None, slots=None, block_size=None):
    """numpy: `before` (a cache `[B, H, S, D]`, or a pool `[blocks, H, block_size, D]`) with the
    rows `[B, H, T, D]` at positions `offset + t` or at `slots [B, T]` (those outside skipped)."""
    out = before.copy()
    b, _, t, _ = rows.shape
    for i, j in np.ndindex(b, t):
        if slots is None:
            if 0 <= offset + j < out.shape[2]: out[i, :, offset + j] = rows[i, :, j]
        elif 0 <= slots[i, j] < out.shape[0] * block_size:
            out[slots[i, j] // block_size, :, slots[i, j] % block_size] = rows[i, :, j]
    return out


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fresh_rows_match_numpy_the_composition_and_the_three_passes(case, dtype):
    shape, dims, traditional, per_batch, with_freqs = case
    rng = np.random.default_rng(0x80)
    x, xv = random(rng, shape, dtype, gpu, spread=2.0)
    w, wv = random(rng, shape[-1:], dtype, gpu)
    ov = np.array([3 * i + 1 for i in range(shape[0])], np.int32) if per_batch else np.array([5], np.int32)
    fv = periods(dims) if with_freqs else None
    rotation = rotation_of(dims, traditional, fv, scale=0.5)
    offset = Tensor(ov, device=gpu)
    with expect_launches(gpu, NORM_ROPE):
        got = fast.norm_rope(x, w, EPS, rotation, offset).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fast.norm_rope(x, w, EPS, rotation, offset).realize()
    assert got.dtype == dtype and got.shape == shape
    name = f"{dtype.name} {shape} dims {dims} traditional {traditional}"
    assert_rows_close(f"{name} vs numpy", values(got), numpy_rows(xv, wv, dtype, rotation, ov, fv), TOLERANCE[dtype])
    assert_rows_close(f"{name} vs composition", values(got), values(composed), COMPOSED[dtype])
    np.testing.assert_array_equal(bits(got), bits(three_passes(x, w, rotation, offset)), err_msg=f"{name} vs three passes")


@pytest.mark.parametrize("x_dtype, w_dtype", [(F16, F32), (BF16, F16), (F32, BF16)], ids=str)
def test_mixed_dtypes_normalise_in_the_promoted_dtype(x_dtype, w_dtype):
    rng = np.random.default_rng(0x81)
    x, xv = random(rng, (2, 4, 9, 128), x_dtype, gpu, spread=2.0)
    w, wv = random(rng, (128,), w_dtype, gpu)
    rotation = rotation_of(64)
    with expect_launches(gpu, NORM_ROPE):
        got = fast.norm_rope(x, w, EPS, rotation, 11).realize()
    out = normed_dtype(x_dtype, w_dtype)
    assert got.dtype == out
    assert_rows_close("mixed vs numpy", values(got), numpy_rows(xv, wv, out, rotation, [11]), TOLERANCE[x_dtype])
    np.testing.assert_array_equal(bits(got), bits(three_passes(x, w, rotation, 11)))


@pytest.mark.parametrize("offset", [9, "tensor 9", "tensor -3", "tensor 14", f"tensor {INT32_MAX}", f"tensor {INT32_MIN}"], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_a_cache_takes_the_rows_inside_it_at_their_positions(offset, dtype):
    """An int offset (checked to fit), or a one-element tensor (rows it puts outside the cache are
    skipped; nothing outside the cache is written: the sanitizer's cases)."""
    rng = np.random.default_rng(0x82)
    x, xv = random(rng, (2, 4, 5, 128), dtype, gpu, spread=2.0)
    w, wv = random(rng, (128,), dtype, gpu)
    cache, cv = random(rng, (2, 4, 16, 128), dtype, gpu)
    cache.realize()
    position = int(str(offset).split()[-1])
    given = Tensor([position], dtype=dtypes.int32, device=gpu) if isinstance(offset, str) else offset
    rotation = rotation_of(128, scale=0.5)
    with expect_launches(gpu, NORM_ROPE):
        got = fast.norm_rope(x, w, EPS, rotation, given, cache)
    want = written(cv, numpy_rows(xv, wv, dtype, rotation, [position]), position)
    assert_rows_close(f"cache at {offset} vs numpy", values(got), want, TOLERANCE[dtype])
    passes = written(cv, values(three_passes(x, w, rotation, given)), position)
    np.testing.assert_array_equal(values(got), passes, err_msg=f"cache at {offset} vs three passes")


def test_rows_and_values_into_caches_of_other_dtypes():
    """norm_rope_kv into caches: k the rotated rows, v `rms_norm(x, None, v_eps)`, each rounded to
    its cache's dtype (float32 rows into bfloat16 caches)."""
    rng = np.random.default_rng(0x83)
    x, xv = random(rng, (1, 2, 3, 256), F32, gpu, spread=4.0)
    w, wv = random(rng, (256,), F32, gpu)
    k_cache, kv = random(rng, (1, 2, 8, 256), BF16, gpu)
    v_cache, vv = random(rng, (1, 2, 8, 256), BF16, gpu)
    fv = periods(128)
    rotation = rotation_of(128, fv=fv)
    with expect_launches(gpu, NORM_ROPE):
        k, v = fast.norm_rope_kv(x, w, EPS, V_EPS, rotation, Tensor([4], device=gpu), k_cache.realize(), v_cache.realize())
    assert k.dtype == v.dtype == BF16
    want_v = round_to(xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + V_EPS), F32)
    want_k = round_to(numpy_rows(xv, wv, F32, rotation, [4], fv), BF16)
    assert_rows_close("k vs numpy", values(k), written(kv, want_k, 4), TOLERANCE[BF16])
    assert_rows_close("v vs numpy", values(v), written(vv, round_to(want_v, BF16), 4), TOLERANCE[BF16])
    np.testing.assert_array_equal(values(k), written(kv, round_to(values(three_passes(x, w, rotation, 4)), BF16), 4))
    with expect_launches(gpu, "nuvec_rms_norm"):
        np.testing.assert_array_equal(values(v), written(vv, round_to(values(fast.rms_norm(x, None, V_EPS)), BF16), 4))


@pytest.mark.parametrize("dtype, d", [(BF16, 512), (F16, 256), (F32, 64)], ids=str)
def test_keys_and_values_fresh_are_the_norm_ropes_and_the_norms_bits(dtype, d):
    rng = np.random.default_rng(0x84)
    x, xv = random(rng, (2, 2, 5, d), dtype, gpu, spread=4.0)
    w, wv = random(rng, (d,), dtype, gpu)
    rotation = rotation_of(d // 2, traditional=True)
    with expect_launches(gpu, NORM_ROPE):
        k, v = fast.norm_rope_kv(x, w, EPS, V_EPS, rotation, 7)
        unweighted_k, _ = fast.norm_rope_kv(x, None, EPS, V_EPS, rotation, 7)
    assert_rows_close("k vs numpy", values(k), numpy_rows(xv, wv, dtype, rotation, [7]), TOLERANCE[dtype])
    assert_rows_close("v vs numpy", values(v), round_to(xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + V_EPS), dtype),
                      TOLERANCE[dtype])
    np.testing.assert_array_equal(bits(k), bits(three_passes(x, w, rotation, 7)))
    np.testing.assert_array_equal(bits(unweighted_k), bits(three_passes(x, None, rotation, 7)))
    with expect_launches(gpu, "nuvec_rms_norm"):
        np.testing.assert_array_equal(bits(v), bits(fast.rms_norm(x, None, V_EPS)))


@pytest.mark.parametrize("slots", ["shuffled", "hostile", "int64"])
def test_a_pool_takes_the_rows_at_their_slots(slots):
    rng = np.random.default_rng(0x85)
    x, xv = random(rng, (3, 2, 4, 128), BF16, gpu, spread=2.0)
    w, wv = random(rng, (128,), BF16, gpu)
    pool, pv = random(rng, (4, 2, 8, 128), BF16, gpu)   # 32 slots
    sv = {"shuffled": rng.permutation(32)[:12].reshape(3, 4),
          "hostile": np.array([[-1, 32, 5, INT32_MAX], [INT32_MIN, 0, 31, -32], [7, 8, 33, 1]]),
          "int64": np.array([[2**40, -2**40, 2**32 + 3, 3], [4, 2**31, 6, -2**31 - 1], [9, 10, 11, 12]])}[slots]
    given = Tensor(sv, dtype=dtypes.int64 if slots == "int64" else dtypes.int32, device=gpu)
    positions = Tensor([0, 40, 7], device=gpu)
    rotation = rotation_of(128)
    with expect_launches(gpu, NORM_ROPE):
        got = fast.norm_rope_at(x, w, EPS, rotation, positions, pool.realize(), given)
    want = written(pv, numpy_rows(xv, wv, BF16, rotation, [0, 40, 7]), slots=sv, block_size=8)
    assert_rows_close(f"{slots} slots vs numpy", values(got), want, TOLERANCE[BF16])
    passes = written(pv, values(three_passes(x, w, rotation, positions)), slots=sv, block_size=8)
    np.testing.assert_array_equal(values(got), passes, err_msg=f"{slots} slots vs three passes")


def test_key_heads_of_a_projection_are_read_in_place_into_a_cache_and_a_pool():
    """k as a model has it: a slice of a fused q/k/v projection's realized output, as heads; the
    kernel reads them in place (a strided view of the projection), with the bits of the heads
    copied first, into a cache and into a pool; and the value heads written beside them by the
    same launch, as they are."""
    rng = np.random.default_rng(0x87)
    projection = random(rng, (4, 3, 1024 + 2 * 256), BF16, gpu, spread=2.0)[0].realize()
    k = projection[:, :, 1024:1280].reshape(4, 3, 2, 128).transpose(1, 2)
    w = random(rng, (128,), BF16, gpu)[0]
    rotation = rotation_of(128)
    cache = random(rng, (4, 2, 8, 128), BF16, gpu)[0].realize()
    pool = random(rng, (8, 2, 4, 128), BF16, gpu)[0].realize()
    slots = Tensor(rng.permutation(32)[:12].reshape(4, 3).astype(np.int32), device=gpu)
    positions = Tensor([0, 5, 2, 9], device=gpu)
    with expect_launches(gpu, NORM_ROPE):
        in_cache = values(fast.norm_rope(k, w, EPS, rotation, 2, cache.clone().realize()))
        copied_cache = values(fast.norm_rope(k.contiguous().realize(), w, EPS, rotation, 2, cache.clone().realize()))
        in_pool = values(fast.norm_rope_at(k, w, EPS, rotation, positions, pool.clone().realize(), slots))
        copied_pool = values(fast.norm_rope_at(k.contiguous().realize(), w, EPS, rotation, positions, pool.clone().realize(), slots))
    np.testing.assert_array_equal(in_cache, copied_cache)
    np.testing.assert_array_equal(in_pool, copied_pool)
    # with the value heads beside them (one launch writes both), equal to the keys' write and the values' copy
    v = projection[:, :, 1280:1536].reshape(4, 3, 2, 128).transpose(1, 2)
    with expect_launches(gpu, NORM_ROPE):
        keys, vals = fast.norm_rope(k, w, EPS, rotation, 2, cache.clone().realize(), v, cache.clone().realize())
        pool_keys, pool_vals = fast.norm_rope_at(k, w, EPS, rotation, positions, pool.clone().realize(), slots, v,
                                                 pool.clone().realize())
    np.testing.assert_array_equal(values(keys), copied_cache)
    np.testing.assert_array_equal(values(pool_keys), copied_pool)
    want_vals = values(cache)
    want_vals[:, :, 2:5] = values(v)
    np.testing.assert_array_equal(values(vals), want_vals)
    with compositions_only():
        np.testing.assert_array_equal(values(pool_vals), values(fast.paged_write(pool.clone(), v.transpose(1, 2), slots)))


@pytest.mark.parametrize("weighted", [True, False])
def test_queries_beside_the_keys_are_norm_ropes_bits_in_one_launch(weighted):
    """q, k and v as a model has them (heads of one realized projection, read in place): the
    queries turned in the keys' launch, into a cache and into a pool (per-sequence positions),
    equal bit for bit norm_rope over q alone, and the caches and pools the call without queries."""
    rng = np.random.default_rng(0x8A)
    projection = random(rng, (4, 3, 2048 + 2 * 512), BF16, gpu, spread=2.0)[0].realize()
    heads = lambda first, count: projection[:, :, first:first + count * 128].reshape(4, 3, count, 128).transpose(1, 2)  # noqa: E731
    q, k, v = heads(0, 16), heads(2048, 4), heads(2560, 4)
    qw, kw = (random(rng, (128,), BF16, gpu)[0] if weighted else None for _ in range(2))
    rotation = rotation_of(128)
    cache = random(rng, (4, 4, 8, 128), BF16, gpu)[0].realize()
    pool = random(rng, (8, 4, 4, 128), BF16, gpu)[0].realize()
    slots = Tensor(rng.permutation(32)[:12].reshape(4, 3).astype(np.int32), device=gpu)
    positions = Tensor([0, 5, 2, 9], device=gpu)
    with expect_launches(gpu, NORM_ROPE) as launches:
        turned, keys, vals = fast.norm_rope(k, kw, EPS, rotation, 2, cache.clone().realize(), v, cache.clone().realize(),
                                            queries=(q, qw))
    assert sum(name.startswith(NORM_ROPE) for name, _ in launches) == 1, launches
    with expect_launches(gpu, NORM_ROPE):
        pool_turned, pool_keys, pool_vals = fast.norm_rope_at(k, kw, EPS, rotation, positions, pool.clone().realize(), slots, v,
                                                              pool.clone().realize(), queries=(q, qw))
        want_keys, want_vals = fast.norm_rope(k, kw, EPS, rotation, 2, cache.clone().realize(), v, cache.clone().realize())
        want_pool_keys, want_pool_vals = fast.norm_rope_at(k, kw, EPS, rotation, positions, pool.clone().realize(), slots, v,
                                                           pool.clone().realize())
    for name, got, want in (("keys", keys, want_keys), ("values", vals, want_vals), ("pool keys", pool_keys, want_pool_keys),
                            ("pool values", pool_vals, want_pool_vals)):
        np.testing.assert_array_equal(values(got), values(want), err_msg=name)
    alone = fast.norm_rope(q.contiguous(), qw, EPS, rotation, 2)
    np.testing.assert_array_equal(values(turned), values(alone), err_msg="queries into a cache")
    np.testing.assert_array_equal(values(pool_turned), values(fast.norm_rope(q.contiguous(), qw, EPS, rotation, positions)),
                                  err_msg="queries into a pool")
    with compositions_only():
        composed = fast.norm_rope(q, qw, EPS, rotation, 2) if weighted else fast.rope(q, 128, base=BASE, offset=2)
    assert_rows_close("queries vs the composition", values(turned), values(composed), COMPOSED[BF16])


def test_two_rows_naming_one_slot_leave_it_one_of_theirs_piece_by_piece():
    """The kernel's rows race for a slot they share (the composition's later row wins): each
    16-byte piece of the slot is one of theirs; every other slot is as the contract says."""
    rng = np.random.default_rng(0x86)
    x, xv = random(rng, (2, 2, 3, 64), BF16, gpu, spread=2.0)
    w = random(rng, (64,), BF16, gpu)[0]
    pool, pv = random(rng, (2, 2, 4, 64), BF16, gpu)
    sv = np.array([[5, 5, 1], [5, 0, 7]])
    positions = Tensor([2, 9], device=gpu)
    rotation = rotation_of(64)
    with expect_launches(gpu, NORM_ROPE):
        got = values(fast.norm_rope_at(x, w, EPS, rotation, positions, pool.realize(), Tensor(sv, device=gpu)))
    rows = values(three_passes(x, w, rotation, positions))
    want = written(pv, rows, slots=np.where(sv == 5, -1, sv), block_size=4)
    others = np.ones((2, 4), bool)
    others[1, 1] = False
    np.testing.assert_array_equal(got.transpose(0, 2, 1, 3)[others], want.transpose(0, 2, 1, 3)[others])
    slot = got[1, :, 1].reshape(2, 8, 8)                                                   # [H, pieces, 8]
    candidates = np.stack([rows[0, :, 0], rows[0, :, 1], rows[1, :, 0]]).reshape(3, 2, 8, 8)
    assert (candidates == slot).all(-1).any(0).all(), "a piece of the shared slot is none of its rows'"


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    rng = np.random.default_rng(0x87)
    x, _ = random(rng, (4, 8, 16, 128), BF16, gpu, spread=2.0)
    w = random(rng, (128,), BF16, gpu)[0]
    cache = random(rng, (4, 8, 32, 128), BF16, gpu)[0].realize()
    ov = np.array([0, 100, 3000, 70000], np.int32)
    rotation = rotation_of(96)
    with expect_launches(gpu, NORM_ROPE):
        together = bits(fast.norm_rope(x, w, EPS, rotation, Tensor(ov, device=gpu)))
        in_cache = bits(fast.norm_rope(x, w, EPS, rotation, 9, cache.clone()))
        for i in (0, 3):
            alone = bits(fast.norm_rope(x[i:i + 1], w, EPS, rotation, Tensor(ov[i:i + 1], device=gpu)))
            np.testing.assert_array_equal(together[i:i + 1], alone, err_msg=f"batch item {i}")
            alone = bits(fast.norm_rope(x[i:i + 1], w, EPS, rotation, 9, cache[i:i + 1].clone()))
            np.testing.assert_array_equal(in_cache[i:i + 1, :, 9:25], alone[:, :, 9:25], err_msg=f"batch item {i} in a cache")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gradients_through_the_kernel_are_the_compositions(dtype):
    rng = np.random.default_rng(0x88)
    x, _ = random(rng, (2, 3, 5, 80), dtype, gpu, spread=2.0)
    w, _ = random(rng, (80,), dtype, gpu)
    g, _ = random(rng, (2, 3, 5, 80), F32, gpu)
    offset = Tensor(np.array([1, 4], np.int32), device=gpu)
    freqs = Tensor(periods(40), device=gpu)
    rotation = fast.Rotation(40, True, None, 0.5, freqs)
    with expect_launches(gpu, NORM_ROPE):  # the forward; the backward is the composition's
        got = gradients(fast.norm_rope(x, w, EPS, rotation, offset), g, [x, w, freqs])
        got_v = gradients(fast.norm_rope_kv(x, w, EPS, V_EPS, rotation, offset)[1], g, [x])
    with expect_launches(gpu, None), compositions_only():
        want = gradients(fast.norm_rope(x, w, EPS, rotation, offset), g, [x, w, freqs])
        want_v = gradients(fast.norm_rope_kv(x, w, EPS, V_EPS, rotation, offset)[1], g, [x])
    for name, a, e in zip(("dx", "dweight", "dfreqs"), got, want):
        assert_rows_close(f"{name} {dtype.name}", a, e, COMPOSED[dtype])
    assert_rows_close(f"dx through v {dtype.name}", got_v[0], want_v[0], COMPOSED[dtype])


def test_a_jitted_decode_step_writes_the_cache_in_place_at_a_bound_variables_position():
    """As a decode step: the offset `Tensor(length) - 1` of a bound Variable; each replay writes
    the new row at its position into the same cache, building nothing."""
    rng = np.random.default_rng(0x89)
    cache = random(rng, (2, 8, 64, 128), BF16, gpu)[0].realize()
    w, wv = random(rng, (128,), BF16, gpu)
    w.realize()
    rotation = rotation_of(128)
    step = TinyJit(lambda x, length: fast.norm_rope(x, w, EPS, rotation, Tensor(length, device=gpu) - 1, cache))
    length = UOp.variable("length", 1, 64)
    for i, position in enumerate([5, 9, 30, 63]):
        x, xv = random(rng, (2, 8, 1, 128), BF16, gpu, spread=2.0)
        before = values(cache)   # the kernel's earlier rows (its update is in place), or the composition's none
        with expect_launches(gpu, NORM_ROPE if i < 2 else None):  # built while capturing, then replayed
            got = step(x.realize(), length.bind(position + 1))
        want = written(before, numpy_rows(xv, wv, BF16, rotation, [position]), position)
        assert_rows_close(f"jitted step at {position}", values(got), want, TOLERANCE[BF16])


def test_rows_too_long_for_the_kernel_and_float64_compose():
    """Rows whose threadgroup would hold more than 16 KB (8192 float32 features) run the three
    passes; float64 runs the composition."""
    rng = np.random.default_rng(0x8A)
    x, xv = random(rng, (1, 2, 2, 8192), F32, gpu, spread=2.0)
    w, wv = random(rng, (8192,), F32, gpu)
    with expect_launches(gpu, "nuvec_rope") as launches:
        got = fast.norm_rope(x, w, EPS, rotation_of(128), 3).realize()
    assert not any(name.startswith(NORM_ROPE) for name, _ in launches)
    assert_rows_close("8192 features", values(got), numpy_rows(xv, wv, F32, rotation_of(128), [3]), TOLERANCE[F32])
    if gpu == "METAL": return  # no float64
    x64, xv64 = random(rng, (1, 2, 3, 16), dtypes.float64, gpu)
    with expect_launches(gpu, None):
        got = values(fast.norm_rope(x64, Tensor.ones(16, dtype=dtypes.float64, device=gpu), EPS, rotation_of(16), 2))
    np.testing.assert_allclose(got, numpy_rows(xv64, np.ones(16), dtypes.float64, rotation_of(16), [2]), atol=1e-5)
