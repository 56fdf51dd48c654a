"""scaled_dot_product_attention against float64 numpy, its capped blocks and gradients, on the CPU
and on each GPU: outputs compared row by row (`assert_rows_close`), and every call through
`checked_attention`, which asserts that the decode kernels launched where the plan runs them (on a
GPU) and that nothing launched elsewhere."""
import gc
import math

import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.device import Buffer
from tinygrad.helpers import GlobalCounters

from nuvec_tg import fast
from attention_reference import attention_reference
from reference import KERNEL_TOLERANCE, assert_close, assert_rows_close, checked_attention, finite_differences, random, \
    tensor, values

# Relative to each row's largest |want|: the kernels' tolerances (reference.py), float64 on the CPU.
ATTENTION_TOLERANCE = {dtypes.float64: 1e-9, **KERNEL_TOLERANCE}


def test_attention_fallback_matches_a_direct_formula():
    rng = np.random.default_rng(0x65)
    lq, lk, d = 3, 5, 4
    (q, qv), (k, kv), (v, vv) = (random(rng, (1, 1, n, d), dtypes.float32, "CPU") for n in (lq, lk, lk))
    got = values(fast.scaled_dot_product_attention(q, k, v, 0.5, mask="causal"))
    for i in range(lq):
        visible = i + lk - lq + 1
        s = [0.5 * sum(qv[0, 0, i, c] * kv[0, 0, j, c] for c in range(d)) for j in range(visible)]
        z = sum(math.exp(x - max(s)) for x in s)
        for c in range(d):
            want = sum(math.exp(s[j] - max(s)) / z * vv[0, 0, j, c] for j in range(visible))
            assert abs(got[0, 0, i, c] - want) < 1e-5
    bad = random(rng, (1, 3, lk, d), dtypes.float32, "CPU")[0]
    q2 = random(rng, (1, 2, lq, d), dtypes.float32, "CPU")[0]
    with pytest.raises(ValueError, match="^scaled_dot_product_attention: "):
        fast.scaled_dot_product_attention(q2, bad, bad, 1.0)
    with pytest.raises(ValueError, match="^scaled_dot_product_attention: "):
        fast.scaled_dot_product_attention(q.reshape(1, lq, d), k, v, 1.0)


def inputs(rng, shape, dtype, device):
    """Queries as a transposed view of `[B, L, H, D]`, keys and values as a slice of a longer cache."""
    b, hq, hkv, lq, lk, d = shape
    q, qv = random(rng, (b, lq, hq, d), dtype, device)
    k, kv = random(rng, (b, hkv, lk + 5, d), dtype, device)
    v, vv = random(rng, (b, hkv, lk + 5, d), dtype, device)
    return (q.transpose(1, 2), k[:, :, 3:3 + lk], v[:, :, 3:3 + lk]), (qv.transpose(0, 2, 1, 3), kv[:, :, 3:3 + lk], vv[:, :, 3:3 + lk])


# (B, Hq, Hkv, Lq, Lk, D)
SHAPES = [(1, 4, 2, 7, 12, 16), (2, 2, 2, 5, 5, 8), (1, 8, 1, 3, 20, 32), (1, 2, 1, 1, 9, 8)]
DECODE_SHAPE = (1, 8, 2, 2, 40, 64)  # a head size and query count the decode kernels take, on a GPU


@pytest.mark.parametrize("shape, dtype", [(s, dtypes.float32) for s in SHAPES] +
                         [(SHAPES[0], dtypes.float16), (SHAPES[0], dtypes.bfloat16), (DECODE_SHAPE, dtypes.bfloat16)],
                         ids=str)
