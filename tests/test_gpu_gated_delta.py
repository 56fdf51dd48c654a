"""The gated delta rule's kernel on a GPU (METAL or CUDA) against numpy and the composition on the
same device: the seeds' gated_delta_kernels_match_the_fallback shapes and dtype pairs, every step's
state, and the slot pool. Every call meant for the kernel asserts that it launched
(`expect_launches`); outputs and states are compared row by row (`assert_rows_close`, tolerances
in reference.py)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.fast.gated_delta import _recurrence as recurrence_composition
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import gated_delta as kernel
from gated_delta_reference import chunked_tolerance, gated_delta_reference, transformers_cases
import test_gated_delta_inputs as inputs_cases
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, random, values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
SHAPES = [(1, 1, 2, 4, 128, 128), (1, 9, 2, 4, 128, 64), (1, 3, 16, 32, 128, 128), (2, 5, 1, 2, 64, 48), (1, 4, 4, 4, 32, 17),
          (1, 17, 2, 4, 64, 32)]  # the seeds', then one past the decode launch (`kernels.gated_delta.plan`)
PAIRS = [(dtypes.float32, dtypes.float32), (dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float32),
         (dtypes.bfloat16, dtypes.bfloat16)]
KERNEL = "nuvec_gated_delta"


def inputs(rng, shape, dtype, gate):
    b, t, hk, hv, dk, dv = shape
    q = random(rng, (b, hk, t, dk), dtype, gpu)[0].transpose(1, 2)            # a transposed view, as projections give
    k = random(rng, (b, t, hk, dk), dtypes.float32, gpu)[0]
    k = (k / (k * k).sum(-1, keepdim=True).sqrt()).cast(dtype)                 # unit keys: the rule is stable
    v = random(rng, (b, t, hv, dv), dtype, gpu)[0]
    g = (random(rng, (b, t, hv), dtypes.float32, gpu)[0] * 0.1 + 0.85).cast(gate)
    beta = (random(rng, (b, t, hv), dtype, gpu)[0] * 0.2 + 0.5).cast(dtype)
    state = random(rng, (b, hv, dv, dk), gate, gpu)[0]
    return [x.realize() for x in (q, k, v, g, beta, state)]


def close(name, got: Tensor, want, dtype):
    """`got` within the kernels' tolerance of the float64 `want` (an array), or twice that of
    another tensor (the composition's, rounded too), row by row."""
    if isinstance(want, Tensor): assert_rows_close(name, values(got), values(want), COMPOSITION_TOLERANCE[dtype])
    else: assert_rows_close(name, values(got), want, KERNEL_TOLERANCE[dtype])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, gate", PAIRS, ids=lambda d: d.name)
def test_the_kernel_matches_numpy_and_the_composition(shape, dtype, gate):
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x68), shape, dtype, gate)
    with expect_launches(gpu, KERNEL):
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        Tensor.realize(y, s)
    with expect_launches(gpu, None), compositions_only():
        cy, cs = fast.gated_delta(q, k, v, g, beta, state)
        Tensor.realize(cy, cs)
    assert y.dtype == q.dtype and s.dtype == state.dtype
    want_y, want_s, _ = gated_delta_reference(*(values(x) for x in (q, k, v, g, beta, state)))
    close(f"{shape} y vs numpy", y, want_y, dtype)
    close(f"{shape} state vs numpy", s, want_s, gate)
    close(f"{shape} y vs composition", y, cy, dtype)
    close(f"{shape} state vs composition", s, cs, gate)
    # Every step's state: rounded to the state's dtype each step, as the composition does.
    with expect_launches(gpu, KERNEL):
        ys, states = fast.gated_delta_steps(q, k, v, g, beta, state)
        Tensor.realize(ys, states)
    with expect_launches(gpu, None), compositions_only():
        cys, cstates = fast.gated_delta_steps(q, k, v, g, beta, state)
        Tensor.realize(cys, cstates)
    assert tuple(states.shape) == (shape[0], shape[1], shape[3], shape[5], shape[4])
    want_ys, _, want_states = gated_delta_reference(*(values(x) for x in (q, k, v, g, beta, state)), storage=gate)
    close(f"{shape} steps y vs numpy", ys, want_ys, dtype)
    close(f"{shape} steps vs numpy", states, want_states, gate)
    close(f"{shape} steps y vs composition", ys, cys, dtype)
    close(f"{shape} steps vs composition", states, cstates, gate)
    if gate == dtypes.float32:  # no rounding between steps: the steps' outputs are the final call's, bit for bit
        np.testing.assert_array_equal(ys.float().numpy(), y.float().numpy())
        np.testing.assert_array_equal(states[:, -1].numpy(), s.numpy())


