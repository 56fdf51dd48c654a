"""The gated delta rule, its steps, slots and chunked form, against a float64 numpy recurrence."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from gated_delta_reference import gated_delta_reference, transformers_cases
from reference import KERNEL_TOLERANCE, assert_close, assert_rows_close, finite_differences, random, values


def inputs(rng, b, t, hk, hv, dk, dv, dtype=dtypes.float64, state_dtype=dtypes.float64):
    (q, qv), (k, kv), (v, vv) = (random(rng, s, dtype, "CPU") for s in ((b, t, hk, dk), (b, t, hk, dk), (b, t, hv, dv)))
    gv, betav = 0.75 + 0.25 * rng.uniform(size=(b, t, hv)), 0.5 + 0.5 * rng.uniform(size=(b, t, hv))
    g, beta = (Tensor(a, device="CPU").cast(dtypes.float32 if dtype != dtypes.float64 else dtypes.float64) for a in (gv, betav))
    gv, betav = values(g), values(beta)
    state, sv = random(rng, (b, hv, dv, dk), state_dtype, "CPU")
    return (q, k, v, g, beta, state), (qv, kv, vv, gv, betav, sv)


@pytest.mark.float64
def test_gated_delta_fallback_matches_a_direct_formula():
    rng = np.random.default_rng(0x67)
    tensors, arrays = inputs(rng, 2, 4, 1, 2, 3, 2)
    y, s = fast.gated_delta(*tensors)
    want_y, want_s, _ = gated_delta_reference(*arrays)
    assert_close("y", values(y), want_y, 1e-12)
    assert_close("state", values(s), want_s, 1e-12)
    # Gradients of every input against central differences.
    def loss(*xs):
        y, s, _ = gated_delta_reference(*xs)
        return np.sum(y * y) + np.sum(s)
    y, s = fast.gated_delta(*tensors)
    grads = ((y * y).sum() + s.sum()).gradient(*tensors)
    Tensor.realize(*grads)
    for name, got, want in zip(["q", "k", "v", "g", "beta", "state"], grads, finite_differences(loss, list(arrays))):
        assert_close(f"d{name}", values(got), want, 1e-6)


def test_grouped_heads_and_half_precision():
    rng = np.random.default_rng(0x68)
    tensors, arrays = inputs(rng, 1, 3, 2, 4, 32, 8, dtypes.bfloat16, dtypes.float32)
    y, s = fast.gated_delta(*tensors)
    assert (y.dtype, s.dtype) == (dtypes.bfloat16, dtypes.float32) and y.shape == (1, 3, 4, 8)
    want_y, want_s, _ = gated_delta_reference(*arrays)
    assert_close("y", values(y), want_y, 2e-2)
    assert_close("state", values(s), want_s, 1e-5)
    # No steps: the state comes back unchanged.
    empty = [t[:, :0] for t in tensors[:5]]
    y, s = fast.gated_delta(*empty, tensors[5])
    assert y.shape == (1, 0, 4, 8)
    np.testing.assert_array_equal(values(s), arrays[5])


@pytest.mark.float64
def test_the_chunked_form_matches_the_recurrence():
    """Three chunks of 4 (the last padded), grouped heads, from a nonzero state (one chunk: the
    models' tests, at the default 64)."""
    rng = np.random.default_rng(0x6B)
    (q, k, v, g, beta, state), arrays = inputs(rng, 2, 10, 1, 2, 3, 2)
    want_y, want_s, _ = gated_delta_reference(*arrays)
    y, s = fast.gated_delta_chunked(q, k, v, g.log(), beta, state, chunk_size=4)
    assert (y.dtype, s.dtype, y.shape) == (dtypes.float64, dtypes.float64, (2, 10, 2, 2))
    assert_close("y", values(y), want_y, 1e-12)
    assert_close("state", values(s), want_s, 1e-12)
    y, s = fast.gated_delta_chunked(q[:, :0], k[:, :0], v[:, :0], g[:, :0].log(), beta[:, :0], state)
    assert y.shape == (2, 0, 2, 2)
    np.testing.assert_array_equal(values(s), arrays[5])


def bits(t):
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


@pytest.mark.parametrize("storage", [dtypes.float16, dtypes.bfloat16, dtypes.float32], ids=str)
def test_steps_round_each_state_to_its_storage(storage):
    rng = np.random.default_rng(41)
    for t_len, dk in ((1, 32), (4, 64)):
        (q, k, v, g, beta, state), _ = inputs(rng, 1, t_len, 2, 4, dk, 16, dtypes.bfloat16, dtypes.float32)
        k = k * 0.1
        y, states = fast.gated_delta_steps(q, k, v, g, beta, state, storage=storage)
        assert states.dtype == storage and states.shape == (1, t_len, 4, 16, dk)
        s = state.cast(storage).contiguous().realize()
        for t in range(t_len):
            at = lambda a: a[:, t:t + 1]  # noqa: E731
            yt, s = fast.gated_delta(at(q), at(k), at(v), at(g), at(beta), s)
            s = s.realize()
            np.testing.assert_array_equal(bits(y[:, t:t + 1]), bits(yt), err_msg=f"T {t_len} step {t}: output")
            np.testing.assert_array_equal(bits(states[:, t]), bits(s), err_msg=f"T {t_len} step {t}: state")
    if storage == dtypes.float32:  # the state's own dtype: the default storage
        y2, states2 = fast.gated_delta_steps(q, k, v, g, beta, state)
        np.testing.assert_array_equal(bits(y2), bits(y))
        np.testing.assert_array_equal(bits(states2), bits(states))
        final = fast.gated_delta(q, k, v, g, beta, state)[1]
        assert_close("final state", values(final), values(states[:, -1]), 1e-6)


def test_slots_equal_per_sequence_calls():
    rng = np.random.default_rng(0x69)
    (q, k, v, g, beta, _), _ = inputs(rng, 4, 2, 1, 2, 32, 4, dtypes.float32, dtypes.float32)
    pool, pool_values = random(rng, (5, 2, 4, 32), dtypes.float32, "CPU")
    slots = Tensor([3, -1, 0, 5], device="CPU")
    y, new_pool = fast.gated_delta_slots(q, k, v, g, beta, pool, slots)
    y, new_pool = values(y), values(new_pool)
    for b, slot in enumerate([3, -1, 0, 5]):
        if 0 <= slot < 5:
            want_y, want_s = fast.gated_delta(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1], pool[slot:slot + 1])
            assert_close(f"y {b}", y[b:b + 1], values(want_y), 1e-6)
            assert_close(f"pool {slot}", new_pool[slot:slot + 1], values(want_s), 1e-6)
        else:
            np.testing.assert_array_equal(y[b], 0.0)  # skipped: zeros
    for untouched in (1, 2, 4):
        np.testing.assert_array_equal(new_pool[untouched], pool_values[untouched].astype(np.float32))


