"""The quantized product kernels: `qmv` (`src/qmv.h`), `y = x · wᵀ` for up to 8 rows of x, `qvm`
(`src/qvm.h`), `y = x · w` for untransposed weights, and `qmm` (`src/qmm.h`), `y = x · wᵀ` for
more rows on the matrix units, over packed weights of any affine width or floating-point mode
(`src/quant_codes.h`), float32 accumulation.

Which kernel runs (the same rule on METAL and CUDA; `quant/affine.py` and `quant/gather.py` ask
with the device's `kernels.Target`, anything else is the composition):
- `quantized_matmul` (`product_route`), 2-D weights: up to MAX_ROWS rows of x, `qmv` (transposed)
  or `qvm` (not), any activation type (`qmv_unsupported`), except that on CUDA QMV_MMA_MIN_ROWS to
  MAX_ROWS rows of float16 or bfloat16 x run `qmv_mma` (`src/qmv_mma.h`, the matrix units;
  `takes_qmv_mma`); more rows of float16 or bfloat16 and transposed, `qmm` (`qmm_unsupported`:
  float32 activations stay on the composition, the tiles are 16-bit).
- `gather_qmm` (`gather_route`), transposed, no global scale: sorted single-row entries averaging
  more than MAX_ROWS rows per weight batch, the gathered `qmm` (`grouped_gather`); otherwise up to
  MAX_ROWS rows per entry, `gather_qmv`.
- On every route: bfloat16 anywhere needs a target with bfloat, qmm a target with matrix units,
  and on Metal a kernel's threadgroup (`*_metal_resources`) must fit an Apple GPU's limits.
- qmm on a target with Hopper's warpgroup products (CUDA sm_90) and K a multiple of 64
  (`takes_qmm_wgmma`: K and the device decide) runs a warpgroup kernel in its place
  (`qmm_hopper_tiles`): up to FEW_ROWS rows of 2-, 4- or 8-bit weights, not gathered,
  `qmm_wgmma_rs` in `few_rows_tiles` (K split in parts from K and N: `few_rows_split`);
  `qmm_wgmma_rs` (`src/qmm_wgmma_rs.h`, w dequantized into the products' registers) by its plan for
  more rows of affine 4-bit weights, not gathered (`takes_qmm_wgmma_rs`); else `qmm_wgmma`
  (`src/qmm_wgmma.h`), or `qmm_wgmma_ws` (`src/qmm_wgmma_ws.h`, a producer warpgroup decodes while
  the others multiply) where routed (`takes_qmm_wgmma_ws`: not at present). From DEQUANTIZED_ROWS
  rows (DEQUANTIZED_RS_ROWS in qmm_wgmma_rs's formats, fewer where N is small) `quantized_matmul`
  dequantizes w once (`dequantize`, `src/dequantize.h`) and runs
  `linear.gemm_wgmma` (`takes_dequantized`). All sum the same rounded weights in the same order:
  the same bits, so a row's bits never depend on the row count that picks the kernel, except
  that the few rows' parts of K (where there are several) give a row the same bits over 1 to
  FEW_ROWS rows only.

`plan` picks qmv's launch shape (`QmvPlan`); its defaults are the module constants below, read off
`tools/tune_qmv.py` on the device. Only `k_split` changes a row's arithmetic order, so
it depends on K and N alone: a row's bits never depend on how many rows share the call (qvm's
`qvm_split` likewise depends on K alone).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import dtype_name
from . import Target
from . import target as _target
from .program import (CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, kernel_input, launch, metal_limit_reason,
                      threadgroup_array)

MAX_ROWS = 8                  # rows of x qmv and qvm take (more: qmm, or the composition)
CODES_PER_STEP = 32 * 32      # a SIMD group's step: 32 lanes x a chunk of 32 consecutive codes
# Launch-shape defaults (see `plan`).
COLUMNS_PER_WARP = 4          # output columns a SIMD group serves (each x value it loads serves them all)
COLUMNS_PER_WARP_LONG = 8     # ... for one row where a SIMD group takes 2 steps or more (x's cost over more codes)
LONG_COLUMNS_MIN_WARPS = 1536 # ... and where that still leaves this many SIMD groups (H200: about 12 an SM)
COLUMN_WARPS = 1              # SIMD groups of a threadgroup that serve different columns ...
COLUMN_WARPS_ONE_ROW = 2      # ... for one row at COLUMNS_PER_WARP columns, K split in 2 or less
TARGET_WARPS = 4096           # K is split until about this many SIMD groups run (H200: 132 SMs x 32) ...
FEW_WARPS = 2048              # ... leaving each 2 steps or more, unless fewer than this many SIMD groups run
MAX_K_SPLIT = 8               # SIMD groups that share a set of columns, each a slice of K's steps
UNROLL = 1                    # steps whose weight loads a lane issues together (at most its step count)
_MODES = {"affine": 0, "mxfp4": 1, "mxfp8": 2, "nvfp4": 3}


class _WarpgroupGrid:
    """What the tiles of the warpgroup kernels share: `warpgroups` warpgroups a threadgroup over a
    grid of `rows` x `columns` tiles of y."""
    rows: int
    columns: int
    warpgroups: int

    @property
    def threads(self) -> int: return 128 * self.warpgroups

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """(row tiles, column tiles, 1): a tile of w's threadgroups launch together, so w is read
        from memory about once."""
        return math.ceil(m / self.rows), math.ceil(n / self.columns), 1


@dataclass(frozen=True)
class WgmmaTiles(_WarpgroupGrid):
    """The tiles of the kernels on Hopper's warpgroup products (gemm_wgmma, qmm_wgmma):
    `warpgroups` x 64 rows by `columns` (64, 128, 224 or 256) outputs a threadgroup, `stages` stage
    buffers of WGMMA_STEP k (STAGES - 2 steps copied ahead)."""
    warpgroups: int
    columns: int
    stages: int

    @property
    def rows(self) -> int: return 64 * self.warpgroups

    @property
    def width(self) -> int:
        """The warpgroup product's N (a wave's cost in `wgmma_tiles`): the tile's columns."""
        return self.columns

    def __str__(self) -> str: return f"wgmma {self.rows}x{self.columns}/{self.stages}s"


@dataclass(frozen=True)
class RegisterTiles(_WarpgroupGrid):
    """qmm_wgmma_rs's tiles (`src/qmm_wgmma_rs.h`, the product as its transpose): `rows` rows of x
    (16, 32, 64, 128 or 256, the warpgroup product's N; 16 with one warpgroup only) by 64 *
    `warpgroups` weight rows (outputs) a threadgroup, `stages` stage buffers of WGMMA_STEP k (STAGES
    - 2 steps copied ahead); `k_split` threadgroups a tile, each a part of K, whose float32 partial
    sums are added in order (the split is part of a row's bits): in the kernel where `cluster_sum`
    (the tile's threadgroups a cluster, 2 to 8 of them, CUDA sm_90), else by `qmm` (`sum_parts`)."""
    rows: int
    warpgroups: int
    stages: int
    k_split: int = 1
    cluster_sum: bool = False

    @property
    def columns(self) -> int: return 64 * self.warpgroups

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """(row tiles, column tiles, parts of K)."""
        return math.ceil(m / self.rows), math.ceil(n / self.columns), self.k_split

    @property
    def width(self) -> int:
        """The warpgroup product's N (a wave's cost in `wgmma_tiles`): the tile's rows of x."""
        return self.rows

    def __str__(self) -> str:
        split = f"/k{self.k_split}{'c' if self.cluster_sum else ''}" if self.k_split > 1 else ""
        return f"wgmma-rs {self.rows}x{self.columns}/{self.stages}s{split}"


@dataclass(frozen=True)
class ProducerTiles(_WarpgroupGrid):
    """qmm_wgmma_ws's tiles (`src/qmm_wgmma_ws.h`, warp-specialised): `warpgroups` consumer
    warpgroups x 64 rows by `columns` (128 or 256) outputs a threadgroup, plus `producers` (1 or 2)
    producer warpgroups that copy x and decode w; `stages` buffers of WGMMA_STEP k (x tile and w
    tile)."""
    warpgroups: int
    columns: int
    stages: int
    producers: int = 1

    @property
    def rows(self) -> int: return 64 * self.warpgroups

    @property
    def threads(self) -> int: return 128 * (self.warpgroups + self.producers)

    @property
    def registers(self) -> tuple[int, int]:
        """(producer, consumer) registers a thread after `setmaxnreg`, or (0, 0) where the launch
        bound leaves every thread enough (256 threads or fewer): the producers keep
        WS_PRODUCER_REGISTERS, the consumers share the rest of what the launch gave."""
        if self.threads <= 256: return 0, 0
        entry = 65536 // self.threads // 8 * 8
        producer = WS_PRODUCER_REGISTERS[self.producers]
        consumer = (entry * self.threads - 128 * self.producers * producer) // (128 * self.warpgroups) // 8 * 8
        return producer, min(consumer, 256)

    @property
    def width(self) -> int:
        """The warpgroup product's N (a wave's cost in `wgmma_tiles`): the tile's columns."""
        return self.columns

    def __str__(self) -> str: return f"wgmma-ws {self.rows}x{self.columns}/{self.stages}s" + (f"/{self.producers}p" if self.producers > 1 else "")


# qmm_wgmma_ws's producer threads' registers after `setmaxnreg`, by producer warpgroups: what a
# producer's words and scales in flight need with the consumers still unspilled (`compile_cuda.py --ptxas`:
# one warpgroup at 144 leaves the consumers 176, and they spill; at 128 the 6-bit producers spill).
WS_PRODUCER_REGISTERS = {1: 136, 2: 88}


# A threadgroup's fixed cost (its x tiles' copies, prologue and epilogue) in columns of products: the
# value that fits the H200 sweep's pair at M 512 N 14336 (128 x 256 tiles in 2 waves at 516 TFLOP/s,
# 128 x 128 in 4 at 458; benchmarks/linear_h200.md).
TILE_OVERHEAD_COLUMNS = 37