def test_the_slot_pool_is_updated_in_place_at_live_slots_only():
    rng = np.random.default_rng(0x5107)
    b, t, hk, hv, dk, dv = 4, 3, 2, 4, 64, 32
    q, k, v, g, beta, _ = inputs(rng, (b, t, hk, hv, dk, dv), dtypes.float32, dtypes.float32)
    pool = random(rng, (6, hv, dv, dk), dtypes.float32, gpu)[0].realize()
    before = pool.numpy().copy()
    slots = Tensor([4, -1, 1, 9], dtype=dtypes.int32, device=gpu)
    with expect_launches(gpu, None), compositions_only():
        cy, cpool = fast.gated_delta_slots(q, k, v, g, beta, Tensor(before, device=gpu), slots)
        Tensor.realize(cy, cpool)
    with expect_launches(gpu, KERNEL):
        y, updated = fast.gated_delta_slots(q, k, v, g, beta, pool, slots)
        Tensor.realize(y, updated)
    close("slots y", y, cy, dtypes.float32)
    assert not y.numpy()[[1, 3]].any()                                    # skipped sequences: zero outputs
    close("slots pool", updated, cpool, dtypes.float32)
    np.testing.assert_array_equal(updated.numpy()[[0, 2, 3, 5]], before[[0, 2, 3, 5]])  # untouched rows


def test_gradients_through_the_kernel_equal_the_compositions():
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x6A), (1, 3, 2, 4, 64, 32), dtypes.float32, dtypes.float32)
    targets = [q, k, v, g, beta, state]

    def loss():
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        return (y * y).sum() + (s * 0.5).sum()
    with expect_launches(gpu, KERNEL):  # the forward; the backward is the composition's
        grads = [x.realize() for x in loss().gradient(*targets)]
    with expect_launches(gpu, None), compositions_only():
        composed = [x.realize() for x in loss().gradient(*targets)]
    for name, got, want in zip("q k v g beta state".split(), grads, composed):
        close(f"d{name}", got, want, dtypes.float32)
    # Only y's gradient (the state's output gets none).
    with expect_launches(gpu, KERNEL):
        (dq,) = fast.gated_delta(q, k, v, g, beta, state)[0].sum().gradient(q)
        dq.realize()
    with expect_launches(gpu, None), compositions_only():
        (cq,) = fast.gated_delta(q, k, v, g, beta, state)[0].sum().gradient(q)
    close("dq (y only)", dq, cq, dtypes.float32)


# The chunked prefill: from CHUNKED_MIN_STEPS steps on, 16-bit q, k and v (`kernels.gated_delta.plan`).
CHUNKED = "nuvec_gated_delta_pass"
CHUNKED_SHAPES = [(1, 64, 2, 4, 128, 128), (1, 300, 2, 4, 128, 128), (2, 97, 1, 2, 64, 48), (1, 131, 16, 32, 128, 128),
                  (3, 65, 1, 1, 32, 16)]  # the plan's first chunked call, chunks partial and whole, Qwen3.5's heads
CHUNKED_PAIRS = [(dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.bfloat16),
                 (dtypes.float16, dtypes.float16)]


def chunked_close(name, got: Tensor, want, dtype, steps):
    assert_rows_close(name, values(got), want, chunked_tolerance(dtype, steps))


