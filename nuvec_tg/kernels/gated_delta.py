"""The gated delta rule's kernels. The recurrence (`src/gated_delta.h`): a SIMD group per few value
rows of a head's state, the rows in registers for the whole time loop; three variants: the final
state, every step's state (rounded to a storage dtype), and a slot pool read and written in place.
The chunked prefill (`src/gated_delta_chunks.h`, then `src/gated_delta_pass.h`): every chunk's WY
forms at once, then the state carried from chunk to chunk on the matrix units; the final state
and the slot pool. `plan` picks between them by the number of steps."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from . import Target
from . import debug, debugging
from . import target as _target
from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int32_indices, int_buffer, kernel_input, launch, \
    metal_limit_reason, threadgroup_array

_ROUND = {dtypes.float16: "round_half(x)", dtypes.bfloat16: "round_bfloat(x)", dtypes.float32: "(x)"}


@dataclass(frozen=True)
class Launch:
    """A threadgroup of `warps` SIMD groups, each serving `rows` value rows of a head's state."""
    warps: int
    rows: int


@dataclass(frozen=True)
class Chunked:
    """The chunked prefill's launch: chunks of `chunk` steps; the state pass's threadgroups of
    `warps` SIMD groups, 16 value rows each. A row's arithmetic does not depend on `warps`."""
    chunk: int
    warps: int


CHUNK = 32                  # steps a chunk: its tiles fit Metal's 32 KB of threadgroup memory at Dk 128
CHUNKED_WARPS = (1, 2, 4)
CHUNKED_MIN_STEPS = 32      # from here on the plan takes the chunked prefill where it can (equal to the recurrence at 32)
CHUNKED_WARPS_PLANNED = 4   # the H200's best at B 1 and 8
PREP_WARPS = 4              # the first pass's threadgroup
# The state pass's line buffers: on CUDA four, each chunk's copies in flight a whole chunk ahead (one
# phase's products are too short to hide a copy); Metal's copies are plain loads, done as issued.
PASS_STAGES = {"cuda": 4, "metal": 2}


def plan(steps: int, chunkable: bool = False) -> Launch | Chunked:
    """The launch for a call of `steps` steps: the chunked prefill from CHUNKED_MIN_STEPS steps
    where it can run (`chunkable`: `chunked_unsupported` gave no reason; four SIMD groups a
    threadgroup of the state pass); otherwise the recurrence, where a decode step (few steps) reads
    the key and query once for four rows (2 x 4) and a prefill runs more SIMD groups, each with a
    shorter chain per step (4 x 1). From the H200 sweeps (`tools/tune_gated_delta.py`,
    `benchmarks/gated_delta_h200.md`). A row's arithmetic is the same in every launch of a route,
    so its bits are too."""
    if chunkable and steps >= CHUNKED_MIN_STEPS: return Chunked(CHUNK, CHUNKED_WARPS_PLANNED)
    return Launch(2, 4) if steps <= 16 else Launch(4, 1)


def unsupported(types: tuple[DType, ...], batch: int, steps: int, value_heads: int, key_dim: int, value_dim: int,
                target: Target) -> str | None:
    """Why the kernel does not take a call on `target` (None when it does): float16, bfloat16 or
    float32 everywhere (`types`: the inputs', the state's and the steps' storage), bfloat16 only
    where the target has bfloat, Dk a multiple of 32, nothing empty (an empty call is the
    composition's), and on Metal a threadgroup within an Apple GPU's limits."""
    if 0 in (batch, steps, value_heads, value_dim): return "an empty call"
    if key_dim % 32: return f"Dk {key_dim} is not a multiple of 32"
    if any(t not in CTYPES for t in types): return "a float64 input, state or storage"
    if (reason := target.lacks(bfloat=dtypes.bfloat16 in types)) is not None: return reason
    if target.backend == "metal" and (reason := metal_limit_reason(metal_resources(plan(steps)))) is not None:
        return f"its threadgroup would take {reason}"
    return None


def metal_resources(shape: Launch) -> Resources:
    """The kernel's threadgroup on Metal for a launch shape: `shape.warps` SIMD groups and no
    threadgroup memory (each SIMD group's rows live in its registers)."""
    return Resources(32 * shape.warps, 0)


