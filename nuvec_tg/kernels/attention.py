"""Decode attention kernels (`src/sdpa_decode.h`, `src/sdpa_merge.h`): one pass, or key blocks
then a merge, for at most 8 query rows per sequence, over contiguous K/V (or slices of a longer
cache, passed whole with runtime offsets) or a paged pool.

The vector pass's geometry: TPK lanes share a key line, each holding EQ of its D features (16
bytes where D allows) and EV of its DV values; a threadgroup of NUM_WARPS SIMD groups serves ROWS
query rows of one key head (ROW_GROUPS threadgroups cover the head's `GQA * Lq` rows, few enough
registers each), one batch item and one of BLOCKS key blocks.

The matrix-unit pass (`src/sdpa_decode_mma.h`, CUDA, 16-bit K/V, always two passes): a
threadgroup of CUDA_MATRIX_WARPS SIMD groups serves MATRIX_ROWS query rows of one key head and one
batch item, and takes `blocks_per_group` of the BLOCKS key blocks in turn (a runtime integer: the
plan's `block_groups` for a large batch), writing each block's partial.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType
from tinygrad.uop.ops import Ops, UOp

from .program import CTYPES, Param, chunks, int_buffer, launch, prelude, specialise


@dataclass(frozen=True)
class Launch:
    """The first pass's threadgroup: `warps` SIMD groups, each lane with `unroll` key lines in flight."""
    warps: int
    unroll: int


# Per backend. CUDA's from the H200 sweep (scripts/tune_decode.py): 8 warps with 2 lines in flight
# beat 4 lines (registers: fewer resident SIMD groups); Metal keeps MLX's 4 SIMD groups.
CUDA_LAUNCH = Launch(warps=8, unroll=2)
METAL_LAUNCH = Launch(warps=4, unroll=2)
LAUNCHES = {"cuda": CUDA_LAUNCH, "metal": METAL_LAUNCH}
NUM_WARPS, UNROLL = METAL_LAUNCH.warps, METAL_LAUNCH.unroll  # the defaults of a DecodeSpec
# The matrix-unit first pass (CUDA): query rows per threadgroup (an mma tile's 16), SIMD groups.
MATRIX_ROWS = 16
CUDA_MATRIX_WARPS = 4
MERGE_THREADS = 256  # at most, per query row


def matrix_staging_bytes(rows: int, value_dim: int, warps: int) -> int:
    """Threadgroup memory of the matrix pass's staged partials (`sdpa_decode_mma.h`: STAGED_ROWS
    rows of each SIMD group, in two buffers where two take at most 44 KB)."""
    one = warps * min(rows, MATRIX_ROWS) * (value_dim + 2) * 4
    return 2 * one if 2 * one <= 44 * 1024 else one


@dataclass(frozen=True)
class Geometry:
    """How a threadgroup's lanes share key lines and which query rows it serves."""
    lanes_per_key: int
    features_per_lane: int
    values_per_lane: int
    rows: int
    row_groups: int