def wgmma_tiles(rows: int, n: int, multiprocessors: int | None, small, wide: tuple, small_rows: int):
    """The wgmma kernels' plan rule over WgmmaTiles or RegisterTiles: `small` up to `small_rows`
    rows; beyond, of `wide` (widest first) the one whose waves of threadgroups over the device's
    multiprocessors (132, the H200's, where unknown) take the least time, a wave's time its tile's
    `width` (the warpgroup product's N) plus TILE_OVERHEAD_COLUMNS; the wider on a tie. A wave only
    part full costs a whole one, which is why narrower tiles can win where the product is one or two
    waves."""
    if rows <= small_rows: return small
    slots = multiprocessors or 132
    return min(wide, key=lambda t: math.ceil(math.prod(t.grid(rows, n)) / slots) * (t.width + TILE_OVERHEAD_COLUMNS))


def gathered_tile_rows(rows: int, batches: int) -> int:
    """Rows of x a tile of a gathered product on Hopper (64 or 128), from the rows a weight batch
    has on average, with a quarter more for the batches above it: 64 where they fit, else 128 (a
    64-row tile costs more a row, and a batch just past 64 rows would take two)."""
    return 64 if 1.25 * rows <= 64 * max(batches, 1) else 128


def gather_tile_slots(rows: int, rows_a_tile: int, batches: int) -> int:
    """The row tiles (threadgroups along M) of a gathered tiled product of `rows` rows: enough for
    sorted picks over `batches` batches, each run of one batch in tiles of at most `rows_a_tile`
    (one partial tile a run, and one more run of picks outside the batches), never more than the rows."""
    return max(1, min(rows, math.ceil(rows / rows_a_tile) + batches + 1))


def gather_tile_starts(picks: Tensor, rows_a_tile: int, batches: int) -> Tensor:
    """The row tiles of a gathered tiled product (GATHER's `TILE_ROWS` in gemm.h, gemm_wgmma.h, qmm.h,
    qmm_wgmma.h, qmm_wgmma_rs.h) as int32 `[slots + 1]` (`gather_tile_slots`): tile t is rows starts[t] ..
    starts[t + 1], at most `rows_a_tile`. Each run of equal picks (`picks` int `[M]`) is cut into
    tiles of its own, so that sorted picks give each tile one weight batch's rows and a tile runs its
    main loop once; the slots left over are empty (M .. M). Where the runs need more tiles than the
    slots (unsorted picks) the tiles are every `rows_a_tile` rows, which the kernels run in turn by
    runs (correct, slower). Tiles change no row's bits."""
    m = picks.shape[0]
    slots = gather_tile_slots(m, rows_a_tile, batches)
    picks = picks.cast(dtypes.int32)
    row = Tensor.arange(m, dtype=dtypes.int32).to(picks.device)
    run_starts = (row == 0) | (picks != picks.pad(((1, 0),))[:m])
    run_first = run_starts.where(row, 0).cummax(0)[0]  # each row's run's first row
    tile_starts = run_starts | ((row - run_first) % rows_a_tile == 0)
    tiles_through = tile_starts.cast(dtypes.int32).cumsum()  # tiles started at or before each row
    slot = Tensor.arange(slots + 1, dtype=dtypes.int32).to(picks.device)
    # tile t's first row: the rows whose tiles all come before t
    by_runs = (tiles_through.reshape(1, m) <= slot.reshape(-1, 1)).cast(dtypes.int32).sum(axis=1)
    fixed = (slot * rows_a_tile).minimum(m)
    return (tiles_through[-1] <= slots).where(by_runs, fixed).cast(dtypes.int32)


WGMMA_STEP = 64                     # k a step (BK): a tile row is 128 bytes, the 128-byte swizzle's width
WGMMA_ROW_BYTES = 2 * WGMMA_STEP
WGMMA_MAX_DYNAMIC = 232448          # an sm_90 threadgroup's dynamic threadgroup memory (227 KB)


@dataclass(frozen=True)
class QmvPlan:
    """A launch shape: a threadgroup of `column_warps * k_split` SIMD groups serves
    `column_warps * columns_per_warp` output columns; the `k_split` SIMD groups of one set of
    columns take K's steps in turn; each lane issues the loads of `unroll` steps together."""
    columns_per_warp: int
    column_warps: int
    k_split: int
    unroll: int

    @property
    def threads(self) -> int: return 32 * self.column_warps * self.k_split

    def groups(self, n: int) -> int:
        """Threadgroups for N output columns."""
        return math.ceil(math.ceil(n / self.columns_per_warp) / self.column_warps)


def k_split_for(k: int, n: int) -> int:
    """SIMD groups per set of columns for K and N (`split_steps` over qmv's steps and column sets):
    a function of K and N only (a row's order of summation)."""
    return split_steps(math.ceil(k / CODES_PER_STEP), math.ceil(n / COLUMNS_PER_WARP))


def split_steps(steps: int, column_sets: int, max_split: int = MAX_K_SPLIT) -> int:
    """SIMD groups sharing a set of columns, each a slice of a row's `steps` SIMD steps: a power of
    two, at most `max_split` and the step count. The steps are split in two while fewer than
    TARGET_WARPS SIMD groups run and each would keep 2 steps or more; a launch of fewer than
    FEW_WARPS SIMD groups is split down to one step a SIMD group. The H200 sweeps that chose it:
    `benchmarks/quant_h200.md` (the K split); the dense gemv shares it (512 bytes of a weight row
    a SIMD step, as qmv's at 4 bits)."""
    split = 1
    while (split * 2 <= min(max_split, steps) and column_sets * split < TARGET_WARPS
           and (math.ceil(steps / (split * 2)) >= 2 or column_sets * split < FEW_WARPS)):
        split *= 2
    return split


def plan(rows: int, k: int, n: int) -> QmvPlan:
    """The default launch shape; columns per SIMD group are at most N. Every row count takes
    COLUMNS_PER_WARP columns; one row takes COLUMNS_PER_WARP_LONG where each SIMD group has 2 steps
    or more and at least LONG_COLUMNS_MIN_WARPS SIMD groups still run (the x values a lane loads
    then serve more codes); one row at COLUMNS_PER_WARP columns with K split in 2 or less puts
    COLUMN_WARPS_ONE_ROW column sets in a threadgroup. Unrolling is at most a SIMD group's steps.
    None of these changes any row's arithmetic. The sweeps that chose them (`tools/tune_qmv.py`):
    `benchmarks/quant_h200.md` (the launch sweeps)."""
    split = k_split_for(k, n)
    warp_steps = math.ceil(math.ceil(k / CODES_PER_STEP) / split)
    long_rows = warp_steps >= 2 and math.ceil(n / COLUMNS_PER_WARP_LONG) * split >= LONG_COLUMNS_MIN_WARPS
    columns = min(COLUMNS_PER_WARP_LONG if rows == 1 and long_rows else COLUMNS_PER_WARP, n)
    paired = rows == 1 and columns == COLUMNS_PER_WARP and split <= 2 and n >= 2 * columns
    return QmvPlan(columns, COLUMN_WARPS_ONE_ROW if paired else COLUMN_WARPS, split, max(1, min(UNROLL, warp_steps)))


def _dtypes_unsupported(kernel: str, x_dtype: DType, scales_dtype: DType, out_dtype: DType,
                        x_dtypes: tuple[DType, ...] = tuple(CTYPES)) -> str | None:
    """Why `kernel` does not take these activation, scale and output dtypes (None when it does)."""
    if x_dtype not in x_dtypes: return f"{dtype_name(x_dtype)} activations ({kernel} takes {', '.join(map(dtype_name, x_dtypes))})"
    if out_dtype not in CTYPES: return f"a {dtype_name(out_dtype)} result"
    if scales_dtype not in CTYPES and scales_dtype != dtypes.uint8: return f"{dtype_name(scales_dtype)} scales"
    return None


def _target_unsupported(target: Target, types: tuple[DType, ...], metal_resources: Callable[[], Resources],
                        matrix_units: bool = False) -> str | None:
    """Why `target` cannot run a kernel over these dtypes: bfloat16 without bfloat, matrix units it
    lacks, or on Metal a threadgroup (`metal_resources()`) past an Apple GPU's limits."""
    reason = target.lacks(bfloat=dtypes.bfloat16 in types, matrix_units=matrix_units)
    if reason is None and target.backend == "metal":
        if (over := metal_limit_reason(metal_resources())) is not None: reason = f"its threadgroup would take {over}"
    return reason


def qmv_unsupported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int, target: Target,
                    kernel: str = "qmv") -> str | None:
    """Why qmv (or, `kernel` "qvm", qvm) does not take a call on `target` (None when it does): it
    takes 1 to MAX_ROWS rows of half, bfloat or float activations and output, and a non-empty
    weight of K inputs and N outputs."""
    if rows > MAX_ROWS: return f"{rows} rows ({kernel} takes at most {MAX_ROWS})"
    if rows == 0 or k == 0 or n == 0: return "an empty product"
    def resources() -> Resources:
        return qmv_metal_resources(rows, plan(rows, k, n)) if kernel == "qmv" else qvm_metal_resources(rows, k)
    return (_dtypes_unsupported(kernel, x_dtype, scales_dtype, out_dtype)
            or _target_unsupported(target, (x_dtype, scales_dtype, out_dtype), resources))


def qmv_metal_resources(rows: int, qmv_plan: QmvPlan) -> Resources:
    """qmv's threadgroup on Metal for `rows` rows of x: the SIMD groups' sums (`partials` in
    `qmv.h`: K_SPLIT x COLUMN_WARPS x XM x COLUMNS floats)."""
    return Resources(qmv_plan.threads,
                     threadgroup_array(qmv_plan.k_split * qmv_plan.column_warps * rows * qmv_plan.columns_per_warp, 4))


QMV = Family("nuvec_qmv", ("quant_codes.h", "column_sums.h", "qmv.h"), qmv_unsupported, plan)


def load_words(bits: int, words_per_row: int) -> int:
    """Words per vector load of a chunk (`bits` words at a multiple of `bits` in its row): 4 (16
    bytes) for 4 and 8 bits, 2 for 2 and 6, 1 otherwise, less where rows are not that aligned."""
    width = 4 if bits in (4, 8) else 2 if bits in (2, 6) else 1
    while words_per_row % width: width //= 2
    return width