GATED_DELTA = Family("nuvec_gated_delta", ("gated_delta.h",), unsupported, plan)


def chunked_unsupported(types: tuple[DType, ...], key_dim: int, value_dim: int, target: Target) -> str | None:
    """Why the chunked prefill does not take a call that the recurrence takes (None when it does):
    q, k and v of one 16-bit dtype (the matrix units' operands), Dk and Dv multiples of 16, Dk up
    to 128 (the state's rows stay in registers), Dv up to 256, the target's matrix units, and on
    Metal both passes' threadgroups within its limits. types: q's, k's and v's dtypes."""
    if len(set(types)) != 1 or types[0] not in (dtypes.float16, dtypes.bfloat16): return "q, k and v not of one 16-bit dtype"
    if key_dim % 16 or value_dim % 16: return f"Dk {key_dim} or Dv {value_dim} not a multiple of 16"
    if key_dim > 128 or value_dim > 256: return f"Dk {key_dim} over 128 or Dv {value_dim} over 256"
    if (reason := target.lacks(matrix_units=True)) is not None: return reason
    if target.backend == "metal":
        resources = chunked_metal_resources(types[0], key_dim, value_dim, Chunked(CHUNK, max(CHUNKED_WARPS)))
        if (reason := metal_limit_reason(*resources)) is not None: return f"its threadgroup would take {reason}"
    return None


def chunked_metal_resources(dtype: DType, key_dim: int, value_dim: int, shape: Chunked) -> tuple[Resources, Resources]:
    """The two passes' threadgroups on Metal: the first's K and Q/V tiles, A, X, three per-step
    vectors and a 16 x 16 block; the second's line buffers and two within tiles."""
    c, size = shape.chunk, dtype.itemsize
    first = (threadgroup_array(c * (key_dim + 8), size) + threadgroup_array(c * (max(key_dim, value_dim) + 8), size)
             + 2 * threadgroup_array(c * (c + 1), 4) + 3 * threadgroup_array(c, 4) + threadgroup_array(16 * 16, 4))
    second = threadgroup_array(PASS_STAGES["metal"] * c * (key_dim + 8), size) + threadgroup_array(2 * c * (c + 8), size)
    return Resources(32 * PREP_WARPS, first), Resources(32 * shape.warps, second)


GATED_DELTA_CHUNKS = Family("nuvec_gated_delta_chunks", ("gated_delta_chunks.h",), chunked_unsupported, plan)
GATED_DELTA_PASS = Family("nuvec_gated_delta_pass", ("gated_delta_pass.h",), chunked_unsupported, plan)


