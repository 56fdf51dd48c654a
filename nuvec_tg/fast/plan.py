"""The attention plan: which program runs a `scaled_dot_product_attention` call, and its memory.

`plan_attention` is a pure function of the shapes, the dtype, the options and the target device
class: the same arguments give the same plan in any thread or process. It validates exactly as the
operation does (`validate_attention` is shared by both).

Routes:
- `Composed`: tinygrad operations over every query row at once.
- `ComposedBlocks(rows)`: the same in blocks of `rows` query rows, each over only the keys it can
  see (its causal prefix, cut to the window), so one block's scores are live at a time. Chosen to
  hold `max_score_bytes`.
- `Vector(passes, blocks, dispatches, matrix, block_groups, l2_ahead)`: the decode kernels
  (`Lq <= 8`); two passes split the keys into `blocks` partitions and merge them; `matrix`: the
  first pass on the matrix units (CUDA only: grouped-query rows, 16-bit K/V), its threadgroups
  taking `block_groups` blocks in turn for a large batch and asking L2 for tiles `l2_ahead`
  rounds ahead where they are few. What the kernels take and their launch are the kernels' own
  (`kernels/attention.py`: `decode_unsupported`, `decode_plan`).
- `Tiled()`: the tiled prefill kernel.
- `BlockedD512(rows)`: head size 512 in half precision, causal, run in blocks of `rows` rows.

Kernel routes are planned for targets with a kernel backend (`PlanTarget.backend` "metal" or
"cuda"). On Metal the rules are MLX's, with the GPU class from the device's name (`p` phone, `g`
base/Pro, `s` Max, `d` Ultra); bfloat16 takes a kernel only where the Metal language has bfloat
(`PlanTarget.bfloat`), and a kernel only where its threadgroups fit an Apple GPU's limits. On CUDA
the routes are class `g`'s, but the decode kernels' key blocks come from the multiprocessor count.
A plan whose route runs a composition says why no kernel does (`AttentionPlan.reason`;
NUVEC_DEBUG prints it).

Memory: the composition's score-sized intermediate is `B * Hq * rows * keys` float32 values;
`scratch_bytes` bounds everything a call allocates beyond its inputs and output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import DType

from .. import kernels
from ..kernels.attention import Vector, decode_metal_resources, decode_plan, decode_unsupported
from ..kernels.prefill import PREFILL_HEADS, Tiled
from ..kernels.prefill import plan as prefill_plan
from ..kernels.prefill import unsupported as prefill_unsupported
from ..kernels.program import metal_limit_reason
from ..tensor import check, check_floating, check_int, check_tensor, dtype_name, is_floating, promote_types


@dataclass(frozen=True)
class Composed:
    """The composition over every query row at once."""


@dataclass(frozen=True)
class ComposedBlocks:
    """The composition in blocks of `rows` query rows."""
    rows: int


@dataclass(frozen=True)
class BlockedD512:
    """Head size 512: blocks of `rows` query rows (grouped heads merged)."""
    rows: int


AttentionKernel = Vector | Tiled | Composed | ComposedBlocks | BlockedD512


# A device class to plan for (`kernels.Target`): `PlanTarget(backend, gpu_class, multiprocessors,
# bfloat, matrix_units)`.
PlanTarget = kernels.Target


@dataclass(frozen=True)
class AttentionPlan:
    """What a call runs (`kernel`), the bytes it allocates beyond its inputs and output
    (`scratch_bytes`), its largest score-sized intermediate (`max_intermediate_bytes`), whether
    `max_score_bytes` changed the route (`capped`), and, where a composition runs, why no kernel
    does (`reason`; empty where a kernel runs)."""
    kernel: AttentionKernel
    scratch_bytes: int
    max_intermediate_bytes: int
    capped: bool
    reason: str = field(default="", compare=False)


@dataclass(frozen=True)
class AttentionCall:
    """A validated attention call: what the plan and the composition read."""
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    v_head_dim: int
    dtype: DType
    mask: str            # "none", "causal" or "array"
    sinks: bool
    window: int | None   # None: no window (or one covering every key)
    max_score_bytes: int | None
    mask_copy_bytes: int = 0  # an array mask's copy for the kernels (booleans as bytes, another dtype cast)

    @property
    def group(self) -> int:
        """Query heads per key head."""
        return self.q_heads // self.kv_heads

    def key_range(self, start: int, end: int) -> tuple[int, int]:
        """The keys `[lo, hi)` that query rows `start..end` can see (all of them without a causal mask)."""
        if self.mask != "causal":
            return 0, self.k_len
        shift = self.k_len - self.q_len  # row i sees keys <= i + shift
        hi = min(self.k_len, max(0, end + shift))
        lo = 0 if self.window is None else max(0, start + shift - self.window + 1)
        return min(lo, hi), hi

    def score_bytes(self, rows: int) -> int:
        """The largest float32 score block over blocks of `rows` query rows.

        The keys a block sees never decrease from one full block to the next, so the largest is
        the last full block or the shorter final one."""
        rows = max(1, min(rows, self.q_len))
        full_blocks, tail = divmod(self.q_len, rows)
        blocks = [((full_blocks - 1) * rows, full_blocks * rows)] if full_blocks else []
        if tail: blocks.append((self.q_len - tail, self.q_len))
        largest = 0
        for start, end in blocks:
            lo, hi = self.key_range(start, end)
            largest = max(largest, (end - start) * (hi - lo))
        return self.batch * self.q_heads * largest * 4


def block_bounds(length: int, rows: int) -> list[tuple[int, int]]:
    """`[start, end)` of the blocks of `rows` query rows."""
    rows = max(rows, 1)
    return [(start, min(start + rows, length)) for start in range(0, length, rows)]


def validate_attention(op: str, q_shape, k_shape, v_shape, dtype: DType, mask, sinks, window,
                       max_score_bytes) -> AttentionCall:
    """Check an attention call's shapes, dtype and options; raise naming `op`."""
    # A symbolic size (a bound variable's expression) plans as its largest value.
    q_shape, k_shape, v_shape = (tuple(n if isinstance(n, int) else int(n.vmax) for n in s) for s in (q_shape, k_shape, v_shape))
    check(all(len(s) == 4 for s in (q_shape, k_shape, v_shape)), op,
          f"q, k and v must be 4-D [B, H, L, D], got {q_shape}, {k_shape} and {v_shape}")
    check(all(n >= 0 for s in (q_shape, k_shape, v_shape) for n in s), op,
          f"dimensions must not be negative, got {q_shape}, {k_shape} and {v_shape}")
    (b, hq, lq, d), (kb, hkv, lk, kd), (vb, vh, vl, dv) = q_shape, k_shape, v_shape
    check(kb == b and vb == b and kd == d and vh == hkv and vl == lk, op,
          f"incompatible shapes q {q_shape}, k {k_shape} and v {v_shape}")
    check(hkv > 0 and hq % hkv == 0, op, f"the query heads ({hq}) must be a multiple of the key heads ({hkv})")
    check_floating(op, "q, k and v (promoted)", dtype)
    mask_copy_bytes = 0
    if mask is None:
        mask_kind = "none"
    elif isinstance(mask, str):
        check(mask == "causal", op, f"mask must be None, 'causal' or a tensor, got {mask!r}")
        mask_kind = "causal"
    else:
        check_tensor(op, "mask", mask)
        check(mask.ndim <= 4, op, f"the mask must have at most 4 dimensions, got shape {tuple(mask.shape)}")
        full = (b, hq, lq, lk)
        fits = all(m in (1, f) for m, f in zip(reversed(mask.shape), reversed(full)))
        check(fits, op, f"the mask of shape {tuple(mask.shape)} does not broadcast to {full}")
        if mask.dtype != dtypes.bool:
            if not is_floating(mask.dtype) or promote_types(mask.dtype, dtype) != dtype:
                raise TypeError(f"{op}: an additive mask must be a float dtype that promotes to {dtype}, got {mask.dtype}")
        mask_kind = "array"
        count = 1
        for size in mask.shape: count *= size
        mask_copy_bytes = count if mask.dtype == dtypes.bool else 0 if mask.dtype == dtype else count * dtype.itemsize
    if sinks is not None:
        check_tensor(op, "sinks", sinks)
        check(sinks.ndim == 1 and sinks.shape[0] == hq, op, f"sinks must be [{hq}], got shape {tuple(sinks.shape)}")
        if not is_floating(sinks.dtype) or promote_types(sinks.dtype, dtype) != dtype:
            raise TypeError(f"{op}: sinks must be a float dtype that promotes to {dtype}, got {sinks.dtype}")
    if window is not None:
        check_int(op, "window", window, 1)
        check(mask_kind == "causal", op, "a window needs mask='causal'")
        if window >= lk:
            window = None  # every key a query can see is in its window: plain causal
    if max_score_bytes is not None: check_int(op, "max_score_bytes", max_score_bytes, 0)
    return AttentionCall(b, hq, hkv, lq, lk, d, dv, dtype, mask_kind, sinks is not None, window, max_score_bytes,
                         mask_copy_bytes)


