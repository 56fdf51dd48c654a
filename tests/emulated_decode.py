"""What the emulated decode tests share (`test_decode_emulated.py`, `test_decode_mma_emulated.py`,
`test_planted_faults.py`): a case's inputs, built from a seed, with the visibility and additive
bias every query row sees; the float64 numpy reference; and the passes run through the kernel
emulator, each program optionally edited first (the planted faults)."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from tinygrad import dtypes
from tinygrad.dtype import DType

from kernel_emulator import build
from nuvec_tg.kernels.attention import DecodeSpec
from nuvec_tg.kernels.program import Program

Edit = Callable[[Program], Program]


def to_bits(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float64 -> the kernel's element: float32, or the 16-bit pattern (bfloat16 rounded to nearest even)."""
    if dtype == dtypes.float32: return x.astype(np.float32)
    if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
    """The kernel's elements as float64."""
    if dtype == dtypes.float32: return bits.astype(np.float64)
    if dtype == dtypes.float16: return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@dataclass(frozen=True)
class Case:
    """A decode call: `batch` items, `q_heads` over `kv_heads`, `q_len` queries over `k_len` keys
    (paged: over each sequence's `lengths`), head sizes, the first pass's `blocks` and `warps`.
    mask: 0 none, 1 boolean, 2 additive (some entries -inf), of `mask_shape` (broadcast to
    `[B, Hq, Lq, Lk]`; default `[B, 1, Lq, Lk]`). cache: `(k_start, k_capacity, v_start,
    v_capacity)`, K and V as slices of longer caches. page: the paged block size (then `pool`
    blocks, `max_blocks` a table row, `tables` and `lengths` as given, hostile ones included).
    passes: 1 (blocks 1) or 2. matrix: the matrix-unit first pass (`unroll` 2: its next tile in
    flight), with `l2_ahead`."""
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    value_dim: int
    blocks: int = 1
    warps: int = 8
    dtype: DType = dtypes.bfloat16
    passes: int = 2
    causal: bool = False
    window: int | None = None
    mask: int = 0
    mask_shape: tuple[int, ...] | None = None
    sinks: bool = False
    cache: tuple[int, int, int, int] | None = None
    page: int = 0
    pool: int = 0
    tables: tuple[tuple[int, ...], ...] = ()
    lengths: tuple[int, ...] = ()
    unroll: int = 2
    matrix: bool = False
    l2_ahead: int = 0

    def spec(self) -> DecodeSpec:
        return DecodeSpec(self.dtype, self.head_dim, self.value_dim, self.q_heads, self.kv_heads, self.q_len, self.passes,
                          self.blocks if self.passes == 2 else 1, self.causal, self.window is not None, self.mask, self.sinks,
                          self.page, self.head_dim ** -0.5, "ints", self.warps, self.unroll, self.matrix, self.l2_ahead)


@dataclass
class Inputs:
    """A case's buffers by parameter name, its runtime integers by name, and what the reference
    needs: q, K and V per sequence as float64, which keys each row sees, the additive bias and the
    sinks (or None)."""
    arrays: dict[str, np.ndarray]
    ints: dict[str, int]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    visible: np.ndarray
    bias: np.ndarray
    sinks: np.ndarray | None
    expected: np.ndarray = field(init=False)


