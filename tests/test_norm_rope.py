"""norm_rope, norm_rope_at and norm_rope_kv equal their compositions (rms_norm, rope, cache writes);
around the fused kernel (a C stand-in on the CPU): its route, destinations, in-place update and backward."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes

from nuvec_tg import fast, kernels
from nuvec_tg.kernels import rope as rope_kernel
from reference import DTYPES, TOLERANCE, assert_close, gradients, launched, random, stand_in_program, values

FREQS = Tensor((1.5 + 0.75 * np.arange(32)).astype(np.float32))


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[t.dtype.itemsize]).numpy()


def composed(x, weight, eps, rotation, offset, cache):
    """The definition: rms_norm, rope, then the rows written into the cache at their positions."""
    h = x if weight is None else fast.rms_norm(x, weight, eps)
    r = fast.rope(h, rotation.dims, traditional=rotation.traditional, base=rotation.base, scale=rotation.scale,
                  offset=offset, freqs=rotation.freqs)
    if cache is None: return r
    c = values(cache)
    c[:, :, offset:offset + r.shape[2]] = values(r)
    return c


# (batch, heads, length, head size, rotated dims, offset, cache capacity)
CASES = [(1, 4, 1, 128, 128, 0, 256), (1, 2, 1, 128, 128, 37, 256), (2, 3, 5, 64, 64, 9, 16), (1, 2, 3, 80, 64, 4, 8),
         (1, 1, 2, 256, 64, 100, 102)]
# Each case in one dtype, in turn, and the last (partial rotation, rows ending at the cache's end)
# in every dtype: every dtype and every case is here, not every pair (the suite's time on 2 cores;
# tests/test_gpu_norm_rope.py runs the kernels' shapes in every dtype).
CASE_DTYPES = [(case, DTYPES[i % len(DTYPES)]) for i, case in enumerate(CASES[:-1])] + [(CASES[-1], d) for d in DTYPES]


@pytest.mark.parametrize("case, dtype", CASE_DTYPES, ids=str)
def test_norm_rope_equals_rms_norm_rope_and_the_cache_write(device, case, dtype):
    b, h, l, d, dims, offset, capacity = case
    rng = np.random.default_rng(0x68)
    x = random(rng, (b, l, h, d), dtype, device)[0].transpose(1, 2)  # the projection's layout, viewed
    w = random(rng, (d,), dtype, device)[0]
    cache = random(rng, (b, h, capacity, d), dtype, device)[0]
    freqs = FREQS.to(device)
    for normed, traditional, with_freqs, cached in [(True, False, False, False), (True, False, False, True),
                                                   (False, False, False, True), (True, True, False, True),
                                                   (False, True, False, False), (True, False, True, True)]:
        if with_freqs and dims != 64: continue
        rotation = fast.Rotation(dims, traditional, None if with_freqs else 10000.0, 1.0, freqs if with_freqs else None)
        weight = w if normed else None
        got = fast.norm_rope(x, weight, 1e-6, rotation, offset, cache.clone() if cached else None)  # the kernel's, in place
        want = composed(x, weight, 1e-6, rotation, offset, cache if cached else None)
        assert got.dtype == dtype
        np.testing.assert_array_equal(values(got), want if cached else values(want))
    # A tensor offset (one element) writes the same rows (an int's angles may be folded at compile
    # time, so to the last bit only within a float32 rounding).
    rotation = fast.Rotation(dims, scale=0.5)
    at_int = fast.norm_rope(x, w, 1e-6, rotation, offset, cache.clone())
    at_tensor = fast.norm_rope(x, w, 1e-6, rotation, Tensor([offset], device=device), cache.clone())
    assert_close("tensor offset", values(at_tensor), values(at_int), TOLERANCE[dtype])


@pytest.mark.float64
def test_norm_rope_gradients_flow_to_x_weight_and_cache(device):
    rng = np.random.default_rng(0x69)
    x, w, cache = (Tensor(rng.uniform(-1, 1, s), device=device) for s in ((1, 2, 3, 16), (16,), (1, 2, 8, 16)))
    g = Tensor(rng.uniform(-1, 1, (1, 2, 8, 16)), device=device)
    rotation = fast.Rotation(16, scale=0.5)
    fused = (fast.norm_rope(x, w, 1e-6, rotation, 4, cache) * g).sum().gradient(x, w, cache)
    rows = fast.rope(fast.rms_norm(x, w, 1e-6), 16, scale=0.5, offset=4)
    reference = (cache[:, :, :4].cat(rows, cache[:, :, 7:], dim=2) * g).sum().gradient(x, w, cache)
    for a, e in zip(fused, reference):
        assert_close("gradient", values(a), values(e), 1e-12)
    dcache = values(fused[2])
    np.testing.assert_array_equal(dcache[:, :, 4:7], 0.0)  # overwritten rows get no gradient


def test_a_decode_loop_through_the_cache(device):
    rng = np.random.default_rng(0x6A)
    w = random(rng, (64,), dtypes.bfloat16, device)[0]
    start = random(rng, (1, 2, 8, 64), dtypes.bfloat16, device)[0].realize()
    rotation = fast.Rotation(64)
    cache, reference = start, values(start)
    for step in range(6):
        x = random(rng, (1, 2, 1, 64), dtypes.bfloat16, device)[0]
        cache = fast.norm_rope(x, w, 1e-6, rotation, step, cache).realize()
        reference[:, :, step:step + 1] = values(fast.rope(fast.rms_norm(x, w, 1e-6), 64, offset=step))
        np.testing.assert_array_equal(values(cache), reference)   # the new row, every other row kept


def test_norm_rope_at_positions_and_a_paged_pool(device):
    rng = np.random.default_rng(0x6B)
    x = random(rng, (2, 2, 3, 32), dtypes.float32, device)[0]
    w = random(rng, (32,), dtypes.float32, device)[0]
    positions = Tensor([5, 11], device=device)
    rotation = fast.Rotation(32, traditional=True)
    rotated = fast.norm_rope_at(x, w, 1e-5, rotation, positions)
    want = fast.rope(fast.rms_norm(x, w, 1e-5), 32, traditional=True, offset=positions)
    np.testing.assert_array_equal(values(rotated), values(want))
    pool = random(rng, (4, 2, 4, 32), dtypes.float32, device)[0].realize()
    slots = Tensor([[0, 1, 2], [13, -1, 99]], device=device)
    got = fast.norm_rope_at(x, w, 1e-5, rotation, positions, pool.clone(), slots)
    np.testing.assert_array_equal(values(got), values(fast.paged_write(pool, want.transpose(1, 2), slots)))


@pytest.mark.parametrize("dtype, d, l", [(dtypes.bfloat16, 512, 3), (dtypes.float16, 256, 1), (dtypes.float32, 64, 5),
                                         (dtypes.float32, 64, 0)], ids=str)
def test_norm_rope_kv_equals_the_composition(device, dtype, d, l):
    rng = np.random.default_rng(0x59)
    x = (random(rng, (1, l, 2, d), dtype, device)[0] * 4).transpose(1, 2)
    w = random(rng, (d,), dtype, device)[0] + 1
    freqs = Tensor.arange(1, d // 4 + 1, dtype=dtypes.float32).to(device)
    rotation = fast.Rotation(d // 2, base=None, freqs=freqs)
    k, v = fast.norm_rope_kv(x, w, 1e-6, 1e-6, rotation, 7)
    want_k = fast.rope(fast.rms_norm(x, w, 1e-6), d // 2, base=None, offset=7, freqs=freqs)
    want_v = fast.rms_norm(x, None, 1e-6)
    np.testing.assert_array_equal(bits(k), bits(want_k))
    np.testing.assert_array_equal(bits(v), bits(want_v))
    k_cache = (Tensor.zeros(1, 2, 16, d, device=device) + 0.5).cast(dtype).realize()
    v_cache = Tensor.zeros(1, 2, 16, d, device=device).cast(dtype).realize()
    k2, v2 = fast.norm_rope_kv(x, w, 1e-6, 1e-6, rotation, 7, k_cache, v_cache)   # a kernel writes the caches in place
    np.testing.assert_array_equal(bits(k2[:, :, 7:7 + l]), bits(want_k))
    np.testing.assert_array_equal(bits(v2[:, :, 7:7 + l]), bits(want_v))
    assert (values(k2[:, :, :7]) == 0.5).all() and (values(k2[:, :, 7 + l:]) == 0.5).all() and (values(v2[:, :, :7]) == 0).all()


NORM_ROPE_INVALID = [
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 4, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 3, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 32))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, -1, Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, Tensor.ones(32), 1e-6, r)),
    (TypeError, lambda x, r: fast.norm_rope(x, None, 1e-6, (64, False))),
    (ValueError, lambda x, r: fast.norm_rope_at(x, None, 1e-6, r, Tensor([1, 2]))),
    (ValueError, lambda x, r: fast.norm_rope_at(x, None, 1e-6, r, Tensor([1]), pool=Tensor.zeros(4, 2, 4, 64))),
    (ValueError, lambda x, r: fast.norm_rope_at(x, None, 1e-6, r, Tensor([1]), Tensor.zeros(4, 2, 4, 64), Tensor([[1, 2]]))),
    (ValueError, lambda x, r: fast.norm_rope_kv(x, None, 1e-6, 1e-6, r, 0, Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope_kv(x, None, 1e-6, 1e-6, r, 6, Tensor.zeros(1, 2, 8, 64), Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, fast.Rotation(65))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), x)),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, None, x, Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), x[:, :1], Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), x, Tensor.zeros(1, 2, 9, 64))),
    (TypeError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), x.cast(dtypes.int32),
                                            Tensor.zeros(1, 2, 8, 64))),
    (ValueError, lambda x, r: fast.norm_rope_at(x, None, 1e-6, r, Tensor([1]), Tensor.zeros(4, 2, 4, 64), Tensor([[1, 2, 3]]), x)),
    # queries: beside a destination, of x's batch, length and head size, as a (q, q_weight) pair
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, queries=(Tensor.zeros(1, 4, 3, 64), None))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), queries=(Tensor.zeros(1, 4, 2, 64), None))),
    (ValueError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), queries=(Tensor.zeros(1, 4, 3, 64),
                                                                                                      Tensor.ones(32)))),
    (TypeError, lambda x, r: fast.norm_rope(x, None, 1e-6, r, 2, Tensor.zeros(1, 2, 8, 64), queries=Tensor.zeros(1, 4, 3, 64))),
    (ValueError, lambda x, r: fast.norm_rope_at(x, None, 1e-6, r, Tensor([1]), queries=(Tensor.zeros(1, 4, 3, 64), None))),
]


@pytest.mark.parametrize("error, call", NORM_ROPE_INVALID)
def test_norm_rope_invalid_arguments(error, call):
    with pytest.raises(error, match="^(norm_rope|norm_rope_at|norm_rope_kv|rope): "):
        call(Tensor.zeros(1, 2, 3, 64), fast.Rotation(64))


# ---- the kernel path, on the CPU ---------------------------------------------------------------
# The CPU has no kernels: these tests give the routes a backend and the launch a C stand-in for the
# norm_rope kernel (the kernel itself runs in test_norm_rope_emulated.py and on a GPU in
# test_gpu_norm_rope.py), to check what the operations do around it: the route, the destination's
# runtime integers, the in-place update, shapes and dtypes, and the backward (the composition's).
# The stand-in writes x's rows (and their negatives as the values, or the copied values' rows) where
# the kernel's DEST puts them, reading x (and the copied values) where their strides place them.

STAND_IN = """
  const int length = ints[0], steps = ints[2], batch_rows = ints[3], rows = ints[4], places = ints[6];
  for (int r = 0; r < rows; r++) {
    const int b = r / batch_rows, t = r % steps;
    const long from = (long)ints[10] + (long)b * ints[11] + (long)((r / steps) % ints[9]) * ints[12] + (long)t * ints[13];
    const long v_from = COPIED ? (long)ints[15] + (long)b * ints[16] + (long)((r / steps) % ints[14]) * ints[17] + (long)t * ints[18] : 0;
    long dest = -1;
    if (DEST == 0) dest = r;
    if (DEST == 1 && (long)offsets[0] + t >= 0 && (long)offsets[0] + t < places) dest = (long)(r / steps) * places + offsets[0] + t;
    if (DEST == 2) {
      const int slot = SLOT, heads = ints[7], block_size = ints[8];
      if (slot >= 0 && slot < places) dest = ((long)(slot / block_size) * heads + (r / steps) % heads) * block_size + slot % block_size;
    }
    if (dest < 0) continue;
    for (int i = 0; i < length; i++) { rotated[dest * length + i] = x[from + i]; VALUES_LINE }
  }
  QUERIES_LOOP