@pytest.mark.parametrize("shape", CHUNKED_SHAPES, ids=str)
@pytest.mark.parametrize("dtype, gate", CHUNKED_PAIRS, ids=lambda d: d.name)
def test_the_chunked_prefill_matches_numpy_and_the_recurrence(shape, dtype, gate):
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x25), shape, dtype, gate)
    with expect_launches(gpu, CHUNKED):
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        Tensor.realize(y, s)
    recurrent = kernel.Launch(4, 1)
    ry, rs = kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=kernel_backend(gpu), shape=recurrent)
    Tensor.realize(ry, rs)
    assert y.dtype == q.dtype and s.dtype == state.dtype
    want_y, want_s, _ = gated_delta_reference(*(values(x) for x in (q, k, v, g, beta, state)))
    steps = shape[1]
    chunked_close(f"{shape} y vs numpy", y, want_y, dtype, steps)
    chunked_close(f"{shape} state vs numpy", s, want_s, max(dtype, gate, key=lambda d: KERNEL_TOLERANCE[d]), steps)
    chunked_close(f"{shape} y vs the recurrent kernel", y, values(ry), dtype, steps)
    chunked_close(f"{shape} state vs the recurrent kernel", s, values(rs), max(dtype, gate, key=lambda d: KERNEL_TOLERANCE[d]), steps)


@pytest.mark.parametrize("warps", kernel.CHUNKED_WARPS)
def test_every_state_pass_launch_matches_numpy(warps):
    """Every threadgroup size of the state pass (the plan takes 4)."""
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x28), (2, 77, 2, 4, 128, 48), dtypes.bfloat16, dtypes.float32)
    with expect_launches(gpu, CHUNKED):
        y, s = kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=kernel_backend(gpu), shape=kernel.Chunked(kernel.CHUNK, warps))
        Tensor.realize(y, s)
    want_y, want_s, _ = gated_delta_reference(*(values(x) for x in (q, k, v, g, beta, state)))
    chunked_close(f"{warps} SIMD groups: y vs numpy", y, want_y, dtypes.bfloat16, 77)
    chunked_close(f"{warps} SIMD groups: state vs numpy", s, want_s, dtypes.bfloat16, 77)


def test_the_plan_takes_the_chunked_prefill_from_its_crossover():
    shape = (1, kernel.CHUNKED_MIN_STEPS - 1, 2, 4, 64, 32)
    short = inputs(np.random.default_rng(1), shape, dtypes.bfloat16, dtypes.float32)
    with expect_launches(gpu, KERNEL) as launches:
        Tensor.realize(*fast.gated_delta(*short))
    assert not any(name.startswith(CHUNKED) for name, _ in launches)
    long = inputs(np.random.default_rng(1), (1, kernel.CHUNKED_MIN_STEPS, 2, 4, 64, 32), dtypes.bfloat16, dtypes.float32)
    with expect_launches(gpu, CHUNKED):
        Tensor.realize(*fast.gated_delta(*long))
    # float32 activations and every step's state keep the recurrence
    long32 = inputs(np.random.default_rng(1), (1, kernel.CHUNKED_MIN_STEPS, 2, 4, 64, 32), dtypes.float32, dtypes.float32)
    with expect_launches(gpu, KERNEL) as launches:
        Tensor.realize(*fast.gated_delta(*long32))
        Tensor.realize(*fast.gated_delta_steps(*long))
    assert not any(name.startswith(CHUNKED) for name, _ in launches)


def test_the_chunked_prefill_gives_each_batch_item_its_bits_alone():
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x26), (3, 100, 2, 4, 128, 64), dtypes.bfloat16, dtypes.float32)
    with expect_launches(gpu, CHUNKED):
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        Tensor.realize(y, s)
    for i in range(3):
        one = [x[i:i + 1].contiguous().realize() for x in (q, k, v, g, beta, state)]
        with expect_launches(gpu, CHUNKED):
            y1, s1 = fast.gated_delta(*one)
            Tensor.realize(y1, s1)
        np.testing.assert_array_equal(y1.float().numpy(), y[i:i + 1].float().numpy())
        np.testing.assert_array_equal(s1.numpy(), s[i:i + 1].numpy())