def program(backend: str, types: dict[str, DType], mode: str, dk: int, dv: int, hk: int, hv: int, shape: Launch) -> Program:
    """One specialisation. types: the dtypes of `q`, `k`, `v`, `g`, `beta`, `state` (or the pool)
    and `storage` (the steps' storage; the state's dtype otherwise); mode: "final", "steps" or
    "slots"; shape: the launch (`plan`)."""
    ctypes = {key: CTYPES[dtype] for key, dtype in types.items()}
    defines = dict(TQ=ctypes["q"], TK=ctypes["k"], TV=ctypes["v"], TG=ctypes["g"], TB=ctypes["beta"], TS=ctypes["state"],
                   TO=ctypes["storage"], DK=dk, DV=dv, HK=hk, HV=hv, EK=dk // 32, WARPS=shape.warps, ROWS=shape.rows,
                   STATE_OUT=int(mode == "final"), STEPS_OUT=int(mode == "steps"), SLOTS=int(mode == "slots"))
    defines["ROUND_STORAGE(x)"] = _ROUND[types["storage"]]
    for which, key in (("S", "state"), ("O", "storage"), ("K", "k"), ("Q", "q")):
        defines.update(chunks(which, dk * types[key].itemsize, dk // 32 * types[key].itemsize))
    if mode == "slots":
        params = [Param("y", "out", ctypes["q"]), Param("pool", "out", ctypes["state"])]
    else:
        params = [Param("y", "out", ctypes["q"]), Param("state_out", "out", ctypes["state"]) if mode == "final" else
                  Param("states", "out", ctypes["storage"])]
    params += [Param(name, "in", ctypes[name]) for name in ("q", "k", "v", "g", "beta")]
    params += [Param("slots", "in", "int")] if mode == "slots" else [Param("state_in", "in", ctypes["state"])]
    params.append(Param("ints", "in", "int"))
    return GATED_DELTA.program(backend, defines, params)


def route(q: Tensor, k: Tensor, v: Tensor, mode: str) -> Launch | Chunked:
    """The plan's launch for a call of the kernel (`gated_delta_kernel`'s shapes; mode "final",
    "steps" or "slots"): every step's state keeps the recurrence."""
    steps, dk, dv = q.shape[1], q.shape[3], v.shape[3]
    reason = "every step's state" if mode == "steps" else chunked_unsupported((q.dtype, k.dtype, v.dtype), dk, dv, _target(q.device))
    shape = plan(steps, reason is None)
    if debugging():
        said = f"the chunked prefill ({shape.chunk}-step chunks, {shape.warps} SIMD groups a threadgroup)" \
            if isinstance(shape, Chunked) else f"the recurrence ({shape.warps} x {shape.rows})"
        if reason is not None and steps >= CHUNKED_MIN_STEPS: said += f", not chunked: {reason}"
        debug(f"gated_delta {mode} {tuple(q.shape)}: {said}")
    return shape


def chunks_program(backend: str, types: dict[str, DType], dk: int, dv: int, hk: int, hv: int, chunk: int,
                   log_decay: bool) -> Program:
    """The chunked prefill's first pass. types: the dtypes of `q` (k's and v's too), `g` and `beta`;
    log_decay: g holds the decay's natural logarithm."""
    t = CTYPES[types["q"]]
    defines = dict(T=t, TG=CTYPES[types["g"]], TB=CTYPES[types["beta"]], DK=dk, DV=dv, HK=hk, HV=hv, CHUNK=chunk,
                   WARPS=PREP_WARPS, DECAY_LOG=int(log_decay))
    params = [Param("w", "out", t), Param("u", "out", t), Param("within", "out", t), Param("c_out", "out", "float"),
              Param("q", "in", t), Param("k", "in", t), Param("v", "in", t), Param("g", "in", defines["TG"]),
              Param("beta", "in", defines["TB"]), Param("ints", "in", "int")]
    return GATED_DELTA_CHUNKS.program(backend, defines, params)


def pass_program(backend: str, types: dict[str, DType], dk: int, dv: int, hk: int, hv: int, shape: Chunked, slots: bool) -> Program:
    """The chunked prefill's second pass. types: the dtypes of `q` (k's, v's and y's), `g`, `beta`
    and `state` (or the pool's); slots: the pool variant."""
    t, ts = CTYPES[types["q"]], CTYPES[types["state"]]
    defines = dict(T=t, TS=ts, DK=dk, DV=dv, HK=hk, HV=hv, CHUNK=shape.chunk, WARPS=shape.warps, STAGES=PASS_STAGES[backend],
                   SLOTS=int(slots))
    params = [Param("y", "out", t), Param("pool" if slots else "state_out", "out", ts)]
    params += [Param("q", "in", t), Param("k", "in", t), Param("v", "in", t), Param("g", "in", CTYPES[types["g"]]),
               Param("beta", "in", CTYPES[types["beta"]]), Param("w", "in", t), Param("u", "in", t), Param("within", "in", t),
               Param("c_in", "in", "float")]
    params += [Param("slots", "in", "int")] if slots else [Param("state_in", "in", ts)]
    params.append(Param("ints", "in", "int"))
    return GATED_DELTA_PASS.program(backend, defines, params)


def chunk_forms(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, backend: str, chunk: int,
                log_decay: bool) -> list[Tensor]:
    """The chunked prefill's first pass (inputs contiguous, shapes as `gated_delta_kernel`'s):
    every chunk's `w [B, Hv, n * chunk, Dk]`, `u [B, Hv, n, Dv, chunk]` (each chunk's transposed)
    and `within [B, Hv, n, chunk, chunk]` in q's dtype, and `c [B, Hv, n * chunk]` (float32, the
    cumulative log2 decays), for the n chunks of T."""
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    device, count = q.device, -(-steps // chunk)
    types = dict(q=q.dtype, g=g.dtype, beta=beta.dtype)
    forms = [Tensor.empty(b, hv, count * chunk, dk, dtype=q.dtype, device=device),
             Tensor.empty(b, hv, count, dv, chunk, dtype=q.dtype, device=device),
             Tensor.empty(b, hv, count, chunk, chunk, dtype=q.dtype, device=device),
             Tensor.empty(b, hv, count * chunk, dtype=dtypes.float32, device=device)]
    return launch(chunks_program(backend, types, dk, dv, hk, hv, chunk, log_decay), device, forms,
                  [q, k, v, g, beta, int_buffer(device, (steps,))], (count, hv, b), 32 * PREP_WARPS,
                  label=f"{backend} gated_delta chunks Dk{dk} Dv{dv} Hk{hk} Hv{hv} chunk {chunk}")


def _chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, backend: str, shape: Chunked,
             slots: Tensor | None, composition: Callable | None, log_decay: bool) -> tuple[Tensor, Tensor]:
    """The chunked prefill's two launches (see `gated_delta_kernel`)."""
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    device = q.device
    types = dict(q=q.dtype, g=g.dtype, beta=beta.dtype, state=state.dtype)
    ins = [kernel_input(t) for t in (q, k, v, g, beta)]
    forms = chunk_forms(*ins, backend, shape.chunk, log_decay)
    program = pass_program(backend, types, dk, dv, hk, hv, shape, slots is not None)
    label = f"Dk{dk} Dv{dv} Hk{hk} Hv{hv} chunk {shape.chunk}, {shape.warps} SIMD groups"
    y = Tensor.empty(b, steps, hv, dv, dtype=q.dtype, device=device)
    grid = (-(-dv // (16 * shape.warps)), hv, b)
    if slots is not None:
        return tuple(launch(program, device, [y, state], ins + forms + [int32_indices(slots).contiguous(),
                            int_buffer(device, (steps, state.shape[0]))], grid, 32 * shape.warps, in_place=True,
                            label=f"{backend} gated_delta chunked slots {label}"))
    state = state.contiguous()
    backward = Backward("gated_delta", composition, (*ins, state), wrt=tuple(range(6))) if composition is not None else None
    out = Tensor.empty(b, hv, dv, dk, dtype=state.dtype, device=device)
    return tuple(launch(program, device, [y, out], ins + forms + [state, int_buffer(device, (steps,))], grid, 32 * shape.warps,
                        backward=backward, label=f"{backend} gated_delta chunked final {label}"))


def gated_delta_kernel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, *, backend: str,
                       storage: DType | None = None, slots: Tensor | None = None, composition: Callable | None = None,
                       shape: Launch | Chunked | None = None, log_decay: bool = False) -> tuple[Tensor, Tensor]:
    """Launch the rule. Shapes as `fast.gated_delta` (validated there); `state` is the `[B, Hv,
    Dv, Dk]` state, or with `slots` the `[P, Hv, Dv, Dk]` pool (updated in place). Returns `(y,
    final state)`, `(y, states [B, T, Hv, Dv, Dk] in storage)` with `storage`, or `(y, pool)`.
    composition: the same rule from tensor operations, `(q, k, v, g, beta, state) -> (y, second
    output)`, whose gradient is the kernel's backward (the slot pool, updated in place, has none).
    shape: the launch (default `plan(...)`: the chunked prefill for long calls where it can run;
    tuning passes others: a `Launch` is the recurrence, a `Chunked` the chunked prefill, which the
    caller has checked with `chunked_unsupported`; within a route they change no bit). log_decay:
    g holds the decay's natural logarithm (the composition then takes it so too)."""
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    device = q.device
    mode = "slots" if slots is not None else "steps" if storage is not None else "final"
    shape = shape or route(q, k, v, mode)
    if isinstance(shape, Chunked):
        return _chunked(q, k, v, g, beta, state, backend, shape, slots, composition, log_decay)
    if log_decay: raise ValueError("gated_delta_kernel: the recurrence takes the decay itself, not its logarithm")
    out_storage = storage if storage is not None else state.dtype
    types = dict(q=q.dtype, k=k.dtype, v=v.dtype, g=g.dtype, beta=beta.dtype, state=state.dtype, storage=out_storage)
    kernel = program(backend, types, mode, dk, dv, hk, hv, shape)
    y = Tensor.empty(b, steps, hv, dv, dtype=q.dtype, device=device)
    ins = [kernel_input(t) for t in (q, k, v, g, beta)]
    if mode == "slots":
        outs = [y, state]
        ins.append(int32_indices(slots).contiguous())
        runtime = (steps, state.shape[0])
    else:
        outs = [y, Tensor.empty(b, hv, dv, dk, dtype=state.dtype, device=device) if mode == "final" else
                Tensor.empty(b, steps, hv, dv, dk, dtype=out_storage, device=device)]
        ins.append(state.contiguous())
        runtime = (steps,)
    backward = None
    if composition is not None and mode != "slots":
        backward = Backward("gated_delta", composition, tuple(ins), wrt=tuple(range(6)))
    ins.append(int_buffer(device, runtime))
    grid = (math.ceil(dv / (shape.warps * shape.rows)), hv, b)
    return tuple(launch(kernel, device, outs, ins, grid, 32 * shape.warps, backward=backward, in_place=mode == "slots",
                        label=f"{backend} gated_delta {mode} Dk{dk} Dv{dv} Hk{hk} Hv{hv}"))


# ---- the gated DeltaNet layer's inputs to the rule (src/gated_delta_inputs.h)

INPUTS_MAX_TAPS = 8   # a thread keeps its channel's window and filter in registers


def inputs_unsupported(types: tuple[DType, ...], taps: int, key_dim: int, value_dim: int, target: Target) -> str | None:
    """Why the inputs kernel does not take a call on `target` (None when it does): float16, bfloat16
    or float32 everywhere (`types`: the projection's, the state's, the filters', a_log's and
    dt_bias's), bfloat16 only where the target has bfloat, 1 to INPUTS_MAX_TAPS taps, and a head's
    channels within a threadgroup (Dk and Dv up to 1024)."""
    if any(t not in CTYPES for t in types): return "a float64 input"
    if (reason := target.lacks(bfloat=dtypes.bfloat16 in types)) is not None: return reason
    if not 1 <= taps <= INPUTS_MAX_TAPS: return f"{taps} taps (the kernel takes 1 to {INPUTS_MAX_TAPS})"
    if max(key_dim, value_dim) > 1024: return f"a head of {max(key_dim, value_dim)} channels (a threadgroup holds 1024)"
    return None


def inputs_plan(key_dim: int, value_dim: int, taps: int, steps: int) -> tuple[int, int]:
    """The launch: (threads a threadgroup, groups of rows): a thread per channel of a head, then one
    group for the rows whose window reaches into the state and one per later row."""
    first = max(taps - 1, 1)
    return 32 * -(-max(key_dim, value_dim) // 32), 1 + max(0, steps - first)


GATED_DELTA_INPUTS = Family("nuvec_gated_delta_inputs", ("pieces.h", "gated_delta_inputs.h"), inputs_unsupported,
                            inputs_plan)


@dataclass(frozen=True)
class DeltaNetHeads:
    """A gated DeltaNet layer's heads: `key_heads` q and k heads of `key_dim`, `value_heads` v heads
    of `value_dim` (a multiple of key_heads), and its input projection's layout: `grouped`, per key
    head its q, k, its value heads' v and z, then per key head its value heads' b and a
    (Qwen3-Next's `in_proj_qkvz`, `in_proj_ba`); else all q, all k, all v, z, b, a (Qwen3.5's
    `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`)."""
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    grouped: bool = False

    @property
    def channels(self) -> int:
        """The convolution's channels: all q, all k, all v."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def width(self) -> int:
        """A projection row: the channels, z, b and a."""
        return self.channels + self.value_heads * (self.value_dim + 2)

    def split(self, projected: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Projection rows `[B, T, width]` to the convolution's input `[B, T, C]` (all q, all k,
        all v), z `[B, T, Hv, Dv]`, and b and a `[B, T, Hv]`."""
        b, t, _ = projected.shape
        hk, hv, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        if not self.grouped:
            mixed, z, beta, a = projected.split([self.channels, hv * dv, hv, hv], dim=-1)
            return mixed, z.reshape(b, t, hv, dv), beta, a
        group = hv // hk
        qkvz, ba = projected.split([hk * (2 * dk + 2 * group * dv), 2 * hv], dim=-1)
        q, k, v, z = qkvz.reshape(b, t, hk, 2 * dk + 2 * group * dv).split([dk, dk, group * dv, group * dv], dim=-1)
        beta, a = ba.reshape(b, t, hk, 2 * group).split([group, group], dim=-1)
        mixed = q.reshape(b, t, hk * dk).cat(k.reshape(b, t, hk * dk), v.reshape(b, t, hv * dv), dim=-1)
        return mixed, z.reshape(b, t, hv, dv), beta.reshape(b, t, hv), a.reshape(b, t, hv)


def inputs_program(backend: str, types: dict[str, DType], heads: DeltaNetHeads, taps: int, threads: int, eps: float,
                   slots: bool, log_decay: bool) -> Program:
    """One specialisation. types: the dtypes of the `projected` rows and the `conv` state (or pool),
    and of `filters`, `a_log` and `dt_bias`, which only the signature names."""
    c = {key: CTYPES[dtype] for key, dtype in types.items()}
    defines = dict(TP=c["projected"], TC=c["conv"],
                   HK=heads.key_heads, HV=heads.value_heads, DK=heads.key_dim, DV=heads.value_dim, TAPS=taps,
                   FIRST=max(taps - 1, 1), THREADS=threads, GROUPED=int(heads.grouped), SLOTS=int(slots),
                   DECAY_LOG=int(log_decay), L2_EPS=f"{eps / heads.key_dim!r}f", RSQRT_DK=f"{heads.key_dim ** -0.5!r}f")
    params = [Param(name, "out", c["projected"]) for name in ("q", "k", "v")] + [Param(name, "out", "float") for name in ("g", "beta")]
    params += [Param("conv", "out", c["conv"]), Param("projected", "in", c["projected"]), Param("filters", "in", c["filters"]),
               Param("a_log", "in", c["a_log"]), Param("dt_bias", "in", c["dt_bias"])]
    params += [Param("slots", "in", "int")] * slots + [Param("ints", "in", "int")]
    return GATED_DELTA_INPUTS.program(backend, defines, params)


def gated_delta_inputs_kernel(projected: Tensor, conv: Tensor, filters: Tensor, a_log: Tensor, dt_bias: Tensor,
                              heads: DeltaNetHeads, eps: float, *, backend: str, slots: Tensor | None = None,
                              log_decay: bool = False) -> tuple[Tensor, ...]:
    """Launch the inputs kernel (shapes as `fast.gated_delta_inputs`, validated there): returns
    `(q, k, v, g, beta, conv)`, the state (or pool) `conv` updated in place."""
    b, steps, width = projected.shape
    taps = filters.shape[1]
    device = projected.device
    types = dict(projected=projected.dtype, conv=conv.dtype, filters=filters.dtype, a_log=a_log.dtype, dt_bias=dt_bias.dtype)
    threads, groups = inputs_plan(heads.key_dim, heads.value_dim, taps, steps)
    program = inputs_program(backend, types, heads, taps, threads, eps, slots is not None, log_decay)
    hk, hv, dk, dv = heads.key_heads, heads.value_heads, heads.key_dim, heads.value_dim
    outs = [Tensor.empty(b, steps, hk, dk, dtype=projected.dtype, device=device),
            Tensor.empty(b, steps, hk, dk, dtype=projected.dtype, device=device),
            Tensor.empty(b, steps, hv, dv, dtype=projected.dtype, device=device),
            Tensor.empty(b, steps, hv, dtype=dtypes.float32, device=device),
            Tensor.empty(b, steps, hv, dtype=dtypes.float32, device=device), conv]
    ins = [kernel_input(t) for t in (projected, filters, a_log, dt_bias)]
    if slots is not None: ins.append(int32_indices(slots).contiguous())
    ins.append(int_buffer(device, (steps, width, conv.shape[0])))
    return tuple(launch(program, device, outs, ins, (2 * hk + hv, groups, b), threads, in_place=True,
                        label=f"{backend} gated_delta_inputs Dk{dk} Dv{dv} Hk{hk} Hv{hv} taps {taps}"))