"""
# With queries: q's rows copied into the fresh outputs, read through their own layout.
QUERIES_LOOP = """
  for (int r = 0; r < ints[19]; r++) {
    const int b = r / ints[20], t = r % steps;
    const long from = (long)ints[22] + (long)b * ints[23] + (long)((r / steps) % ints[21]) * ints[24] + (long)t * ints[25];
    for (int i = 0; i < length; i++) queries[(long)r * length + i] = q_x[from + i];
  }
"""


@pytest.fixture
def stand_ins(monkeypatch):
    """Kernels on for every device, the norm_rope program replaced by its C stand-in (float32 only)."""
    render = rope_kernel.norm_rope_program

    def stand_in(backend, types, destination, traditional, scale, shape, *, eps=None, v_eps=None):
        params = render(backend, types, destination, traditional, scale, shape, eps=eps, v_eps=v_eps).params
        body = STAND_IN.replace("DEST", str(rope_kernel.DESTINATIONS.index(destination)))
        body = body.replace("SLOT", "slots[b * steps + t]" if destination == "pool" else "0")
        copied = "values_in" in types
        body = body.replace("COPIED", str(int(copied))).replace("VALUES_LINE", "values[dest * length + i] = v_rows[v_from + i];" if copied
                                                                else "values[dest * length + i] = -x[from + i];" if v_eps is not None else "")
        body = body.replace("QUERIES_LOOP", QUERIES_LOOP if "queries" in types else "")
        return stand_in_program(f"stand_in_norm_rope_{destination}", params, body)
    monkeypatch.setattr(kernels, "active_backend", lambda device: "cuda")
    monkeypatch.setattr(rope_kernel, "norm_rope_program", stand_in)


def test_norm_rope_launches_the_kernel_into_a_cache_in_place_and_fresh_rows_with_the_compositions_gradient(stand_ins):
    rng = np.random.default_rng(0x6C)
    x, xv = random(rng, (2, 3, 4, 16), dtypes.float32, "CPU")
    w = random(rng, (16,), dtypes.float32, "CPU")[0]
    cache, cv = random(rng, (2, 3, 8, 16), dtypes.float32, "CPU")
    cache.realize()
    rotation = fast.Rotation(16)
    with kernels.record_launches() as launches:
        updated = fast.norm_rope(x, w, 1e-6, rotation, 3, cache)
        outside = fast.norm_rope(x, None, 1e-6, rotation, Tensor([-2], device="CPU"), updated.clone())
        fresh = fast.norm_rope(x, w, 1e-6, rotation, Tensor([1, 5], device="CPU"))   # per-batch offsets
    assert launched(launches) == ["stand_in_norm_rope_cache", "stand_in_norm_rope_cache", "stand_in_norm_rope_fresh"]
    assert launches[0][1] == "cuda norm_rope 24x16 dims 16 into cache"
    want = cv.copy()
    want[:, :, 3:7] = xv
    np.testing.assert_array_equal(updated.numpy(), want)
    np.testing.assert_array_equal(cache.numpy(), want)                        # the caller's buffer, updated in place
    want[:, :, 0:2] = xv[:, :, 2:]                                             # rows 0 and 1 at -2 and -1: skipped
    np.testing.assert_array_equal(outside.numpy(), want)
    assert fresh.shape == x.shape and fresh.dtype == dtypes.float32
    np.testing.assert_array_equal(fresh.numpy(), xv)
    g = random(rng, (2, 3, 4, 16), dtypes.float32, "CPU")[0]
    offsets = Tensor([1, 5], device="CPU")
    got = gradients(fast.norm_rope(x, w, 1e-6, rotation, offsets), g, [x, w])
    got += gradients(fast.norm_rope_kv(x, w, 1e-6, 1e-5, rotation, offsets)[1], g, [x])   # the values' alone
    with kernels.compositions_only():
        want_grads = gradients(fast.norm_rope(x, w, 1e-6, rotation, offsets), g, [x, w])
        want_grads += gradients(fast.norm_rope_kv(x, w, 1e-6, 1e-5, rotation, offsets)[1], g, [x])
    for name, a, e in zip(("dx", "dweight", "dx through the values"), got, want_grads):
        assert_close(name, a, e, 1e-5)


def test_norm_rope_at_writes_a_pool_at_its_slots_in_place(stand_ins):
    rng = np.random.default_rng(0x6D)
    x, xv = random(rng, (2, 2, 3, 8), dtypes.float32, "CPU")
    pool, pv = random(rng, (3, 2, 4, 8), dtypes.float32, "CPU")
    pool.realize()
    slots = np.array([[5, -1, 11], [2**31 + 4, 0, 12]])   # int64: one past int32 (clamped, still outside), one past the pool
    with kernels.record_launches() as launches:
        got = fast.norm_rope_at(x, None, 1e-6, fast.Rotation(8), Tensor([3, 9], device="CPU"), pool,
                                Tensor(slots, dtype=dtypes.int64, device="CPU"))
    assert launched(launches) == ["stand_in_norm_rope_pool"]
    want = pv.copy()
    for (b, t), slot in np.ndenumerate(slots):
        if 0 <= slot < 12: want[slot // 4, :, slot % 4] = xv[b, :, t]
    np.testing.assert_array_equal(got.numpy(), want)


def test_norm_rope_kv_writes_both_caches_from_one_launch(stand_ins):
    rng = np.random.default_rng(0x6E)
    x, xv = random(rng, (1, 2, 3, 16), dtypes.float32, "CPU")
    k_cache, kv = random(rng, (1, 2, 6, 16), dtypes.float32, "CPU")
    v_cache, vv = random(rng, (1, 2, 6, 16), dtypes.float32, "CPU")
    with kernels.record_launches() as launches:
        k, v = fast.norm_rope_kv(x, None, 1e-6, 1e-5, fast.Rotation(16), Tensor([2], device="CPU"), k_cache, v_cache)
        fresh_k, fresh_v = fast.norm_rope_kv(x, random(rng, (16,), dtypes.float32, "CPU")[0], 1e-6, 1e-5, fast.Rotation(16), 2)
    assert launched(launches) == ["stand_in_norm_rope_cache", "stand_in_norm_rope_fresh"]
    kv[:, :, 2:5], vv[:, :, 2:5] = xv, -xv
    np.testing.assert_array_equal(k.numpy(), kv)
    np.testing.assert_array_equal(v.numpy(), vv)
    assert fresh_k.shape == fresh_v.shape == x.shape
    np.testing.assert_array_equal(fresh_k.numpy(), xv)
    np.testing.assert_array_equal(fresh_v.numpy(), -xv)


def test_keys_and_values_of_a_projection_go_into_caches_and_pools_from_one_launch_read_in_place(stand_ins):
    """k and v as a model has them, head views of a fused projection's realized output: one launch
    writes both into caches (at an offset) and into pools (at slots), x and the values read where
    the projection holds them (the stand-in reads them through the layout's strides), as the
    composition writes them."""
    rng = np.random.default_rng(0x70)
    projection, pv = random(rng, (2, 3, 48), dtypes.float32, "CPU")
    projection.realize()
    heads = lambda start: projection[:, :, start:start + 16].reshape(2, 3, 2, 8).transpose(1, 2)   # noqa: E731
    k, v = heads(16), heads(32)
    rotation = fast.Rotation(8)
    caches = [random(rng, (2, 2, 6, 8), dtypes.float32, "CPU")[0].realize() for _ in range(2)]
    pools = [random(rng, (3, 2, 4, 8), dtypes.float32, "CPU")[0].realize() for _ in range(2)]
    slots = Tensor([[5, -1, 11], [0, 12, 3]], device="CPU")
    with kernels.compositions_only():
        want_cache = [values(t) for t in fast.norm_rope(k, None, 1e-6, rotation, 2, caches[0].clone(), v, caches[1].clone())]
        want_pool = [values(t) for t in fast.norm_rope_at(k, None, 1e-6, rotation, Tensor([3, 9], device="CPU"), pools[0].clone(),
                                                          slots, v, pools[1].clone())]
    with kernels.record_launches() as launches:
        got_cache = fast.norm_rope(k, None, 1e-6, rotation, 2, *caches[:1], v, caches[1])
        got_pool = fast.norm_rope_at(k, None, 1e-6, rotation, Tensor([3, 9], device="CPU"), pools[0], slots, v, pools[1])
    assert launched(launches) == ["stand_in_norm_rope_cache", "stand_in_norm_rope_pool"]
    assert launches[0][1] == "cuda norm_rope 12x8 dims 8 into cache with copied values"
    # the stand-in writes x's rows unrotated: the values are the composition's, the keys' rows x's own
    for got, want in ((got_cache, want_cache), (got_pool, want_pool)):
        np.testing.assert_array_equal(values(got[1]), want[1])
    key_rows = pv[:, :, 16:32].reshape(2, 3, 2, 8).transpose(0, 2, 1, 3)                # [B, H, T, D]
    np.testing.assert_array_equal(values(got_cache[0])[:, :, 2:5], key_rows)
    pool_keys = values(got_pool[0])
    for (b, t), slot in np.ndenumerate(slots.numpy()):
        if 0 <= slot < 12: np.testing.assert_array_equal(pool_keys[slot // 4, :, slot % 4], key_rows[b, :, t])


def test_what_the_kernel_does_not_take_composes(stand_ins):
    x = Tensor.ones(1, 2, 3, 16, device="CPU")
    with kernels.record_launches() as launches:
        fast.norm_rope(x.cast(dtypes.float64), Tensor.ones(16, dtype=dtypes.float64, device="CPU"), 1e-6, fast.Rotation(16)).realize()
        fast.norm_rope(x[:, :, :0], Tensor.ones(16, device="CPU"), 1e-6, fast.Rotation(16)).realize()   # empty
        fast.norm_rope(x.cast(dtypes.float64), None, 1e-6, fast.Rotation(16), 0, Tensor.zeros(1, 2, 8, 16, device="CPU")).realize()
    assert not any(name.startswith("stand_in") for name in launched(launches))


def test_a_jitted_decode_step_writes_the_cache_in_place_at_a_bound_variables_position(stand_ins):
    """As a model's decode step: the offset `Tensor(length) - 1` of a bound Variable; each replay
    writes the new row at its position into the same cache, building nothing."""
    rng = np.random.default_rng(0x6F)
    cache, want = random(rng, (2, 2, 8, 16), dtypes.float32, "CPU")
    cache.realize()
    w = random(rng, (16,), dtypes.float32, "CPU")[0].realize()
    rotation = fast.Rotation(16)
    step = TinyJit(lambda x, length: fast.norm_rope(x, w, 1e-6, rotation, Tensor(length, device="CPU") - 1, cache))
    length = UOp.variable("length", 1, 8)
    for i, position in enumerate([2, 5, 0, 7]):
        x, xv = random(rng, (2, 2, 1, 16), dtypes.float32, "CPU")
        with kernels.record_launches() as launches:
            got = step(x.realize(), length.bind(position + 1))
        assert launched(launches) == (["stand_in_norm_rope_cache"] if i < 2 else [])   # built while capturing, then replayed
        want[:, :, position] = xv[:, :, 0]
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(cache.numpy(), want)


def test_queries_beside_the_keys_take_the_keys_launch_and_equal_their_own_call(stand_ins):
    """q, k and v heads of one projection: the queries' rows come from the keys' launch into a
    cache and into a pool (the stand-in copies q's rows through their layout), the caches and pools
    as without queries; queries the launch cannot share (here normalised where the keys are not)
    take a call of their own."""
    rng = np.random.default_rng(0x71)
    projection, pv = random(rng, (2, 3, 64), dtypes.float32, "CPU")
    projection.realize()
    heads = lambda start, count: projection[:, :, start:start + count * 8].reshape(2, 3, count, 8).transpose(1, 2)  # noqa: E731
    q, k, v = heads(0, 4), heads(32, 2), heads(48, 2)
    rotation = fast.Rotation(8)
    caches = [random(rng, (2, 2, 6, 8), dtypes.float32, "CPU")[0].realize() for _ in range(2)]
    pools = [random(rng, (3, 2, 4, 8), dtypes.float32, "CPU")[0].realize() for _ in range(2)]
    slots, starts = Tensor([[5, -1, 11], [0, 12, 3]], device="CPU"), Tensor([3, 9], device="CPU")
    want_cache = [values(t) for t in fast.norm_rope(k, None, 1e-6, rotation, 2, caches[0].clone().realize(), v,
                                                    caches[1].clone().realize())]
    want_pool = [values(t) for t in fast.norm_rope_at(k, None, 1e-6, rotation, starts, pools[0].clone().realize(), slots, v,
                                                      pools[1].clone().realize())]
    with kernels.record_launches() as launches:
        got_cache = fast.norm_rope(k, None, 1e-6, rotation, 2, caches[0], v, caches[1], queries=(q, None))
        got_pool = fast.norm_rope_at(k, None, 1e-6, rotation, starts, pools[0], slots, v, pools[1], queries=(q, None))
    assert launched(launches) == ["stand_in_norm_rope_cache", "stand_in_norm_rope_pool"]
    assert launches[0][1] == "cuda norm_rope 12x8 dims 8 into cache with copied values and 24 query rows"
    query_rows = pv[:, :, :32].reshape(2, 3, 4, 8).transpose(0, 2, 1, 3)
    for got, want in ((got_cache, want_cache), (got_pool, want_pool)):
        assert len(got) == 3 and got[0].shape == q.shape
        np.testing.assert_array_equal(values(got[0]), query_rows)
        np.testing.assert_array_equal(values(got[1]), want[0])
        np.testing.assert_array_equal(values(got[2]), want[1])
    # not shareable: queries normalised beside keys that are not: their own launch after the keys', the same rows
    w = random(rng, (8,), dtypes.float32, "CPU")[0]
    with kernels.record_launches() as launches:
        turned, *_ = fast.norm_rope(k, None, 1e-6, rotation, 2, caches[0].clone().realize(), v, caches[1].clone().realize(),
                                    queries=(q, w))
    assert launched(launches) == ["stand_in_norm_rope_cache", "stand_in_norm_rope_fresh"]
    np.testing.assert_array_equal(values(turned), query_rows)


def test_queries_beside_the_keys_compose_as_their_own_calls(device):
    """Without kernels (or where they do not run) the queries are norm_rope over q alone."""
    rng = np.random.default_rng(0x72)
    q, k, v = (random(rng, (2, h, 3, 16), dtypes.float32, device)[0] for h in (4, 2, 2))
    qw, kw = (random(rng, (16,), dtypes.float32, device)[0] for _ in range(2))
    rotation = fast.Rotation(16, scale=0.5)
    cache = Tensor.zeros(2, 2, 8, 16, device=device).contiguous().realize()
    with kernels.compositions_only():
        turned, keys, vals = fast.norm_rope(k, kw, 1e-6, rotation, 3, cache.clone(), v, cache.clone(), queries=(q, qw))
        pool_turned, *_ = fast.norm_rope_at(k, kw, 1e-6, rotation, Tensor([1, 4], device=device), Tensor.zeros(4, 2, 4, 16),
                                            Tensor([[0, 1, 2], [4, 5, 6]], device=device), queries=(q, qw))
        np.testing.assert_array_equal(values(turned), values(fast.norm_rope(q, qw, 1e-6, rotation, 3)))
        np.testing.assert_array_equal(values(pool_turned), values(fast.norm_rope(q, qw, 1e-6, rotation, Tensor([1, 4], device=device))))
        np.testing.assert_array_equal(values(keys), values(fast.norm_rope(k, kw, 1e-6, rotation, 3, cache.clone())))