def test_every_mask_kind_with_and_without_sinks(device, shape, dtype):
    rng = np.random.default_rng(0x70)
    b, hq, hkv, lq, lk, d = shape
    (q, k, v), (qv, kv, vv) = inputs(rng, shape, dtype, device)
    sinks, sv = random(rng, (hq,), dtype, device)
    bool_values = rng.uniform(size=(lq, lk)) > 0.3
    additive_values = dict(zip(("tensor", "values"), random(rng, (hq, 1, lk), dtype, device)))
    scale = 1 / math.sqrt(d)
    cases = [
        (dict(), dict()),
        (dict(mask="causal"), dict(causal=True)),
        (dict(mask=Tensor(bool_values, device=device)), dict(mask=bool_values)),
        (dict(mask=additive_values["tensor"]), dict(mask=additive_values["values"])),
        (dict(mask="causal", window=3), dict(causal=True, window=3)),
    ]
    for options, reference in cases:
        for with_sinks in (False, True):
            extra = dict(sinks=sinks) if with_sinks else {}
            got = checked_attention(q, k, v, scale, **options, **extra)
            assert got.dtype == dtype and got.shape == (b, hq, lq, d)
            want = attention_reference(qv, kv, vv, scale, sinks=sv if with_sinks else None, **reference)
            assert_rows_close(f"{options} sinks {with_sinks}", values(got), want, ATTENTION_TOLERANCE[dtype])


def test_windows_below_at_and_above_the_keys(device):
    rng = np.random.default_rng(0x71)
    (q, k, v), (qv, kv, vv) = inputs(rng, (1, 4, 2, 6, 10, 8), dtypes.float32, device)
    causal = checked_attention(q, k, v, 0.3, mask="causal")
    for window in (1, 4, 9, 10, 11, 100):
        got = checked_attention(q, k, v, 0.3, mask="causal", window=window)
        assert_rows_close(f"window {window}", values(got), attention_reference(qv, kv, vv, 0.3, causal=True, window=window), 1e-5)
        # The same as its explicit band mask.
        band = (np.arange(10)[None] <= np.arange(6)[:, None] + 4) & (np.arange(10)[None] > np.arange(6)[:, None] + 4 - window)
        banded = checked_attention(q, k, v, 0.3, mask=Tensor(band, device=device))
        assert_rows_close(f"band {window}", values(got), values(banded), 1e-6)
        if window >= 10:  # plain causal, bit for bit
            np.testing.assert_array_equal(values(got), values(causal))


def test_queries_that_see_no_key_and_empty_inputs(device):
    rng = np.random.default_rng(0x72)
    q, _ = random(rng, (1, 2, 5, 8), dtypes.float32, device)
    k, _ = random(rng, (1, 2, 3, 8), dtypes.float32, device)
    sinks, _ = random(rng, (2,), dtypes.float32, device)
    # Causal with more queries than keys: the first two queries see nothing.
    out = values(checked_attention(q, k, k, 0.5, mask="causal"))
    np.testing.assert_array_equal(out[:, :, :2], 0.0)
    assert np.isfinite(out).all() and np.abs(out[:, :, 2:]).sum() > 0
    # An all-false boolean mask row and an all -inf additive row give zeros too.
    mask = np.ones((5, 3), bool); mask[1] = False
    out = values(checked_attention(q, k, k, 0.5, mask=Tensor(mask, device=device), sinks=sinks))
    np.testing.assert_array_equal(out[:, :, 1], 0.0)
    additive = np.zeros((5, 3), np.float32); additive[3] = -np.inf
    out = values(checked_attention(q, k, k, 0.5, mask=Tensor(additive, device=device)))
    np.testing.assert_array_equal(out[:, :, 3], 0.0)
    # No queries: an empty result. No keys: zeros (with a window, causal and sinks too).
    empty_q = Tensor.zeros(1, 2, 0, 8, device=device)
    assert checked_attention(empty_q, k, k, 0.1, mask="causal", window=3).shape == (1, 2, 0, 8)
    none = Tensor.zeros(1, 2, 0, 8, device=device)
    for options in (dict(), dict(mask="causal"), dict(mask="causal", window=3, sinks=sinks)):
        out = checked_attention(q, none, none, 0.1, **options)
        np.testing.assert_array_equal(values(out), np.zeros((1, 2, 5, 8)))


