"""The tiled prefill attention kernels, the attention plan's `Tiled` route: FlashAttention-style
tiles of query rows against tiles of keys on the matrix units, over contiguous K/V (or slices of
longer caches, read in place) or a paged pool. `src/sdpa_prefill.h` runs on CUDA's mma.sync and
Metal's simdgroup matrices; `src/sdpa_prefill_wgmma.h` on Hopper's warpgroup products (CUDA sm_90a)
for head sizes 64, 128 and 256.

A threadgroup of `warps` SIMD groups serves `warps * row_tiles * 16` query rows of one key head and
one batch item (the head's grouped query heads packed with the positions); its key tiles hold
`keys` keys. `plan` chooses these from the head sizes, the dtype and the target only, never from
the batch or the lengths, so a row's bits never depend on the call it is in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import dtype_name
from . import Target
from .attention import attention_inputs
from .program import CTYPES, Family, Param, Program, Resources, int_buffer, launch, metal_limit_reason, \
    threadgroup_array


@dataclass(frozen=True)
class Tiled:
    """The tiled prefill kernel's launch (the attention plan's `Tiled` route): threadgroups of
    `warps` SIMD groups, each owning `row_tiles` tiles of 16 query rows, over key tiles of `keys`
    keys; `q_resident`: Q's fragments held in registers for the whole key loop (else read from
    threadgroup memory at every key tile); `resident_groups` (CUDA): threadgroups a multiprocessor
    must hold at once, which caps the compiler's registers (0: no cap). With `wgmma_stages` the
    launch is sdpa_prefill_wgmma.h's: `warps / 4` warpgroups of 64 rows (`row_tiles` 1), key tiles
    copied `wgmma_stages - 1` ahead into as many stages."""
    warps: int
    row_tiles: int
    keys: int
    q_resident: bool
    resident_groups: int = 0
    wgmma_stages: int = 0  # past 0: the warpgroup kernel, `warps / 4` warpgroups, this many stages of K and V

    @property
    def rows(self) -> int:
        """Query rows (grouped heads x positions) a threadgroup serves."""
        return self.warps * self.row_tiles * 16


# Head sizes (D, DV) the kernel takes: D a multiple of 8 (padded to 16 for the products), DV of 8.
PREFILL_HEADS = frozenset({(d, d) for d in (64, 72, 80, 96, 128, 192, 256)} | {(96, 64)})
PREFILL_DTYPES = (dtypes.float16, dtypes.bfloat16)


# Head sizes the warpgroup kernel takes: its products read 64-feature blocks, and V's blocks are
# the N of a wgmma shape the prelude writes out (64, 128, 256).
WGMMA_HEADS = frozenset({(d, dv) for d in (64, 128, 256) for dv in (64, 128, 256)}) & PREFILL_HEADS
# From the sweep (`tools/tune_prefill.py --wgmma`, benchmarks/prefill_h200.md; causal bf16 32/8
# heads, 4096 tokens, on an H100): head size 64, one warpgroup over 128-key tiles (321 TFLOP/s
# against 268-304 for two and three); 128, three warpgroups over 128-key tiles (452 against 404 for
# two); 256, two over 64-key tiles (473: a thread's O takes 128 registers, so three do not fit, and
# Q and two stages of 128-key tiles would not fit 227 KB); two stages (a third gained nothing).
WGMMA_SHAPES = {64: Tiled(4, 1, 128, False, wgmma_stages=2), 128: Tiled(12, 1, 128, False, wgmma_stages=2),
                256: Tiled(8, 1, 64, False, wgmma_stages=2)}
# Under an array mask three warpgroups' 168 registers a thread would spill (132 bytes, ptxas): two.
WGMMA_MASKED_128 = Tiled(8, 1, 128, False, wgmma_stages=2)
WGMMA_MAX_DYNAMIC = 227 * 1024  # an sm_90 threadgroup's dynamic threadgroup memory


def padded(head_dim: int) -> int:
    """D rounded up to the 16 features of an mma step."""
    return -(-head_dim // 16) * 16


def plan(backend: str, head_dim: int, value_dim: int, array_mask: bool = False, warpgroups: bool = False) -> Tiled:
    """The launch for head sizes `(head_dim, value_dim)` on `backend` (`array_mask`: the call reads a
    mask array; `warpgroups`: a CUDA target with Hopper's warpgroup products, whose kernel takes the
    head sizes of WGMMA_HEADS in the launch WGMMA_SHAPES gives the larger of them, WGMMA_MASKED_128
    for 128 under an array mask). Otherwise within 48 KB of static threadgroup memory (CUDA) or Apple's 32 KB, and a lane's
    registers without spilling: a 16-row tile's output is `DV / 2` floats a lane, its Q fragments
    `D / 4` words (in registers where `q_resident`), its scores `KEYS / 2` floats. From the H200
    sweep (`tools/tune_prefill.py`, benchmarks/prefill_h200.md): CUDA, 4 SIMD groups over 64-key
    tiles with Q in registers, two row tiles each up to head size 64 (the fragments of K and V
    serve twice the rows) but one under an array mask (whose addressing would spill); past 128,
    32-key tiles, or under an array mask 2 SIMD groups over 16-key tiles reading Q from threadgroup
    memory. Metal (whose
    tiles hold floats): Q from threadgroup memory, 4 SIMD groups over 16-key tiles up to 128, 1
    SIMD group beyond."""
    largest = max(head_dim, value_dim)
    if backend == "cuda" and warpgroups and (head_dim, value_dim) in WGMMA_HEADS:
        return WGMMA_MASKED_128 if array_mask and largest == 128 else WGMMA_SHAPES[largest]
    if backend == "cuda":
        if largest <= 64: return Tiled(4, 1 if array_mask else 2, 64, True)
        if largest <= 128: return Tiled(4, 1, 64, True)
        return Tiled(2, 1, 16, False) if array_mask else Tiled(4, 1, 32, True)
    return Tiled(1, 1, 16, False) if largest > 128 else Tiled(4, 1, 16, False)


def threadgroup_bytes(head_dim: int, value_dim: int, dtype: DType, shape: Tiled) -> int:
    """The kernel's threadgroup memory: Q's rows, then K's and V's tiles (in the same buffer once Q's
    fragments are in registers)."""
    k_line, v_line = padded(head_dim) + 8, value_dim + 8
    q, kv = shape.rows * k_line, shape.keys * (k_line + v_line)
    return threadgroup_array(max(q, kv) if shape.q_resident else q + kv, dtype.itemsize)


def wgmma_bytes(head_dim: int, value_dim: int, shape: Tiled) -> int:
    """The warpgroup kernel's dynamic threadgroup memory: Q's tile, the stages of K's and V's tiles
    (16-bit), and 1024 bytes to align them."""
    return 2 * (shape.rows * head_dim + shape.wgmma_stages * shape.keys * (head_dim + value_dim)) + 1024


def metal_resources(head_dim: int, value_dim: int, dtype: DType, shape: Tiled) -> Resources:
    """The threadgroup on Metal: its threads and its one threadgroup array."""
    return Resources(shape.warps * 32, threadgroup_bytes(head_dim, value_dim, dtype, shape))


def unsupported(head_dim: int, value_dim: int, dtype: DType, target: Target) -> str | None:
    """Why the tiled kernel does not take a prefill call on `target` (None when it does): head sizes
    in PREFILL_HEADS, float16 or bfloat16 (float32 composes), a target with matrix units (and bfloat
    for bfloat16), a threadgroup within an Apple GPU's limits on Metal."""
    if (head_dim, value_dim) not in PREFILL_HEADS: return f"head sizes D {head_dim} / DV {value_dim} have no tiled kernel"
    if dtype not in PREFILL_DTYPES: return f"{dtype_name(dtype)} has no tiled kernel (float16 and bfloat16 do; float32 composes)"
    if (reason := target.lacks(bfloat=dtype == dtypes.bfloat16, matrix_units=True)) is not None: return reason
    if target.backend == "metal":
        over = metal_limit_reason(metal_resources(head_dim, value_dim, dtype, plan("metal", head_dim, value_dim, True)))
        if over is not None: return f"the tiled kernel's threadgroup would take {over}"
    return None