@pytest.mark.float64
def test_the_chunked_form_on_slots_equals_each_sequence_alone():
    """`gated_delta_chunked` over a pool: each live sequence continues from its slot as the
    recurrence does from that state (chunks of 4, the last padded); a slot outside the pool gives
    zeros and changes nothing; the other slots keep their bits."""
    rng = np.random.default_rng(0x6C)
    (q, k, v, g, beta, _), arrays = inputs(rng, 3, 10, 1, 2, 3, 2)
    pool_values = rng.uniform(-1, 1, (4, 2, 2, 3))
    pool = Tensor(pool_values, device="CPU")
    slots = [2, -1, 0]
    y, new_pool = fast.gated_delta_chunked(q, k, v, g.log(), beta, pool, chunk_size=4, slots=Tensor(slots, device="CPU"))
    y, new_pool = values(y), values(new_pool)
    for b, slot in enumerate(slots):
        if slot < 0:
            np.testing.assert_array_equal(y[b], 0.0)
            continue
        want_y, want_s, _ = gated_delta_reference(*(a[b:b + 1] for a in arrays[:5]), pool_values[slot:slot + 1])
        assert_close(f"y {b}", y[b:b + 1], want_y, 1e-12)
        assert_close(f"slot {slot}", new_pool[slot:slot + 1], want_s, 1e-12)
    for untouched in (1, 3):
        np.testing.assert_array_equal(new_pool[untouched], pool_values[untouched])


