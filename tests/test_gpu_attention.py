"""The decode attention kernels on a GPU (METAL or CUDA) against the composition on the same
device and against numpy: masks, sinks, windows, grouped heads, cache slices, paged pools, the
plan's dispatches, bits across batch items and runs, TinyJit, gradients."""
import math

import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit, UOp, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only, record_launches
from attention_reference import attention_reference
from reference import random, values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
TOL = {dtypes.float32: 2e-4, dtypes.float16: 1e-2, dtypes.bfloat16: 5e-2}


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def close(name, got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bad = ~(np.abs(got - want) <= tol * np.maximum(np.abs(want), 1.0))
    assert not bad.any(), f"{name}: {bad.sum()} of {bad.size} differ; worst {np.abs(got - want).max()}"


def run_both(fn):
    """`fn()` through the kernels, then through the compositions, on the GPU."""
    with record_launches() as launches:
        kernel = fn()
        kernel.realize()
    with compositions_only():
        composed = fn().realize()
    return kernel, composed, launches


# (B, Hq, Hkv, Lq, Lk, D, Dv)
DECODE_SHAPES = [(2, 4, 4, 1, 37, 64, 64), (1, 8, 2, 4, 50, 128, 128), (1, 4, 4, 2, 33, 96, 64),
                 (1, 2, 1, 1, 20, 192, 128), (1, 8, 1, 1, 1100, 128, 128), (1, 16, 2, 1, 9000, 128, 128),
                 (1, 8, 1, 1, 2048, 512, 512), (3, 32, 8, 1, 5000, 256, 256), (1, 4, 2, 8, 300, 128, 128)]


@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=str)
def test_decode_kernels_match_the_composition_and_numpy(shape, dtype):
    b, hq, hkv, lq, lk, d, dv = shape
    rng = np.random.default_rng(0x66)
    q, qv = random(rng, (b, hq, lq, d), dtype, gpu)
    # Keys and values as transposed views of [B, L, H, D] (as in a model), and as a cache slice.
    k, kv = random(rng, (b, lk, hkv, d), dtype, gpu)
    v, vv = random(rng, (b, lk, hkv, dv), dtype, gpu)
    k, v, kv, vv = k.transpose(1, 2), v.transpose(1, 2), kv.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
    sinks, sv = random(rng, (hq,), dtype, gpu)
    bool_values = rng.uniform(size=(lq, lk)) > 0.25
    additive, av = random(rng, (1, hq, lq, lk), dtype, gpu)
    scale = 1 / math.sqrt(d)
    cases = [(dict(), dict()), (dict(mask="causal"), dict(causal=True)),
             (dict(mask=Tensor(bool_values, device=gpu)), dict(mask=bool_values)),
             (dict(mask=additive), dict(mask=av)), (dict(mask="causal", sinks=sinks), dict(causal=True, sinks=sv)),
             (dict(mask="causal", window=min(lk, 77)), dict(causal=True, window=min(lk, 77)))]
    for options, reference in cases:
        plan = fast.plan_attention(q.shape, k.shape, v.shape, dtype, device=gpu, **options)
        kernel, composed, launches = run_both(lambda: fast.scaled_dot_product_attention(q, k, v, scale, **options))
        name = f"{options.keys()} {plan}"
        if isinstance(plan.kernel, fast.Vector):
            assert len(launches) == plan.kernel.dispatches, (name, launches)
            assert launches[0][0].startswith("nuvec_sdpa_decode") and f"passes{plan.kernel.passes}" in launches[0][1]
            assert launches[0][0].startswith("nuvec_sdpa_decode_mma") == plan.kernel.matrix, (name, launches)
        else:
            assert not launches, name
        close(f"{name} vs composition", values(kernel), values(composed), TOL[dtype])
        close(f"{name} vs numpy", values(kernel), attention_reference(qv, kv, vv, scale, **reference), TOL[dtype])


def test_every_decode_shape_of_the_seeds_runs_a_kernel():
    for b, hq, hkv, lq, lk, d, dv in DECODE_SHAPES:
        plan = fast.plan_attention((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv), dtypes.float16, device=gpu)
        assert isinstance(plan.kernel, fast.Vector), (b, hq, hkv, lq, lk, d, dv, plan)


@pytest.mark.parametrize("case", [(1, 300, 64, 8, 1, 128), (1, 4096, 64, 8, 8, 128), (1, 9000, 128, 8, 1, 3),
                                  (1, 2000, 256, 4, 1, 1024), (4, 600, 128, 4, 2, 7), (8, 1500, 64, 4, 4, 128),
                                  (1, 4000, 64, 8, 1, 128), (1, 9000, 128, 16, 2, 300)], ids=str)
