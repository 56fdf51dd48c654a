"""The tiled prefill kernel on a GPU (METAL or CUDA) against float64 numpy and the composition on
the same device: lengths off the tiles (9-300 and primes), every mask kind, windows below, at and
above the keys, sinks, grouped heads 1, 3, 4 and 8, `Lq < Lk` (a chunk continuing a cache), every
head size and 16-bit dtype, K/V as views of a model's layout and as cache slices; empty calls;
batch items equal to each item alone bit for bit, and repeated runs; gradients through the
composition. Paged prefill (more than 8 queries over a pool): tests/test_paged.py. Every call
meant for the kernel asserts that the plan's kernel launched (`expect_launches`): on Hopper the
warpgroup kernel for head sizes 64, 128 and 256, where the mma.sync kernel is also run directly."""
import math

import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only, prefill
from attention_reference import attention_reference
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, kernel_target, random, \
    values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
PREFILL = "nuvec_sdpa_prefill"
PREFILL_WGMMA = "nuvec_sdpa_prefill_wgmma"
HALVES = [dtypes.float16, dtypes.bfloat16]


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast(dtypes.uint16).numpy()


def inputs(rng, b, hq, hkv, lq, lk, d, dv, dtype):
    """q `[B, Hq, Lq, D]`, and K and V as transposed views of `[B, Lk, Hkv, D]` (a model's layout),
    each with its float64 values `[B, H, L, D]`."""
    q, qv = random(rng, (b, hq, lq, d), dtype, gpu)
    k, kv = random(rng, (b, lk, hkv, d), dtype, gpu)
    v, vv = random(rng, (b, lk, hkv, dv), dtype, gpu)
    return (q, qv), (k.transpose(1, 2), kv.transpose(0, 2, 1, 3)), (v.transpose(1, 2), vv.transpose(0, 2, 1, 3))


def check_call(name, q, k, v, qv, kv, vv, scale, dtype, options, reference):
    """One call through the kernel (asserting the plan is Tiled and it launched), against numpy and
    against the composition on the device."""
    plan = fast.plan_attention(q.shape, k.shape, v.shape, dtype, device=kernel_target(gpu), **options)
    assert isinstance(plan.kernel, fast.Tiled), (name, plan)
    with expect_launches(gpu, PREFILL_WGMMA if plan.kernel.wgmma_stages else PREFILL):
        out = fast.scaled_dot_product_attention(q, k, v, scale, **options).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fast.scaled_dot_product_attention(q, k, v, scale, **options).realize()
    want = attention_reference(qv, kv, vv, scale, **reference)
    assert_rows_close(f"{name} vs numpy", values(out), want, KERNEL_TOLERANCE[dtype])
    assert_rows_close(f"{name} vs composition", values(out), values(composed), COMPOSITION_TOLERANCE[dtype])
    return out


