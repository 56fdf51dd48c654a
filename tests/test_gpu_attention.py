"""The decode attention kernels on a GPU (METAL or CUDA) against numpy and the composition on the
same device: masks, sinks, windows, grouped heads, cache slices, the plan's dispatches, bits across
batch items and runs, TinyJit, gradients (paged pools: test_paged.py on each GPU). Every call meant
for the kernels asserts that they launched (`expect_launches`); outputs are compared row by row
(`assert_rows_close`, tolerances in reference.py)."""
import math

import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit, UOp, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only
from attention_reference import attention_reference
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, kernel_target, random, \
    values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
DECODE = "nuvec_sdpa_decode"


def bits(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def run_both(fn, kernel):
    """`fn()` with the kernels on (a program named `kernel...` must launch; None: the plan's
    composition, nothing may), then through the compositions (nothing launches), on the GPU."""
    with expect_launches(gpu, kernel) as launches:
        out = fn().realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fn().realize()
    return out, composed, launches


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
        # The plan with the kernels on (not following NUVEC_KERNELS=0): head size 512 with an array
        # mask is the one composition here (MLX's rule).
        plan = fast.plan_attention(q.shape, k.shape, v.shape, dtype, device=kernel_target(gpu), **options)
        vector = plan.kernel if isinstance(plan.kernel, fast.Vector) else None
        assert vector is not None or (d == 512 and isinstance(options.get("mask"), Tensor)), plan
        out, composed, launches = run_both(lambda: fast.scaled_dot_product_attention(q, k, v, scale, **options),
                                           DECODE if vector else None)
        name = f"{list(options)} {plan.kernel}"
        if vector:
            assert len(launches) == vector.dispatches, (name, launches)
            assert f"passes{vector.passes}" in launches[0][1], (name, launches)
            assert launches[0][0].startswith("nuvec_sdpa_decode_mma") == vector.matrix, (name, launches)
        assert_rows_close(f"{name} vs numpy", values(out), attention_reference(qv, kv, vv, scale, **reference),
                          KERNEL_TOLERANCE[dtype])
        assert_rows_close(f"{name} vs composition", values(out), values(composed), COMPOSITION_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=str)
def test_every_decode_shape_of_the_seeds_runs_a_kernel(dtype):
    """The plan on this GPU (kernels on: under NUVEC_KERNELS=0 this fails) takes the decode kernels."""
    for b, hq, hkv, lq, lk, d, dv in DECODE_SHAPES:
        plan = fast.plan_attention((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv), dtype, device=gpu)
        assert isinstance(plan.kernel, fast.Vector), (b, hq, hkv, lq, lk, d, dv, plan)


@pytest.mark.parametrize("case", [(1, 300, 64, 8, 1, 128), (1, 4096, 64, 8, 8, 128), (1, 9000, 128, 8, 1, 3),
                                  (1, 2000, 256, 4, 1, 1024), (4, 600, 128, 4, 2, 7), (8, 1500, 64, 4, 4, 128),
                                  (1, 4000, 64, 8, 1, 128), (1, 9000, 128, 16, 2, 300)], ids=str)
def test_windows_read_exactly_their_keys(case):
    """The window through the kernels equals numpy and the kernels under its band as a boolean mask;
    one query's bits equal an unmasked call over exactly its window's keys."""
    lq, lk, d, hq, hkv, window = case
    rng = np.random.default_rng(0x56)
    (q, qv), (k, kv), (v, vv) = (random(rng, s, dtypes.bfloat16, gpu) for s in ((1, hq, lq, d), (1, hkv, lk, d), (1, hkv, lk, d)))
    want = attention_reference(qv, kv, vv, 0.125, causal=True, window=window)
    tol = KERNEL_TOLERANCE[dtypes.bfloat16]
    with expect_launches(gpu, DECODE):
        got = fast.scaled_dot_product_attention(q, k, v, 0.125, mask="causal", window=window).realize()
    assert_rows_close("window vs numpy", values(got), want, tol)
    band = (np.arange(lk)[None] <= np.arange(lq)[:, None] + lk - lq) & (np.arange(lk)[None] > np.arange(lq)[:, None] + lk - lq - window)
    with expect_launches(gpu, DECODE):
        masked = fast.scaled_dot_product_attention(q, k, v, 0.125, mask=Tensor(band, device=gpu)).realize()
    assert_rows_close("band vs numpy", values(masked), want, tol)
    if lq == 1:
        start = max(0, lk - window)
        with expect_launches(gpu, DECODE):
            alone = fast.scaled_dot_product_attention(q, k[:, :, start:], v[:, :, start:], 0.125).realize()
        np.testing.assert_array_equal(bits(got), bits(alone))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_batch_items_equal_each_item_alone_and_runs_repeat(dtype):
    rng = np.random.default_rng(0x5B0)
    for hq, hkv, lk, d, passes_keys in ((32, 8, 3000, 128, 0), (8, 8, 700, 64, 0), (16, 2, 9000, 128, 1)):
        b = 3
        q, k, v = (random(rng, s, dtype, gpu)[0].realize() for s in ((b, hq, 1, d), (b, hkv, lk, d), (b, hkv, lk, d)))
        sinks = random(rng, (hq,), dtype, gpu)[0]
        with expect_launches(gpu, DECODE):
            first = bits(fast.scaled_dot_product_attention(q, k, v, 0.1, mask="causal", sinks=sinks))
            again = bits(fast.scaled_dot_product_attention(q, k, v, 0.1, mask="causal", sinks=sinks))
        np.testing.assert_array_equal(again, first)
        for i in range(b):
            with expect_launches(gpu, DECODE):
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
            query = queries[i].clone().realize()
            # TinyJit runs the step at its first two calls (the second captured) and replays it after:
            # the kernels launch in those two, and later steps build nothing.
            with expect_launches(gpu, DECODE if i < 2 else None):
                got = jitted(query, length.bind(n))
            if i == 1: compiled_after_two = len(compiled)
            with expect_launches(gpu, DECODE):
                eager = fast.scaled_dot_product_attention(queries[i], k_cache[:, :, :n], v_cache[:, :, :n], 0.09).realize()
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
        with expect_launches(gpu, DECODE):  # the forward; the backward is the composition's
            kernel = grads()
        with expect_launches(gpu, None), compositions_only():
            composed = grads()
        for name, a, e in zip(("dq", "dk", "dv", "dsinks"), kernel, composed):
            assert_rows_close(f"Lk {lk} {name}", values(a), values(e), COMPOSITION_TOLERANCE[dtypes.float32])


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
    with expect_launches(gpu, DECODE):
        everything = bits(fast.scaled_dot_product_attention(q, k, v, 0.1))
    for i in (0, 17, 39):
        with expect_launches(gpu, DECODE):
            alone = bits(fast.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], 0.1))
        np.testing.assert_array_equal(alone, everything[i:i + 1], err_msg=f"item {i}")
