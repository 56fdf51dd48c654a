"""paged_attention and paged_write against contiguous attention and numpy, on the CPU and on each
GPU: outputs compared row by row (`assert_rows_close`, the kernels' tolerances), every paged call
asserting that the decode kernels launched where the plan runs them on a paged pool (on a GPU) and
that nothing launched elsewhere (`checked_paged_attention`)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from nuvec_tg.kernels.attention import paged_unsupported
from nuvec_tg.tensor import promote_types
from attention_reference import attention_reference
from reference import KERNEL_TOLERANCE, assert_close, assert_rows_close, expect_launches, kernel_target, round_to, values


def checked_paged_attention(q, k_cache, v_cache, block_tables, lengths, scale, *, sinks=None, window=None) -> Tensor:
    """`fast.paged_attention`, realized, asserting what launched: the decode kernels where the plan
    for q's device (kernels on) takes the call over the table's capacity and they read the pool's
    head size and block size (`paged_unsupported`), the tiled kernel where the plan is `Tiled` (more
    than 8 queries), nothing otherwise."""
    b, _, _, d = q.shape
    block_size = k_cache.shape[2]
    cache_shape = (b, k_cache.shape[1], block_tables.shape[1] * block_size, d)
    dtype = promote_types(promote_types(q.dtype, k_cache.dtype), v_cache.dtype)
    plan = fast.plan_attention(q.shape, cache_shape, cache_shape, dtype, mask="causal", sinks=sinks, window=window,
                               device=kernel_target(q.device))
    decodes = isinstance(plan.kernel, fast.Vector) and paged_unsupported(d, block_size) is None
    kernel = "nuvec_sdpa_decode" if decodes else "nuvec_sdpa_prefill" if isinstance(plan.kernel, fast.Tiled) else None
    with expect_launches(q.device, kernel):
        return fast.paged_attention(q, k_cache, v_cache, block_tables, lengths, scale, sinks=sinks, window=window).realize()


def paged(keys, values_, block_size, rng):
    """Pools holding `[B, Hkv, N, D]` keys and values in blocks placed in a shuffled order (with
    three unused blocks), and the block table."""
    b, hkv, n, d = keys.shape
    per = -(-n // block_size)
    blocks = b * per + 3
    order = rng.permutation(blocks)
    pools = [np.zeros((blocks, hkv, block_size, d)) for _ in range(2)]
    for s in range(b):
        for j in range(per):
            length = min(block_size, n - j * block_size)
            for pool, src in zip(pools, (keys, values_)):
                pool[order[s * per + j], :, :length] = src[s, :, j * block_size:j * block_size + length]
    return pools[0], pools[1], order[:b * per].reshape(b, per).astype(np.int32)


def to(values_, dtype, device):
    return Tensor(values_.astype(np.float32), device=device).cast(dtype)


# (batch, query heads, kv heads, queries, head size, block size, lengths, window)
CASES = [
    (1, 4, 4, 1, 32, 16, (37,), None),
    (3, 8, 2, 1, 16, 8, (1, 20, 45), None),
    (2, 4, 1, 4, 16, 16, (4, 77), None),
    (2, 8, 1, 1, 512, 16, (40, 70), None),
    (2, 8, 2, 1, 16, 16, (40, 100), 32),
    (2, 4, 2, 4, 16, 8, (9, 77), 5),
    (2, 16, 2, 1, 64, 16, (40, 300), None),   # 8 rows a key head: CUDA's matrix-unit pass
    (2, 8, 1, 2, 128, 8, (9, 150), 20),
    # More than 8 queries: the tiled kernel on a GPU (a chunk of a prompt continuing its sequence).
    (2, 8, 2, 20, 64, 16, (40, 100), None),
    (2, 8, 1, 33, 128, 8, (9, 150), 20),      # the first sequence is shorter than the queries
    (1, 4, 4, 70, 64, 32, (70,), None),       # a whole prompt
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=str)
def test_paged_attention_equals_contiguous_attention(device, case, dtype):
    b, hq, hkv, lq, d, bs, lengths, window = case
    rng = np.random.default_rng(0x6B)
    n = max(lengths)
    keys, vals = (round_to(rng.uniform(-1, 1, (b, hkv, n, d)), dtype) for _ in range(2))
    qv = round_to(rng.uniform(-1, 1, (b, hq, lq, d)), dtype)
    sv = round_to(rng.uniform(-1, 1, (hq,)), dtype)
    k_pool, v_pool, table = paged(keys, vals, bs, rng)
    if window is not None:  # blocks wholly before each sequence's window hold NaN, never read
        for s, length in enumerate(lengths):
            first = max(length - lq - window + 1, 0)
            for j in range(first // bs):
                k_pool[table[s, j]] = np.nan
                v_pool[table[s, j]] = np.nan
    scale = d ** -0.5
    q, kc, vc = to(qv, dtype, device), to(k_pool, dtype, device), to(v_pool, dtype, device)
    sinks = to(sv, dtype, device)
    lens = Tensor(np.array(lengths, np.int32), device=device)
    for with_sinks in (False, True):
        got = checked_paged_attention(q, kc, vc, Tensor(table, device=device), lens, scale, window=window,
                                      sinks=sinks if with_sinks else None)
        assert got.dtype == dtype and got.shape == (b, hq, lq, d)
        got = values(got)
        for s, length in enumerate(lengths):
            want = attention_reference(qv[s:s + 1], keys[s:s + 1, :, :length], vals[s:s + 1, :, :length], scale,
                                       causal=True, window=window, sinks=sv if with_sinks else None)
            assert_rows_close(f"sequence {s} sinks {with_sinks}", got[s:s + 1], want, KERNEL_TOLERANCE[dtype])


@pytest.mark.float64
def test_paged_attention_gradients_equal_contiguous_ones(device):
    rng = np.random.default_rng(0x6F)
    b, hq, hkv, lq, d, bs, lengths = 2, 4, 2, 2, 8, 4, (6, 11)
    keys, vals = (rng.uniform(-1, 1, (b, hkv, 11, d)) for _ in range(2))
    qv = rng.uniform(-1, 1, (b, hq, lq, d))
    k_pool, v_pool, table = paged(keys, vals, bs, rng)
    q, kc, vc = (Tensor(a, device=device) for a in (qv, k_pool, v_pool))
    got = fast.paged_attention(q, kc, vc, Tensor(table, device=device), Tensor(np.array(lengths), device=device), 0.5)
    grads = got.sum().gradient(q, kc, vc)
    for s, length in enumerate(lengths):
        qs = Tensor(qv[s:s + 1], device=device)
        ks, vs = Tensor(keys[s:s + 1, :, :length], device=device), Tensor(vals[s:s + 1, :, :length], device=device)
        want = fast.scaled_dot_product_attention(qs, ks, vs, 0.5, mask="causal").sum().gradient(qs, ks, vs)
        assert_close("dq", values(grads[0])[s:s + 1], values(want[0]), 1e-9)
        # The pools' gradients land in the sequence's blocks, in table order.
        for pool_grad, contiguous in ((grads[1], want[1]), (grads[2], want[2])):
            pool_grad = values(pool_grad)
            laid_out = np.concatenate([pool_grad[block] for block in table[s]], axis=1)[None, :, :length]
            assert_close("dpool", laid_out, values(contiguous), 1e-9)


def test_paged_attention_clamps_hostile_tables_and_lengths(device):
    rng = np.random.default_rng(0x6E)
    for b, hq, hkv, lq, d, bs, max_blocks, dtype in ((2, 4, 2, 1, 16, 8, 4, dtypes.float32), (2, 4, 2, 3, 32, 16, 3, dtypes.float32),
                                                     (2, 16, 2, 1, 64, 8, 4, dtypes.bfloat16),   # CUDA's matrix pass
                                                     (2, 8, 2, 12, 64, 8, 4, dtypes.bfloat16)):   # the tiled kernel
        blocks = 5
        k_pool, v_pool = (round_to(rng.uniform(-1, 1, (blocks, hkv, bs, d)), dtype) for _ in range(2))
        qv = round_to(rng.uniform(-1, 1, (b, hq, lq, d)), dtype)
        table = np.array([[(i % blocks), blocks + 1000, -5, 2**31 - 1][i % 4] for i in range(b * max_blocks)],
                         np.int32).reshape(b, max_blocks)
        capacity = max_blocks * bs
        lens = np.array([capacity + 1, 2**31 - 1][:b], np.int32)
        got = values(checked_paged_attention(*(to(a, dtype, device) for a in (qv, k_pool, v_pool)),
                                             Tensor(table, device=device), Tensor(lens, device=device), 0.125))
        assert np.isfinite(got).all()
        # The clamped meaning: entries clamped to the pool, lengths to the capacity.
        clamped = np.clip(table, 0, blocks - 1)
        for s in range(b):
            keys = np.concatenate([k_pool[i] for i in clamped[s]], axis=1)[None]
            vals = np.concatenate([v_pool[i] for i in clamped[s]], axis=1)[None]
            want = attention_reference(qv[s:s + 1], keys, vals, 0.125, causal=True)
            assert_rows_close(f"hostile {s}", got[s:s + 1], want, KERNEL_TOLERANCE[dtype])


def pool(values_, dtype, device) -> Tensor:
    """A realized pool of `values_` (what the kernel writes in place)."""
    return to(values_, dtype, device).contiguous().realize()


def checked_paged_write(cache, new, slots) -> np.ndarray:
    """`fast.paged_write`'s result as float64, asserting that the kernel ran on a GPU (and nothing on the CPU)."""
    with expect_launches(cache.device, "nuvec_paged_write"):
        return values(fast.paged_write(cache, new, slots))


