"""The gated delta kernel (`src/gated_delta.h`) run on the CPU from its CUDA rendering
(`kernel_emulator`), against a float64 numpy recurrence: one step and several, both launches of
the plan (2 SIMD groups x 4 rows up to 16 steps, 4 x 1 beyond), value rows past a threadgroup's
(Dv not a multiple of its rows), grouped key heads, each lane's share of a row in one, two and
four elements (Dk 32, 64, 128), float32, float16 and bfloat16 inputs, states and step storage in
mixed combinations; the three variants (the final state, every step's state rounded to its
storage, a slot pool read and written in place), the pool with slots past it and negative (zero
outputs, no pool row touched)."""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from tinygrad import dtypes
from tinygrad.dtype import DType

from emulated_decode import Edit, from_bits, to_bits
from gated_delta_reference import chunked_tolerance, transformers_cases
from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import gated_delta as kernel
from reference import KERNEL_TOLERANCE, assert_rows_close, round_to

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
NAMES = ("q", "k", "v", "g", "beta", "state")
TOLERANCE = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}


@dataclass(frozen=True)
class Case:
    """A call: `mode` "final", "steps" (each step's state in `storage`) or "slots" (a pool of `pool`
    states at `slots`); q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`; `types` the dtypes of q, k, v,
    g, beta and the state (or pool)."""
    mode: str
    batch: int
    steps: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    types: tuple[DType, ...]
    storage: DType | None = None
    pool: int = 0
    slots: tuple[int, ...] = ()


CASES = {
    # One step (a decode), float32 throughout; Dv 12 over threadgroups of 8 rows: the second has 4 past Dv.
    "one_step_f32": Case("final", 2, 1, 1, 2, 32, 12, (F32,) * 6),
    # Three steps, 16-bit q, k, v with float32 gates and state; 2 value heads per key head.
    "grouped_bf16_inputs": Case("final", 1, 3, 2, 4, 64, 8, (BF16, BF16, BF16, F32, F32, F32)),
    # 17 steps (a prefill: 4 SIMD groups of one row), float16 throughout, a lane's share of 4 halves.
    "prefill_f16": Case("final", 1, 17, 1, 1, 128, 6, (F16,) * 6),
    # Every step's state rounded to bfloat16 (and continued from it), from a float32 state.
    "steps_bf16_storage": Case("steps", 2, 4, 1, 2, 32, 9, (F16, F16, F16, BF16, F16, F32), storage=BF16),
    # Every step's state in float16, from a bfloat16 state, float32 inputs.
    "steps_f16_storage": Case("steps", 1, 2, 2, 2, 64, 8, (F32, F32, F32, F32, F32, BF16), storage=F16),
    # A bfloat16 pool: live slots, one past the pool, one negative; untouched rows must stay.
    "slots_hostile_bf16": Case("slots", 4, 2, 1, 2, 64, 8, (BF16,) * 6, pool=3, slots=(2, -1, 5, 0)),
    "slots_f32": Case("slots", 2, 1, 1, 1, 128, 5, (F32,) * 6, pool=2, slots=(1, 2)),
}


def round_storage(x: np.ndarray, dtype: DType | None) -> np.ndarray:
    return x if dtype is None else round_to(x, dtype)


