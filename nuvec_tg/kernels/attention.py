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

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType
from tinygrad.uop.ops import Ops, UOp

from .program import CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, kernel_input, launch, threadgroup_array


@dataclass(frozen=True)
class Launch:
    """The first pass's threadgroup: `warps` SIMD groups, each lane with `unroll` key lines in flight."""
    warps: int
    unroll: int


# Per backend. CUDA's from the H200 sweep (tools/tune_decode.py): 8 warps with 2 lines in flight
# beat 4 lines (registers: fewer resident SIMD groups); Metal keeps MLX's 4 SIMD groups.
CUDA_LAUNCH = Launch(warps=8, unroll=2)
METAL_LAUNCH = Launch(warps=4, unroll=2)
LAUNCHES = {"cuda": CUDA_LAUNCH, "metal": METAL_LAUNCH}
NUM_WARPS, UNROLL = METAL_LAUNCH.warps, METAL_LAUNCH.unroll  # the defaults of a DecodeSpec
# The matrix-unit first pass (CUDA): query rows per threadgroup (an mma tile's 16), SIMD groups.
MATRIX_ROWS = 16
CUDA_MATRIX_WARPS = 4
MERGE_THREADS = 256  # at most, per query row


def default_launch(backend: str, matrix: bool) -> Launch:
    """The first pass's threadgroup where the caller names none: the backend's `LAUNCHES` entry,
    or CUDA_MATRIX_WARPS SIMD groups with the same lines in flight for the matrix-unit pass."""
    return Launch(CUDA_MATRIX_WARPS, LAUNCHES[backend].unroll) if matrix else LAUNCHES[backend]


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
class Vector:
    """The decode kernels' launch (the attention plan's `Vector` route): `passes` 1 (`blocks` 1)
    or 2 (`blocks` key partitions, then a merge), `dispatches` launches; `matrix`: the first pass
    on the matrix units (two passes), whose threadgroups per (batch item, key head, row group) are
    `block_groups`, each taking its share of the blocks in turn (0: one per block), and whose SIMD
    groups ask L2 for their tiles `l2_ahead` rounds ahead (0: not at all; a hint, so it may depend
    on the batch)."""
    passes: int
    blocks: int
    dispatches: int
    matrix: bool = False
    block_groups: int = 0
    l2_ahead: int = 0


# What the decode kernels take: these (D, DV) pairs, at most 8 query rows per sequence, and at most
# 32 query rows (grouped heads x query positions) per key head.
DECODE_HEADS = frozenset({(d, d) for d in (64, 96, 128, 256, 512)} | {(192, 128), (96, 64)})
MAX_QUERIES = 8
MAX_ROWS_PER_KEY_HEAD = 32


def decode_unsupported(head_dim: int, value_dim: int, q_len: int, k_len: int, group: int) -> str | None:
    """Why the decode kernels do not take a call (None when they do): `group` query heads per key
    head, `q_len` queries over `k_len` keys."""
    if (head_dim, value_dim) not in DECODE_HEADS: return f"head sizes D {head_dim} / DV {value_dim} have no decode kernel"
    if q_len > MAX_QUERIES: return f"{q_len} queries (the decode kernels take at most {MAX_QUERIES})"
    if q_len > k_len: return f"more queries ({q_len}) than keys ({k_len})"
    if q_len * group > MAX_ROWS_PER_KEY_HEAD:
        return f"{q_len * group} query rows per key head (the decode kernels take at most {MAX_ROWS_PER_KEY_HEAD})"
    return None


def paged_unsupported(head_dim: int, page: int) -> str | None:
    """Why the decode kernels do not read a paged pool of `page`-position blocks and head size D
    (None when they do): D 64, 128, 256 or 512 (K and V alike), `page` a power of two."""
    if head_dim not in (64, 128, 256, 512): return f"paged head size {head_dim} (the kernels page 64, 128, 256, 512)"
    if page & (page - 1): return f"a block size of {page} (the kernels page powers of two)"
    return None