@pytest.mark.parametrize("source, destination", [(dtypes.bfloat16, dtypes.bfloat16), (dtypes.float32, dtypes.bfloat16),
                                                 (dtypes.float16, dtypes.float32)])
def test_paged_write(device, source, destination):
    rng = np.random.default_rng(0x6C)
    cache_values = round_to(rng.uniform(-1, 1, (6, 2, 4, 16)), destination)
    new_values = rng.uniform(-1, 1, (5, 2, 16))
    new = to(new_values, source, device).realize()   # a lazy cast to float16 and back would fold away
    rows = round_to(round_to(new_values, source), destination)   # the rows as the pool holds them: rounded once more
    out = checked_paged_write(pool(cache_values, destination, device), new, Tensor([23, 0, 5, 17, 6], device=device))
    want = cache_values.copy()
    for row, slot in enumerate([23, 0, 5, 17, 6]):
        want[slot // 4, :, slot % 4] = rows[row]
    np.testing.assert_array_equal(out, want)
    # Batched rows `[B, T, Hkv, D]` at shuffled slots.
    batched = checked_paged_write(pool(cache_values, destination, device), new.reshape(1, 5, 2, 16)[:, 1:],
                                  Tensor([[9, 3, 22, 1]], device=device))
    want = cache_values.copy()
    for row, slot in ((1, 9), (2, 3), (3, 22), (4, 1)):
        want[slot // 4, :, slot % 4] = rows[row]
    np.testing.assert_array_equal(batched, want)


def test_two_rows_naming_one_slot(device):
    """The composition keeps the later row; the kernel's rows race, so the slot holds pieces of
    either (8 elements of a bfloat16 row a piece)."""
    rng = np.random.default_rng(0x6E)
    cache_values = round_to(rng.uniform(-1, 1, (3, 2, 4, 64)), dtypes.bfloat16)
    new_values = round_to(rng.uniform(-1, 1, (3, 2, 64)), dtypes.bfloat16)
    new = to(new_values, dtypes.bfloat16, device)
    got = checked_paged_write(pool(cache_values, dtypes.bfloat16, device), new, Tensor([5, 2, 5], device=device))
    np.testing.assert_array_equal(got[0, :, 2], new_values[1])
    if device == "CPU":
        np.testing.assert_array_equal(got[1, :, 1], new_values[2])
        return
    pieces = got[1, :, 1].reshape(2, 8, 8)
    for head in range(2):
        for p in range(8):
            assert any(np.array_equal(pieces[head, p], new_values[r, head, 8 * p:8 * p + 8]) for r in (0, 2)), (head, p)


def test_paged_write_reads_the_value_heads_of_a_projection_in_place(device):
    """Rows `[B, T, Hkv, D]` that are a slice of a fused projection's realized output (what a
    model's values are): the kernel reads them in place, with the result of the rows copied first."""
    rng = np.random.default_rng(0x6F)
    projection = to(rng.uniform(-1, 1, (2, 3, 96)), dtypes.bfloat16, device).realize()
    rows = projection[:, :, 64:96].reshape(2, 3, 2, 16)
    cache_values = round_to(rng.uniform(-1, 1, (4, 2, 4, 16)), dtypes.bfloat16)
    slots = Tensor([[5, 0, 13], [2, -1, 9]], device=device)
    got = checked_paged_write(pool(cache_values, dtypes.bfloat16, device), rows, slots)
    want = checked_paged_write(pool(cache_values, dtypes.bfloat16, device), rows.contiguous().realize(), slots)
    np.testing.assert_array_equal(got, want)


def test_paged_write_skips_out_of_range_slots(device):
    rng = np.random.default_rng(0x6D)
    blocks, hkv, bs, d = 6, 2, 4, 16
    end = blocks * bs
    cache_values, new_values = rng.uniform(-1, 1, (blocks, hkv, bs, d)), rng.uniform(-1, 1, (6, hkv, d))
    new = to(new_values, dtypes.float32, device)
    slots = Tensor(np.array([-1, 3, end, 2**31 - 1, 7, -2**31], np.int32), device=device)
    got = checked_paged_write(pool(cache_values, dtypes.float32, device), new, slots)
    want = checked_paged_write(pool(cache_values, dtypes.float32, device), new[[1, 4]], Tensor([3, 7], device=device))
    np.testing.assert_array_equal(got, want)
    assert (got != cache_values.astype(np.float32)).sum() <= 2 * hkv * d
    # int64 slots beyond int32 stay outside the pool (never wrapped onto a live slot)
    wide = Tensor(np.array([2**32 + 3, 3, -2**32 + 7, 2**40, 7, 2**63 - 1], np.int64), device=device)
    np.testing.assert_array_equal(checked_paged_write(pool(cache_values, dtypes.float32, device), new, wide), want)


PAGED_INVALID = [
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, Tensor.zeros(4, 3, 8, 64), Tensor.zeros(4, 3, 8, 64), t, l, 1.0)),
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, c, c, l, l, 1.0)),
    (TypeError, lambda q, c, t, l: fast.paged_attention(q, c, c, t, Tensor([9.0]), 1.0)),
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, c, c, t, l, 1.0, window=0)),
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, c, c, t, l, 1.0, sinks=Tensor.zeros(3))),
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, Tensor.zeros(0, 2, 8, 64), Tensor.zeros(0, 2, 8, 64), t, l, 1.0)),
    (ValueError, lambda q, c, t, l: fast.paged_attention(q, c, Tensor.zeros(4, 2, 8, 32), t, l, 1.0)),
    (TypeError, lambda q, c, t, l: fast.paged_attention(q, c, c, t.cast(dtypes.float32), l, 1.0)),
    (ValueError, lambda q, c, t, l: fast.paged_write(c, Tensor.zeros(5, 3, 64), Tensor([1, 2, 3, 4, 5]))),
    (ValueError, lambda q, c, t, l: fast.paged_write(c, Tensor.zeros(5, 2, 64), Tensor([1, 2]))),
    (TypeError, lambda q, c, t, l: fast.paged_write(c, Tensor.zeros(2, 2, 64), Tensor([1.0, 2.0]))),
]