def recurrence(q, k, v, g, beta, state, storage: DType | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rule in float64: `(y [B, T, Hv, Dv], final state [B, Hv, Dv, Dk])`, or with `storage`
    every step's state `[B, T, Hv, Dv, Dk]`, each rounded to it and continued from (the first
    from the state rounded)."""
    steps, group = q.shape[1], v.shape[2] // q.shape[2]
    s = round_storage(np.array(state, np.float64), storage)
    ys, states = [], []
    for t in range(steps):
        key, query = np.repeat(k[:, t], group, axis=1)[:, :, None, :], np.repeat(q[:, t], group, axis=1)[:, :, None, :]
        s = s * g[:, t][:, :, None, None]
        correction = (v[:, t] - (s * key).sum(-1)) * beta[:, t][:, :, None]
        s = s + key * correction[..., None]
        ys.append((s * query).sum(-1))
        if storage is not None:
            s = round_to(s, storage)
            states.append(s)
    return np.stack(ys, 1), (np.stack(states, 1) if storage is not None else s)


def inputs(name: str, case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The case's arrays in the kernel's elements and as float64 (keys of unit length, decays in
    (0.75, 1), rates in (0.5, 1): a stable recurrence)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    b, t, hk, hv, dk, dv = case.batch, case.steps, case.key_heads, case.value_heads, case.key_dim, case.value_dim
    k = rng.standard_normal((b, t, hk, dk))
    state_shape = (case.pool, hv, dv, dk) if case.mode == "slots" else (b, hv, dv, dk)
    raw = {"q": rng.standard_normal((b, t, hk, dk)) * 0.5, "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
           "v": rng.standard_normal((b, t, hv, dv)), "g": rng.uniform(0.75, 1, (b, t, hv)),
           "beta": rng.uniform(0.5, 1, (b, t, hv)), "state": rng.standard_normal(state_shape) * 0.3}
    arrays = {name: to_bits(raw[name], dtype) for name, dtype in zip(NAMES, case.types)}
    return arrays, {name: from_bits(arrays[name], dtype) for name, dtype in zip(NAMES, case.types)}


def emulated(case: Case, arrays: dict[str, np.ndarray], edit: Edit | None = None) -> dict[str, np.ndarray]:
    """The kernel's outputs (`y`, and `state_out`, `states` or the updated `pool`) as float64."""
    b, t, hv, dk, dv = case.batch, case.steps, case.value_heads, case.key_dim, case.value_dim
    shape = kernel.plan(t)
    types = dict(zip(NAMES, case.types), storage=case.storage or case.types[5])
    program = kernel.program("cuda", types, case.mode, dk, dv, case.key_heads, hv, shape)
    program = program if edit is None else edit(program)

    def filled(dims, dtype):  # NaN patterns: an output the kernel misses shows
        return np.full(dims, np.nan, np.float32) if dtype == F32 else np.full(dims, 0xFFFF, np.uint16)
    buffers = dict(arrays, y=filled((b, t, hv, dv), case.types[0]))
    if case.mode == "slots":
        buffers.update(pool=arrays["state"].copy(), slots=np.array(case.slots, np.int32), ints=np.array([t, case.pool], np.int32))
    else:
        buffers.update(state_in=arrays["state"], ints=np.array([t], np.int32))
        if case.mode == "final": buffers["state_out"] = filled((b, hv, dv, dk), case.types[5])
        else: buffers["states"] = filled((b, t, hv, dv, dk), case.storage)
    build(program)([buffers[p.name] for p in program.params], -(-dv // (shape.warps * shape.rows)), 32 * shape.warps, hv, b)
    second = {"final": ("state_out", case.types[5]), "steps": ("states", case.storage), "slots": ("pool", case.types[5])}[case.mode]
    return {"y": from_bits(buffers["y"], case.types[0]), second[0]: from_bits(buffers[second[0]], second[1])}


def expected(case: Case, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The case's outputs from the float64 recurrence (y rounded to q's dtype, states to theirs)."""
    q, k, v, g, beta, state = (values[name] for name in NAMES)
    if case.mode != "slots":
        y, second = recurrence(q, k, v, g, beta, state, case.storage)
        which, dtype = ("states", case.storage) if case.mode == "steps" else ("state_out", case.types[5])
        return {"y": round_to(y, case.types[0]), which: round_to(second, dtype)}
    slots = np.array(case.slots)
    live = (slots >= 0) & (slots < case.pool)
    y, final = recurrence(q, k, v, g, beta, state[np.where(live, slots, 0)])
    pool = state.copy()
    pool[slots[live]] = round_to(final[live], case.types[5])
    return {"y": round_to(np.where(live[:, None, None, None], y, 0), case.types[0]), "pool": pool}


def check_gated_delta(name: str, edit: Edit | None = None) -> None:
    """The case through the emulated kernel (its program edited first where asked) against numpy:
    y and the state(s), each row within the tolerance of its largest element."""
    case = CASES[name]
    arrays, values = inputs(name, case)
    got, want = emulated(case, arrays, edit), expected(case, values)
    for which in want:
        dtype = case.storage if which == "states" else case.types[0] if which == "y" else case.types[5]
        assert_rows_close(f"{name} {which}", got[which], want[which], TOLERANCE[dtype])


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_gated_delta_matches_numpy(name):
    check_gated_delta(name)


def test_the_hostile_slots_leave_their_rows_and_give_zeros():
    """Slots past the pool and negative: zero outputs, and the pool's rows that no live slot names
    keep their bits (the comparison above allows a tolerance; this does not)."""
    case = CASES["slots_hostile_bf16"]
    arrays, _ = inputs("slots_hostile_bf16", case)
    got = emulated(case, arrays)
    assert not got["y"][[1, 2]].any() and got["y"][[0, 3]].all()
    np.testing.assert_array_equal(got["pool"][1], from_bits(arrays["state"], BF16)[1])


# The chunked prefill (`src/gated_delta_chunks.h`, then `src/gated_delta_pass.h`): its two passes
# chained through their buffers, against the same float64 recurrence.
@dataclass(frozen=True)
class ChunkedCase:
    """A chunked call: q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]` of the 16-bit `activation`, g
    and beta of `gate`, the state (or a pool of `pool` states at `slots`) of `state`; the state
    pass's threadgroups of `warps` SIMD groups; `log_decay`: g passed as its logarithm."""
    batch: int
    steps: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    activation: DType
    gate: DType
    state: DType
    warps: int = 1
    log_decay: bool = False
    pool: int = 0
    slots: tuple[int, ...] = ()


CHUNKED_CASES = {
    # Two chunks, the second partial; bfloat16 activations, float32 gates and state.
    "chunked_bf16": ChunkedCase(1, 40, 1, 2, 32, 16, BF16, F32, F32),
    # Three chunks over two batch items, two value heads a key head, float16 state, 2 SIMD groups
    # a threadgroup (Dv 48: the second threadgroup's second SIMD group lies past Dv).
    "chunked_f16_grouped": ChunkedCase(2, 70, 1, 2, 64, 48, F16, F32, F16, warps=2),
    # One whole chunk, Dk 128 (a Qwen3.5 head), the decay given as its logarithm, bfloat16 gates.
    "chunked_log_decay": ChunkedCase(1, 32, 2, 2, 128, 32, BF16, BF16, F32, log_decay=True),
    # The plan's 4 SIMD groups a threadgroup at Dk 128: Dv 48 leaves the fourth past Dv; three chunks.
    "chunked_four_groups": ChunkedCase(1, 90, 1, 2, 128, 48, BF16, F32, F32, warps=4),
    # A pool at Dk 32 (slot 3 past it, row 2 untouched), 2 SIMD groups a threadgroup, the second past Dv.
    "chunked_slots_dk32": ChunkedCase(3, 40, 1, 1, 32, 16, F16, F32, F16, warps=2, pool=3, slots=(1, 3, 0)),
    # A pool: live slots, one past it, one negative.
    "chunked_slots": ChunkedCase(4, 33, 1, 1, 32, 32, F16, F32, BF16, pool=3, slots=(2, -1, 5, 0)),
}


def chunked_inputs(name: str, case: ChunkedCase) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """As `inputs`: the arrays in the kernel's elements and as float64 (g as the decay itself)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    b, t, hk, hv, dk, dv = case.batch, case.steps, case.key_heads, case.value_heads, case.key_dim, case.value_dim
    k = rng.standard_normal((b, t, hk, dk))
    decay = rng.uniform(0.75, 1, (b, t, hv))
    raw = {"q": rng.standard_normal((b, t, hk, dk)) * 0.5, "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
           "v": rng.standard_normal((b, t, hv, dv)), "g": np.log(decay) if case.log_decay else decay,
           "beta": rng.uniform(0.5, 1, (b, t, hv)),
           "state": rng.standard_normal((case.pool, hv, dv, dk) if case.slots else (b, hv, dv, dk)) * 0.3}
    types = dict(q=case.activation, k=case.activation, v=case.activation, g=case.gate, beta=case.gate, state=case.state)
    arrays = {key: to_bits(raw[key], types[key]) for key in NAMES}
    values = {key: from_bits(arrays[key], types[key]) for key in NAMES}
    if case.log_decay: values["g"] = np.exp(values["g"])
    return arrays, values


def emulated_chunked(case: ChunkedCase, arrays: dict[str, np.ndarray], metal_tiles: bool = False, first_edit: Edit | None = None,
                     second_edit: Edit | None = None) -> dict[str, np.ndarray]:
    """Both passes' outputs: `y`, and `state_out` or the updated `pool`, as float64 (`metal_tiles`:
    on the Metal prelude's simdgroup matrices, whose operands stay float; `first_edit`,
    `second_edit`: the passes' programs edited first)."""
    b, t, hk, hv, dk, dv = case.batch, case.steps, case.key_heads, case.value_heads, case.key_dim, case.value_dim
    c = kernel.CHUNK
    count = -(-t // c)
    types = dict(q=case.activation, g=case.gate, beta=case.gate, state=case.state)
    prep = kernel.chunks_program("cuda", types, dk, dv, hk, hv, c, case.log_decay)
    prep = prep if first_edit is None else first_edit(prep)
    half = lambda *dims: np.full(dims, 0xFFFF, np.uint16)  # noqa: E731 - NaN patterns: an element the first pass misses shows
    forms = dict(w=half(b, hv, count * c, dk), u=half(b, hv, count, dv, c), within=half(b, hv, count, c, c),
                 c_out=np.full((b, hv, count * c), np.nan, np.float32))
    buffers = dict(arrays, **forms, ints=np.array([t], np.int32))
    build(prep, metal_tiles)([buffers[p.name] for p in prep.params], count, 32 * kernel.PREP_WARPS, hv, b)
    shape = kernel.Chunked(c, case.warps)
    program = kernel.pass_program("cuda", types, dk, dv, hk, hv, shape, bool(case.slots))
    program = program if second_edit is None else second_edit(program)
    buffers = dict(arrays, w=forms["w"], u=forms["u"], within=forms["within"], c_in=forms["c_out"],
                   y=np.full((b, t, hv, dv), 0xFFFF, np.uint16))
    if case.slots:
        buffers.update(pool=arrays["state"].copy(), slots=np.array(case.slots, np.int32), ints=np.array([t, case.pool], np.int32))
    else:
        filled = np.full((b, hv, dv, dk), np.nan, np.float32) if case.state == F32 else np.full((b, hv, dv, dk), 0xFFFF, np.uint16)
        buffers.update(state_in=arrays["state"], state_out=filled, ints=np.array([t], np.int32))
    build(program, metal_tiles)([buffers[p.name] for p in program.params], -(-dv // (16 * case.warps)),
                                32 * case.warps, hv, b)
    second = "pool" if case.slots else "state_out"
    return {"y": from_bits(buffers["y"], case.activation), second: from_bits(buffers[second], case.state)}


def check_chunked(name: str, metal_tiles: bool = False, first_edit: Edit | None = None, second_edit: Edit | None = None) -> None:
    """The chunked case through both emulated passes (edited where asked) against the float64
    recurrence: y and the state (or the pool), each row within `chunked_tolerance`, and a pool's
    rows that no live slot names unchanged, bit for bit."""
    case = CHUNKED_CASES[name]
    arrays, values = chunked_inputs(name, case)
    got = emulated_chunked(case, arrays, metal_tiles, first_edit, second_edit)
    q, k, v, g, beta, state = (values[key] for key in NAMES)
    tol = max(chunked_tolerance(case.activation, case.steps), KERNEL_TOLERANCE[case.state])
    if case.slots:
        slots = np.array(case.slots)
        live = (slots >= 0) & (slots < case.pool)
        y, final = recurrence(q, k, v, g, beta, state[np.where(live, slots, 0)])
        y = np.where(live[:, None, None, None], y, 0)
        pool = state.copy()
        pool[slots[live]] = final[live]
        assert_rows_close(f"{name} y", got["y"], y, tol)
        assert_rows_close(f"{name} pool", got["pool"], pool, tol)
        untouched = sorted(set(range(case.pool)) - set(slots[live].tolist()))
        np.testing.assert_array_equal(got["pool"][untouched], state[untouched])  # no live slot names them: their bits stay
    else:
        y, final = recurrence(q, k, v, g, beta, state)
        assert_rows_close(f"{name} y", got["y"], y, tol)
        assert_rows_close(f"{name} state", got["state_out"], final, tol)


@pytest.mark.parametrize("metal_tiles", [False, True], ids=["mma", "metal_tiles"])
@pytest.mark.parametrize("name", list(CHUNKED_CASES))
def test_emulated_chunked_prefill_matches_numpy(name, metal_tiles):
    check_chunked(name, metal_tiles)


@pytest.mark.parametrize("name", list(transformers_cases()))
def test_emulated_chunked_prefill_matches_transformers(name):
    """Both passes (bfloat16 q, k, v; the decay as its logarithm) against transformers' chunked rule."""
    case = transformers_cases()[name]
    b, t, hk, dk = case["q"].shape
    hv, dv = case["v"].shape[2:]
    shape = ChunkedCase(b, t, hk, hv, dk, dv, BF16, F32, F32, warps=4, log_decay=True)
    arrays = {"q": to_bits(case["q"], BF16), "k": to_bits(case["k"], BF16), "v": to_bits(case["v"], BF16),
              "g": case["log_g"], "beta": case["beta"], "state": case["state"]}
    got = emulated_chunked(shape, arrays)
    assert_rows_close(f"{name} y", got["y"], case["y"], chunked_tolerance(BF16, t))
    assert_rows_close(f"{name} state", got["state_out"], case["final"], chunked_tolerance(BF16, t))