INVALID = [
    (ValueError, "gated_delta", lambda q, k, v, g, b, s: fast.gated_delta(q, k, Tensor.zeros(2, 4, 3, 2, device="CPU"), g, b, s)),
    (ValueError, "gated_delta", lambda q, k, v, g, b, s: fast.gated_delta(q, k, v, Tensor.zeros(2, 4, 2, 1, device="CPU"), b, s)),
    (ValueError, "gated_delta", lambda q, k, v, g, b, s: fast.gated_delta(q, k, v, g, b, Tensor.zeros(2, 2, 3, 2, device="CPU"))),
    (ValueError, "gated_delta", lambda q, k, v, g, b, s: fast.gated_delta(q, k[:, :3], v, g, b, s)),
    (TypeError, "gated_delta", lambda q, k, v, g, b, s: fast.gated_delta(q.cast(dtypes.int32), k, v, g, b, s)),
    (TypeError, "gated_delta_steps", lambda q, k, v, g, b, s: fast.gated_delta_steps(q, k, v, g, b, s, storage=dtypes.int32)),
    (ValueError, "gated_delta_chunked", lambda q, k, v, g, b, s: fast.gated_delta_chunked(q, k, v, g, b, s, chunk_size=3)),
    (ValueError, "gated_delta_chunked", lambda q, k, v, g, b, s: fast.gated_delta_chunked(q, k, v, g[:, :3], b, s)),
    (ValueError, "gated_delta_chunked", lambda q, k, v, g, b, s: fast.gated_delta_chunked(q, k, v, g, b, s, slots=Tensor([0, 1, 2], device="CPU"))),
    (TypeError, "gated_delta_chunked", lambda q, k, v, g, b, s: fast.gated_delta_chunked(q, k, v, g, b, Tensor.zeros(3, 2, 2, 3, device="CPU"),
                                                                                          slots=Tensor([0.0, 1.0], device="CPU"))),
    (ValueError, "gated_delta_slots", lambda q, k, v, g, b, s: fast.gated_delta_slots(q, k, v, g, b, s, Tensor([0, 1, 2], device="CPU"))),
    (ValueError, "gated_delta_slots", lambda q, k, v, g, b, s: fast.gated_delta_slots(q, k, v, g, b, Tensor.zeros(3, 2, 2, 2, device="CPU"),
                                                                                       Tensor([0, 1], device="CPU"))),
    (TypeError, "gated_delta_slots", lambda q, k, v, g, b, s: fast.gated_delta_slots(q, k, v, g, b, Tensor.zeros(3, 2, 2, 3, device="CPU"),
                                                                                      Tensor([0.0, 1.0], device="CPU"))),
]


@pytest.mark.parametrize("error, op, call", INVALID)
def test_invalid_arguments(error, op, call):
    rng = np.random.default_rng(0x6A)
    tensors, _ = inputs(rng, 2, 4, 1, 2, 3, 2)
    with pytest.raises(error, match=f"^{op}: "):
        call(*tensors)


@pytest.mark.parametrize("name", list(transformers_cases()))
def test_transformers_chunked_rule_is_the_recurrence_and_the_chunked_composition(name):
    """transformers' `torch_chunk_gated_delta_rule` (chunks of 64) is the float64 recurrence up to
    float32 rounding (the fixture's conventions: q pre-scaled, the state's layout), and
    `gated_delta_chunked`'s composition (chunks of 64 and 32) matches it."""
    case = transformers_cases()[name]
    want_y, want_s, _ = gated_delta_reference(case["q"], case["k"], case["v"], np.exp(case["log_g"].astype(np.float64)),
                                              case["beta"], case["state"])
    assert_rows_close(f"{name} transformers y vs the recurrence", case["y"], want_y, KERNEL_TOLERANCE[dtypes.float32])
    assert_rows_close(f"{name} transformers state vs the recurrence", case["final"], want_s, KERNEL_TOLERANCE[dtypes.float32])
    tensors = [Tensor(case[key], device="CPU") for key in ("q", "k", "v", "log_g", "beta", "state")]
    for chunk_size in (64, 32):
        y, s = fast.gated_delta_chunked(*tensors, chunk_size=chunk_size)
        assert_rows_close(f"{name} chunked composition ({chunk_size}) y", values(y), case["y"], KERNEL_TOLERANCE[dtypes.float32])
        assert_rows_close(f"{name} chunked composition ({chunk_size}) state", values(s), case["final"], KERNEL_TOLERANCE[dtypes.float32])
