"""`fast.gated_delta_inputs`: a gated DeltaNet layer's inputs to the rule from its projection. The
kernel (`src/gated_delta_inputs.h`) run on the CPU from its CUDA rendering (`kernel_emulator`) and
the composition (tinygrad on the CPU), both against a float64 numpy reference: both projection
layouts (Qwen3.5's separate parts, Qwen3-Next's per key head), one row and several (the rows whose
window reaches into the state in one threadgroup, each later row in its own), fewer rows than the
state holds (the new state part old, part new), value heads narrower than key heads (threads past
a head's channels), a slot pool with slots past it and negative (zero features, no row touched),
the decay and its logarithm, float32, float16 and bfloat16; then the checks of bad input."""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from emulated_decode import from_bits, to_bits
from kernel_emulator import COMPILER, build
from nuvec_tg import fast
from nuvec_tg.fast import DeltaNetHeads
from nuvec_tg.kernels import gated_delta as kernel
from reference import assert_rows_close, round_to

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
TOLERANCE = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}   # of the projection's dtype: the features are rounded to it
EPS = 1e-6
OUTPUTS = ("q", "k", "v", "g", "beta")


@dataclass(frozen=True)
class Case:
    """A call: B sequences of T rows of a layer of `heads`, a filter of `taps`, the projection's,
    the state's and the gates' (a_log, dt_bias) dtypes; with `pool` rows, `slots`."""
    batch: int
    steps: int
    heads: DeltaNetHeads
    taps: int
    types: tuple[DType, DType, DType]
    pool: int = 0
    slots: tuple[int, ...] = ()
    log_decay: bool = False


CASES = {
    # A decode step of Qwen3.5's layout: two sequences, 4 value heads of 16 over 2 key heads of 32.
    "decode_separate_bf16": Case(2, 1, DeltaNetHeads(2, 4, 32, 16), 4, (BF16, BF16, F32)),
    # Five rows of Qwen3-Next's layout: rows 0-2 reach into the state, rows 3 and 4 one group each;
    # value heads of 40 channels in threadgroups of 64 threads.
    "prefill_grouped_f32": Case(1, 5, DeltaNetHeads(1, 2, 64, 40, grouped=True), 4, (F32, F32, F32), log_decay=True),
    # Two rows (fewer than the state's 3): the new state is the old's last row, then both new rows.
    "short_grouped_f16": Case(2, 2, DeltaNetHeads(2, 4, 32, 32, grouped=True), 4, (F16, F32, F16)),
    # A pool: slot 1, one past the pool, one negative, slot 0; rows the live slots do not name stay.
    "slots_hostile_bf16": Case(4, 1, DeltaNetHeads(1, 1, 32, 32), 4, (BF16, BF16, BF16), pool=3, slots=(1, 3, -1, 0)),
    # A pool over three rows and a filter of 2 taps (a state of one row).
    "slots_prefill_f32": Case(2, 3, DeltaNetHeads(1, 2, 32, 8), 2, (F32, F32, F32), pool=2, slots=(1, 0), log_decay=True),
}


def inputs(name: str, case: Case) -> dict[str, np.ndarray]:
    """The case's arrays as float64, already representable in their dtypes."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    h = case.heads
    rows = case.pool if case.pool else case.batch
    projected_t, conv_t, gate_t = case.types
    return {"projected": round_to(rng.standard_normal((case.batch, case.steps, h.width)), projected_t),
            "conv": round_to(rng.standard_normal((rows, case.taps - 1, h.channels)), conv_t),
            "filters": round_to(rng.standard_normal((h.channels, case.taps)) * 0.5, projected_t),
            "a_log": round_to(rng.uniform(-1, 1, h.value_heads), gate_t),
            "dt_bias": round_to(rng.uniform(-1, 1, h.value_heads), gate_t)}


def numpy_split(projected: np.ndarray, h: DeltaNetHeads) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The convolution's input `[B, T, C]` and b, a `[B, T, Hv]` of projection rows."""
    b, t, _ = projected.shape
    if not h.grouped:
        c, hv = h.channels, h.value_heads
        start = c + hv * h.value_dim
        return projected[..., :c], projected[..., start:start + hv], projected[..., start + hv:start + 2 * hv]
    group = h.value_heads // h.key_heads
    block = 2 * h.key_dim + 2 * group * h.value_dim
    qkvz = projected[..., :h.key_heads * block].reshape(b, t, h.key_heads, block)
    ba = projected[..., h.key_heads * block:].reshape(b, t, h.key_heads, 2 * group)
    dk, dv = h.key_dim, h.value_dim
    mixed = np.concatenate([qkvz[..., :dk].reshape(b, t, -1), qkvz[..., dk:2 * dk].reshape(b, t, -1),
                            qkvz[..., 2 * dk:2 * dk + group * dv].reshape(b, t, -1)], axis=-1)
    return mixed, ba[..., :group].reshape(b, t, -1), ba[..., group:].reshape(b, t, -1)