def _params(out_ctype: str, x_ctype: str, scales_ctype: str, mode: str, gather: bool, tile_table: bool = False) -> list[Param]:
    """The products' buffer parameters: y, x, w, scales (, biases) (, picks) (, tile_starts: the
    gathered tiled products' `gather_tile_starts`)."""
    params = [Param("y", "out", out_ctype), Param("x", "in", x_ctype), Param("w", "in", "uint"),
              Param("scales", "in", scales_ctype)]
    if mode == "affine": params.append(Param("biases", "in", scales_ctype))
    if gather: params.append(Param("picks", "in", "int"))
    if tile_table: params.append(Param("tile_starts", "in", "int"))
    return params


def ctype(dtype: DType) -> str:
    """A weight's scales' (or an activation's) type in the dialect: uint8 scale codes are `uchar`."""
    return "uchar" if dtype == dtypes.uint8 else CTYPES[dtype]


def qmv_program(backend: str, x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int,
                bits: int, rows: int, k: int, n: int, qmv_plan: QmvPlan, batches: int = 0, glu: bool = False) -> Program:
    """The qmv specialisation for these arguments; `batches` > 0: the gathered product over that
    many weight batches (`gather_qmv`); `glu`: the product with SwiGLU's silu(gate) * up of x
    `[M, 2K]` (`swiglu_qmv`)."""
    if qmv_plan.columns_per_warp > n: raise ValueError(f"qmv: {qmv_plan.columns_per_warp} columns per SIMD group > N = {n}")
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], N_TOTAL=n, K_TOTAL=k, XM=rows, COLUMNS=qmv_plan.columns_per_warp,
                   COLUMN_WARPS=qmv_plan.column_warps, K_SPLIT=qmv_plan.k_split, UNROLL=qmv_plan.unroll,
                   LOAD_WORDS=load_words(bits, k * bits // 32), GATHER=int(batches > 0), BATCHES=max(batches, 1),
                   GLU=int(glu))
    return QMV.program(backend, defines, _params(defines["TY"], defines["TX"], defines["TS"], mode, batches > 0))


def _backward(op: str, composition, ins: list[Tensor], mode: str) -> Backward | None:
    """A product's backward: the gradient of `composition(x, weight, scales, biases, *rest)` in x
    and, for affine weights, in the scales and biases; `ins` the call's inputs in that order
    (without biases where there are none)."""
    if composition is None: return None
    affine = mode == "affine"

    def composed(x: Tensor, weight: Tensor, scales: Tensor, *rest: Tensor) -> Tensor:
        return composition(x, weight, scales, rest[0] if affine else None, *rest[affine:])
    return Backward(op, composed, tuple(ins), wrt=(0, 2, 3) if affine else (0,))


def _inputs(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, picks: Tensor | None = None) -> list[Tensor]:
    ins = [kernel_input(x), kernel_input(weight), kernel_input(scales)]
    if biases is not None: ins.append(kernel_input(biases))
    if picks is not None: ins.append(picks.cast(dtypes.int32).contiguous())
    return ins


def qmv(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, composition=None, qmv_plan: QmvPlan | None = None, glu: bool = False) -> Tensor:
    """`x [M, K] · wᵀ` for packed `weight [N, K * bits / 32]`, `scales` (and affine `biases`)
    `[N, K / group_size]`; returns `[M, N]` in `out_dtype`. With `glu`, x is `[M, 2K]` (a gated
    MLP's gate, then up) and the product is `(silu(gate) * up) · wᵀ` (K a multiple of 8).
    composition: `(x, weight, scales, biases) -> y`, whose gradient is the backward. `qmv_plan`
    overrides `plan` (tuning)."""
    rows, k = x.shape[0], x.shape[1] // (2 if glu else 1)
    if glu and (x.shape[1] != 2 * k or k % 8): raise ValueError(f"swiglu_qmv: x of {x.shape[1]} (gate and up) needs K a multiple of 8")
    n = weight.shape[0]
    qmv_plan = qmv_plan or plan(rows, k, n)
    kernel = qmv_program(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows,
                         k=k, n=n, qmv_plan=qmv_plan, glu=glu)
    ins = _inputs(x, weight, scales, biases)
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(kernel, x.device, [y], ins, (qmv_plan.groups(n), 1, 1), qmv_plan.threads,
                  backward=_backward("quantized_matmul", composition, ins, mode),
                  label=f"{backend} qmv{' swiglu' if glu else ''} {mode} {bits}-bit g{group_size} M{rows} {qmv_plan}")[0]


# The matrix-unit qmv (`src/qmv_mma.h`, CUDA): 2-8 rows of 16-bit x, each threadgroup a tile of
# QMV_MMA_COLUMNS outputs, its SIMD groups taking units of QMV_MMA_UNIT k in turn.
QMV_MMA_COLUMNS = 16          # outputs a tile (the mma's 16 rows of A)
QMV_MMA_UNIT = 128            # k a unit: 4 chunks, one a lane of each row of A
QMV_MMA_MIN_ROWS = 2          # one row runs qmv, faster there (benchmarks/quant_h200.md, "qmv_mma")
QMV_MMA_MAX_SPLIT = 8         # SIMD groups of a threadgroup, each a slice of K's units
QMV_MMA_UNROLL = 1            # units whose loads a lane issues together (the sweep: quant_h200.md)
# Whether `quantized_matmul` routes QMV_MMA_MIN_ROWS-8 rows to qmv_mma (off: qmv serves them; the
# route test asks for both).
QMV_MMA_ROUTED = True


@dataclass(frozen=True)
class QmvMmaPlan:
    """qmv_mma's launch: a threadgroup of `k_split` SIMD groups per tile of QMV_MMA_COLUMNS outputs,
    each taking every `k_split`-th unit of K; each lane issues the loads of `unroll` units together."""
    k_split: int
    unroll: int

    @property
    def threads(self) -> int: return 32 * self.k_split

    def groups(self, n: int) -> int:
        """Threadgroups for N output columns."""
        return math.ceil(n / QMV_MMA_COLUMNS)

    def __str__(self) -> str: return f"mma split {self.k_split} unroll {self.unroll}"


# Every launch `tools/narrow_probe.py --sweep` times (and the compile checks cover) besides the plan's.
# 16 SIMD groups at unroll 4 spill under the launch's register bound (128 a thread), so no plan asks for them
QMV_MMA_PLANS = tuple(QmvMmaPlan(split, unroll) for split in (1, 2, 4, 8, 16) for unroll in (1, 2, 4)
                      if split * unroll < 64)


def qmv_mma_plan(k: int, n: int) -> QmvMmaPlan:
    """qmv_mma's launch for K and N (`split_steps` over its units and tiles, at most
    QMV_MMA_MAX_SPLIT): K and N only, so a row's order of summation never depends on the rows."""
    units = math.ceil(k / QMV_MMA_UNIT)
    split = split_steps(units, math.ceil(n / QMV_MMA_COLUMNS), QMV_MMA_MAX_SPLIT)
    return QmvMmaPlan(split, max(1, min(QMV_MMA_UNROLL, math.ceil(units / split))))


def qmv_mma_unsupported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int,
                        target: Target) -> str | None:
    """Why qmv_mma does not take a call on `target` (None when it does): CUDA with matrix units,
    1 to MAX_ROWS rows of float16 or bfloat16 x, at least QMV_MMA_COLUMNS outputs, K a multiple of 16."""
    if target.backend != "cuda": return "qmv_mma is a CUDA kernel"
    if rows == 0 or k == 0 or n == 0: return "an empty product"
    if rows > MAX_ROWS: return f"{rows} rows (qmv_mma takes at most {MAX_ROWS})"
    if n < QMV_MMA_COLUMNS: return f"N = {n} (qmv_mma's tiles are {QMV_MMA_COLUMNS} outputs)"
    if k % 16: return f"K = {k} (qmv_mma takes multiples of 16)"
    return (_dtypes_unsupported("qmv_mma", x_dtype, scales_dtype, out_dtype, QMM_DTYPES)
            or target.lacks(bfloat=dtypes.bfloat16 in (x_dtype, scales_dtype, out_dtype), matrix_units=True))


def takes_qmv_mma(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int, target: Target) -> bool:
    """Whether `quantized_matmul` runs qmv_mma in qmv's place: QMV_MMA_ROUTED, QMV_MMA_MIN_ROWS to
    MAX_ROWS rows, and a call it takes (`qmv_mma_unsupported`). The rows choose between the two
    kernels, whose orders differ: a row keeps the same bits over 2-8 rows, not at 1."""
    return (QMV_MMA_ROUTED and rows >= QMV_MMA_MIN_ROWS
            and qmv_mma_unsupported(x_dtype, scales_dtype, out_dtype, rows, k, n, target) is None)


QMV_MMA = Family("nuvec_qmv_mma", ("quant_codes.h", "qmv_mma.h"), qmv_mma_unsupported, qmv_mma_plan, backends=("cuda",))


# Whether the Hopper products (qmm_wgmma, qmm_wgmma_rs, qmm_wgmma_ws), the dequantized route and
# qmv_mma decode 4-bit weights two at a time in x's type (`PAIRS`, quant_codes.h: each weight
# rounded once from the exact scale · code + bias). All of them or none, so that a row's bits never
# depend on which runs (affine's pairs round differently at rare ties; mxfp4's and nvfp4's never);
# False only for the probe's A/B against the general decoding.
PAIR_DECODING = True


def decodes_pairs(weights_dtype: DType, scales_dtype: DType, mode: str, bits: int) -> bool:
    """Whether weights of `weights_dtype` can be decoded two at a time in that type (`PAIRS`,
    `quant_codes.h`): 4-bit affine codes with 16-bit scales and biases of the same type, mxfp4
    codes into bfloat16 (its e8m0 scales are bfloat16 values exactly) and nvfp4 codes into either
    16-bit type (its e4m3 scales are values of both)."""
    if mode == "mxfp4": return weights_dtype == dtypes.bfloat16
    if mode == "nvfp4": return weights_dtype in (dtypes.float16, dtypes.bfloat16)
    return mode == "affine" and bits == 4 and scales_dtype == weights_dtype and weights_dtype in (dtypes.float16, dtypes.bfloat16)


def _pairs(weights_dtype: DType, scales_dtype: DType, mode: str, bits: int) -> int:
    """The PAIRS define of the Hopper products, the dequantized route and qmv_mma."""
    return int(PAIR_DECODING and decodes_pairs(weights_dtype, scales_dtype, mode, bits))