def test_promotion_and_value_head_size(device):
    rng = np.random.default_rng(0x73)
    q, qv = random(rng, (1, 2, 3, 8), dtypes.float16, device)
    k, kv = random(rng, (1, 2, 4, 8), dtypes.bfloat16, device)
    v, vv = random(rng, (1, 2, 4, 5), dtypes.float32, device)
    out = checked_attention(q, k, v, 0.5)
    assert out.dtype == dtypes.float32 and out.shape == (1, 2, 3, 5)
    assert_rows_close("promoted", values(out), attention_reference(qv, kv, vv, 0.5), 1e-5)


# ---- the capped composition ------------------------------------------------------------------

# (shape, dtype): grouped heads with the window inside the keys, and one head per key head.
CAPPED_CASES = [((1, 4, 2, 33, 45, 16), dtypes.float32), ((2, 2, 2, 20, 29, 8), dtypes.float32),
                ((1, 8, 1, 18, 60, 16), dtypes.bfloat16)]


def window_mask(lq, lk, w):
    positions = np.arange(lk - lq, lk)[:, None]
    keys = np.arange(lk)[None, :]
    return (positions >= keys) & (positions < keys + w)


@pytest.mark.parametrize("shape, dtype", CAPPED_CASES, ids=str)
def test_capped_equals_uncapped_and_the_window_formula(device, shape, dtype):
    rng = np.random.default_rng(0x74)
    b, hq, hkv, lq, lk, d = shape
    (q, k, v), (qv, kv, vv) = inputs(rng, shape, dtype, device)
    sinks, sv = random(rng, (hq,), dtype, device)
    bool_values = rng.uniform(size=(lq, lk)) > 0.5
    scale = 1 / math.sqrt(d)
    # (options, reference, sinks): the causal mask, a boolean one, and a window of 7 as its band.
    kinds = [
        (dict(mask="causal"), dict(causal=True), False),
        (dict(mask=Tensor(bool_values, device=device)), dict(mask=bool_values), False),
        (dict(mask="causal", window=7), dict(mask=window_mask(lq, lk, 7)), False),
        (dict(mask="causal", window=7, sinks=sinks), dict(mask=window_mask(lq, lk, 7), sinks=sv), True),
    ]
    for options, reference, with_sinks in kinds:
        want = attention_reference(qv, kv, vv, scale, **reference)
        for blocks in sorted({2, math.ceil(lq / 9)}):  # the cases take 2, 3 and 4 blocks between them
            rows = math.ceil(lq / blocks)
            keys = min(lk, 7 + rows - 1) if "window" in options else lk
            cap = b * hq * keys * 4 * rows
            plan = fast.plan_attention(q.shape, k.shape, v.shape, dtype, max_score_bytes=cap, device=device, **options)
            assert plan.max_intermediate_bytes <= cap, (plan, cap)
            assert isinstance(plan.kernel, fast.ComposedBlocks) and plan.capped, (plan, cap)
            assert math.ceil(lq / plan.kernel.rows) >= blocks
            got = checked_attention(q, k, v, scale, max_score_bytes=cap, **options)
            name = f"{options.get('mask')} window {options.get('window')} sinks {with_sinks} cap {cap} {plan}"
            assert_rows_close(name, values(got), want, ATTENTION_TOLERANCE[dtype])
        # The same bits run to run for a fixed plan.
        again = checked_attention(q, k, v, scale, max_score_bytes=cap, **options)
        np.testing.assert_array_equal(values(again), values(got), err_msg=f"{name}: run to run")


