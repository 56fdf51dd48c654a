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
  first pass on the matrix units (CUDA only: grouped-query rows, 16-bit K/V;
  `_cuda_matrix_route`), its threadgroups taking `block_groups` blocks in turn for a large batch
  and asking L2 for tiles `l2_ahead` rounds ahead where they are few.
- `Tiled()`: the tiled prefill kernel.
- `BlockedD512(rows)`: head size 512 in half precision, causal, run in blocks of `rows` rows.

Kernel routes are planned for targets with a kernel backend (`PlanTarget.backend` "metal" or
"cuda"). On Metal the rules are MLX's, with the GPU class from the device's name (`p` phone, `g`
base/Pro, `s` Max, `d` Ultra). On CUDA the routes are class `g`'s, but the decode kernels' key
blocks come from the multiprocessor count (`_cuda_vector_blocks`, read off the H200 sweep of
`scripts/tune_decode.py`); heads with at least `_CUDA_MATRIX_MIN_ROWS` query rows per key head
(grouped heads x query positions) in 16-bit types take the matrix-unit first pass, whose blocks
come from the same sweep run with `--matrix`.

Memory: the composition's score-sized intermediate is `B * Hq * rows * keys` float32 values;
`scratch_bytes` bounds everything a call allocates beyond its inputs and output.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import check, check_floating, check_int, check_tensor, is_floating, promote_types
from ..kernels import attention_backend
from ..kernels.attention import CUDA_LAUNCH, CUDA_MATRIX_WARPS, MATRIX_ROWS, geometry


@dataclass(frozen=True)
class Vector:
    """The decode kernels: `passes` 1 (`blocks` 1) or 2 (`blocks` key partitions), `dispatches`
    launches; `matrix`: the first pass on the matrix units (two passes), whose threadgroups
    per (batch item, key head, row group) are `block_groups`, each taking its share of the blocks
    in turn (0: one per block), and whose SIMD groups ask L2 for their tiles `l2_ahead` rounds
    ahead (0: not at all; a hint, so it may depend on the batch)."""
    passes: int
    blocks: int
    dispatches: int
    matrix: bool = False
    block_groups: int = 0
    l2_ahead: int = 0


@dataclass(frozen=True)
class Tiled:
    """The tiled prefill kernel."""


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


@dataclass(frozen=True)
class PlanTarget:
    """A device class to plan for: `backend` "metal", "cuda" or None (compositions only);
    `gpu_class` for Metal (`p`, `g`, `s`, `d`; None is `g`); `multiprocessors` for CUDA."""
    backend: str | None
    gpu_class: str | None = None
    multiprocessors: int | None = None


@dataclass(frozen=True)
class AttentionPlan:
    """What a call runs (`kernel`), the bytes it allocates beyond its inputs and output
    (`scratch_bytes`), its largest score-sized intermediate (`max_intermediate_bytes`), and
    whether `max_score_bytes` changed the route (`capped`)."""
    kernel: AttentionKernel
    scratch_bytes: int
    max_intermediate_bytes: int
    capped: bool


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
    return AttentionCall(b, hq, hkv, lq, lk, d, dv, dtype, mask_kind, sinks is not None, window, max_score_bytes)


# ---- targets ---------------------------------------------------------------------------------

def gpu_class_from_name(name: str) -> str:
    """MLX's GPU class from a Metal device's name: `d` Ultra, `s` Max, `g` other Macs (M-series), `p` phones and tablets."""
    if "Ultra" in name: return "d"
    if "Max" in name: return "s"
    if name.startswith("Apple M") or "Pro" in name: return "g"
    return "p"


@functools.cache
def _metal_gpu_class(device: str) -> str:
    try:
        from tinygrad.runtime.ops_metal import from_ns_str
        return gpu_class_from_name(from_ns_str(Device[device].sysdevice.name()))
    except Exception:  # noqa: BLE001 - an unreadable name plans as the base class
        return "g"


@functools.cache
def _cuda_multiprocessors(device: str) -> int | None:
    try:
        import ctypes
        from tinygrad.runtime.autogen import cuda
        count = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(count), cuda.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, Device[device].cu_device)
        return count.value or None
    except Exception:  # noqa: BLE001 - unknown: plan as for class g
        return None


def target_for_device(device: str) -> PlanTarget:
    """The plan target of a tinygrad device name: its kernel backend (None while kernels are off),
    its Metal GPU class or its CUDA multiprocessor count."""
    device = Device.canonicalize(device)
    backend = attention_backend(device)
    if backend == "metal": return PlanTarget("metal", _metal_gpu_class(device))
    if backend == "cuda": return PlanTarget("cuda", multiprocessors=_cuda_multiprocessors(device))
    return PlanTarget(None)


# ---- routing ---------------------------------------------------------------------------------

_TILED_HEADS = {(d, d) for d in (64, 72, 80, 96, 128, 192, 256)} | {(96, 64)}
_VECTOR_HEADS = {(d, d) for d in (64, 96, 128, 256, 512)} | {(192, 128), (96, 64)}
_HUGE_SCORES = 8 << 30
_BLOCKED_D512_ROWS, _BLOCKED_D512_MIN_ROWS = 256, 32