def qmv_mma_program(x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
                    rows: int, k: int, n: int, mma_plan: QmvMmaPlan, pairs: bool | None = None) -> Program:
    """The qmv_mma specialisation (CUDA) for these arguments: parameters as qmv's. `pairs`: the
    two-codes-at-a-time decoding as the other kernels have it (None: `PAIR_DECODING` where
    `decodes_pairs`), or not (False: the probe's A/B)."""
    if n < QMV_MMA_COLUMNS: raise ValueError(f"qmv_mma: N = {n} < {QMV_MMA_COLUMNS} outputs a tile")
    able = decodes_pairs(x_dtype, scales_dtype, mode, bits)
    if pairs and not able: raise ValueError(f"qmv_mma: no two-code decoding for {mode} {bits}-bit codes with {scales_dtype} scales")
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], N_TOTAL=n, K_TOTAL=k, XM=rows, K_SPLIT=mma_plan.k_split, UNROLL=mma_plan.unroll,
                   LOAD_WORDS=load_words(bits, k * bits // 32),
                   PAIRS=_pairs(x_dtype, scales_dtype, mode, bits) if pairs is None else int(pairs))
    # the launch's threads must find their registers on one multiprocessor: 16 SIMD groups at
    # unroll 4 asked for more than 65536 (CUDA error 701) until the bound capped them
    return QMV_MMA.program("cuda", defines, _params(defines["TY"], defines["TX"], defines["TS"], mode, False),
                           occupancy=(mma_plan.threads, 1))


def qmv_mma(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
            out_dtype: DType, backend: str, composition=None, mma_plan: QmvMmaPlan | None = None,
            pairs: bool | None = None) -> Tensor:
    """`x [M, K] · wᵀ` (M 1-8, x float16 or bfloat16) for packed `weight [N, K * bits / 32]`,
    `scales` (and affine `biases`) `[N, K / group_size]` on the matrix units; returns `[M, N]` in
    `out_dtype`. The weights are dequantized into x's type (qmm's rounding; with PAIRS the same fma
    rounded once in x's type), the products accumulate in float32. composition: `(x, weight,
    scales, biases) -> y`, whose gradient is the backward. `mma_plan` overrides `qmv_mma_plan` and
    `pairs` the decoding (`qmv_mma_program`; tuning)."""
    if backend != "cuda": raise ValueError(f"qmv_mma: a CUDA kernel, not {backend}")
    rows, k = x.shape
    n = weight.shape[0]
    mma_plan = mma_plan or qmv_mma_plan(k, n)
    kernel = qmv_mma_program(x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows, k=k,
                             n=n, mma_plan=mma_plan, pairs=pairs)
    ins = _inputs(x, weight, scales, biases)
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(kernel, x.device, [y], ins, (mma_plan.groups(n), 1, 1), mma_plan.threads,
                  backward=_backward("quantized_matmul", composition, ins, mode),
                  label=f"{backend} qmv_mma {mode} {bits}-bit g{group_size} M{rows} {mma_plan}")[0]


# The vector-matrix kernel (`src/qvm.h`): y = x · w for untransposed weights w [K, N], packed along N.
QVM_COLUMNS = 256     # output columns a threadgroup serves (8 chunks of 32)
QVM_MAX_SPLIT = 32    # SIMD groups of a threadgroup, each taking every K_SPLIT-th row of w
QVM_MIN_ROWS = 64     # rows of w a SIMD group takes at least


def qvm_split(k: int) -> int:
    """SIMD groups per threadgroup of `qvm`: a power of two, each taking at least QVM_MIN_ROWS rows
    of w. A function of K alone (the rows' order of summation)."""
    split = 1
    while split * 2 <= QVM_MAX_SPLIT and split * 2 * QVM_MIN_ROWS <= k: split *= 2
    return split


def qvm_unsupported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int,
                    target: Target) -> str | None:
    """Why qvm does not take a call on `target` (`qmv_unsupported`'s rules, qvm's threadgroup)."""
    return qmv_unsupported(x_dtype, scales_dtype, out_dtype, rows, k, n, target, kernel="qvm")


def qvm_metal_resources(rows: int, k: int) -> Resources:
    """qvm's threadgroup on Metal for `rows` rows of x and K: `qvm_split(k)` SIMD groups, their
    sums (`totals` in `qvm.h`: XM x QVM_COLUMNS floats)."""
    return Resources(32 * qvm_split(k), threadgroup_array(rows * QVM_COLUMNS, 4))


QVM = Family("nuvec_qvm", ("quant_codes.h", "qvm.h"), qvm_unsupported, qvm_split)


def qvm_program(backend: str, x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int,
                bits: int, rows: int, k: int, n: int) -> Program:
    """The qvm specialisation for these arguments."""
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], N_TOTAL=n, K_TOTAL=k, XM=rows, K_SPLIT=qvm_split(k),
                   LOAD_WORDS=load_words(bits, n * bits // 32))
    return QVM.program(backend, defines, _params(defines["TY"], defines["TX"], defines["TS"], mode, False))


def qvm(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, composition=None) -> Tensor:
    """`x [M, K] · w` for `weight [K, N * bits / 32]` packed along N, `scales` (and affine `biases`)
    `[K, N / group_size]`; returns `[M, N]` in `out_dtype`. Each row has a one-row product's bits.
    composition: as `qmv`'s."""
    rows, k = x.shape
    n = weight.shape[1] * 32 // bits
    kernel = qvm_program(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows,
                         k=k, n=n)
    ins = _inputs(x, weight, scales, biases)
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(kernel, x.device, [y], ins, (math.ceil(n / QVM_COLUMNS), 1, 1), 32 * qvm_split(k),
                  backward=_backward("quantized_matmul", composition, ins, mode),
                  label=f"{backend} qvm {mode} {bits}-bit g{group_size} M{rows} K{k} N{n}")[0]


MAX_ENTRIES = 65535  # a gathered product's entries are the grid's second axis (CUDA's limit)


def gather_qmv(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, picks: Tensor, *, mode: str,
               group_size: int, bits: int, out_dtype: DType, backend: str, composition=None,
               qmv_plan: QmvPlan | None = None) -> Tensor:
    """Entry p of `x [P, M, K]` times weight batch `picks[p]` (int32 `[P]`) of `weight [E, N, K *
    bits / 32]`, `scales` (and affine `biases`) `[E, N, K / group_size]`; returns `[P, M, N]` in
    `out_dtype`, zeros for a pick outside 0..E-1. Each row has the bits of a one-row `qmv`.
    composition: `(x, weight, scales, biases, picks) -> y`, whose gradient is the backward."""
    entries, rows, k = x.shape
    batches, n = weight.shape[0], weight.shape[1]
    qmv_plan = qmv_plan or plan(rows, k, n)
    kernel = qmv_program(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows,
                         k=k, n=n, qmv_plan=qmv_plan, batches=batches)
    ins = _inputs(x, weight, scales, biases, picks)
    y = Tensor.empty(entries, rows, n, dtype=out_dtype, device=x.device)
    return launch(kernel, x.device, [y], ins, (qmv_plan.groups(n), entries, 1), qmv_plan.threads,
                  backward=_backward("gather_qmm", composition, ins, mode),
                  label=f"{backend} gather_qmv {mode} {bits}-bit g{group_size} M{rows} E{batches} {qmv_plan}")[0]


# The matrix-matrix kernel (`src/qmm.h`): y = x · wᵀ for more rows than qmv takes (prefill), on the
# matrix units; tiles of QMM_ROWS x QMM_COLUMNS outputs in steps of QMM_STEP along K, 4 SIMD groups
# each. These are the source's BM, BN, BK, TILE_LD and STAGES (`qmm_program` passes them).
QMM_ROWS, QMM_COLUMNS, QMM_STEP, QMM_THREADS = 64, 64, 32, 128
QMM_TILE_LD = QMM_STEP + 8  # a tile row's stride (padding: no bank conflicts in the fragment loads)
# Stage buffers of the copies in flight: 3 steps ahead on CUDA (cp.async); Metal's copies are plain
# loads, done when issued, so a second buffer (the next step's words) is all staging gives there.
QMM_STAGES = {"cuda": 4, "metal": 2}
QMM_DTYPES = (dtypes.float16, dtypes.bfloat16)  # the mma's inputs: x (and the dequantized tiles) in x's type


def qmm_unsupported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int, bits: int,
                    target: Target) -> str | None:
    """Why qmm does not take a call of `bits`-bit weights on `target` (None when it does): it
    takes more than MAX_ROWS rows of 16-bit activations (float32 and the few-row products go
    elsewhere), a non-empty weight, at most 65535 row tiles (the grid's axis), and a target with
    matrix units."""
    if rows <= MAX_ROWS: return f"{rows} rows (qmm takes more than {MAX_ROWS})"
    if k == 0 or n == 0: return "an empty product"
    if math.ceil(rows / QMM_ROWS) > 65535: return f"{rows} rows (more than 65535 tiles of {QMM_ROWS})"
    return (_dtypes_unsupported("qmm", x_dtype, scales_dtype, out_dtype, QMM_DTYPES)
            or _target_unsupported(target, (x_dtype, scales_dtype, out_dtype), lambda: qmm_metal_resources(bits),
                                   matrix_units=True))