def decode_plan(backend: str, *, batch: int, kv_heads: int, group: int, q_len: int, keys: int, head_dim: int,
                value_dim: int, dtype: DType, gpu_class: str | None = None, multiprocessors: int | None = None) -> Vector:
    """The decode kernels' launch for a call they take (`decode_unsupported`): `keys` the most keys
    a query sees (a window's reach), `gpu_class` Metal's (MLX's rules), `multiprocessors` CUDA's.
    On CUDA, 16-bit heads of at least `_CUDA_MATRIX_MIN_ROWS` query rows per key head take the
    matrix-unit first pass (`_cuda_matrix_launch`), others the vector kernel's key blocks
    (`_cuda_vector_blocks`). No key-block count depends on the batch: a batch item's bits must not
    depend on the batch it runs in."""
    if backend == "cuda":
        matrix = _cuda_matrix_launch(batch, kv_heads, group * q_len, keys, head_dim, value_dim, dtype, multiprocessors)
        if matrix is not None: return matrix
        blocks = _cuda_vector_blocks(kv_heads, group * q_len, keys, head_dim, value_dim, dtype, multiprocessors)
        return Vector(passes=1, blocks=1, dispatches=1) if blocks == 1 else Vector(passes=2, blocks=blocks, dispatches=2)
    gpu_class = gpu_class or "g"
    two_pass = (gpu_class in ("d", "s") and keys >= 1024) or (group > 1 and keys >= 4096)
    if not two_pass: return Vector(passes=1, blocks=1, dispatches=1)
    return Vector(passes=2, blocks=_metal_blocks(gpu_class, group * q_len, keys), dispatches=2)


def _metal_blocks(gpu_class: str, queries: int, keys: int) -> int:
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


# The vector first pass on CUDA keeps about this many SIMD groups resident per multiprocessor
# (their registers allow 16 on the H200: 127 per thread at a group of 4 heads).
_CUDA_RESIDENT_WARPS = 16
_CUDA_MIN_BLOCK_KEYS = 64  # fewer keys per block and the merge costs more than the split saves
CUDA_DEFAULT_MULTIPROCESSORS = 132


def _power_of_two_at_most(wanted: int) -> int:
    """The largest power of two not above `wanted` (1 for anything below 2)."""
    return 1 << (wanted.bit_length() - 1) if wanted > 1 else 1