def _vector_blocks(gpu_class: str, queries: int, keys: int) -> int:
    """MLX's key partitions for the two-pass kernel: `queries` = grouped heads x query rows."""
    if gpu_class == "s":
        if keys > 1024 and queries > 4:
            return 128 if keys <= 8192 else 256 if keys <= 32768 else 512 if keys <= 65536 else 1024
        return 64
    if gpu_class == "d":
        if queries <= 2 and keys > 8192: return 256
        if queries >= 6 and keys >= 65536: return 1024
        if queries >= 6 and keys >= 16384: return 512
        return 128
    return 64 if queries >= 4 else 32


# The decode kernels' first pass on CUDA keeps about this many SIMD groups resident per
# multiprocessor (their registers allow 16 on the H200: 127 per thread at a group of 4 heads).
_CUDA_RESIDENT_WARPS = 16
_CUDA_MIN_BLOCK_KEYS = 64  # fewer keys per block and the merge costs more than the split saves
_CUDA_DEFAULT_MULTIPROCESSORS = 132


def _cuda_vector_blocks(call: AttentionCall, keys: int, multiprocessors: int | None) -> int:
    """Key blocks on CUDA: enough threadgroups for one wave of resident SIMD groups for one batch
    item, no block under `_CUDA_MIN_BLOCK_KEYS` keys, rounded down to a power of two (so that a
    growing cache compiles a few specialisations, not one per length). 1 is a single pass.

    The batch size is left out on purpose: a batch item's bits must not depend on the batch it
    runs in. On the H200 (132 multiprocessors) the sweep's best launches were 16 blocks at B=1,
    32/8, Lk=1024, and 32-64 at 16384 and 65536; at B=32 (32/8, 16384) the 32 blocks this gives
    ran 10% slower than one pass (`scripts/tune_decode.py`, `benchmarks/attention_h200.md`)."""
    shape = geometry(call.head_dim, call.v_head_dim, call.dtype, call.group * call.q_len, CUDA_LAUNCH.warps)
    threadgroups = call.kv_heads * shape.row_groups
    resident = (multiprocessors or _CUDA_DEFAULT_MULTIPROCESSORS) * _CUDA_RESIDENT_WARPS
    wanted = min(resident // (threadgroups * CUDA_LAUNCH.warps), keys // _CUDA_MIN_BLOCK_KEYS)
    return 1 << (wanted.bit_length() - 1) if wanted > 1 else 1


# The matrix-unit first pass on CUDA (`kernels/src/sdpa_decode_mma.h`): taken from this many query
# rows per key head. Its blocks leave the batch size out (an item's bits must not depend on its
# batch), so one count serves B = 1, which wants many short blocks (one item fills few
# multiprocessors), and a large batch, which wants few long ones: there every block still costs
# its epilogue (the SIMD groups' merge through threadgroup memory) and its partial. On the H200
# sweep (`scripts/tune_decode.py --matrix [--grouped]`, kept in `benchmarks/attention_h200.md`) the
# compromise that loses least against PyTorch at either end is about
# sqrt(keys / _CUDA_MATRIX_KEY_SCALE) blocks (4 at 1024 keys, 8 at 4096, 16 at 16384, 32 at
# 65536), a power of two (a growing cache compiles a few specialisations), and no more than fill
# `_CUDA_MATRIX_RESIDENT_WARPS` SIMD groups per multiprocessor for one item. A large batch runs
# the same blocks in about one wave of threadgroups (`_CUDA_MATRIX_RESIDENT_GROUPS` per
# multiprocessor: registers for about 250 a thread), each taking its share in turn.
_CUDA_MATRIX_MIN_ROWS = 4
_CUDA_MATRIX_RESIDENT_WARPS = 8
_CUDA_MATRIX_KEY_SCALE = 64
_CUDA_MATRIX_RESIDENT_GROUPS = 2
# Where the pass launches no more threadgroups than there are multiprocessors (B = 1, or a small
# batch over a short cache), one 4-SIMD-group threadgroup per multiprocessor leaves the loads'
# latency unhidden, and asking L2 for each SIMD group's tiles 2 rounds ahead (beyond the registers'
# one) gains 3-17% on the H200; with more, the memory is busy already and it costs 11-12% (B = 1
# 32/8 Lk 65536: 256 threadgroups). 3 rounds ahead is no better than 2 (`scripts/tune_decode.py
# --matrix --plan-only --l2 0,2,3`, in `benchmarks/attention_h200.md`). It changes no bits.
_CUDA_MATRIX_L2_AHEAD = 2


def _cuda_matrix_route(call: AttentionCall, keys: int, multiprocessors: int | None) -> Vector | None:
    """The matrix-unit decode pass, when the call fits it: float16 or bfloat16, head sizes up to
    128 (D a multiple of 32, DV of 64: the registers of two tiles in flight), enough rows per key
    head to fill the mma's rows. Its blocks, like the vector kernel's, leave the batch size out."""
    rows = call.group * call.q_len
    if (call.dtype not in (dtypes.float16, dtypes.bfloat16) or call.head_dim % 32 or call.v_head_dim % 64
            or call.head_dim > 128 or call.v_head_dim > 128 or rows < _CUDA_MATRIX_MIN_ROWS):
        return None
    multiprocessors = multiprocessors or _CUDA_DEFAULT_MULTIPROCESSORS
    threadgroups = call.kv_heads * -(-rows // MATRIX_ROWS)
    by_warps = multiprocessors * _CUDA_MATRIX_RESIDENT_WARPS // (threadgroups * CUDA_MATRIX_WARPS)
    by_keys = math.isqrt(keys // _CUDA_MATRIX_KEY_SCALE)
    wanted = min(by_warps, by_keys)
    blocks = 1 << (wanted.bit_length() - 1) if wanted > 1 else 1
    block_groups = matrix_block_groups(threadgroups, call.batch, blocks, multiprocessors)
    launched = threadgroups * call.batch * (block_groups or blocks)
    return Vector(passes=2, blocks=blocks, dispatches=2, matrix=True, block_groups=block_groups,
                  l2_ahead=_CUDA_MATRIX_L2_AHEAD if launched <= multiprocessors else 0)


def matrix_block_groups(threadgroups: int, batch: int, blocks: int, multiprocessors: int | None = None,
                        warps: int = CUDA_MATRIX_WARPS) -> int:
    """The matrix pass's threadgroups per (batch item, key head, row group) for `threadgroups` per
    item: a large batch runs the same blocks in about one wave of them, each taking its share in
    turn (a block's partial is the same whichever threadgroup computes it, so the bits stay the
    item's own); 0 where that is one per block. `warps`: SIMD groups per threadgroup (the resident
    SIMD groups fill fewer threadgroups of more)."""
    resident = max(1, _CUDA_MATRIX_RESIDENT_GROUPS * CUDA_MATRIX_WARPS // warps)
    wave = (multiprocessors or _CUDA_DEFAULT_MULTIPROCESSORS) * resident
    groups = max(1, min(blocks, wave // (threadgroups * batch)))
    return 0 if groups == blocks else groups


def _vector_route(call: AttentionCall, gpu_class: str, target: PlanTarget) -> Vector | None:
    heads = (call.head_dim, call.v_head_dim)
    if heads not in _VECTOR_HEADS or call.q_len > call.k_len or call.q_len * call.group > 32:
        return None
    if call.head_dim == 512 and not (call.q_len == 1 and call.group == 8 and call.mask != "array" and call.k_len >= 1024):
        return None
    keys = call.k_len if call.window is None else min(call.k_len, call.window + call.q_len - 1)
    if target.backend == "cuda":
        matrix = _cuda_matrix_route(call, keys, target.multiprocessors)
        if matrix is not None: return matrix
        blocks = _cuda_vector_blocks(call, keys, target.multiprocessors)
        return Vector(passes=1, blocks=1, dispatches=1) if blocks == 1 else Vector(passes=2, blocks=blocks, dispatches=2)
    two_pass = (gpu_class in ("d", "s") and keys >= 1024) or (call.group > 1 and keys >= 4096)
    if not two_pass:
        return Vector(passes=1, blocks=1, dispatches=1)
    return Vector(passes=2, blocks=_vector_blocks(gpu_class, call.group * call.q_len, keys), dispatches=2)


def _tiled_route(call: AttentionCall) -> bool:
    d = call.head_dim
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
    if call.q_len == 0 or call.k_len == 0:
        return AttentionPlan(Composed(), 0, 0, False)
    if target.backend is not None and call.dtype in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
        gpu_class = (target.gpu_class or "g") if target.backend == "metal" else "g"
        if call.q_len <= 8:
            vector = _vector_route(call, gpu_class, target)
            if vector is not None:
                partials = call.batch * call.q_heads * call.q_len * vector.blocks * (call.v_head_dim + 2) * 4
                return AttentionPlan(vector, partials if vector.passes == 2 else 0, 0, False)
        elif _blocked_d512(call):
            rows, capped = _BLOCKED_D512_ROWS, False
            while call.max_score_bytes is not None and call.score_bytes(rows) > call.max_score_bytes \
                    and rows >= 2 * _BLOCKED_D512_MIN_ROWS:
                rows, capped = rows // 2, True
            if call.max_score_bytes is None or call.score_bytes(rows) <= call.max_score_bytes:
                return AttentionPlan(BlockedD512(rows), _composed_scratch(call, rows), call.score_bytes(rows), capped)
        elif _tiled_route(call):
            return AttentionPlan(Tiled(), 0, 0, False)
    rows, capped = _composed_rows(call, op)
    kernel = Composed() if rows >= call.q_len else ComposedBlocks(rows)
    return AttentionPlan(kernel, _composed_scratch(call, rows), call.score_bytes(rows), capped)


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
        target = target_for_device(device if device is not None else Device.DEFAULT)
    return plan_call(call, target, op)


__all__ = ["Vector", "Tiled", "Composed", "ComposedBlocks", "BlockedD512", "PlanTarget", "AttentionPlan",
           "plan_attention", "validate_attention", "plan_call", "block_bounds", "target_for_device", "gpu_class_from_name"]