def test_the_chunked_prefill_takes_the_decay_as_its_logarithm():
    """`gated_delta_chunked` (a model's prefill) hands the kernel the log decay itself."""
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x27), (2, 150, 2, 4, 128, 128), dtypes.bfloat16, dtypes.float32)
    with expect_launches(gpu, CHUNKED):
        y, s = fast.gated_delta_chunked(q, k, v, g.log(), beta, state)
        Tensor.realize(y, s)
    with expect_launches(gpu, None), compositions_only():
        cy, cs = fast.gated_delta_chunked(q, k, v, g.log(), beta, state)
        Tensor.realize(cy, cs)
    want_y, want_s, _ = gated_delta_reference(*(values(x) for x in (q, k, v, g, beta, state)))
    chunked_close("log decay y vs numpy", y, want_y, dtypes.bfloat16, 150)
    chunked_close("log decay state vs numpy", s, want_s, dtypes.bfloat16, 150)
    chunked_close("log decay y vs the chunked composition", y, values(cy), dtypes.bfloat16, 150)
    chunked_close("log decay state vs the chunked composition", s, values(cs), dtypes.bfloat16, 150)


def test_the_chunked_prefill_updates_live_slots_only():
    rng = np.random.default_rng(0x5108)
    b, t, hk, hv, dk, dv = 4, 70, 2, 4, 64, 32
    q, k, v, g, beta, _ = inputs(rng, (b, t, hk, hv, dk, dv), dtypes.float16, dtypes.float32)
    pool = random(rng, (6, hv, dv, dk), dtypes.float32, gpu)[0].realize()
    before = pool.numpy().copy()
    slots = Tensor([4, -1, 1, 9], dtype=dtypes.int32, device=gpu)
    ry, rpool = kernel.gated_delta_kernel(q, k, v, g, beta, Tensor(before, device=gpu).realize(), backend=kernel_backend(gpu),
                                          slots=slots, shape=kernel.Launch(4, 1))
    with expect_launches(gpu, CHUNKED):
        y, updated = fast.gated_delta_slots(q, k, v, g, beta, pool, slots)
        Tensor.realize(y, updated)
    chunked_close("chunked slots y vs the recurrent kernel", y, values(ry), dtypes.float16, t)
    assert not y.numpy()[[1, 3]].any()
    chunked_close("chunked slots pool vs the recurrent kernel", updated, values(rpool), dtypes.float16, t)
    np.testing.assert_array_equal(updated.numpy()[[0, 2, 3, 5]], before[[0, 2, 3, 5]])


def test_the_chunked_prefill_on_slots_takes_the_log_decay_and_equals_its_composition():
    """`gated_delta_chunked(..., slots=)` (a paged model's prefill): the chunked slot kernel on the
    log decay, against the composition (each live slot's state gathered, chunked, written back)."""
    rng = np.random.default_rng(0x5109)
    b, t, hk, hv, dk, dv = 3, 90, 2, 4, 128, 128
    q, k, v, g, beta, _ = inputs(rng, (b, t, hk, hv, dk, dv), dtypes.bfloat16, dtypes.float32)
    pool = random(rng, (5, hv, dv, dk), dtypes.float32, gpu)[0].realize()
    before = pool.numpy().copy()
    slots = Tensor([3, -1, 0], dtype=dtypes.int32, device=gpu)
    with expect_launches(gpu, None), compositions_only():
        cy, cpool = fast.gated_delta_chunked(q, k, v, g.log(), beta, Tensor(before, device=gpu), slots=slots)
        Tensor.realize(cy, cpool)
    with expect_launches(gpu, CHUNKED):
        y, updated = fast.gated_delta_chunked(q, k, v, g.log(), beta, pool, slots=slots)
        Tensor.realize(y, updated)
    chunked_close("chunked slots y vs the composition", y, values(cy), dtypes.bfloat16, t)
    chunked_close("chunked slots pool vs the composition", updated, values(cpool), dtypes.bfloat16, t)
    assert not y.numpy()[1].any()
    np.testing.assert_array_equal(updated.numpy()[[1, 2, 4]], before[[1, 2, 4]])