@pytest.mark.parametrize("error, call", PAGED_INVALID)
def test_paged_invalid_arguments(error, call):
    q, c = Tensor.zeros(1, 4, 1, 64), Tensor.zeros(4, 2, 8, 64)
    t, l = Tensor([[0, 1]], dtype=dtypes.int32), Tensor([9], dtype=dtypes.int32)
    assert fast.paged_attention(q, c, c, t, l, 1.0).shape == (1, 4, 1, 64)
    with pytest.raises(error, match="^paged_(attention|write): "):
        call(q, c, t, l)


# ---- take: rows by index ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, row", [(dtypes.bfloat16, (64,)), (dtypes.uint32, (20,)), (dtypes.float32, (4, 3)),
                                        (dtypes.float16, (1,))], ids=str)
def test_take_copies_the_rows_named_and_zeros_outside(device, dtype, row):
    """An embedding table's rows (bfloat16), a quantized table's words (uint32), rows of a rank-3 x
    and of one element: the rows named as their bits, indices repeated and of any shape, negative
    ones and ones past the table zeros; one kernel where x is a buffer on a GPU."""
    rng = np.random.default_rng(0x140)
    rows = 37
    source = rng.integers(0, 2**31, (rows, *row)) if dtype == dtypes.uint32 else rng.standard_normal((rows, *row))
    x = Tensor(source, device=device).cast(dtype).realize()
    xv = values(x)
    indices = np.array([[5, 0, 36], [5, -1, 37], [2**31 - 1, 12, 3]])
    with expect_launches(device, "nuvec_take_rows"):
        got = fast.take(x, Tensor(indices, dtype=dtypes.int64, device=device)).realize()
    inside = (indices >= 0) & (indices < rows)
    want = xv[np.where(inside, indices, 0)]
    want[~inside] = 0
    assert got.shape == (3, 3, *row) and got.dtype == dtype
    np.testing.assert_array_equal(values(got), want)


