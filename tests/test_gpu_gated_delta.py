"""The gated delta rule's kernel on a GPU (METAL or CUDA) against the composition on the same
device: the seeds' gated_delta_kernels_match_the_fallback shapes and dtype pairs, the kernel
actually running, every step's state, and the slot pool."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg.kernels import compositions_only, record_launches
from reference import random

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
SHAPES = [(1, 1, 2, 4, 128, 128), (1, 9, 2, 4, 128, 64), (1, 3, 16, 32, 128, 128), (2, 5, 1, 2, 64, 48), (1, 4, 4, 4, 32, 17),
          (1, 17, 2, 4, 64, 32)]  # the seeds', then one past the decode launch (`kernels.gated_delta.plan`)
PAIRS = [(dtypes.float32, dtypes.float32), (dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float32),
         (dtypes.bfloat16, dtypes.bfloat16)]
TOL = {dtypes.float32: 2e-4, dtypes.float16: 4e-3, dtypes.bfloat16: 3e-2}


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


def close(name, got, want, tol):
    got, want = got.float().numpy().astype(np.float64), want.float().numpy().astype(np.float64)
    scale = max(np.abs(want).max(), 1.0)
    assert np.abs(got - want).max() <= tol * scale, f"{name}: worst {np.abs(got - want).max()} (scale {scale})"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, gate", PAIRS, ids=lambda d: d.name)
def test_the_kernel_matches_the_composition(shape, dtype, gate):
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x68), shape, dtype, gate)
    with record_launches() as launches:
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        y, s = y.realize(), s.realize()
    assert [name for name, _ in launches if name.startswith("nuvec_gated_delta")], launches
    with compositions_only():
        cy, cs = (x.realize() for x in fast.gated_delta(q, k, v, g, beta, state))
    assert y.dtype == q.dtype and s.dtype == state.dtype
    close(f"{shape} y", y, cy, TOL[dtype])
    close(f"{shape} state", s, cs, TOL[gate])
    # Every step's state: rounded to the state's dtype each step, as the composition does.
    ys, states = fast.gated_delta_steps(q, k, v, g, beta, state)
    with compositions_only():
        cys, cstates = fast.gated_delta_steps(q, k, v, g, beta, state)
    assert tuple(states.shape) == (shape[0], shape[1], shape[3], shape[5], shape[4])
    close(f"{shape} steps y", ys, cys, TOL[dtype])
    close(f"{shape} steps", states, cstates, TOL[gate])
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
    with compositions_only():
        cy, cpool = (x.realize() for x in fast.gated_delta_slots(q, k, v, g, beta, Tensor(before, device=gpu), slots))
    y, updated = fast.gated_delta_slots(q, k, v, g, beta, pool, slots)
    y, updated = y.realize(), updated.realize()
    close("slots y", y, cy, TOL[dtypes.float32])
    assert not y.numpy()[[1, 3]].any()                                    # skipped sequences: zero outputs
    close("slots pool", updated, cpool, TOL[dtypes.float32])
    np.testing.assert_array_equal(updated.numpy()[[0, 2, 3, 5]], before[[0, 2, 3, 5]])  # untouched rows


def test_gradients_through_the_kernel_equal_the_compositions():
    q, k, v, g, beta, state = inputs(np.random.default_rng(0x6A), (1, 3, 2, 4, 64, 32), dtypes.float32, dtypes.float32)
    targets = [q, k, v, g, beta, state]

    def loss():
        y, s = fast.gated_delta(q, k, v, g, beta, state)
        return (y * y).sum() + (s * 0.5).sum()
    with record_launches() as launches:
        grads = [x.realize() for x in loss().gradient(*targets)]
    assert any(name.startswith("nuvec_gated_delta") for name, _ in launches)
    with compositions_only():
        composed = [x.realize() for x in loss().gradient(*targets)]
    for name, got, want in zip("q k v g beta state".split(), grads, composed):
        close(f"d{name}", got, want, 1e-4)
    # Only y's gradient (the state's output gets none).
    (dq,) = fast.gated_delta(q, k, v, g, beta, state)[0].sum().gradient(q)
    with compositions_only():
        (cq,) = fast.gated_delta(q, k, v, g, beta, state)[0].sum().gradient(q)
    close("dq (y only)", dq, cq, 1e-4)