# ---- routing ---------------------------------------------------------------------------------

_TILED_HEADS = {(d, d) for d in (64, 72, 80, 96, 128, 192, 256)} | {(96, 64)}
_HUGE_SCORES = 8 << 30
_BLOCKED_D512_ROWS, _BLOCKED_D512_MIN_ROWS = 256, 32


def _vector_route(call: AttentionCall, target: PlanTarget) -> Vector | str:
    """The decode kernels' launch for the call, or why they do not run it."""
    reason = decode_unsupported(call.head_dim, call.v_head_dim, call.q_len, call.k_len, call.group)
    if reason is not None: return reason
    if call.head_dim == 512 and not (call.q_len == 1 and call.group == 8 and call.mask != "array" and call.k_len >= 1024):
        return "head size 512 decodes on the kernel only for one query of 8 grouped heads over 1024+ keys, no array mask (MLX's rule)"
    if (reason := target.lacks(bfloat=call.dtype == dtypes.bfloat16)) is not None: return reason
    keys = call.k_len if call.window is None else min(call.k_len, call.window + call.q_len - 1)
    vector = decode_plan(target.backend, batch=call.batch, kv_heads=call.kv_heads, group=call.group, q_len=call.q_len,
                         keys=keys, head_dim=call.head_dim, value_dim=call.v_head_dim, dtype=call.dtype,
                         gpu_class=target.gpu_class, multiprocessors=target.multiprocessors)
    if target.backend == "metal":
        resources = decode_metal_resources(call.head_dim, call.v_head_dim, call.dtype, call.group * call.q_len, vector)
        if (reason := metal_limit_reason(*resources)) is not None: return f"the decode kernels would take {reason}"
    return vector