PREFILL = Family("nuvec_sdpa_prefill", ("sdpa_rows.h", "sdpa_prefill.h"), unsupported, plan)
PREFILL_WGMMA = Family("nuvec_sdpa_prefill_wgmma", ("wgmma_steps.h", "sdpa_rows.h", "sdpa_prefill_wgmma.h"), unsupported, plan,
                       backends=("cuda",), arch="sm_90a")


@dataclass(frozen=True)
class PrefillSpec:
    """A specialisation of the tiled kernel: everything its source depends on."""
    dtype: DType
    head_dim: int
    value_dim: int
    q_heads: int
    kv_heads: int
    causal: bool
    window: bool
    mask_kind: int   # 0 none, 1 boolean, 2 additive
    sinks: bool
    page: int        # the paged block size; 0: contiguous K/V
    scale: float
    shape: Tiled

    @property
    def family(self) -> Family:
        """The kernel this specialisation is of."""
        return PREFILL_WGMMA if self.shape.wgmma_stages else PREFILL

    def runtime_names(self) -> list[str]:
        """The integers the kernel reads from its `ints` buffer, in order."""
        names = ["q_len"] + (["max_blocks", "pool_blocks"] if self.page else
                             ["k_len", "k_offset", "v_offset", "k_batch_stride", "k_head_stride", "v_batch_stride",
                              "v_head_stride"])
        if self.mask_kind: names += ["mask_key_stride", "mask_query_stride", "mask_head_stride", "mask_batch_stride"]
        if self.window: names.append("window")
        return names

    def params(self) -> list[Param]:
        """The kernel's parameters in launch order: the output, then its inputs."""
        ctype = CTYPES[self.dtype]
        ins = [Param("q", "in", ctype), Param("k", "in", ctype), Param("v", "in", ctype)]
        if self.mask_kind: ins.append(Param("mask", "in", "unsigned char" if self.mask_kind == 1 else ctype))
        if self.sinks: ins.append(Param("sinks", "in", ctype))
        if self.page: ins += [Param("block_tables", "in", "int"), Param("lengths", "in", "int")]
        return [Param("out", "out", ctype)] + ins + [Param("ints", "in", "int")]

    def program(self, backend: str) -> Program:
        """The specialisation for `backend`."""
        group = self.q_heads // self.kv_heads
        defines = dict(T=CTYPES[self.dtype], D=self.head_dim, DP=padded(self.head_dim), DV=self.value_dim, HQ=self.q_heads,
                       HKV=self.kv_heads, GQA=group, WARPS=self.shape.warps, ROW_TILES=self.shape.row_tiles,
                       KEYS=self.shape.keys, Q_RESIDENT=int(self.shape.q_resident), CAUSAL=int(self.causal), WINDOW_ON=int(self.window), MASK_KIND=self.mask_kind,
                       SINKS=int(self.sinks), PAGED=int(self.page > 0), PAGE=max(self.page, 1),
                       SCALE_LOG2E=f"{self.scale * math.log2(math.e)!r}f",
                       SCALE_POSITIVE=int(self.scale > 0),
                       RUNTIME_INTS="".join(f"const int {name} = ints[{i}]; " for i, name in enumerate(self.runtime_names())))
        if self.shape.wgmma_stages:
            dynamic = wgmma_bytes(self.head_dim, self.value_dim, self.shape)
            if backend != "cuda" or (self.head_dim, self.value_dim) not in WGMMA_HEADS or dynamic > WGMMA_MAX_DYNAMIC:
                raise ValueError(f"prefill_attention: no warpgroup kernel for D {self.head_dim} / DV {self.value_dim} "
                                 f"on {backend} in {dynamic} bytes of threadgroup memory")
            defines.update(WARPGROUPS=self.shape.warps // 4, STAGES=self.shape.wgmma_stages)
            # one threadgroup a multiprocessor: the compiler keeps to the registers that leaves a thread
            return PREFILL_WGMMA.program("cuda", defines, self.params(), occupancy=(self.shape.warps * 32, 1),
                                         dynamic_bytes=dynamic)
        groups = self.shape.resident_groups
        return PREFILL.program(backend, defines, self.params(),
                               occupancy=(self.shape.warps * 32, groups) if groups and backend == "cuda" else None)

    def grid(self, batch: int, q_len: int) -> tuple[int, int, int]:
        """Threadgroups: the tiles of each key head's `q_len * GQA` rows, the key heads, the batch."""
        return (-(-q_len * (self.q_heads // self.kv_heads) // self.shape.rows), self.kv_heads, batch)

    def metal_resources(self) -> Resources:
        return metal_resources(self.head_dim, self.value_dim, self.dtype, self.shape)


def describe(shape: Tiled) -> str:
    """The launch in words, for NUVEC_DEBUG and the launch labels."""
    if shape.wgmma_stages:
        return f"{shape.warps // 4} warpgroups x 64 rows, {shape.keys}-key tiles in {shape.wgmma_stages} stages, wgmma"
    return (f"{shape.warps} SIMD groups x {shape.row_tiles * 16} rows, {shape.keys}-key tiles, Q "
            + ("in registers" if shape.q_resident else "read each tile"))


def prefill_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, shape: Tiled, *, dtype: DType, backend: str,
                      causal: bool, window: int | None, mask: Tensor | None, sinks: Tensor | None,
                      paged: tuple[Tensor, Tensor, int] | None = None, composition: Callable | None = None) -> Tensor:
    """Launch the tiled kernel; returns `[B, Hq, Lq, DV]` in `dtype` (float16 or bfloat16).

    q: `[B, Hq, Lq, D]`. Without `paged`, k and v are `[B, Hkv, Lk, D|DV]` (slices of longer caches
    along the sequence are read in place); with `paged = (block_tables int32 [B, M], lengths int32
    [B], page)` (tables and lengths as `paged_attention` clamps them: entries are clamped again in
    the kernel), k and v are pools `[blocks, Hkv, page, D|DV]` and the queries are each sequence's
    last positions. mask: bool or additive in `dtype`, broadcastable to `[B, Hq, Lq, Lk]`. window:
    with `causal`. composition: `(q, k, v, mask, sinks) -> out` from tensor operations on the
    call's own inputs, whose gradient is the kernel's backward.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, value_dim = k.shape[1], v.shape[3]
    if batch > 65535 or kv_heads > 65535:
        raise ValueError(f"prefill_attention: a batch of {batch} and {kv_heads} key heads exceed the grid's 65535")
    device = q.device
    mask_kind = 0 if mask is None else 1 if mask.dtype == dtypes.bool else 2
    ins, runtime, backward = attention_inputs(q, k, v, dtype, mask, sinks, paged, composition)
    runtime = [q_len] + ([] if paged is not None else [k.shape[2]]) + runtime
    if window is not None: runtime.append(window)
    ins.append(int_buffer(device, tuple(runtime)))
    spec = PrefillSpec(dtype, head_dim, value_dim, q_heads, kv_heads, causal, window is not None, mask_kind,
                       sinks is not None, paged[2] if paged is not None else 0, scale, shape)
    label = f"{backend} {dtype_name(dtype)} D{head_dim}/{value_dim} gqa{q_heads // kv_heads} Lq{q_len} tiled ({describe(shape)})"
    out = Tensor.empty(batch, q_heads, q_len, value_dim, dtype=dtype, device=device)
    return launch(spec.program(backend), device, [out], ins, spec.grid(batch, q_len), shape.warps * 32, backward=backward,
                  label=label)[0]