def make_inputs(name: str, case: Case) -> Inputs:
    """The case's inputs from a seed of its name (`hash` of a str changes per process)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    b, hq, hkv, lq, d, dv, dtype = case.batch, case.q_heads, case.kv_heads, case.q_len, case.head_dim, case.value_dim, case.dtype
    arrays: dict[str, np.ndarray] = {"q": to_bits(rng.standard_normal((b, hq, lq, d)), dtype)}
    ints: dict[str, int] = {}
    if case.page:
        page, max_blocks = case.page, len(case.tables[0])
        k_pool = to_bits(rng.standard_normal((case.pool, hkv, page, d)) * 2, dtype)
        v_pool = to_bits(rng.standard_normal((case.pool, hkv, page, dv)), dtype)
        tables = np.array(case.tables, np.int32)
        lengths = np.array(case.lengths, np.int32)
        lk = max_blocks * page
        pages = np.clip(tables, 0, case.pool - 1)                      # out-of-range entries: clamped
        k = from_bits(k_pool[pages].transpose(0, 2, 1, 3, 4).reshape(b, hkv, lk, d), dtype)
        v = from_bits(v_pool[pages].transpose(0, 2, 1, 3, 4).reshape(b, hkv, lk, dv), dtype)
        k_len = np.clip(lengths, 0, lk)                                  # lengths past the table: clamped
        arrays.update(k=k_pool, v=v_pool, block_tables=tables, lengths=lengths)
        ints.update(max_blocks=max_blocks, pool_blocks=case.pool)
    else:
        lk = case.k_len
        k_start, k_capacity, v_start, v_capacity = case.cache or (0, lk, 0, lk)
        k_cache = to_bits(rng.standard_normal((b, hkv, k_capacity, d)) * 2, dtype)
        v_cache = to_bits(rng.standard_normal((b, hkv, v_capacity, dv)), dtype)
        k = from_bits(k_cache[:, :, k_start:k_start + lk], dtype)
        v = from_bits(v_cache[:, :, v_start:v_start + lk], dtype)
        k_len = np.full(b, lk)
        arrays.update(k=k_cache, v=v_cache)
        ints.update(k_offset=k_start, v_offset=v_start, k_batch_stride=hkv * k_capacity * d, k_head_stride=k_capacity * d,
                    v_batch_stride=hkv * v_capacity * dv, v_head_stride=v_capacity * dv, int_length=lk)
    keys = np.arange(lk)
    last = k_len[:, None] - lq + np.arange(lq)[None, :]                  # [B, Lq]: each query's position
    visible = keys[None, None, :] < k_len[:, None, None]
    if case.causal or case.page: visible = visible & (keys[None, None, :] <= last[..., None])
    if case.window is not None:
        visible = visible & (keys[None, None, :] > last[..., None] - case.window)
        ints["window"] = case.window
    visible = np.broadcast_to(visible[:, None], (b, hq, lq, lk)).copy()
    bias = np.zeros((b, hq, lq, lk))
    if case.mask:
        shape = case.mask_shape or (b, 1, lq, lk)
        if case.mask == 1:
            mask = rng.random(shape) < 0.7
            visible &= np.broadcast_to(mask, visible.shape)
            arrays["mask"] = mask.astype(np.uint8)
        else:
            values = rng.standard_normal(shape) * 3
            values[rng.random(shape) < 0.1] = -np.inf                    # masked out the additive way
            arrays["mask"] = to_bits(values, dtype)
            bias = bias + np.broadcast_to(from_bits(arrays["mask"], dtype), bias.shape)
        strides, running = [], 1
        for size in reversed((1,) * (4 - len(shape)) + tuple(shape)):   # key, query, head, batch
            strides.append(0 if size == 1 else running)
            running *= size
        ints.update(mask_key_stride=strides[0], mask_query_stride=strides[1], mask_head_stride=strides[2],
                    mask_batch_stride=strides[3])
    sinks = None
    if case.sinks:
        arrays["sinks"] = to_bits(rng.standard_normal(hq) * 2, dtype)
        sinks = from_bits(arrays["sinks"], dtype)
    inputs = Inputs(arrays, ints, from_bits(arrays["q"], dtype), k, v, visible, bias, sinks)
    inputs.expected = reference(inputs.q, k, v, d ** -0.5, visible, bias, sinks)
    return inputs


def reference(q, k, v, scale, visible, bias, sinks=None) -> np.ndarray:
    """Attention in float64: q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D|DV], visible/bias [B, Hq, Lq, Lk],
    sinks [Hq] joining each row's denominator; a key at -inf bias is not seen, and a row that sees
    no key is zeros."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    seen = visible & (bias != -np.inf)
    scores = np.where(seen, np.einsum("bhqd,bhkd->bhqk", q, k) * scale + np.where(seen, bias, 0), -np.inf)
    sink = np.full(q.shape[:3] + (1,), -np.inf) if sinks is None else np.broadcast_to(sinks[None, :, None, None], q.shape[:3] + (1,))
    top = np.maximum(scores.max(-1, keepdims=True), sink)
    top = np.where(np.isfinite(top), top, 0)
    weights = np.where(seen, np.exp(scores - top), 0)
    total = weights.sum(-1, keepdims=True) + np.exp(sink - top)
    return np.einsum("bhqk,bhkd->bhqd", weights, v) / np.where(total > 0, total, 1)