def qmm_metal_resources(bits: int) -> Resources:
    """qmm's threadgroup on Metal for `bits`-bit weights (`qmm.h` without MMA_DIRECT): QMM_STAGES
    stage buffers of packed words (`w_stage_memory`), the float tiles of w and x (`w_tile_memory`,
    `x_tile`: QMM_TILE_LD floats a row) and each SIMD group's 16 x 8 float scratch (`out_tile`);
    x is not staged (it is widened straight into its tile)."""
    return Resources(QMM_THREADS, threadgroup_array(QMM_STAGES["metal"] * QMM_COLUMNS * bits, 4)
                     + threadgroup_array(QMM_COLUMNS * QMM_TILE_LD, 4) + threadgroup_array(QMM_ROWS * QMM_TILE_LD, 4)
                     + threadgroup_array(QMM_THREADS // 32 * 16 * 8, 4))


def qmm_plan(rows: int, n: int) -> tuple[int, int]:
    """qmm's grid for M rows and N columns: (column tiles, row tiles) of QMM_COLUMNS x QMM_ROWS
    outputs, QMM_THREADS threads each (one tile shape for every call)."""
    return math.ceil(n / QMM_COLUMNS), math.ceil(rows / QMM_ROWS)


QMM = Family("nuvec_qmm", ("tile_rows.h", "quant_codes.h", "qmm.h"), qmm_unsupported, qmm_plan)


def product_route(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int, *, bits: int,
                  mode: str, transpose: bool, batched: bool, target: Target) -> tuple[str, str | None]:
    """`quantized_matmul`'s kernel on `target` for `rows` rows of x against a `bits`-bit weight of
    K inputs and N outputs in `mode`: `("qmv" | "qvm" | "qmm" | "qmm_dequantized", reason it cannot run or
    None)`. Up to MAX_ROWS rows, qmv (transposed) or qvm (not); more, qmm (transposed only), or
    from DEQUANTIZED_ROWS rows (DEQUANTIZED_RS_ROWS in qmm_wgmma_rs's formats; DEQUANTIZED_NARROW_ROWS at N up to DEQUANTIZED_NARROW_N) on Hopper
    `dequantize` then gemm_wgmma (`takes_dequantized`, the same bits); QMV_MMA_MIN_ROWS to
    MAX_ROWS rows of 16-bit x on CUDA, qmv_mma (`takes_qmv_mma`: "qmv_mma"); more rows of
    untransposed weights on Hopper, `dequantize` then gemm_wgmma over the dense rows' transpose
    (`takes_qmm_wgmma`: "qmm_dequantized"; elsewhere no kernel); `batched` (weights with batch axes:
    `quantized_matmul` takes them to `gather_route`) has no kernel here."""
    kernel = ("qmv" if transpose else "qvm") if rows <= MAX_ROWS else "qmm"
    if batched: return kernel, "weights with batch axes"
    if transpose and takes_qmv_mma(x_dtype, scales_dtype, out_dtype, rows, k, n, target): return "qmv_mma", None
    if kernel == "qmm":
        if not transpose:
            if takes_qmm_wgmma(k, target) and not qmm_unsupported(x_dtype, scales_dtype, out_dtype, rows, k, n, bits, target):
                return "qmm_dequantized", dequantize_unsupported(scales_dtype, x_dtype, k, n, target)   # w [K, N]: rows of N codes
            return kernel, f"{rows} rows of untransposed weights (qvm takes at most {MAX_ROWS}; dequantized on Hopper)"
        reason = qmm_unsupported(x_dtype, scales_dtype, out_dtype, rows, k, n, bits, target)
        if reason is None and takes_dequantized(rows, k, n, target, mode, bits):
            return "qmm_dequantized", dequantize_unsupported(scales_dtype, x_dtype, n, k, target)
        return kernel, reason
    return kernel, qmv_unsupported(x_dtype, scales_dtype, out_dtype, rows, k, n, target, kernel)


def grouped_gather(entries: int, rows_per_entry: int, batches: int) -> bool:
    """Whether a sorted gathered product runs as the gathered qmm (each weight batch's rows as one
    product) rather than gather_qmv (each row alone): single-row entries (MLX's rule), at least 16
    of them, more than MAX_ROWS per weight batch on average. Below that an expert's rows are few,
    qmv's domain, and keep the bits of one-row products (the seeds'
    `sorted_few_row_gathers_keep_the_one_row_bits`)."""
    return rows_per_entry == 1 and entries >= 16 and entries > MAX_ROWS * batches


def gather_route(x_dtype: DType, scales_dtype: DType, out_dtype: DType, entries: int, rows: int, k: int, n: int,
                 batches: int, *, bits: int, transpose: bool, sorted_indices: bool, global_scale: bool,
                 target: Target) -> tuple[str, str | None]:
    """`gather_qmm`'s kernel on `target` for `entries` entries of `rows` rows each over `batches`
    batches of `bits`-bit weights: `("qmm" | "gather_qmv", reason it cannot run or None)`. Sorted
    single-row entries averaging more than MAX_ROWS rows a batch (`grouped_gather`), and entries of
    more than MAX_ROWS rows (each a run of its batch's rows, sorted or not), the gathered qmm;
    otherwise gather_qmv, up to MAX_ROWS rows an entry. Both take transposed weights without a
    global scale."""
    grouped = (sorted_indices and grouped_gather(entries, rows, batches)) or rows > MAX_ROWS
    kernel = "qmm" if grouped else "gather_qmv"
    if not transpose: return kernel, "untransposed weights"
    if global_scale: return kernel, "a global scale"
    if batches == 0: return kernel, "no weight batches"
    if grouped: return kernel, qmm_unsupported(x_dtype, scales_dtype, out_dtype, entries * rows, k, n, bits, target)
    if entries > MAX_ENTRIES: return kernel, f"{entries} entries (more than {MAX_ENTRIES})"
    return kernel, qmv_unsupported(x_dtype, scales_dtype, out_dtype, rows if entries else 0, k, n, target)


# qmm on Hopper's warpgroup products (`src/qmm_wgmma.h`): WgmmaTiles of 64 or 128 rows by 128 or
# 256 columns, steps of 64 k. gemm_wgmma's measured choices with 4 stages (the words' stages and two
# w tiles take the room of more); not yet swept on the device, every shape GPU-tested.
QMM_WGMMA_SMALL = WgmmaTiles(1, 128, 4)
QMM_WGMMA_LARGE = WgmmaTiles(2, 256, 4)
QMM_WGMMA_NARROW = WgmmaTiles(2, 128, 4)  # where 128 x 256 tiles' waves cost more (`wgmma_tiles`, gemm_wgmma's rule)
QMM_WGMMA_SHAPES = (QMM_WGMMA_SMALL, WgmmaTiles(1, 256, 4), QMM_WGMMA_NARROW, WgmmaTiles(2, 128, 6), QMM_WGMMA_LARGE,
                    WgmmaTiles(2, 256, 3))
QMM_WGMMA_SMALL_ROWS = 64


def takes_qmm_wgmma(k: int, target: Target) -> bool:
    """Whether qmm_wgmma runs a qmm call of depth K on `target` in qmm's place: warpgroup products
    and K a multiple of 64 (whole steps of two chunks). K and the device decide, never M."""
    return target.backend == "cuda" and target.warpgroups and k % WGMMA_STEP == 0


def qmm_wgmma_plan(rows: int, n: int, multiprocessors: int | None = None) -> WgmmaTiles:
    """qmm_wgmma's tiles for M rows and N columns: QMM_WGMMA_SMALL up to QMM_WGMMA_SMALL_ROWS rows,
    else QMM_WGMMA_LARGE or QMM_WGMMA_NARROW, whichever's waves over the device's multiprocessors
    (132 where unknown) cost less (`wgmma_tiles`). Any shape gives the same bits, so the plan may
    follow M and N."""
    return wgmma_tiles(rows, n, multiprocessors, QMM_WGMMA_SMALL, (QMM_WGMMA_LARGE, QMM_WGMMA_NARROW), QMM_WGMMA_SMALL_ROWS)


def qmm_wgmma_bytes(tiles: WgmmaTiles, bits: int) -> int:
    """qmm_wgmma's dynamic threadgroup memory: the stages (x's 128-byte rows and the weight rows'
    8 * bits bytes of words), the two dequantized w tiles, and 1024 bytes to align them."""
    return tiles.stages * (tiles.rows * WGMMA_ROW_BYTES + tiles.columns * 8 * bits) + 2 * tiles.columns * WGMMA_ROW_BYTES + 1024


QMM_WGMMA = Family("nuvec_qmm_wgmma", ("tile_rows.h", "quant_codes.h", "wgmma_steps.h", "qmm_wgmma.h"), qmm_unsupported, qmm_wgmma_plan, backends=("cuda",),
                   arch="sm_90a")


def qmm_wgmma_program(x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
                      tiles: WgmmaTiles, gather: bool = False) -> Program:
    """The qmm_wgmma specialisation (CUDA sm_90a): parameters as qmm's."""
    if (needed := qmm_wgmma_bytes(tiles, bits)) > WGMMA_MAX_DYNAMIC:
        raise ValueError(f"qmm_wgmma: {tiles} at {bits} bits takes {needed} bytes of threadgroup memory (at most {WGMMA_MAX_DYNAMIC})")
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], GATHER=int(gather), WARPGROUPS=tiles.warpgroups, BM=tiles.rows, BN=tiles.columns,
                   BK=WGMMA_STEP, STAGES=tiles.stages, COPY_BYTES=16 if bits % 2 == 0 else 8,
                   LOAD_WORDS=load_words(bits, 2 * bits),  # quant_codes.h's (a row: whole steps of 2 chunks)
                   PAIRS=_pairs(x_dtype, scales_dtype, mode, bits))
    params = _params(defines["TY"], defines["TX"], defines["TS"], mode, gather, tile_table=gather) + [Param("ints", "in", "int")]
    return QMM_WGMMA.program("cuda", defines, params, dynamic_bytes=qmm_wgmma_bytes(tiles, bits))


# qmm on Hopper's warpgroup products with the weights dequantized into the products' registers
# (`src/qmm_wgmma_rs.h`) for the widths whose lanes find their codes at whole shifts of a word:
# RegisterTiles of 64, 128 or 256 rows of x by 128 weight rows; the other widths run qmm_wgmma.
QMM_WGMMA_RS_BITS = (2, 4, 8)
# The formats for which qmm plans qmm_wgmma_rs past FEW_ROWS rows, not gathered: affine 4-bit (timed
# with scales of x's type, whose weights decode in pairs: PAIRS). On an H100 (session 59, `quant_h200.md`) it beat qmm_wgmma_ws,
# qmm_wgmma and the dequantized route at 128, 256 and 512 rows of each of K x N 4096 x 14336,
# 4096 x 4096 and 14336 x 4096 (512 rows of 4096 x 14336: 134.0 µs against 167.2, 233.0 and 181.0).
# The other widths and modes have not been timed since the pairs and stay qmm_wgmma's; gathered
# products keep qmm_wgmma's tiles (the MoE rows were timed with them).
QMM_WGMMA_RS_FORMATS = (("affine", 4),)
QMM_WGMMA_RS_SMALL = RegisterTiles(64, 2, 4)
QMM_WGMMA_RS_WIDE = (RegisterTiles(256, 2, 4), RegisterTiles(128, 2, 4), RegisterTiles(64, 2, 4))
# Every shape the GPU tests and the probe's sweep run: the plan's, more stages, and one warpgroup a
# threadgroup (128 rows: two or three threadgroups an SM, whose decoding and products interleave;
# 256 rows in 3 stages, which would fit two, spills).
QMM_WGMMA_RS_SHAPES = (QMM_WGMMA_RS_SMALL, RegisterTiles(64, 1, 4), RegisterTiles(128, 2, 4), RegisterTiles(128, 2, 6),
                       RegisterTiles(256, 2, 4), RegisterTiles(256, 2, 3), RegisterTiles(256, 2, 5), RegisterTiles(256, 1, 4),
                       RegisterTiles(128, 1, 4), RegisterTiles(128, 1, 6))