def test_take_gradients_reach_the_rows_taken(device):
    """Gradients through the composition: each row's gradient summed over the indices naming it."""
    rng = np.random.default_rng(0x141)
    x = Tensor(rng.standard_normal((9, 6)), device=device).cast(dtypes.float32).realize()
    indices = Tensor([3, 0, 3, 8, -2], device=device)
    g = rng.standard_normal((5, 6))
    (grad,) = (fast.take(x, indices) * Tensor(g, device=device).cast(dtypes.float32)).sum().gradient(x)
    want = np.zeros((9, 6))
    for i, index in enumerate([3, 0, 3, 8]): want[index] += g[i]
    assert_close("dx", values(grad), want, 1e-6)


def test_take_of_a_computed_x_composes(device):
    """x not a buffer: its rows are composed with it (no kernel realizes the whole of it first)."""
    x = Tensor(np.arange(40.0).reshape(10, 4), device=device).cast(dtypes.float32).realize() * 2
    with expect_launches(device, None):
        got = fast.take(x, Tensor([9, 1], device=device)).realize()
    np.testing.assert_array_equal(values(got), [[72, 74, 76, 78], [8, 10, 12, 14]])


@pytest.mark.parametrize("error, call", [(TypeError, lambda: fast.take(Tensor.zeros(4, 2), Tensor([1.0]))),
                                         (ValueError, lambda: fast.take(Tensor(3.0), Tensor([0]))),
                                         (TypeError, lambda: fast.take([1, 2], Tensor([0])))])