def test_gradients_through_the_chunked_prefill_equal_the_compositions():
    """The chunked launch carries the composition's backward (a short call forced onto it: the
    recurrence's composition over many steps would be slow to build)."""
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x6B), (1, 5, 2, 4, 64, 32), dtypes.float16, dtypes.float32)
    targets = [q, k, v, g, beta, state]

    rng = np.random.default_rng(0x6C)
    y_weights, s_weights = (Tensor(rng.standard_normal(shape).astype(np.float32), device=gpu) for shape in ((1, 5, 4, 32), (1, 4, 32, 64)))

    def loss(forced: bool):  # linear in the outputs: both backwards start from the same gradients
        if forced:
            y, s = kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=kernel_backend(gpu), shape=kernel.Chunked(kernel.CHUNK, 1),
                                             composition=lambda *x: recurrence_composition(*x, None))
        else:
            y, s = fast.gated_delta(q, k, v, g, beta, state)
        return (y.float() * y_weights).sum() + (s * s_weights).sum()
    with expect_launches(gpu, CHUNKED):
        grads = [x.realize() for x in loss(True).gradient(*targets)]
    with expect_launches(gpu, None), compositions_only():
        composed = [x.realize() for x in loss(False).gradient(*targets)]
    for name, got, want in zip("q k v g beta state".split(), grads, composed):
        close(f"d{name}", got, want, dtypes.float16 if name in ("q", "k", "v", "beta") else dtypes.float32)  # inputs' dtypes


@pytest.mark.parametrize("name", list(transformers_cases()))
def test_the_chunked_prefill_matches_transformers(name):
    """`gated_delta_chunked` with bfloat16 q, k, v on the kernel against transformers' chunked rule."""
    case = transformers_cases()[name]
    q, k, v = (Tensor(case[key], device=gpu).cast(dtypes.bfloat16).realize() for key in ("q", "k", "v"))
    log_g, beta, state = (Tensor(case[key], device=gpu).realize() for key in ("log_g", "beta", "state"))
    with expect_launches(gpu, CHUNKED):
        y, s = fast.gated_delta_chunked(q, k, v, log_g, beta, state)
        Tensor.realize(y, s)
    steps = case["q"].shape[1]
    chunked_close(f"{name} y vs transformers", y, case["y"], dtypes.bfloat16, steps)
    chunked_close(f"{name} state vs transformers", s, case["final"], dtypes.bfloat16, steps)


# `fast.gated_delta_inputs`: the layer's inputs kernel against the float64 reference and the
# composition on the same device (the cases of test_gated_delta_inputs.py, and Qwen3.5-9B's layer).
INPUT_CASES = {**inputs_cases.CASES,
               "qwen3_5_9b_decode_b2": inputs_cases.Case(2, 1, fast.DeltaNetHeads(16, 32, 128, 128), 4, (dtypes.bfloat16,) * 2 + (dtypes.float32,)),
               "qwen3_5_9b_prefill_t40": inputs_cases.Case(1, 40, fast.DeltaNetHeads(16, 32, 128, 128), 4,
                                                           (dtypes.bfloat16,) * 2 + (dtypes.float32,), log_decay=True)}


@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_the_deltanet_inputs_kernel_matches_numpy_and_the_composition(name):
    case = INPUT_CASES[name]
    x = inputs_cases.inputs(name, case)
    projected_t, conv_t, gate_t = case.types

    def call():
        tensors = {key: Tensor(x[key].astype(np.float32), device=gpu).cast(dtype).realize()
                   for key, dtype in (("projected", projected_t), ("conv", conv_t), ("filters", projected_t),
                                      ("a_log", gate_t), ("dt_bias", gate_t))}
        slots = Tensor(list(case.slots), dtype=dtypes.int32, device=gpu) if case.pool else None
        outs = fast.gated_delta_inputs(tensors["projected"], tensors["conv"], tensors["filters"], tensors["a_log"],
                                       tensors["dt_bias"], case.heads, slots=slots, eps=inputs_cases.EPS, log_decay=case.log_decay)
        Tensor.realize(*outs)
        return {key: values(out) for key, out in zip((*inputs_cases.OUTPUTS, "conv"), outs)}
    with expect_launches(gpu, "nuvec_gated_delta_inputs"):
        got = call()
    with expect_launches(gpu, None), compositions_only():
        composed = call()
    want = inputs_cases.expected(case, x)
    inputs_cases.check(f"{name} vs numpy", got, want, case)
    inputs_cases.check(f"{name} vs composition", got, composed, case, loose=3.0)