def _cuda_vector_blocks(kv_heads: int, rows: int, keys: int, head_dim: int, value_dim: int, dtype: DType,
                        multiprocessors: int | None) -> int:
    """Key blocks of the vector kernel on CUDA (`rows`: query rows per key head): enough
    threadgroups for one wave of resident SIMD groups for one batch item, no block under
    `_CUDA_MIN_BLOCK_KEYS` keys, a power of two (a growing cache compiles a few specialisations,
    not one per length). 1 is a single pass. Read off the H200 sweep (`tools/tune_decode.py`,
    `benchmarks/attention_h200.md`)."""
    shape = geometry(head_dim, value_dim, dtype, rows, CUDA_LAUNCH.warps)
    threadgroups = kv_heads * shape.row_groups
    resident = (multiprocessors or CUDA_DEFAULT_MULTIPROCESSORS) * _CUDA_RESIDENT_WARPS
    return _power_of_two_at_most(min(resident // (threadgroups * CUDA_LAUNCH.warps), keys // _CUDA_MIN_BLOCK_KEYS))


# The matrix-unit first pass on CUDA (`src/sdpa_decode_mma.h`): taken from this many query rows
# per key head. Its blocks leave the batch size out, so one count serves B = 1, which wants many
# short blocks (one item fills few multiprocessors), and a large batch, which wants few long ones
# (every block costs its epilogue and its partial): about sqrt(keys / _CUDA_MATRIX_KEY_SCALE)
# blocks, a power of two, and no more than fill `_CUDA_MATRIX_RESIDENT_WARPS` SIMD groups per
# multiprocessor for one item. A large batch runs the same blocks in about one wave of
# threadgroups (`_CUDA_MATRIX_RESIDENT_GROUPS` per multiprocessor), each taking its share in turn.
# Where the pass launches no more threadgroups than there are multiprocessors, asking L2 for each
# SIMD group's tiles `_CUDA_MATRIX_L2_AHEAD` rounds ahead hides the loads' latency (it changes no
# bits). All read off the H200 sweep (`tools/tune_decode.py --matrix`, `benchmarks/attention_h200.md`).
_CUDA_MATRIX_MIN_ROWS = 4
_CUDA_MATRIX_RESIDENT_WARPS = 8
_CUDA_MATRIX_KEY_SCALE = 64
_CUDA_MATRIX_RESIDENT_GROUPS = 2
_CUDA_MATRIX_L2_AHEAD = 2


def _cuda_matrix_launch(batch: int, kv_heads: int, rows: int, keys: int, head_dim: int, value_dim: int, dtype: DType,
                        multiprocessors: int | None) -> Vector | None:
    """The matrix-unit decode pass, when the call fits it: float16 or bfloat16, head sizes up to
    128 (D a multiple of 32, DV of 64: the registers of two tiles in flight), at least
    `_CUDA_MATRIX_MIN_ROWS` query rows per key head to fill the mma's rows."""
    if (dtype not in (dtypes.float16, dtypes.bfloat16) or head_dim % 32 or value_dim % 64 or head_dim > 128
            or value_dim > 128 or rows < _CUDA_MATRIX_MIN_ROWS):
        return None
    multiprocessors = multiprocessors or CUDA_DEFAULT_MULTIPROCESSORS
    threadgroups = kv_heads * -(-rows // MATRIX_ROWS)
    by_warps = multiprocessors * _CUDA_MATRIX_RESIDENT_WARPS // (threadgroups * CUDA_MATRIX_WARPS)
    blocks = _power_of_two_at_most(min(by_warps, math.isqrt(keys // _CUDA_MATRIX_KEY_SCALE)))
    block_groups = matrix_block_groups(threadgroups, batch, blocks, multiprocessors)
    launched = threadgroups * batch * (block_groups or blocks)
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
    wave = (multiprocessors or CUDA_DEFAULT_MULTIPROCESSORS) * resident
    groups = max(1, min(blocks, wave // (threadgroups * batch)))
    return 0 if groups == blocks else groups


def merge_splits(blocks: int, value_dim: int) -> int:
    """The merge's groups of `DV / 4` threads (float4 pieces of a value row), each over every
    `splits`-th of the `blocks` blocks: as many as MERGE_THREADS threads hold."""
    return max(1, min(blocks, MERGE_THREADS // (value_dim // 4)))


def merge_threads(blocks: int, value_dim: int) -> int:
    """The merge's threads per query row: its splits' threads, in whole SIMD groups."""
    return -(-merge_splits(blocks, value_dim) * (value_dim // 4) // 32) * 32


def decode_metal_resources(head_dim: int, value_dim: int, dtype: DType, rows: int, vector: Vector,
                           warps: int = METAL_LAUNCH.warps) -> tuple[Resources, ...]:
    """A Metal decode launch's threadgroups, one per program (the vector pass, then the merge for
    two passes), for `rows` query rows per key head: the first pass keeps each SIMD group's
    partial rows (`shared_acc`, `shared_max`, `shared_sum` in `sdpa_decode.h`), the merge each
    split's (`split_max`, `split_sum`, `split_acc` in `sdpa_merge.h`)."""
    if vector.matrix: raise ValueError("decode_metal_resources: the matrix-unit pass has no Metal kernel")
    staged = warps * geometry(head_dim, value_dim, dtype, rows, warps).rows
    first = Resources(warps * 32, threadgroup_array(staged * value_dim, 4) + 2 * threadgroup_array(staged, 4))
    if vector.passes == 1: return (first,)
    splits = merge_splits(vector.blocks, value_dim)
    merge = Resources(merge_threads(vector.blocks, value_dim),
                      2 * threadgroup_array(splits, 4) + threadgroup_array(splits * value_dim, 4))
    return first, merge


DECODE = Family("nuvec_sdpa_decode", ("sdpa_keys.h", "sdpa_decode.h"), decode_unsupported, decode_plan)
DECODE_MATRIX = Family("nuvec_sdpa_decode_mma", ("sdpa_keys.h", "sdpa_decode_mma.h"), decode_unsupported, decode_plan,
                       backends=("cuda",))
MERGE = Family("nuvec_sdpa_merge", ("sdpa_merge.h",), decode_unsupported, decode_plan)


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
        """Groups of `DV / 4` merge threads, each over every `splits`-th block (`merge_splits`)."""
        return merge_splits(self.blocks, self.value_dim)

    def merge_threads(self) -> int:
        """The merge's threads per query row (`merge_threads`)."""
        return merge_threads(self.blocks, self.value_dim)

    def metal_resources(self) -> tuple[Resources, ...]:
        """The threadgroups of `programs("metal")`, one per program (`decode_metal_resources`)."""
        return decode_metal_resources(self.head_dim, self.value_dim, self.dtype, self.q_heads // self.kv_heads * self.q_len,
                                      Vector(self.passes, self.blocks, self.passes, self.matrix), self.warps)

    def first_pass_params(self, ctype: str) -> list[Param]:
        """The first (or only) pass's buffer parameters, in launch order: outputs, then inputs."""
        outs = ([Param("out", "out", ctype)] if self.passes == 1 else
                [Param("part_acc", "out", "float"), Param("part_max", "out", "float"), Param("part_sum", "out", "float")])
        ins = [Param("q", "in", ctype), Param("k", "in", ctype), Param("v", "in", ctype)]
        if self.mask_kind: ins.append(Param("mask", "in", "unsigned char" if self.mask_kind == 1 else ctype))
        if self.sinks: ins.append(Param("sinks", "in", ctype))
        if self.page: ins += [Param("block_tables", "in", "int"), Param("lengths", "in", "int")]
        return outs + ins + [Param("ints", "in", "int")]

    def programs(self, backend: str, length_params: Sequence[Param] = ()) -> list[Program]:
        """The program of each pass: the first (or only) pass, then the merge."""
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
            programs = [DECODE_MATRIX.program(backend, defines, params)]
        else:
            shape, size = self.geometry(), self.dtype.itemsize
            defines = dict(common, ROWS=shape.rows, ROW_GROUPS=shape.row_groups, TPK=shape.lanes_per_key,
                           EQ=shape.features_per_lane, EV=shape.values_per_lane, UNROLL=self.unroll,
                           TWO_PASS=int(self.passes == 2), SINKS=int(self.sinks), BLOCK_ROUND=1,
                           **chunks("K", self.head_dim * size, shape.features_per_lane * size),
                           **chunks("V", self.value_dim * size, shape.values_per_lane * size))
            programs = [DECODE.program(backend, defines, params)]
        if self.passes == 2:
            merge_params = [Param("out", "out", ctype), Param("part_acc", "in", "float"), Param("part_max", "in", "float"),
                            Param("part_sum", "in", "float")]
            if self.sinks: merge_params.append(Param("sinks", "in", ctype))
            # The first pass's inputs ride along, unread, so that the merge's backward reaches them.
            merge_params += [Param(f"unused_{p.name}", "in", p.ctype) for p in params if p.kind == "in"]
            merge_defines = dict(T=ctype, DV=self.value_dim, HQ=self.q_heads, LQ=self.q_len, BLOCKS=self.blocks,
                                 SINKS=int(self.sinks), THREADS=self.merge_threads(), SPLITS=self.merge_splits())
            programs.append(MERGE.program(backend, merge_defines, merge_params))
        return programs


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, vector: Vector, *, dtype: DType, backend: str,
                     causal: bool, window: int | None, mask: Tensor | None, sinks: Tensor | None,
                     paged: tuple[Tensor, Tensor, int] | None = None, composition: Callable | None = None,
                     shape: Launch | None = None) -> Tensor:
    """Launch the decode kernels as `vector` (the plan's launch) says; returns `[B, Hq, Lq, DV]` in `dtype`.

    q: `[B, Hq, Lq, D]`. Without `paged`, k and v are `[B, Hkv, Lk, D|DV]` (slices of a longer
    cache are read in place); with `paged = (block_tables int32 [B, M], lengths int32 [B],
    page)`, k and v are pools `[blocks, Hkv, page, D|DV]` and the queries are each sequence's last
    positions. mask: bool or additive in `dtype`, broadcastable to `[B, Hq, Lq, Lk]`.
    composition: `(q, k, v, mask, sinks) -> out`, the same attention from tensor operations on
    the call's own (logical) inputs: the kernels' backward is its gradient. shape: the first
    pass's SIMD groups per threadgroup and key lines (matrix: 16-key tiles) in flight per lane
    (default: the backend's `LAUNCHES` entry, `CUDA_MATRIX_WARPS` SIMD groups for the matrix pass);
    tuning passes others, which change no bit.
    """
    matrix, passes, blocks = vector.matrix, vector.passes, vector.blocks
    if shape is None: shape = default_launch(backend, matrix)
    warps, unroll = shape.warps, shape.unroll
    if matrix:
        if backend != "cuda" or dtype not in (dtypes.float16, dtypes.bfloat16) or q.shape[3] % 32 or v.shape[3] % 64 or passes != 2:
            raise ValueError(f"decode_attention: the matrix-unit pass needs CUDA, a 16-bit dtype, D % 32 == 0, DV % 64 == 0 "
                             f"and two passes (got {backend}, {dtype}, D {q.shape[3]}, DV {v.shape[3]}, passes {passes})")
        if matrix_staging_bytes(q.shape[1] // k.shape[1] * q.shape[2], v.shape[3], warps) > 48 * 1024:
            raise ValueError(f"decode_attention: {warps} SIMD groups' partials of DV {v.shape[3]} exceed 48 KB of threadgroup memory")
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, value_dim = k.shape[1], v.shape[3]
    device = q.device
    mask_kind = 0 if mask is None else 1 if mask.dtype == dtypes.bool else 2
    ins, runtime, backward = attention_inputs(q, k, v, dtype, mask, sinks, paged, composition)
    length_scalars: list[UOp] = []
    length_params: list[Param] = []
    length = "ints"
    if paged is None and not isinstance(k.shape[2], int):
        length = _length_expression(k.shape[2], length_scalars, length_params)
    if window is not None: runtime.append(window)
    if length == "ints" and paged is None: runtime.append(k.shape[2])
    if matrix:  # each threadgroup's share of the blocks (block_groups threadgroups, or one per block)
        blocks_per_group = -(-blocks // max(1, min(vector.block_groups or blocks, blocks)))
        runtime.append(blocks_per_group)
    ins.append(int_buffer(device, tuple(runtime) or (0,)))
    spec = DecodeSpec(dtype, head_dim, value_dim, q_heads, kv_heads, q_len, passes, blocks, causal, window is not None,
                      mask_kind, sinks is not None, paged[2] if paged is not None else 0, scale, length, warps, unroll, matrix,
                      vector.l2_ahead if matrix else 0)
    programs = spec.programs(backend, length_params)
    grid = (kv_heads * spec.row_groups(), batch, -(-blocks // blocks_per_group) if matrix else blocks if passes == 2 else 1)
    label = (f"{backend} {dtype.name} D{head_dim}/{value_dim} gqa{q_heads // kv_heads} Lq{q_len} passes{passes} blocks{blocks}"
             + (" matrix" if matrix else ""))
    out = Tensor.empty(batch, q_heads, q_len, value_dim, dtype=dtype, device=device)
    if passes == 1:
        return launch(programs[0], device, [out], ins, grid, warps * 32, scalars=length_scalars, backward=backward,
                      label=label)[0]
    rows = batch * q_heads * q_len
    partials = launch(programs[0], device,
                      [Tensor.empty(rows * blocks * value_dim, dtype=dtypes.float32, device=device),
                       Tensor.empty(rows * blocks, dtype=dtypes.float32, device=device),
                       Tensor.empty(rows * blocks, dtype=dtypes.float32, device=device)],
                      ins, grid, warps * 32, scalars=length_scalars, label=label)
    # The first pass's inputs ride along, unread, so that the merge's backward reaches them.
    merge_ins = list(partials) + ([ins[3 + (mask_kind > 0)]] if sinks is not None else []) + ins
    return launch(programs[1], device, [out], merge_ins, (rows, 1, 1), spec.merge_threads(), backward=backward, label=label)[0]


def attention_inputs(q: Tensor, k: Tensor, v: Tensor, dtype: DType, mask: Tensor | None, sinks: Tensor | None,
                     paged: tuple[Tensor, Tensor, int] | None, composition: Callable | None
                     ) -> tuple[list[Tensor], list[int], Backward | None]:
    """What the attention kernels read, as `decode_attention` and `prefill_attention` take their
    arguments: the buffers in parameter order (q, K and V or their caches or pools, the mask, the
    sinks, then with `paged` the block tables and lengths), the runtime integers they start with
    (K's and V's offsets and strides, or the table's width and the pool's blocks; then the mask's
    strides), and the backward from `composition`."""
    ins = [kernel_input(q.cast(dtype))]
    key_of = value_of = whole
    if paged is None:
        buffers, runtime, key_of, value_of = kv_buffers(k, v, dtype)
        ins += buffers
    else:
        block_tables, lengths, _ = paged
        ins += [k.cast(dtype), v.cast(dtype)]
        runtime = [block_tables.shape[1], k.shape[0]]
    mask_kind = 0
    if mask is not None:
        mask_kind = 1 if mask.dtype == dtypes.bool else 2
        mask, strides = mask_buffer(mask, dtype)
        ins.append(mask)
        runtime += strides
    if sinks is not None: ins.append(sinks.cast(dtype))
    backward = attention_backward(composition, tuple(ins), key_of, value_of, mask_kind, sinks is not None)
    if paged is not None: ins += [block_tables, lengths]
    return ins, runtime, backward


def kv_buffers(k: Tensor, v: Tensor, dtype: DType) -> tuple[list[Tensor], list[int], Callable, Callable]:
    """K and V `[B, Hkv, Lk, D|DV]` as the kernels read them: their buffers in `dtype` (where one is a
    slice of a longer cache along the sequence, that cache, read in place), their runtime integers
    (`k_offset, v_offset, k_batch_stride, k_head_stride, v_batch_stride, v_head_stride`), and how
    the composition sees K and V from those buffers (`key_of`, `value_of`)."""
    kv_heads, head_dim, value_dim = k.shape[1], k.shape[3], v.shape[3]
    keys, values = k.cast(dtype), v.cast(dtype)
    key_view, value_view = cache_view(keys), cache_view(values)
    strides = [key_view.offset, value_view.offset, kv_heads * key_view.capacity * head_dim, key_view.capacity * head_dim,
               kv_heads * value_view.capacity * value_dim, value_view.capacity * value_dim]
    return [key_view.base, value_view.base], strides, _logical(key_view, keys), _logical(value_view, values)


def mask_buffer(mask: Tensor, dtype: DType) -> tuple[Tensor, list[int]]:
    """An array mask as the kernels read it (a boolean one as bytes, an additive one in `dtype`) and
    its element strides over `[B, Hq, Lq, Lk]` in the order key, query, head, batch (0 where it
    broadcasts)."""
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    strides, running = [], 1
    for size in reversed(mask.shape):
        strides.append(0 if size == 1 else running)
        running *= size
    return (mask.cast(dtypes.uint8) if mask.dtype == dtypes.bool else mask.cast(dtype)), strides


def attention_backward(composition: Callable | None, inputs: tuple[Tensor, ...], key_of: Callable, value_of: Callable,
                       mask_kind: int, sinks: bool) -> Backward | None:
    """The attention kernels' backward: the gradient of `composition(q, k, v, mask, sinks)` in q, k, v
    and the sinks, from the call's inputs `(q, k or its cache, v or its cache[, mask][, sinks])`;
    `key_of` and `value_of` give the call's keys and values from what the kernel reads, and a
    boolean mask (passed as bytes) is read back as bool."""
    if composition is None: return None

    def composed(q: Tensor, k_base: Tensor, v_base: Tensor, *rest: Tensor) -> Tensor:
        mask = None if not mask_kind else rest[0] != 0 if mask_kind == 1 else rest[0]
        return composition(q, key_of(k_base), value_of(v_base), mask, rest[-1] if sinks else None)
    return Backward("scaled_dot_product_attention", composed, inputs, wrt=(0, 1, 2) + ((len(inputs) - 1,) if sinks else ()))


def whole(base: Tensor) -> Tensor:
    """A kernel's K or V argument as the composition sees it: itself (not a slice of a cache)."""
    return base


def _logical(view: CacheView, t: Tensor) -> Callable[[Tensor], Tensor]:
    """How the composition sees `t` (K or V in the call's dtype) from the kernel's argument: the
    argument itself, or the slice of the cache it views."""
    if view.base is t: return whole
    return lambda base: base[:, :, view.offset:view.offset + t.shape[2]]