@pytest.mark.float64
def test_blocked_gradients_match_unblocked_and_finite_differences(device):
    rng = np.random.default_rng(0x75)
    shape = (1, 4, 2, 11, 14, 8)
    (q, k, v), (qv, kv, vv) = inputs(rng, shape, dtypes.float64, device)
    sinks, sv = random(rng, (4,), dtypes.float64, device)
    gv = rng.uniform(-1, 1, size=(1, 4, 11, 8))
    g = tensor(gv, dtypes.float64, device)
    for options, reference in ((dict(mask="causal"), dict(causal=True)), (dict(mask="causal", window=4), dict(causal=True, window=4))):
        grads = {}
        for cap in (None, 1 * 4 * 14 * 4 * 3):
            out = fast.scaled_dot_product_attention(q, k, v, 0.4, sinks=sinks, max_score_bytes=cap, **options)
            gradient = (out * g).sum().gradient(q, k, v, sinks)
            Tensor.realize(*gradient)  # one schedule for the four
            grads[cap] = [values(t) for t in gradient]
        plan = fast.plan_attention(q.shape, k.shape, v.shape, dtypes.float64, sinks=sinks, max_score_bytes=1 * 4 * 14 * 4 * 3,
                                   device=device, **options)
        assert isinstance(plan.kernel, fast.ComposedBlocks) and plan.capped
        for cap, got in grads.items():
            for a, e in zip(got, grads[None]):
                assert_close(f"cap {cap}", a, e, 1e-9)  # float64 sums in another order
        loss = lambda q, k, v, s: np.sum(attention_reference(q, k, v, 0.4, sinks=s, **reference) * gv)  # noqa: E731
        want = finite_differences(loss, [qv, kv, vv, sv])
        for what, a, e in zip(("q", "k", "v", "sinks"), grads[None], want):
            assert_close(f"d{what}", a, e, 1e-6)


class PeakMemory:
    """The most device memory tinygrad holds while realizing, beyond what it held before."""

    def __enter__(self):
        gc.collect()  # buffers of earlier tests freed now, not while measuring (their frees lower the count)
        self.original, self.baseline = Buffer.allocate, GlobalCounters.mem_used
        self.peak = self.baseline
        meter = self

        def allocate(buffer, *args, **kwargs):
            result = meter.original(buffer, *args, **kwargs)
            meter.peak = max(meter.peak, GlobalCounters.mem_used)
            return result
        Buffer.allocate = allocate
        return self

    def __exit__(self, *exc):
        Buffer.allocate = self.original

    @property
    def used(self) -> int:
        return self.peak - self.baseline


@pytest.mark.parametrize("case", [
    ((1, 4, 2, 64, 64, 32), dtypes.float32, dict()),
    ((2, 8, 2, 50, 70, 16), dtypes.bfloat16, dict(mask="causal", window=16)),
    ((1, 4, 2, 64, 64, 32), dtypes.float32, dict(mask="causal", max_score_bytes=4 * 4 * 64 * 8)),
    ((1, 4, 4, 128, 128, 16), dtypes.float16, dict(max_score_bytes=4 * 4 * 128 * 16)),
], ids=str)
def test_scratch_bytes_hold_against_tinygrad_memory(device, case):
    shape, dtype, options = case
    rng = np.random.default_rng(0x76)
    b, hq, hkv, lq, lk, d = shape
    q, k, v = (random(rng, s, dtype, device)[0].realize() for s in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    plan = fast.plan_attention(q.shape, k.shape, v.shape, dtype, device=device, **options)
    with PeakMemory() as memory:
        out = checked_attention(q, k, v, 0.1, **options)
    assert 0 < memory.used - out.nbytes() <= plan.scratch_bytes, (memory.used - out.nbytes(), plan)
    if "max_score_bytes" in options:
        # One block's scores at a time: far below every block's scores at once.
        assert isinstance(plan.kernel, fast.ComposedBlocks)
        assert memory.used - out.nbytes() < b * hq * lq * lk * 4


def test_symbolic_key_counts_need_the_decode_kernels():
    from tinygrad import UOp
    cache = Tensor.zeros(1, 2, 16, 8, device="CPU").contiguous().realize()
    length = UOp.variable("length", 1, 16, dtype=dtypes.int32).bind(5)
    q = Tensor.zeros(1, 2, 1, 8, device="CPU")
    with pytest.raises(ValueError, match="^scaled_dot_product_attention: a symbolic size"):
        fast.scaled_dot_product_attention(q, cache[:, :, :length], cache[:, :, :length], 1.0)