# Why the `BlockedD512` route runs blocks of the composition.
NO_D512_KERNEL = "head size 512 has no tiled kernel (the composition in blocks of rows)"


def _tiled_route(call: AttentionCall, target: PlanTarget) -> bool:
    """Whether a prefill call (more than 8 queries) takes the tiled kernel's route: on CUDA every
    head size the kernel takes; on Metal MLX's rules (its kernel's head sizes; 192 only above 8 GiB
    of scores, 256 above that or causal with `Lq >= 1024` and `Lk <= 8192`; no causal call with
    `Lq > Lk`)."""
    d = call.head_dim
    if target.backend == "cuda": return (d, call.v_head_dim) in PREFILL_HEADS
    if (d, call.v_head_dim) not in _TILED_HEADS or (call.mask == "causal" and call.q_len > call.k_len):
        return False
    huge = call.batch * call.q_heads * call.q_len * call.k_len * call.dtype.itemsize > _HUGE_SCORES
    if d == 192: return huge
    if d == 256:
        return huge or (call.mask == "causal" and call.q_len >= 1024 and call.k_len <= 8192)
    return True


def _blocked_d512(call: AttentionCall) -> bool:
    return (call.head_dim == call.v_head_dim == 512 and call.dtype in (dtypes.float16, dtypes.bfloat16) and call.mask == "causal"
            and not call.sinks and 1024 <= call.q_len <= call.k_len)


def _composed_rows(call: AttentionCall, op: str) -> tuple[int, bool]:
    """The most query rows per block whose scores fit the cap (all of them without one)."""
    cap = call.max_score_bytes
    if cap is None or call.score_bytes(call.q_len) <= cap:
        return call.q_len, False
    smallest = call.score_bytes(1)
    check(smallest <= cap, op, f"max_score_bytes {cap} is below one query row's scores; the smallest cap is {smallest}")
    lo, hi = 1, call.q_len  # score_bytes grows with rows: the largest rows within the cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if call.score_bytes(mid) <= cap else (lo, mid - 1)
    return lo, True