def _buffers(program: Program, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The program's buffers in its parameters' order (the merge's `unused_x` are the first pass's x)."""
    return [arrays[p.name.removeprefix("unused_")] for p in program.params]


def _edited(program: Program, edit: Edit | None) -> Program:
    return program if edit is None else edit(program)


def first_pass(case: Case, inputs: Inputs, edit: Edit | None = None, blocks_per_group: int = 1) -> dict[str, np.ndarray]:
    """The first pass's outputs: `out` for one pass, `part_acc`, `part_max`, `part_sum` for two
    (NaN where the kernel writes nothing). The matrix pass's threadgroups take `blocks_per_group`
    blocks in turn."""
    spec = case.spec()
    program = _edited(spec.programs("cuda")[0], edit)
    rows = case.batch * case.q_heads * case.q_len
    if case.passes == 1:
        outputs = {"out": np.full(rows * case.value_dim, 0xFFFF if case.dtype != dtypes.float32 else np.nan,
                                  np.float32 if case.dtype == dtypes.float32 else np.uint16)}
    else:
        outputs = {"part_acc": np.full(rows * spec.blocks * case.value_dim, np.nan, np.float32),
                   "part_max": np.full(rows * spec.blocks, np.nan, np.float32),
                   "part_sum": np.full(rows * spec.blocks, np.nan, np.float32)}
    ints = dict(inputs.ints, blocks_per_group=blocks_per_group)
    arrays = dict(inputs.arrays, **outputs, ints=np.array([ints[n] for n in spec.runtime_names()] or [0], np.int32))
    groups_z = -(-spec.blocks // blocks_per_group) if case.matrix else spec.blocks if case.passes == 2 else 1
    build(program)(_buffers(program, arrays), case.kv_heads * spec.row_groups(), case.warps * 32, case.batch, groups_z)
    return outputs


def merge_pass(case: Case, inputs: Inputs, partials: dict[str, np.ndarray], edit: Edit | None = None) -> np.ndarray:
    """The merge's output `[B, Hq, Lq, DV]` as float64, from the first pass's partials."""
    spec = case.spec()
    program = _edited(spec.programs("cuda")[1], edit)
    rows = case.batch * case.q_heads * case.q_len
    out = np.full(rows * case.value_dim, np.nan, np.float32) if case.dtype == dtypes.float32 else \
        np.full(rows * case.value_dim, 0xFFFF, np.uint16)
    arrays = dict(inputs.arrays, **partials, out=out, ints=np.zeros(1, np.int32))
    build(program)(_buffers(program, arrays), rows, spec.merge_threads())
    return from_bits(out, case.dtype).reshape(case.batch, case.q_heads, case.q_len, case.value_dim)


def attention(case: Case, inputs: Inputs, first_edit: Edit | None = None, merge_edit: Edit | None = None) -> np.ndarray:
    """The case's output `[B, Hq, Lq, DV]` (float64) from the emulated kernels: one pass, or the
    first pass then the merge."""
    outputs = first_pass(case, inputs, first_edit)
    if case.passes == 1:
        return from_bits(outputs["out"], case.dtype).reshape(case.batch, case.q_heads, case.q_len, case.value_dim)
    return merge_pass(case, inputs, outputs, merge_edit)


def merged_partials(partials: dict[str, np.ndarray], shape: tuple[int, ...], blocks: int) -> np.ndarray:
    """The partials merged in float64 (an independent second pass): `shape` `[B, Hq, Lq, DV]`."""
    rows, dv = int(np.prod(shape[:-1])), shape[-1]
    acc = partials["part_acc"].reshape(rows, blocks, dv).astype(np.float64)
    top = partials["part_max"].reshape(rows, blocks).astype(np.float64)
    sums = partials["part_sum"].reshape(rows, blocks).astype(np.float64)
    best = top.max(1, keepdims=True)
    factor = np.where(np.isfinite(top), np.exp2(top - np.where(np.isfinite(best), best, 0)), 0)
    total = (sums * factor).sum(1)
    return ((acc * factor[..., None]).sum(1) / np.where(total > 0, total, 1)[:, None]).reshape(shape)


TOLERANCE = {dtypes.float32: 1e-4, dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2}