# (B, Hq, Hkv, Lq, Lk, D, Dv)
SHAPES = [(1, 8, 2, 9, 9, 128, 128), (2, 4, 4, 37, 37, 64, 64), (1, 6, 2, 100, 131, 128, 128),
          (1, 8, 1, 257, 300, 64, 64), (2, 16, 2, 61, 200, 80, 80), (1, 4, 1, 131, 131, 72, 72),
          (1, 8, 8, 97, 113, 96, 96), (1, 4, 2, 50, 70, 96, 64), (1, 4, 1, 73, 101, 256, 256),
          (1, 2, 2, 40, 41, 192, 192)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_tiled_kernel_matches_numpy_and_the_composition(shape, dtype):
    b, hq, hkv, lq, lk, d, dv = shape
    rng = np.random.default_rng(0x7F1)
    (q, qv), (k, kv), (v, vv) = inputs(rng, b, hq, hkv, lq, lk, d, dv, dtype)
    sinks, sv = random(rng, (hq,), dtype, gpu, spread=3.0)
    bool_values = rng.uniform(size=(b, 1, lq, lk)) > 0.3
    bool_values[:, :, 3] = False                                  # a row that sees nothing
    additive, av = random(rng, (1, hq, lq, lk), dtype, gpu, spread=4.0)
    scale = 1 / math.sqrt(d)
    cases = [(dict(), dict()), (dict(mask="causal"), dict(causal=True)),
             (dict(mask=Tensor(bool_values, device=gpu)), dict(mask=bool_values)),
             (dict(mask=additive), dict(mask=av)),
             (dict(mask="causal", sinks=sinks), dict(causal=True, sinks=sv)),
             (dict(sinks=sinks), dict(sinks=sv)),
             (dict(mask="causal", window=max(1, lk // 3)), dict(causal=True, window=max(1, lk // 3)))]
    for options, reference in cases:
        check_call(f"{list(options)}", q, k, v, qv, kv, vv, scale, dtype, options, reference)


@pytest.mark.parametrize("lq", [9, 10, 15, 16, 17, 31, 33, 63, 64, 65, 97, 127, 128, 129, 211, 255, 256, 257, 300])
def test_lengths_off_the_tiles(lq):
    """Every query count against a longer and an equal key count, causal and not, group 4."""
    rng = np.random.default_rng(lq)
    dtype = dtypes.bfloat16
    for lk in (lq, lq + 53):
        (q, qv), (k, kv), (v, vv) = inputs(rng, 1, 8, 2, lq, lk, 128, 128, dtype)
        for options, reference in ((dict(), dict()), (dict(mask="causal"), dict(causal=True))):
            check_call(f"Lq {lq} Lk {lk} {list(options)}", q, k, v, qv, kv, vv, 0.08, dtype, options, reference)


@pytest.mark.parametrize("window", [1, 7, 64, 149, 150, 151, 400])
def test_windows_below_at_and_above_the_keys(window):
    rng = np.random.default_rng(window)
    lq, lk, dtype = 120, 150, dtypes.float16
    (q, qv), (k, kv), (v, vv) = inputs(rng, 2, 8, 4, lq, lk, 64, 64, dtype)
    check_call(f"window {window}", q, k, v, qv, kv, vv, 0.125, dtype, dict(mask="causal", window=window),
               dict(causal=True, window=window))


@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_grouped_heads_share_their_key_head(group):
    rng = np.random.default_rng(0x600 + group)
    dtype = dtypes.bfloat16
    (q, qv), (k, kv), (v, vv) = inputs(rng, 2, 2 * group, 2, 45, 90, 64, 64, dtype)
    check_call(f"group {group}", q, k, v, qv, kv, vv, 0.125, dtype, dict(mask="causal"), dict(causal=True))


def test_cache_slices_are_read_in_place():
    """K and V as slices of longer caches along the sequence (a chunk continuing a cache)."""
    rng = np.random.default_rng(0x5C)
    dtype = dtypes.bfloat16
    k_cache, kc = random(rng, (1, 2, 256, 128), dtype, gpu)
    v_cache, vc = random(rng, (1, 2, 256, 128), dtype, gpu)
    q, qv = random(rng, (1, 8, 40, 128), dtype, gpu)
    k, v = k_cache.realize()[:, :, 30:130], v_cache.realize()[:, :, 30:130]
    check_call("slice", q, k, v, qv, kc[:, :, 30:130], vc[:, :, 30:130], 0.1, dtype, dict(mask="causal"), dict(causal=True))


def test_empty_calls_launch_nothing_and_float32_composes():
    rng = np.random.default_rng(0xE)
    q, k, v = (random(rng, s, dtypes.bfloat16, gpu)[0] for s in ((1, 4, 0, 64), (1, 4, 20, 64), (1, 4, 20, 64)))
    with expect_launches(gpu, None):
        assert fast.scaled_dot_product_attention(q, k, v, 0.1).realize().shape == (1, 4, 0, 64)
    q, k, v = (random(rng, s, dtypes.bfloat16, gpu)[0] for s in ((1, 4, 20, 64), (1, 4, 0, 64), (1, 4, 0, 64)))
    with expect_launches(gpu, None):
        assert (values(fast.scaled_dot_product_attention(q, k, v, 0.1)) == 0).all()
    (q, qv), (k, kv), (v, vv) = inputs(rng, 1, 4, 2, 30, 30, 64, 64, dtypes.float32)
    with expect_launches(gpu, None):
        out = fast.scaled_dot_product_attention(q, k, v, 0.1, mask="causal")
    assert_rows_close("float32", values(out), attention_reference(qv, kv, vv, 0.1, causal=True), KERNEL_TOLERANCE[dtypes.float32])


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_batch_items_equal_each_item_alone_and_runs_repeat(dtype):
    rng = np.random.default_rng(0x7B)
    b = 3
    q, k, v = (random(rng, s, dtype, gpu)[0].realize() for s in ((b, 16, 150, 128), (b, 4, 300, 128), (b, 4, 300, 128)))
    sinks = random(rng, (16,), dtype, gpu)[0].realize()
    for options in (dict(mask="causal"), dict(mask="causal", window=100, sinks=sinks)):
        with expect_launches(gpu, PREFILL):
            everything = bits(fast.scaled_dot_product_attention(q, k, v, 0.1, **options))
        with expect_launches(gpu, PREFILL):
            np.testing.assert_array_equal(bits(fast.scaled_dot_product_attention(q, k, v, 0.1, **options)), everything)
        for i in range(b):
            with expect_launches(gpu, PREFILL):
                alone = bits(fast.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], 0.1, **options))
            np.testing.assert_array_equal(alone, everything[i:i + 1], err_msg=f"{list(options)} item {i}")


def test_a_long_causal_prompt():
    """1024 causal queries of Qwen3-8B's heads (32 over 8, head size 128) against the composition."""
    rng = np.random.default_rng(0x1024)
    dtype = dtypes.bfloat16
    (q, qv), (k, kv), (v, vv) = inputs(rng, 1, 32, 8, 1024, 1024, 128, 128, dtype)
    check_call("1024", q, k, v, qv, kv, vv, 128 ** -0.5, dtype, dict(mask="causal"), dict(causal=True))


def test_gradients_through_the_kernel_equal_the_composition():
    rng = np.random.default_rng(0x61)
    dtype = dtypes.bfloat16
    q, k, v = (random(rng, s, dtype, gpu)[0] for s in ((1, 8, 40, 64), (1, 2, 60, 64), (1, 2, 60, 64)))
    sinks = random(rng, (8,), dtype, gpu)[0]
    g = random(rng, (1, 8, 40, 64), dtype, gpu)[0]

    def grads():
        out = fast.scaled_dot_product_attention(q, k, v, 0.125, mask="causal", sinks=sinks)
        result = (out.float() * g.float()).sum().gradient(q, k, v, sinks)
        Tensor.realize(*result)
        return result
    with expect_launches(gpu, PREFILL):  # the forward; the backward is the composition's
        kernel = grads()
    with expect_launches(gpu, None), compositions_only():
        composed = grads()
    for name, a, e in zip(("dq", "dk", "dv", "dsinks"), kernel, composed):
        assert_rows_close(name, values(a), values(e), COMPOSITION_TOLERANCE[dtype])


@pytest.mark.parametrize("shape", [(2, 8, 2, 77, 150, 64, 64), (1, 8, 2, 130, 131, 128, 128), (1, 4, 1, 73, 101, 256, 256),
                                   (1, 4, 2, 50, 90, 128, 64)], ids=str)
def test_the_mma_sync_kernel_where_the_warpgroup_kernel_routes(shape):
    """Head sizes the warpgroup kernel takes on Hopper run the mma.sync kernel elsewhere: run it
    directly (its own plan's launch) against numpy under each option, and beside the plan's kernel."""
    b, hq, hkv, lq, lk, d, dv = shape
    rng = np.random.default_rng(0x5A5A)
    dtype = dtypes.bfloat16
    (q, qv), (k, kv), (v, vv) = inputs(rng, b, hq, hkv, lq, lk, d, dv, dtype)
    sinks, sv = random(rng, (hq,), dtype, gpu, spread=3.0)
    bool_values = rng.uniform(size=(b, 1, lq, lk)) > 0.3
    mma_sync = prefill.plan(kernel_target(gpu).backend, d, dv)
    for options, reference in ((dict(causal=True, window=None, mask=None, sinks=sinks), dict(causal=True, sinks=sv)),
                               (dict(causal=True, window=40, mask=None, sinks=None), dict(causal=True, window=40)),
                               (dict(causal=False, window=None, mask=Tensor(bool_values, device=gpu), sinks=None),
                                dict(mask=bool_values))):
        shape_used = prefill.plan(kernel_target(gpu).backend, d, dv, options["mask"] is not None)
        with expect_launches(gpu, PREFILL):
            out = prefill.prefill_attention(q.contiguous(), k.contiguous(), v.contiguous(), d ** -0.5, shape_used,
                                            dtype=dtype, backend=kernel_target(gpu).backend, **options).realize()
        assert not shape_used.wgmma_stages and not mma_sync.wgmma_stages
        assert_rows_close(f"mma.sync {list(reference)}", values(out), attention_reference(qv, kv, vv, d ** -0.5, **reference),
                          KERNEL_TOLERANCE[dtype])