def takes_qmm_wgmma_rs(mode: str, bits: int) -> bool:
    """Whether qmm's plan runs qmm_wgmma_rs (its plan's tiles) for more than FEW_ROWS rows, not
    gathered: a format of QMM_WGMMA_RS_FORMATS."""
    return (mode, bits) in QMM_WGMMA_RS_FORMATS


def qmm_wgmma_rs_plan(rows: int, n: int, multiprocessors: int | None = None) -> RegisterTiles:
    """qmm_wgmma_rs's tiles for M rows and N columns: QMM_WGMMA_RS_SMALL up to 64 rows, else of
    QMM_WGMMA_RS_WIDE the one whose waves cost least (`wgmma_tiles`). Any shape gives the same bits."""
    return wgmma_tiles(rows, n, multiprocessors, QMM_WGMMA_RS_SMALL, QMM_WGMMA_RS_WIDE, QMM_WGMMA_RS_SMALL.rows)


# qmm_wgmma_rs for few rows (9 to FEW_ROWS, not gathered, its widths): one warpgroup's 64 weight
# rows a threadgroup, x's rows in the narrowest warpgroup product that holds them (16, 32 or 64),
# and K split where the weight tiles alone would leave multiprocessors idle (N 4096: 64 tiles).
# The split aims at FEW_ROWS_THREADGROUPS threadgroups, a constant (not the device's
# multiprocessors: the split is part of a row's bits), each part at least FEW_ROWS_MIN_STEPS
# steps of 64 k. FEW_ROWS_STAGES: the sweep's best (H100, `quant_h200.md`: 4 stages level with or
# faster than 6, 8 and 12 at every shape, 57.7 against 66.6 µs at M 64 K 4096 N 14336).
FEW_ROWS = 64
FEW_ROWS_ROUTED = True
FEW_ROWS_THREADGROUPS = 256
FEW_ROWS_MIN_STEPS = 16
FEW_ROWS_MAX_SPLIT = 8
FEW_ROWS_STAGES = 4
# Where a split's parts are added: in the kernel, the tile's threadgroups a cluster (`RegisterTiles`'
# cluster_sum: no float32 parts in memory, no second kernel), for splits of at most
# FEW_ROWS_CLUSTER_SPLIT parts; by a second kernel (`sum_parts`) for more. Both give the same bits.
# On an H100 (`quant_h200.md`, session 59) clusters of 2 were 8-14% faster than the second kernel,
# clusters of 4 7-20% slower.
FEW_ROWS_CLUSTER_SPLIT = 2


def few_rows_split(k: int, n: int) -> int:
    """The parts of K (a power of two, at most FEW_ROWS_MAX_SPLIT) for a few-row product of K x N:
    doubled while the threadgroups (64 weight rows each, times the parts) are fewer than
    FEW_ROWS_THREADGROUPS and each part keeps FEW_ROWS_MIN_STEPS steps. K and N only, never M."""
    tiles, steps, split = math.ceil(n / 64), k // WGMMA_STEP, 1
    while split < FEW_ROWS_MAX_SPLIT and tiles * split < FEW_ROWS_THREADGROUPS and steps // (2 * split) >= FEW_ROWS_MIN_STEPS:
        split *= 2
    return split


def few_rows_tiles(rows: int, k: int, n: int) -> RegisterTiles:
    """qmm_wgmma_rs's tiles for 1 to FEW_ROWS rows: x's rows in 16, 32 or 64, one warpgroup,
    FEW_ROWS_STAGES, `few_rows_split(k, n)` parts of K, added in a cluster up to FEW_ROWS_CLUSTER_SPLIT parts."""
    split = few_rows_split(k, n)
    return RegisterTiles(16 if rows <= 16 else 32 if rows <= 32 else 64, 1, FEW_ROWS_STAGES, split,
                         cluster_sum=1 < split <= FEW_ROWS_CLUSTER_SPLIT)


def takes_few_rows(rows: int, bits: int, batches: int) -> bool:
    """Whether qmm's plan runs `few_rows_tiles` (qmm_wgmma_rs, K split): at most FEW_ROWS rows, not
    gathered, `bits` of QMM_WGMMA_RS_BITS, while FEW_ROWS_ROUTED."""
    return FEW_ROWS_ROUTED and not batches and rows <= FEW_ROWS and bits in QMM_WGMMA_RS_BITS


def qmm_hopper_tiles(rows: int, n: int, bits: int, multiprocessors: int | None = None, batches: int = 0, mode: str = "affine",
                     *, k: int):
    """qmm's tiles on Hopper (`takes_qmm_wgmma`) for a product of K x N, whose kind picks the kernel:
    `few_rows_tiles` (qmm_wgmma_rs with K split) up to FEW_ROWS rows where `takes_few_rows`;
    RegisterTiles (qmm_wgmma_rs) by its plan for more rows of a format of QMM_WGMMA_RS_FORMATS, not
    gathered (`takes_qmm_wgmma_rs`); ProducerTiles (qmm_wgmma_ws) for more than QMM_WGMMA_WS_SMALL's
    64 rows where `takes_qmm_wgmma_ws`, not gathered; else WgmmaTiles (qmm_wgmma) by its plan.
    Gathered over `batches` weight batches: qmm_wgmma's tiles of `gathered_tile_rows` rows, 64 as
    QMM_WGMMA_SMALL, 128 as QMM_WGMMA_LARGE (qmm_wgmma_ws's gathered tiles lose 3 of the 4 MoE rows of
    `tools/dequantize_probe.py --moe`, `quant_h200.md`). All give the same bits, except where the
    few rows' K split (`few_rows_split`) is more than 1: a row's bits are then the same over 1 to
    FEW_ROWS rows only."""
    if takes_few_rows(rows, bits, batches): return few_rows_tiles(rows, k, n)
    if batches: return QMM_WGMMA_LARGE if gathered_tile_rows(rows, batches) == 128 else QMM_WGMMA_SMALL
    if takes_qmm_wgmma_rs(mode, bits): return qmm_wgmma_rs_plan(rows, n, multiprocessors)
    if rows > QMM_WGMMA_WS_SMALL.rows and takes_qmm_wgmma_ws(mode, bits): return qmm_wgmma_ws_plan(rows, n, multiprocessors)
    return qmm_wgmma_plan(rows, n, multiprocessors)


def qmm_hopper_family(rows: int, n: int, bits: int, multiprocessors: int | None = None, batches: int = 0,
                      mode: str = "affine", *, k: int) -> str:
    """The kernel family (its name) of `qmm_hopper_tiles`' plan: what the tests expect to launch."""
    return HOPPER_QMM[type(qmm_hopper_tiles(rows, n, bits, multiprocessors, batches, mode, k=k))][0].stem


def qmm_wgmma_rs_bytes(tiles: RegisterTiles, bits: int) -> int:
    """qmm_wgmma_rs's dynamic threadgroup memory: the stages (x's 128-byte rows and the weight rows'
    8 * bits bytes of words) and 1024 bytes to align them."""
    return tiles.stages * (tiles.rows * WGMMA_ROW_BYTES + tiles.columns * 8 * bits) + 1024


QMM_WGMMA_RS = Family("nuvec_qmm_wgmma_rs", ("tile_rows.h", "quant_codes.h", "wgmma_steps.h", "qmm_wgmma_rs.h"), qmm_unsupported,
                      qmm_wgmma_rs_plan, backends=("cuda",), arch="sm_90a")


def qmm_wgmma_rs_program(x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
                         tiles: RegisterTiles, gather: bool = False, clock_probe: bool = False) -> Program:
    """The qmm_wgmma_rs specialisation (CUDA sm_90a, `bits` in QMM_WGMMA_RS_BITS): parameters as qmm's.
    clock_probe: threadgroup (0, 0) overwrites y's first words with its clocks a part of the steps
    (`tools/dequantize_probe.py --clocks`)."""
    if bits not in QMM_WGMMA_RS_BITS: raise ValueError(f"qmm_wgmma_rs: {bits}-bit weights (it takes {QMM_WGMMA_RS_BITS})")
    if tiles.rows not in (16, 32, 64, 128, 256) or (tiles.rows == 16 and tiles.warpgroups != 1):
        raise ValueError(f"qmm_wgmma_rs: {tiles} (rows of x 16, 32, 64, 128 or 256; 16 with one warpgroup)")
    if tiles.k_split > 1 and (gather or (out_dtype != dtypes.float32 and not tiles.cluster_sum)):
        raise ValueError(f"qmm_wgmma_rs: {tiles} writes float32 partial sums of a product without gathers")
    if tiles.cluster_sum and not 2 <= tiles.k_split <= 8:
        raise ValueError(f"qmm_wgmma_rs: {tiles} adds its parts in a cluster of 2 to 8 threadgroups")
    if (needed := qmm_wgmma_rs_bytes(tiles, bits)) > WGMMA_MAX_DYNAMIC:
        raise ValueError(f"qmm_wgmma_rs: {tiles} at {bits} bits takes {needed} bytes of threadgroup memory (at most {WGMMA_MAX_DYNAMIC})")
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], GATHER=int(gather), WARPGROUPS=tiles.warpgroups, BM=tiles.rows, BN=tiles.columns,
                   BK=WGMMA_STEP, STAGES=tiles.stages, K_SPLIT=tiles.k_split, SPLIT_SUM=int(tiles.cluster_sum),
                   LOAD_WORDS=load_words(bits, 2 * bits), PAIRS=_pairs(x_dtype, scales_dtype, mode, bits))
    if clock_probe: defines["CLOCK_PROBE"] = 1
    params = _params(defines["TY"], defines["TX"], defines["TS"], mode, gather, tile_table=gather) + [Param("ints", "in", "int")]
    return QMM_WGMMA_RS.program("cuda", defines, params, dynamic_bytes=qmm_wgmma_rs_bytes(tiles, bits),
                                cluster=(1, 1, tiles.k_split) if tiles.cluster_sum else None)