def test_take_invalid_arguments(error, call):
    with pytest.raises(error, match="^take: "):
        call()


def test_take_launches_one_kernel_around_which_the_rows_and_their_gradient_are_the_compositions(monkeypatch):
    """The kernel's call on the CPU (the route given a backend, the program a C stand-in that
    copies the bytes of each chunk named): one launch reading x in place, the runtime integers, the
    values, and the gradient (the composition's)."""
    from nuvec_tg import kernels
    from nuvec_tg.kernels import paged as paged_kernel
    from reference import launched, stand_in_program
    render = paged_kernel.take_program

    def stand_in(backend, width):
        params = tuple(type(p)(p.name, p.kind, "unsigned char" if p.ctype != "int" else "int") for p in render(backend, width).params)
        body = f"""
          const int chunks = ints[0], count = ints[1], rows = ints[2];
          for (long i = 0; i < count; i++) for (long b = 0; b < (long)chunks * {width}; b++)
            y[i * chunks * {width} + b] = indices[i] >= 0 && indices[i] < rows ? x[(long)indices[i] * chunks * {width} + b] : 0;"""
        return stand_in_program("stand_in_take", params, body)
    monkeypatch.setattr(kernels, "active_backend", lambda device: "cuda")
    monkeypatch.setattr(paged_kernel, "take_program", stand_in)
    rng = np.random.default_rng(0x142)
    x = Tensor(rng.standard_normal((11, 6)), device="CPU").cast(dtypes.float32).realize()
    indices = Tensor([[4, 10], [-3, 4]], device="CPU")
    with kernels.record_launches() as launches:
        got = fast.take(x, indices)
    assert launched(launches) == ["stand_in_take"] and launches[0][1] == "cuda take 4 of 11 rows of 24 bytes"
    with kernels.compositions_only():
        want = fast.take(x, indices)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    g = Tensor(rng.standard_normal((2, 2, 6)), device="CPU").cast(dtypes.float32)
    (grad,) = (fast.take(x, indices) * g).sum().gradient(x)
    with kernels.compositions_only():
        (want_grad,) = (fast.take(x, indices) * g).sum().gradient(x)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-6, atol=1e-6)