def geometry(head_dim: int, value_dim: int, dtype: DType, query_rows: int, warps: int = NUM_WARPS) -> Geometry:
    """How a threadgroup splits key lines among lanes and query rows among threadgroups."""
    per_16_bytes = 16 // dtype.itemsize
    lanes = head_dim // per_16_bytes
    if lanes > 32 or lanes & (lanes - 1) or head_dim % per_16_bytes: lanes = 32
    features, values = head_dim // lanes, value_dim // lanes
    # Rows: a power of two (the scores' reduce-scatter halves them), at most the lanes of a key,
    # dividing the head's rows; registers: each row keeps its query features and its value sums;
    # threadgroup memory keeps `warps` partial rows of DV floats.
    rows = 1
    while (query_rows % (rows * 2) == 0 and rows * 2 <= lanes and rows * 2 * (features + values) <= 96
           and warps * rows * 2 * value_dim * 4 <= 32 * 1024):
        rows *= 2
    return Geometry(lanes, features, values, rows, query_rows // rows)


@dataclass(frozen=True)
class CacheView:
    """K or V as a buffer `[B, H, S, Dx]` and the first of the call's rows in it."""
    base: Tensor
    offset: int
    capacity: int | UOp


def cache_view(t: Tensor) -> CacheView:
    """`t` itself, or, when `t` is a slice along the sequence axis of a longer 4-D tensor, that
    tensor and the slice's start: the kernel then reads the cache in place, with no copy."""
    u = t.uop
    if u.op is Ops.SHRINK and len(u.src[0].shape) == 4:
        bounds = u.marg
        source_shape = u.src[0].shape
        if all(bounds[i] == (0, source_shape[i]) for i in (0, 1, 3)) and isinstance(bounds[2][0], int):
            return CacheView(Tensor(u.src[0]), bounds[2][0], source_shape[2])
    return CacheView(t, 0, t.shape[2])


def _length_expression(k_len, scalars: list[UOp], params: list[Param]) -> str:
    """The C expression of the key count: an int, or a symbolic length whose bound variables
    become scalar parameters (so a jitted decode step reads the current length)."""
    if isinstance(k_len, int): return str(k_len)
    for bound in k_len.toposort():
        if bound.op is Ops.AFTER and bound.src[0].op is Ops.BUFFER:  # a bound variable
            scalars.append(bound)
            params.append(Param(bound.unbind()[0].expr, "scalar"))
    return f"({k_len.render()})"


@dataclass(frozen=True)
class DecodeSpec:
    """A specialisation of the decode kernels: everything their source depends on."""
    dtype: DType
    head_dim: int
    value_dim: int
    q_heads: int
    kv_heads: int
    q_len: int
    passes: int
    blocks: int
    causal: bool
    window: bool
    mask_kind: int          # 0 none, 1 boolean, 2 additive
    sinks: bool
    page: int               # the paged block size; 0: contiguous K/V
    scale: float
    length: str = "ints"    # the key count: "ints" (read from the ints buffer), or a C expression of scalars
    warps: int = NUM_WARPS  # SIMD groups per threadgroup of the first pass
    unroll: int = UNROLL    # key lines (matrix: 16-key tiles) each lane loads before using the first
    matrix: bool = False    # the first pass on the matrix units (`sdpa_decode_mma.h`; CUDA, 16-bit, two passes)
    l2_ahead: int = 0       # matrix: rounds of tiles ahead that a SIMD group asks L2 for (0: none)

    def runtime_names(self) -> list[str]:
        """The integers the first pass reads from its `ints` buffer, in order (known when the graph
        is built; a symbolic key count is a scalar parameter instead, see `length`)."""
        names = (["max_blocks", "pool_blocks"] if self.page else
                 ["k_offset", "v_offset", "k_batch_stride", "k_head_stride", "v_batch_stride", "v_head_stride"])
        if self.mask_kind: names += ["mask_key_stride", "mask_query_stride", "mask_head_stride", "mask_batch_stride"]
        if self.window: names.append("window")
        if not self.page and self.length == "ints": names.append("int_length")
        if self.matrix: names.append("blocks_per_group")
        return names

    def geometry(self) -> Geometry:
        """How the first pass's threadgroups split the keys' lines and the query rows."""
        return geometry(self.head_dim, self.value_dim, self.dtype, self.q_heads // self.kv_heads * self.q_len, self.warps)

    def row_groups(self) -> int:
        """Threadgroups per key head, each over some of its `GQA * Lq` query rows."""
        if not self.matrix: return self.geometry().row_groups
        rows = self.q_heads // self.kv_heads * self.q_len
        return -(-rows // MATRIX_ROWS)

    def merge_splits(self) -> int:
        """Groups of `DV / 4` merge threads (float4 pieces of a value row), each over every
        `splits`-th block."""
        return max(1, min(self.blocks, MERGE_THREADS // (self.value_dim // 4)))

    def merge_threads(self) -> int:
        """The merge's threads per query row: its splits, in whole SIMD groups."""
        return -(-self.merge_splits() * (self.value_dim // 4) // 32) * 32

    def first_pass_params(self, ctype: str) -> list[Param]:
        """The first (or only) pass's buffer parameters, in launch order: outputs, then inputs."""
        outs = ([Param("out", "out", ctype)] if self.passes == 1 else
                [Param("part_acc", "out", "float"), Param("part_max", "out", "float"), Param("part_sum", "out", "float")])
        ins = [Param("q", "in", ctype), Param("k", "in", ctype), Param("v", "in", ctype)]
        if self.mask_kind: ins.append(Param("mask", "in", "unsigned char" if self.mask_kind == 1 else ctype))
        if self.sinks: ins.append(Param("sinks", "in", ctype))
        if self.page: ins += [Param("block_tables", "in", "int"), Param("lengths", "in", "int")]
        return outs + ins + [Param("ints", "in", "int")]

    def sources(self, backend: str, length_params: Sequence[Param] = ()) -> list[tuple[str, str, list[Param]]]:
        """`(program name, source without the prelude, parameters)` for each pass."""
        ctype = CTYPES[self.dtype]
        # What both first passes take; each adds its own layout.
        common = dict(T=ctype, D=self.head_dim, DV=self.value_dim, HQ=self.q_heads, HKV=self.kv_heads,
                      GQA=self.q_heads // self.kv_heads, LQ=self.q_len, NUM_WARPS=self.warps,
                      BLOCKS=self.blocks if self.passes == 2 else 1, CAUSAL=int(self.causal), WINDOW_ON=int(self.window),
                      MASK_KIND=self.mask_kind, PAGED=int(self.page > 0), PAGE=max(self.page, 1),
                      SCALE_LOG2E=f"{self.scale * math.log2(math.e)!r}f",
                      K_LEN="int_length" if self.length == "ints" else self.length,
                      RUNTIME_INTS="".join(f"const int {name} = ints[{i}]; " for i, name in enumerate(self.runtime_names())))
        params = self.first_pass_params(ctype) + list(length_params)
        if self.matrix:
            defines = dict(common, MMA="mma_bf16" if self.dtype == dtypes.bfloat16 else "mma_f16", ROW_GROUPS=self.row_groups(),
                           PREFETCH=int(self.unroll > 1), L2_AHEAD=self.l2_ahead, BLOCK_ROUND=16 * self.warps)
            programs = [_named(backend, "nuvec_sdpa_decode_mma", ("sdpa_keys.h", "sdpa_decode_mma.h"), defines, params)]
        else:
            shape, size = self.geometry(), self.dtype.itemsize
            defines = dict(common, ROWS=shape.rows, ROW_GROUPS=shape.row_groups, TPK=shape.lanes_per_key,
                           EQ=shape.features_per_lane, EV=shape.values_per_lane, UNROLL=self.unroll,
                           TWO_PASS=int(self.passes == 2), SINKS=int(self.sinks), BLOCK_ROUND=1,
                           **chunks("K", self.head_dim * size, shape.features_per_lane * size),
                           **chunks("V", self.value_dim * size, shape.values_per_lane * size))
            programs = [_named(backend, "nuvec_sdpa_decode", ("sdpa_keys.h", "sdpa_decode.h"), defines, params)]
        if self.passes == 2:
            merge_params = [Param("out", "out", ctype), Param("part_acc", "in", "float"), Param("part_max", "in", "float"),
                            Param("part_sum", "in", "float")]
            if self.sinks: merge_params.append(Param("sinks", "in", ctype))
            # The first pass's inputs ride along, unread, so that the merge's backward reaches them.
            merge_params += [Param(f"unused_{p.name}", "in", p.ctype) for p in params if p.kind == "in"]
            merge_defines = dict(T=ctype, DV=self.value_dim, HQ=self.q_heads, LQ=self.q_len, BLOCKS=self.blocks,
                                 SINKS=int(self.sinks), THREADS=self.merge_threads(), SPLITS=self.merge_splits())
            programs.append(_named(backend, "nuvec_sdpa_merge", "sdpa_merge.h", merge_defines, merge_params))
        return programs


def _named(backend: str, stem: str, source: str | tuple[str, ...], defines: dict,
           params: list[Param]) -> tuple[str, str, list[Param]]:
    """A program name per specialisation (tinygrad keys runtimes by name) and its source."""
    text = specialise(backend, stem, source, defines, params)
    name = f"{stem}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return name, text.replace(f"{stem}(", f"{name}("), params


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, *, dtype: DType, backend: str, passes: int,
                     blocks: int, causal: bool, window: int | None, mask: Tensor | None, sinks: Tensor | None,
                     paged: tuple[Tensor, Tensor, int] | None = None, composition=None, warps: int | None = None,
                     unroll: int | None = None, matrix: bool = False, block_groups: int = 0, l2_ahead: int = 0) -> Tensor:
    """Launch the decode kernels; returns `[B, Hq, Lq, DV]` in `dtype`.

    q: `[B, Hq, Lq, D]`. Without `paged`, k and v are `[B, Hkv, Lk, D|DV]` (slices of a longer
    cache are read in place); with `paged = (block_tables int32 [B, M], lengths int32 [B],
    page)`, k and v are pools `[blocks, Hkv, page, D|DV]` and the queries are each sequence's last
    positions. mask: bool or additive in `dtype`, broadcastable to `[B, Hq, Lq, Lk]`.
    composition: `(q, k, v, mask, sinks) -> out`, the same attention from tensor operations on
    the call's own (logical) inputs: the kernels' backward is its gradient. warps, unroll: the
    first pass's SIMD groups per threadgroup and key lines in flight per lane (default: the
    backend's `LAUNCHES` entry). matrix: the first pass on the matrix units (CUDA, float16 or
    bfloat16, D a multiple of 32, DV of 64, two passes; `warps` default `CUDA_MATRIX_WARPS`);
    block_groups: its threadgroups per (batch item, key head, row group), each taking its share of
    the `blocks` in turn (0: one per block; a block's partial is the same either way); l2_ahead:
    how many rounds of its 16-key tiles ahead each SIMD group of it asks L2 for (0: none; a hint,
    which changes no result).
    """
    if matrix:
        if backend != "cuda" or dtype not in (dtypes.float16, dtypes.bfloat16) or q.shape[3] % 32 or v.shape[3] % 64 or passes != 2:
            raise ValueError(f"decode_attention: the matrix-unit pass needs CUDA, a 16-bit dtype, D % 32 == 0, DV % 64 == 0 "
                             f"and two passes (got {backend}, {dtype}, D {q.shape[3]}, DV {v.shape[3]}, passes {passes})")
        warps = CUDA_MATRIX_WARPS if warps is None else warps
        if matrix_staging_bytes(q.shape[1] // k.shape[1] * q.shape[2], v.shape[3], warps) > 48 * 1024:
            raise ValueError(f"decode_attention: {warps} SIMD groups' partials of DV {v.shape[3]} exceed 48 KB of threadgroup memory")
    warps = LAUNCHES[backend].warps if warps is None else warps
    unroll = LAUNCHES[backend].unroll if unroll is None else unroll
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, value_dim = k.shape[1], v.shape[3]
    device = q.device
    mask_kind = 0 if mask is None else 1 if mask.dtype == dtypes.bool else 2
    ins = [q.cast(dtype).contiguous()]
    runtime: list[int] = []
    length_scalars: list[UOp] = []
    length_params: list[Param] = []
    length = "ints"
    if paged is None:
        key_view, value_view = cache_view(k.cast(dtype)), cache_view(v.cast(dtype))
        ins += [key_view.base, value_view.base]
        runtime += [key_view.offset, value_view.offset, kv_heads * key_view.capacity * head_dim,
                    key_view.capacity * head_dim, kv_heads * value_view.capacity * value_dim,
                    value_view.capacity * value_dim]
        if not isinstance(k.shape[2], int): length = _length_expression(k.shape[2], length_scalars, length_params)
    else:
        block_tables, lengths, page = paged
        ins += [k.cast(dtype), v.cast(dtype)]
        runtime += [block_tables.shape[1], k.shape[0]]
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
        strides, running = [], 1
        for size in reversed(mask.shape):  # key, query, head, batch
            strides.append(0 if size == 1 else running)
            running *= size
        ins.append(mask.cast(dtypes.uint8) if mask_kind == 1 else mask.cast(dtype))
        runtime += strides
    if sinks is not None: ins.append(sinks.cast(dtype))
    if paged is not None: ins += [block_tables, lengths]
    if window is not None: runtime.append(window)
    if length == "ints" and paged is None: runtime.append(k.shape[2])
    if matrix:  # each threadgroup's share of the blocks (block_groups threadgroups, or one per block)
        blocks_per_group = -(-blocks // max(1, min(block_groups or blocks, blocks)))
        runtime.append(blocks_per_group)
    # The integers travel in a small buffer: one program serves every value (a scalar parameter
    # would need a Variable, which TinyJit could not bind), and a jitted step keeps its values.
    ins.append(int_buffer(device, tuple(runtime) or (0,)))
    spec = DecodeSpec(dtype, head_dim, value_dim, q_heads, kv_heads, q_len, passes, blocks, causal, window is not None,
                      mask_kind, sinks is not None, paged[2] if paged is not None else 0, scale, length, warps, unroll, matrix,
                      l2_ahead if matrix else 0)
    programs = spec.sources(backend, length_params)
    first_name, first_source, _ = programs[0]
    grid = (kv_heads * spec.row_groups(), batch, -(-blocks // blocks_per_group) if matrix else blocks if passes == 2 else 1)
    label = (f"{backend} {dtype.name} D{head_dim}/{value_dim} gqa{q_heads // kv_heads} Lq{q_len} passes{passes} blocks{blocks}"
             + (" matrix" if matrix else ""))
    logical = _logical_inputs(k, v, paged)
    ctype_prelude = prelude(backend)
    rows = batch * q_heads * q_len
    if passes == 1:
        out = Tensor.empty(batch, q_heads, q_len, value_dim, dtype=dtype, device=device)
        backward = _backward(composition, logical, first_input=1, mask=mask_kind, sinks=sinks is not None)
        return launch(first_name, ctype_prelude + first_source, device, [out], ins, length_scalars, grid, (warps * 32, 1, 1),
                      grad_fxn=backward, label=label)[0]
    partials = launch(first_name, ctype_prelude + first_source, device,
                      [Tensor.empty(rows * blocks * value_dim, dtype=dtypes.float32, device=device),
                       Tensor.empty(rows * blocks, dtype=dtypes.float32, device=device),
                       Tensor.empty(rows * blocks, dtype=dtypes.float32, device=device)],
                      ins, length_scalars, grid, (warps * 32, 1, 1), label=label)
    merge_name, merge_source, _ = programs[1]
    merge_ins = list(partials) + ([ins[3 + (mask_kind > 0)]] if sinks is not None else []) + ins
    out = Tensor.empty(batch, q_heads, q_len, value_dim, dtype=dtype, device=device)
    backward = _backward(composition, logical, first_input=1 + len(merge_ins) - len(ins), mask=mask_kind,
                         sinks=sinks is not None)
    return launch(merge_name, ctype_prelude + merge_source, device, [out], merge_ins, [], (rows, 1, 1),
                  (spec.merge_threads(), 1, 1), grad_fxn=backward, label=label)[0]


def _logical_inputs(k: Tensor, v: Tensor, paged) -> tuple:
    """How the composition sees K and V from the kernel's arguments: the slice of a cache view, or
    the pools themselves (paged)."""
    if paged is not None: return (lambda base: base, lambda base: base)
    def view(t: Tensor):
        found = cache_view(t)
        if found.base is t: return lambda base: base
        return lambda base: base[:, :, found.offset:found.offset + t.shape[2]]
    return view(k), view(v)


def _backward(composition, logical, first_input: int, mask: int, sinks: bool):
    """The kernel call's backward: the gradient of `composition` on detached copies of its inputs
    (q, k, v at `first_input`, then the mask and the sinks), None for everything else."""
    if composition is None: return None
    key_of, value_of = logical

    def grad_fxn(gradient, call):
        def argument(index: int) -> Tensor: return Tensor(call.src[1 + index]).detach()
        q, k_base, v_base = (argument(first_input + i) for i in range(3))
        at = first_input + 3
        mask_tensor = None
        if mask:
            mask_tensor = argument(at) != 0 if mask == 1 else argument(at)
            at += 1
        sinks_tensor = argument(at) if sinks else None
        out = composition(q, key_of(k_base), value_of(v_base), mask_tensor, sinks_tensor)
        targets = [q, k_base, v_base] + ([sinks_tensor] if sinks else [])
        grads = out.gradient(*targets, gradient=Tensor(gradient))
        result: list = [None] * (len(call.src) - 1)
        for index, grad in zip([first_input, first_input + 1, first_input + 2] + ([at] if sinks else []), grads):
            result[index] = grad.uop
        return tuple(result)
    return grad_fxn