# qmm on Hopper's warpgroup products, warp-specialised (`src/qmm_wgmma_ws.h`): a producer warpgroup
# copies x and decodes w into the stage buffers while the consumer warpgroups only issue the
# products, so the decoding runs under the tensor cores' work. Every width and mode; the same bits
# as qmm_wgmma. Where routed (QMM_WGMMA_WS_ROUTED), for more than 64 rows of QMM_WGMMA_WS_FORMATS,
# not gathered (`qmm_hopper_tiles`), after qmm_wgmma_rs's formats. It was routed for affine 4-bit
# (6-29% faster than qmm_wgmma at M 128-2048, H100), until the weights decoded in pairs made
# qmm_wgmma_rs faster still at every shape timed (session 59, `quant_h200.md`); other formats have
# not been timed. It stays for the probe's sweeps (`tools/dequantize_probe.py --ws-sweep`).
QMM_WGMMA_WS_FORMATS = (("affine", 4),)
QMM_WGMMA_WS_ROUTED = False
QMM_WGMMA_WS_SMALL = ProducerTiles(1, 256, 4, producers=2)
QMM_WGMMA_WS_LARGE = ProducerTiles(2, 256, 4)
QMM_WGMMA_WS_NARROW = ProducerTiles(2, 128, 4)  # where 128 x 256 tiles' waves cost more (`wgmma_tiles`)
# Two producer warpgroups for two consumers over 128 x 128 tiles: where N is at most
# DEQUANTIZED_NARROW_N, from QMM_WGMMA_WS_TWO_PRODUCER_ROWS rows (`qmm_wgmma_ws_plan`).
QMM_WGMMA_WS_TWO_PRODUCERS = ProducerTiles(2, 128, 4, producers=2)
QMM_WGMMA_WS_SHAPES = (QMM_WGMMA_WS_LARGE, ProducerTiles(2, 256, 3), QMM_WGMMA_WS_NARROW,
                       ProducerTiles(2, 128, 6), ProducerTiles(1, 256, 4), QMM_WGMMA_WS_SMALL, ProducerTiles(1, 128, 6),
                       QMM_WGMMA_WS_TWO_PRODUCERS)


def qmm_wgmma_ws_bytes(tiles: ProducerTiles, bits: int = 0) -> int:
    """qmm_wgmma_ws's dynamic threadgroup memory: the buffers (x's and w's 128-byte rows), their two
    8-byte barriers each, and 1024 bytes to align them (`bits` does not change it)."""
    return tiles.stages * ((tiles.rows + tiles.columns) * WGMMA_ROW_BYTES + 16) + 1024


def qmm_wgmma_ws_plan(rows: int, n: int, multiprocessors: int | None = None) -> ProducerTiles:
    """qmm_wgmma_ws's tiles for M rows and N columns: QMM_WGMMA_WS_SMALL up to 64 rows;
    QMM_WGMMA_WS_TWO_PRODUCERS from QMM_WGMMA_WS_TWO_PRODUCER_ROWS rows where N is at most
    DEQUANTIZED_NARROW_N; else QMM_WGMMA_WS_LARGE or QMM_WGMMA_WS_NARROW, whichever's waves cost
    less (`wgmma_tiles`, as qmm_wgmma's plan). Any shape gives the same bits."""
    if n <= DEQUANTIZED_NARROW_N and rows >= QMM_WGMMA_WS_TWO_PRODUCER_ROWS: return QMM_WGMMA_WS_TWO_PRODUCERS
    return wgmma_tiles(rows, n, multiprocessors, QMM_WGMMA_WS_SMALL, (QMM_WGMMA_WS_LARGE, QMM_WGMMA_WS_NARROW), 64)


def takes_qmm_wgmma_ws(mode: str, bits: int) -> bool:
    """Whether qmm's plan runs qmm_wgmma_ws (rather than qmm_wgmma) for more than 64 rows, not
    gathered: a format of QMM_WGMMA_WS_FORMATS, while QMM_WGMMA_WS_ROUTED."""
    return QMM_WGMMA_WS_ROUTED and (mode, bits) in QMM_WGMMA_WS_FORMATS


QMM_WGMMA_WS = Family("nuvec_qmm_wgmma_ws", ("tile_rows.h", "quant_codes.h", "wgmma_steps.h", "qmm_wgmma_ws.h"), qmm_unsupported,
                      qmm_wgmma_ws_plan, backends=("cuda",), arch="sm_90a")


def whole_scale_vectors(k: int, group_size: int) -> bool:
    """Whether a weight row of K codes has its groups in whole, aligned fours (qmm_wgmma_ws's scale
    loads): K / group_size a multiple of 4."""
    return k % group_size == 0 and k // group_size % 4 == 0


def qmm_wgmma_ws_program(x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
                         tiles: ProducerTiles, gather: bool = False, k: int | None = None) -> Program:
    """The qmm_wgmma_ws specialisation (CUDA sm_90a): parameters as qmm's. At most 384 threads, or
    512 for 128 columns: ptxas compiles a warpgroup product within the registers a thread has at
    entry whatever `setmaxnreg` gives it later, and 512 threads leave 128, below a 64 x 256
    product's 154 but enough for a 64 x 128 one's. k: the K it will run (`whole_scale_vectors`:
    its producer loads four groups' scales at once where K allows); None: any K, group by group."""
    if tiles.threads > (512 if tiles.columns == 128 else 384):
        raise ValueError(f"qmm_wgmma_ws: {tiles} takes {tiles.threads} threads (at most 384; 512 for 128 columns)")
    if (needed := qmm_wgmma_ws_bytes(tiles)) > WGMMA_MAX_DYNAMIC:
        raise ValueError(f"qmm_wgmma_ws: {tiles} takes {needed} bytes of threadgroup memory (at most {WGMMA_MAX_DYNAMIC})")
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], GATHER=int(gather), WARPGROUPS=tiles.warpgroups, PRODUCERS=tiles.producers, BM=tiles.rows,
                   BN=tiles.columns, BK=WGMMA_STEP, STAGES=tiles.stages, LOAD_WORDS=load_words(bits, bits),  # a chunk's words from a row's step
                   PRODUCER_REGISTERS=tiles.registers[0], CONSUMER_REGISTERS=tiles.registers[1],
                   SCALE_VECTORS=int(k is not None and whole_scale_vectors(k, group_size)),
                   PAIRS=_pairs(x_dtype, scales_dtype, mode, bits))
    params = _params(defines["TY"], defines["TX"], defines["TS"], mode, gather, tile_table=gather) + [Param("ints", "in", "int")]
    return QMM_WGMMA_WS.program("cuda", defines, params, dynamic_bytes=qmm_wgmma_ws_bytes(tiles),
                                occupancy=(tiles.threads, 1))


# qmm's Hopper kernels by the kind of their tiles (`qmm_hopper_tiles`): family and specialisation.
HOPPER_QMM = {WgmmaTiles: (QMM_WGMMA, qmm_wgmma_program), RegisterTiles: (QMM_WGMMA_RS, qmm_wgmma_rs_program),
              ProducerTiles: (QMM_WGMMA_WS, qmm_wgmma_ws_program)}