def expected(case: Case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 reference, rounded where the contract rounds (the convolution and SiLU to the
    projection's dtype, the new state to its own)."""
    h, (projected_t, conv_t, _) = case.heads, case.types
    b, t = case.batch, case.steps
    hk, hv, dk, dv = h.key_heads, h.value_heads, h.key_dim, h.value_dim
    mixed, beta_in, a_in = numpy_split(x["projected"], h)
    if case.pool:
        slots = np.array(case.slots)
        live = (slots >= 0) & (slots < case.pool)
        history = np.where(live[:, None, None], x["conv"][np.where(live, slots, 0)], 0.0)
    else:
        live, history = np.ones(b, bool), x["conv"]
    sequence = np.concatenate([round_to(history, projected_t), mixed], axis=1)       # [B, K - 1 + T, C]
    convolved = sum(x["filters"][:, j] * sequence[:, j:j + t] for j in range(case.taps))
    convolved = round_to(convolved, projected_t)
    features = round_to(convolved / (1 + np.exp(-convolved)), projected_t) * live[:, None, None]
    q = features[..., :hk * dk].reshape(b, t, hk, dk)
    k = features[..., hk * dk:2 * hk * dk].reshape(b, t, hk, dk)
    v = features[..., 2 * hk * dk:].reshape(b, t, hv, dv)
    def l2(x): return x / np.sqrt((x * x).sum(-1, keepdims=True) + EPS)
    log_decay = -np.exp(x["a_log"]) * np.log1p(np.exp(a_in + x["dt_bias"]))
    out = {"q": round_to(l2(q) / np.sqrt(dk), projected_t), "k": round_to(l2(k), projected_t), "v": v,
           "g": log_decay if case.log_decay else np.exp(log_decay),
           "beta": 1 / (1 + np.exp(-beta_in))}
    new = round_to(sequence[:, t:], conv_t)
    if case.pool:
        pool = x["conv"].copy()
        pool[slots[live]] = new[live]
        out["conv"] = pool
    else:
        out["conv"] = new
    return out


def emulated(case: Case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The kernel's outputs as float64 (each output buffer filled with NaN first: a miss shows)."""
    h, (projected_t, conv_t, gate_t) = case.heads, case.types
    b, t = case.batch, case.steps
    types = dict(projected=projected_t, conv=conv_t, filters=projected_t, a_log=gate_t, dt_bias=gate_t)
    threads, groups = kernel.inputs_plan(h.key_dim, h.value_dim, case.taps, t)
    program = kernel.inputs_program("cuda", types, h, case.taps, threads, EPS, bool(case.pool), case.log_decay)
    shapes = {"q": (b, t, h.key_heads, h.key_dim), "k": (b, t, h.key_heads, h.key_dim),
              "v": (b, t, h.value_heads, h.value_dim), "g": (b, t, h.value_heads), "beta": (b, t, h.value_heads)}
    def filled(dims, dtype):   # NaN patterns: an output the kernel misses shows
        return np.full(dims, np.nan, np.float32) if dtype == F32 else np.full(dims, 0xFFFF, np.uint16)
    out_types = {"q": projected_t, "k": projected_t, "v": projected_t, "g": F32, "beta": F32}
    buffers = {name: filled(shape, out_types[name]) for name, shape in shapes.items()}
    buffers.update({name: to_bits(x[name], types[name]) for name in ("projected", "conv", "filters", "a_log", "dt_bias")})
    rows = case.pool if case.pool else b
    buffers["slots"] = np.array(case.slots, np.int32)
    buffers["ints"] = np.array([t, h.width, rows], np.int32)
    build(program)([buffers[p.name] for p in program.params], 2 * h.key_heads + h.value_heads, threads, groups, b)
    got = {name: from_bits(buffers[name], out_types[name]) for name in OUTPUTS}
    got["conv"] = from_bits(buffers["conv"], conv_t)
    return got


def composition(case: Case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`fast.gated_delta_inputs` on the CPU (the composition), as float64."""
    projected_t, conv_t, gate_t = case.types
    tensors = {name: Tensor(x[name].astype(np.float32)).cast(dtype)
               for name, dtype in (("projected", projected_t), ("conv", conv_t), ("filters", projected_t),
                                   ("a_log", gate_t), ("dt_bias", gate_t))}
    slots = Tensor(list(case.slots), dtype=dtypes.int32) if case.pool else None
    outs = fast.gated_delta_inputs(tensors["projected"], tensors["conv"], tensors["filters"], tensors["a_log"],
                                   tensors["dt_bias"], case.heads, slots=slots, eps=EPS, log_decay=case.log_decay)
    return {name: out.float().numpy().astype(np.float64) for name, out in zip((*OUTPUTS, "conv"), outs)}


def check(name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray], case: Case, loose: float = 1.0) -> None:
    tolerance = TOLERANCE[case.types[0]] * loose
    for which in (*OUTPUTS, "conv"):
        assert_rows_close(f"{name} {which}", got[which], want[which], 0.0 if which == "conv" else tolerance)


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernel_matches_numpy(name):
    case = CASES[name]
    x = inputs(name, case)
    check(name, emulated(case, x), expected(case, x), case)


@pytest.mark.parametrize("name", list(CASES))
def test_composition_matches_numpy(name):
    case = CASES[name]
    x = inputs(name, case)
    # tinygrad rounds each 16-bit product of the convolution and SiLU's sigmoid too: a few units more
    check(name, composition(case, x), expected(case, x), case, loose=3.0)


def test_the_dead_slots_give_zeros_and_leave_the_pool():
    """Slots past the pool and negative: zero q, k and v, and the pool's row no live slot names
    keeps its bits (checked exactly, where the comparison above allows a tolerance)."""
    case = CASES["slots_hostile_bf16"]
    x = inputs("slots_hostile_bf16", case)
    got = emulated(case, x) if COMPILER is not None else composition(case, x)
    assert not got["q"][[1, 2]].any() and not got["v"][[1, 2]].any() and got["v"][[0, 3]].any()
    np.testing.assert_array_equal(got["conv"][2], x["conv"][2])


@pytest.mark.parametrize("change, message", [
    (dict(projected=Tensor.zeros(1, 1, 10)), "projected must be"),
    (dict(filters=Tensor.zeros(3, 4)), r"filters \[32, K\], .* got .*\(3, 4\)"),
    (dict(conv=Tensor.zeros(1, 3, 48)), r"conv \[\.\., K - 1, 32\], .* got .*\(1, 3, 48\)"),
    (dict(conv=Tensor.zeros(2, 3, 32)), r"conv must be \[1, 3, 32\]"),
    (dict(a_log=Tensor.zeros(3)), "a_log and dt_bias"),
    (dict(slots=Tensor([0, 1], dtype=dtypes.int32)), "slots must be"),
    (dict(slots=Tensor([0.0])), "slots"),
    (dict(projected=Tensor.zeros(1, 1, 52, dtype=dtypes.int32)), "projected"),
    (dict(heads=DeltaNetHeads(2, 3, 8, 8)), "heads must be"),
])
def test_bad_input_raises_naming_the_operation(change, message):
    heads = DeltaNetHeads(1, 2, 8, 8)   # channels 32, width 32 + 2 * 10 = 52
    args = dict(projected=Tensor.zeros(1, 1, heads.width), conv=Tensor.zeros(1, 3, heads.channels),
                filters=Tensor.zeros(heads.channels, 4), a_log=Tensor.zeros(2), dt_bias=Tensor.zeros(2), heads=heads)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=f"gated_delta_inputs.*{message}"):
        fast.gated_delta_inputs(**args)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_q_k_and_v_take_the_projections_dtype_and_the_gates_float32(dtype):
    heads = DeltaNetHeads(1, 2, 8, 8)
    outs = fast.gated_delta_inputs(Tensor.zeros(1, 2, heads.width, dtype=dtype), Tensor.zeros(1, 3, heads.channels, dtype=dtype),
                                   Tensor.zeros(heads.channels, 4, dtype=dtype), Tensor.zeros(2), Tensor.zeros(2), heads)
    assert [o.dtype for o in outs] == [dtype, dtype, dtype, F32, F32, dtype]