def _composed_scratch(call: AttentionCall, rows: int) -> int:
    """What the composition allocates: the scores and their exponentials (float32), per-row
    statistics, and the blocks' outputs before they are joined."""
    scores = call.score_bytes(rows)
    rows_stats = call.batch * call.q_heads * call.q_len * 4 * 4
    outputs = call.batch * call.q_heads * call.q_len * call.v_head_dim * 4 * 2
    return 2 * scores + rows_stats + outputs


def plan_call(call: AttentionCall, target: PlanTarget, op: str = "plan_attention") -> AttentionPlan:
    """The plan of a validated call on `target`."""
    if 0 in (call.batch, call.q_heads, call.q_len, call.k_len):
        return AttentionPlan(Composed(), 0, 0, False, "nothing to attend (an empty batch, head, query or key axis)")
    if target.backend is None:
        reason = "the target has no kernels"
    elif call.dtype not in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
        reason = f"{dtype_name(call.dtype)} has no kernel"
    elif call.q_len <= 8:
        vector = _vector_route(call, target)
        if isinstance(vector, Vector):
            partials = call.batch * call.q_heads * call.q_len * vector.blocks * (call.v_head_dim + 2) * 4
            return AttentionPlan(vector, (partials if vector.passes == 2 else 0) + call.mask_copy_bytes, 0, False)
        reason = vector
    elif _blocked_d512(call):
        rows, capped = _BLOCKED_D512_ROWS, False
        while call.max_score_bytes is not None and call.score_bytes(rows) > call.max_score_bytes \
                and rows >= 2 * _BLOCKED_D512_MIN_ROWS:
            rows, capped = rows // 2, True
        if call.max_score_bytes is None or call.score_bytes(rows) <= call.max_score_bytes:
            return AttentionPlan(BlockedD512(rows), _composed_scratch(call, rows), call.score_bytes(rows), capped,
                                 NO_D512_KERNEL)
        reason = f"max_score_bytes {call.max_score_bytes} is below {_BLOCKED_D512_MIN_ROWS} rows' scores"
    elif _tiled_route(call, target):
        reason = prefill_unsupported(call.head_dim, call.v_head_dim, call.dtype, target)
        if reason is None:
            shape = prefill_plan(target.backend, call.head_dim, call.v_head_dim, call.mask == "array", target.warpgroups)
            return AttentionPlan(shape, call.mask_copy_bytes, 0, False)
    else:
        reason = f"{call.q_len} queries of head sizes D {call.head_dim} / DV {call.v_head_dim} have no tiled route"
    rows, capped = _composed_rows(call, op)
    kernel = Composed() if rows >= call.q_len else ComposedBlocks(rows)
    return AttentionPlan(kernel, _composed_scratch(call, rows), call.score_bytes(rows), capped, reason)


def plan_attention(q_shape, k_shape, v_shape, dtype: DType, *, mask=None, sinks: Tensor | None = None,
                   window: int | None = None, max_score_bytes: int | None = None,
                   device: str | PlanTarget | None = None) -> AttentionPlan:
    """The plan `scaled_dot_product_attention` runs for these shapes, dtype and options.

    q_shape `[B, Hq, Lq, D]`, k_shape `[B, Hkv, Lk, D]`, v_shape `[B, Hkv, Lk, Dv]`; dtype: the
    promoted dtype of q, k and v. mask: None, "causal" or a tensor (only its shape and dtype are
    read); sinks: a `[Hq]` tensor or None. device: a tinygrad device name (default: the default
    device) or a `PlanTarget`. Raises as the operation does on invalid arguments.
    """
    op = "plan_attention"
    call = validate_attention(op, q_shape, k_shape, v_shape, dtype, mask, sinks, window, max_score_bytes)
    if isinstance(device, PlanTarget):
        check(device.backend in (None, "metal", "cuda"), op, f"unknown backend {device.backend!r}")
        check(device.gpu_class in (None, "p", "g", "s", "d"), op, f"unknown GPU class {device.gpu_class!r}")
        target = device
    else:
        target = kernels.target(device if device is not None else Device.DEFAULT)
    return plan_call(call, target, op)


__all__ = ["Vector", "Tiled", "Composed", "ComposedBlocks", "BlockedD512", "PlanTarget", "AttentionPlan",
           "plan_attention", "validate_attention", "plan_call", "block_bounds"]