def qmm_program(backend: str, x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int,
                bits: int, k: int, gather: bool = False) -> Program:
    """The qmm specialisation: parameters y, x, w, scales (, biases) (, picks, tile_starts), ints (M, N, K (,
    batches)). K only picks the width of the weight loads (its rows' alignment). `gather`: each
    row of x with its own weight batch (sorted gathers of `gather_qmm`)."""
    defines = dict(TX=ctype(x_dtype), TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size,
                   MODE=_MODES[mode], LOAD_WORDS=load_words(bits, k * bits // 32), GATHER=int(gather), BM=QMM_ROWS,
                   BN=QMM_COLUMNS, BK=QMM_STEP, TILE_LD=QMM_TILE_LD, STAGES=QMM_STAGES[backend])
    params = _params(defines["TY"], defines["TX"], defines["TS"], mode, gather, tile_table=gather) + [Param("ints", "in", "int")]
    return QMM.program(backend, defines, params)


def qmm(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, composition=None, picks: Tensor | None = None,
        tiles: WgmmaTiles | RegisterTiles | ProducerTiles | None = None) -> Tensor:
    """`x [M, K] · wᵀ` (x float16 or bfloat16) for packed `weight [N, K * bits / 32]`, `scales`
    (and affine `biases`) `[N, K / group_size]`; returns `[M, N]` in `out_dtype`. The weights are
    dequantized into x's type (rounded once: `quant_codes.h`), the products accumulate in float32.

    picks (int32 `[M]`): row i of x times weight batch `picks[i]` of `weight [E, N, ...]`, `scales`
    (and `biases`) `[E, N, ...]`, zeros for a pick outside 0..E-1; rows grouped by batch (sorted
    picks) run as one product per batch and row tile (a mixture of experts' prefill).
    composition: `(x, weight, scales, biases[, picks]) -> y`, whose gradient is the backward.
    On Hopper with K a multiple of 64 the kernel is `qmm_hopper_tiles`' (qmm_wgmma_rs for few rows
    and where `takes_qmm_wgmma_rs`, qmm_wgmma_ws where `takes_qmm_wgmma_ws`, else qmm_wgmma; `tiles`
    overrides the plan and, by its kind, the kernel: tuning)."""
    rows, k = x.shape
    n = weight.shape[-2]
    gather = picks is not None
    target = _target(x.device)
    wgmma = backend == "cuda" and takes_qmm_wgmma(k, target)
    if wgmma:
        batches = weight.shape[0] if gather else 0
        tiles = tiles or qmm_hopper_tiles(rows, n, bits, target.multiprocessors, batches, mode, k=k)
        make = HOPPER_QMM[type(tiles)][1]
        if make is qmm_wgmma_ws_program: make = functools.partial(make, k=k)  # its scale loads follow K
        split = tiles.k_split if isinstance(tiles, RegisterTiles) else 1
        if split > k // WGMMA_STEP: raise ValueError(f"qmm: {tiles} splits K {k} into more parts than its {k // WGMMA_STEP} steps")
        parts = 1 if split == 1 or tiles.cluster_sum else split  # float32 parts that qmm adds (`sum_parts`)
        kernel = make(x.dtype, scales.dtype, out_dtype if parts == 1 else dtypes.float32, mode=mode, group_size=group_size,
                      bits=bits, tiles=tiles, gather=gather)
        grid, threads = tiles.grid(rows, n), tiles.threads
        if gather: grid = (gather_tile_slots(rows, tiles.rows, batches), grid[1], 1)
    else:
        parts = 1
        kernel = qmm_program(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, k=k,
                             gather=gather)
        grid, threads = (*qmm_plan(rows, n), 1), QMM_THREADS
        if gather: grid = (grid[0], gather_tile_slots(rows, QMM_ROWS, weight.shape[0]), 1)
    ins = _inputs(x, weight, scales, biases, picks)
    if parts > 1 and composition is not None:  # each part's gradient is y's: the composition's, shared out
        whole = composition
        composition = lambda *a: whole(*a).cast(dtypes.float32).unsqueeze(0).expand(parts, rows, n) / parts  # noqa: E731
    backward = _backward("quantized_matmul" if picks is None else "gather_qmm", composition, ins, mode)
    if gather: ins.append(gather_tile_starts(ins[-1], tiles.rows if wgmma else QMM_ROWS, weight.shape[0]))
    ins.append(int_buffer(x.device, (rows, n, k) + ((weight.shape[0],) if gather else ())))
    y = Tensor.empty(*((parts,) if parts > 1 else ()), rows, n, dtype=out_dtype if parts == 1 else dtypes.float32, device=x.device)
    name = f"qmm_{tiles}" if wgmma else "qmm"
    y = launch(kernel, x.device, [y], ins, grid, threads, backward=backward,
               label=f"{backend} {name} {mode} {bits}-bit g{group_size} M{rows} K{k} N{n}{' gather' if gather else ''}")[0]
    return y if parts == 1 else sum_parts(y).cast(out_dtype)


def sum_parts(parts: Tensor) -> Tensor:
    """A K split's float32 partial sums `[parts, ...]` added in order, part 0 first (the order is
    part of a row's bits)."""
    total = parts[0]
    for part in range(1, parts.shape[0]): total = total + parts[part]
    return total


# ---- dequantize: packed weights as dense rows (src/dequantize.h) --------------------------------

DEQUANTIZE_THREADS = 256
# Pieces of 8 codes a thread: 1 measured at 71.1 µs for K 4096 x N 14336 on an H100 (62% of its
# peak, `quant_h200.md`). More issue more loads before the first store (`src/dequantize.h`);
# `tools/dequantize_probe.py --pieces 1,2,4` measures them (not yet run).
DEQUANTIZE_PIECES = 1
# Rows of x from which a product that qmm_wgmma would take dequantizes w once into x's dtype and
# runs gemm_wgmma instead (`takes_dequantized`): the dequantization is one pass over w, while
# qmm_wgmma's main loop dequantizes w again for every tile of rows (`tools/dequantize_probe.py`,
# `benchmarks/quant_h200.md`, H100: the route is faster from 512 rows at N 14336, and from 128 rows
# at N 4096, where qmm_wgmma's few tiles of 128 x 128 leave most multiprocessors idle: 54.7 µs
# against 62.9 at M 128 K 4096, 173.2 against 183.8 at M 128 K 14336; at N 14336 M 256 it is
# slower, 137.6 against 122.5).
DEQUANTIZED_ROWS = 512
DEQUANTIZED_NARROW_ROWS, DEQUANTIZED_NARROW_N = 128, 4096
# The same, at every N, in the formats of qmm_wgmma_rs and qmm_wgmma_ws where they run instead of
# qmm_wgmma (`takes_qmm_wgmma_rs`, `takes_qmm_wgmma_ws`): qmm_wgmma_rs is faster at 128-512 rows
# (session 59, H100: 134.0 µs against the route's 181.0 at M 512 K 4096 N 14336, 34.7 against 46.2
# at M 128 K 4096 N 4096) and slower at 1024 rows of N 14336 (318.7 against 285.7); at 1024 rows of
# K 4096 N 4096 it was faster (67.2 against 82.8), and other shapes past 512 rows are not timed.
DEQUANTIZED_RS_ROWS = 513
# qmm_wgmma_ws's plan: two producers where N is at most DEQUANTIZED_NARROW_N from this many rows
# (512 rows: 11% faster than one at K 4096 and K 14336, session 54's sweep, H100).
QMM_WGMMA_WS_TWO_PRODUCER_ROWS = 512


def dequantize_unsupported(scales_dtype: DType, out_dtype: DType, rows: int, k: int, target: Target) -> str | None:
    """Why the dequantize kernel does not take `rows` packed rows of `k` codes into `out_dtype` on
    `target` (None when it does): float16, bfloat16 or float32 rows (bfloat16 only where the
    target has it), nothing empty."""
    if rows == 0 or k == 0: return "an empty weight"
    if rows * -(-k // 32) * 4 >= 2**31 - DEQUANTIZE_THREADS: return "2^31 pieces of 8 codes or more (int32 sizes)"
    if out_dtype not in CTYPES: return f"{dtype_name(out_dtype)} rows (the kernel writes float16, bfloat16 and float32)"
    return target.lacks(bfloat=dtypes.bfloat16 in (out_dtype, scales_dtype))


def dequantize_groups(rows: int, k: int, pieces: int = DEQUANTIZE_PIECES) -> int:
    """The dequantize kernel's threadgroups for `rows` rows of `k` codes, `pieces` pieces of 8
    codes a thread, four pieces a chunk of 32 (the last of a row whole where K is 16 past a
    multiple of 32)."""
    return -(-rows * -(-k // 32) * 4 // (DEQUANTIZE_THREADS * pieces))


DEQUANTIZE = Family("nuvec_dequantize", ("pieces.h", "quant_codes.h", "dequantize.h"), dequantize_unsupported, dequantize_groups)


def dequantize_program(backend: str, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
                       k: int, pieces: int = DEQUANTIZE_PIECES) -> Program:
    """One specialisation: rows of `k` `bits`-bit codes of `mode` (groups of `group_size`, scales
    of `scales_dtype`) into `out_dtype`, `pieces` pieces a thread; parameters y, w, scales (,
    biases), ints (R, K, the grid's threads). K only picks the width of the weight loads (its
    rows' alignment)."""
    piece = 8 * out_dtype.itemsize
    defines = dict(TS=ctype(scales_dtype), TY=ctype(out_dtype), BITS=bits, GROUP=group_size, MODE=_MODES[mode],
                   LOAD_WORDS=load_words(bits, k * bits // 32), THREADS=DEQUANTIZE_THREADS, PIECES=pieces,
                   PAIRS=_pairs(out_dtype, scales_dtype, mode, bits) if backend == "cuda" else 0, **chunks("Y", piece, piece))
    params = [Param("y", "out", ctype(out_dtype)), Param("w", "in", "uint"), Param("scales", "in", ctype(scales_dtype))]
    if mode == "affine": params.append(Param("biases", "in", ctype(scales_dtype)))
    return DEQUANTIZE.program(backend, defines, params + [Param("ints", "in", "int")])


def dequantize(weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
               out_dtype: DType, backend: str, composition: Callable | None = None,
               pieces: int = DEQUANTIZE_PIECES) -> Tensor:
    """The dense weights `[..., N, K]` in `out_dtype` of packed `weight [..., N, K * bits / 32]`,
    `scales` (and affine `biases`) `[..., N, K / group_size]`: each value `fma(scale, code, bias)`
    (affine) or `code * scale`, rounded once, as qmm_wgmma dequantizes its tiles. composition:
    `(weight, scales, biases) -> w`, whose gradient (in affine scales and biases) is the backward.
    pieces: pieces of 8 codes a thread (DEQUANTIZE_PIECES; others for the probe's sweep)."""
    *lead, words = weight.shape
    k, rows = words * 32 // bits, math.prod(weight.shape[:-1])
    program = dequantize_program(backend, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, k=k,
                                 pieces=pieces)
    ins = [kernel_input(weight), kernel_input(scales)] + ([] if biases is None else [kernel_input(biases)])
    backward = None
    if composition is not None and mode == "affine":
        backward = Backward("dequantize", lambda w, s, b: composition(w, s, b).reshape(rows, k), tuple(ins), wrt=(1, 2))
    y = Tensor.empty(rows, k, dtype=out_dtype, device=weight.device)
    groups = dequantize_groups(rows, k, pieces)
    ins.append(int_buffer(weight.device, (rows, k, groups * DEQUANTIZE_THREADS)))
    out = launch(program, weight.device, [y], ins, (groups, 1, 1), DEQUANTIZE_THREADS, backward=backward,
                 label=f"{backend} dequantize {mode} {bits}-bit g{group_size} {rows}x{k}")[0]
    return out.reshape(*lead, k)


def takes_dequantized(rows: int, k: int, n: int, target: Target, mode: str, bits: int) -> bool:
    """Whether a product that qmm would take runs as `dequantize`, then gemm_wgmma: where qmm_wgmma
    would run (`takes_qmm_wgmma`): from DEQUANTIZED_RS_ROWS rows in the formats qmm_wgmma_rs or
    qmm_wgmma_ws takes (`takes_qmm_wgmma_rs`, `takes_qmm_wgmma_ws`), else from DEQUANTIZED_ROWS rows,
    or DEQUANTIZED_NARROW_ROWS where N is at most DEQUANTIZED_NARROW_N. All sum each output's
    products in steps of 16 k in increasing order into one float32 accumulator over the same rounded
    weights, so the row count, N and the format may choose between them: a row's bits are the same
    either way."""
    if takes_qmm_wgmma_rs(mode, bits) or takes_qmm_wgmma_ws(mode, bits):
        enough = rows >= DEQUANTIZED_RS_ROWS
    else:
        enough = rows >= (DEQUANTIZED_NARROW_ROWS if n <= DEQUANTIZED_NARROW_N else DEQUANTIZED_ROWS)
    return enough and takes_qmm_wgmma(k, target)