def test_windows_read_exactly_their_keys(case):
    lq, lk, d, hq, hkv, window = case
    rng = np.random.default_rng(0x56)
    q, k, v = (random(rng, s, dtypes.bfloat16, gpu)[0] for s in ((1, hq, lq, d), (1, hkv, lk, d), (1, hkv, lk, d)))
    got = fast.scaled_dot_product_attention(q, k, v, 0.125, mask="causal", window=window)
    band = (np.arange(lk)[None] <= np.arange(lq)[:, None] + lk - lq) & (np.arange(lk)[None] > np.arange(lq)[:, None] + lk - lq - window)
    masked = fast.scaled_dot_product_attention(q, k, v, 0.125, mask=Tensor(band, device=gpu))
    close("window vs band", values(got), values(masked), TOL[dtypes.bfloat16])
    if lq == 1:  # the row's bits equal an unmasked call over exactly its window's keys
        start = max(0, lk - window)
        alone = fast.scaled_dot_product_attention(q, k[:, :, start:], v[:, :, start:], 0.125)
        np.testing.assert_array_equal(bits(got), bits(alone))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_batch_items_equal_each_item_alone_and_runs_repeat(dtype):
    rng = np.random.default_rng(0x5B0)
    for hq, hkv, lk, d, passes_keys in ((32, 8, 3000, 128, 0), (8, 8, 700, 64, 0), (16, 2, 9000, 128, 1)):
        b = 3
        q, k, v = (random(rng, s, dtype, gpu)[0].realize() for s in ((b, hq, 1, d), (b, hkv, lk, d), (b, hkv, lk, d)))
        sinks = random(rng, (hq,), dtype, gpu)[0]
        everything = fast.scaled_dot_product_attention(q, k, v, 0.1, mask="causal", sinks=sinks)
        first = bits(everything)
        np.testing.assert_array_equal(bits(fast.scaled_dot_product_attention(q, k, v, 0.1, mask="causal", sinks=sinks)), first)
        for i in range(b):
            alone = fast.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], 0.1, mask="causal", sinks=sinks)
            np.testing.assert_array_equal(bits(alone), first[i:i + 1])


@pytest.mark.parametrize("hq", [16, 32], ids=lambda h: f"{h}/4")  # 32/4: the matrix-unit pass
def test_a_jitted_decode_loop_over_a_growing_cache(hq):
    rng = np.random.default_rng(0x5D)
    hkv, d, capacity = 4, 128, 96
    k_cache, v_cache = (random(rng, (1, hkv, capacity, d), dtypes.float16, gpu)[0].realize() for _ in range(2))
    queries = [random(rng, (1, hq, 1, d), dtypes.float16, gpu)[0].realize() for _ in range(64)]
    length = UOp.variable("length", 1, capacity, dtype=dtypes.int32)

    def step(q, n):
        return fast.scaled_dot_product_attention(q, k_cache[:, :, :n], v_cache[:, :, :n], 0.09).realize()
    jitted = TinyJit(step)
    compiler = Device[gpu].compiler
    compiled, original = [], compiler.compile
    compiler.compile = lambda src: compiled.append(src) or original(src)
    try:
        for i in range(64):
            n = 20 + i
            got = jitted(queries[i].clone().realize(), length.bind(n))
            if i == 1: compiled_after_two = len(compiled)
            eager = fast.scaled_dot_product_attention(queries[i], k_cache[:, :, :n], v_cache[:, :, :n], 0.09)
            np.testing.assert_array_equal(bits(got), bits(eager), err_msg=f"step {i}")
        assert len(compiled) == compiled_after_two or all("nuvec" not in s for s in compiled[compiled_after_two:])
    finally:
        compiler.compile = original


def test_gradients_through_the_kernels_equal_the_composition():
    rng = np.random.default_rng(0x60)
    for lk, hq, hkv in ((100, 8, 2), (5000, 16, 2)):
        q, k, v = (random(rng, s, dtypes.float32, gpu)[0] for s in ((1, hq, 2, 64), (1, hkv, lk, 64), (1, hkv, lk, 64)))
        sinks = random(rng, (hq,), dtypes.float32, gpu)[0]
        g = random(rng, (1, hq, 2, 64), dtypes.float32, gpu)[0]

        def grads():
            out = fast.scaled_dot_product_attention(q, k, v, 0.125, mask="causal", sinks=sinks)
            result = (out * g).sum().gradient(q, k, v, sinks)
            Tensor.realize(*result)
            return result
        with record_launches() as launches:
            kernel = grads()
        assert launches, "the forward ran no kernel"
        with compositions_only():
            composed = grads()
        for a, e in zip(kernel, composed):
            close("gradient", values(a), values(e), 1e-4)


def test_a_large_batch_runs_the_same_blocks_in_fewer_threadgroups():
    """CUDA's matrix-unit pass at B = 40: the plan keeps one item's blocks but runs several in
    turn per threadgroup; every item keeps the bits it has alone."""
    rng = np.random.default_rng(0x5B1)
    b, hq, hkv, lk, d = 40, 16, 2, 2048, 64
    q, k, v = (random(rng, s, dtypes.bfloat16, gpu)[0].realize() for s in ((b, hq, 1, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    batched = fast.plan_attention(q.shape, k.shape, v.shape, dtypes.bfloat16, device=gpu).kernel
    alone_plan = fast.plan_attention(q[:1].shape, k[:1].shape, v[:1].shape, dtypes.bfloat16, device=gpu).kernel
    assert batched.blocks == alone_plan.blocks
    if batched.matrix: assert batched.block_groups and not alone_plan.block_groups, (batched, alone_plan)
    everything = bits(fast.scaled_dot_product_attention(q, k, v, 0.1))
    for i in (0, 17, 39):
        alone = fast.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], 0.1)
        np.testing.assert_array_equal(bits(alone), everything[i:i + 1], err_msg=f"item {i}")
