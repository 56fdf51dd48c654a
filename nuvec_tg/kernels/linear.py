"""The dense products' kernels, `y = x · wᵀ (+ bias)` with float32 accumulation: `gemv`
(`src/gemv.h`) for up to 8 rows of x, memory-bound, reading w once; `gemm` (`src/gemm.h`) for more
rows, on the matrix units (CUDA's mma.sync, Metal's simdgroup matrices); on Hopper (CUDA sm_90)
`gemm_wgmma` (`src/gemm_wgmma.h`) in its place, on the warpgroup matrix products.

Which kernel runs (`route`, the same rule on METAL and CUDA; `fast.linear` asks with the device's
`kernels.Target`, anything else is the composition):
- up to MAX_ROWS rows: gemv, any of float16, bfloat16 and float32 for x, w, bias and y;
- more rows: gemm, x and w of one 16-bit dtype (bias and y any kernel dtype: the products of
  16-bit values are exact in float32, so promoting them changes nothing); float32 products stay on
  the composition (the matrix units would round them). On CUDA K must be even (the copies need
  4-byte aligned rows), on Metal the target needs simdgroup matrices; on a target with warpgroup
  products (sm_90) and K a multiple of 8 (16-byte rows), gemm_wgmma instead;
- on every route: bfloat16 anywhere needs a target with bfloat, and on Metal a kernel's
  threadgroup (`*_metal_resources`) must fit an Apple GPU.

Bits. gemv's arithmetic order depends on K and N only (its piece width and K split), gemm's on K
only (whatever its tiles), as gemm_wgmma's (which of the two runs depends on K and the device,
not on M), so a row's bits never depend on how many rows share the call: a row of 1-8 rows has the
bits of that row alone, and a row of more than 8 the bits of that row in any other product of more
than 8 rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from ..tensor import dtype_name
from . import Target
from . import target as _target
from .program import (CTYPES, Backward, Family, Param, Program, Resources, chunks, int_buffer, kernel_input, launch, metal_limit_reason,
                      threadgroup_array)
from .quant import (MAX_ENTRIES, WGMMA_MAX_DYNAMIC, WGMMA_ROW_BYTES, WGMMA_STEP, QmvPlan, WgmmaTiles, gather_tile_slots, gather_tile_starts,
                    gathered_tile_rows, grouped_gather, split_steps, wgmma_tiles)

MAX_ROWS = 8             # rows of x gemv takes (more: gemm)
VEC = 8                  # elements of a lane's piece of a row where K allows (16 bytes of a 16-bit w)
# gemv's launch-shape defaults (`gemv_plan`): starting points until tools/tune_linear.py sweeps them
# on the device.
COLUMNS_PER_WARP = 4     # output columns a SIMD group serves (each x value it loads serves them all)
COLUMN_WARPS = 1         # SIMD groups of a threadgroup serving different columns
UNROLL = 2               # steps whose w loads a lane issues together
GEMM_DTYPES = (dtypes.float16, dtypes.bfloat16)   # the matrix units' inputs


def piece_width(k: int) -> int:
    """gemv's elements a piece: the widest of 8, 4, 2, 1 dividing K (so no piece is partial).
    A function of K alone; it is part of a row's order of summation."""
    width = VEC
    while k % width: width //= 2
    return width


def gemv_plan(rows: int, k: int, n: int) -> QmvPlan:
    """gemv's launch shape (qmv's layout of SIMD groups, `QmvPlan`): COLUMNS_PER_WARP columns a SIMD
    group (at most N), COLUMN_WARPS column sets a threadgroup, UNROLL steps of loads in flight (at
    most a SIMD group's steps), and the K split `quant.split_steps` gives for a SIMD step of 32
    pieces and these column sets: a function of K and N only (a row's order of summation), the
    rest changes no row's arithmetic."""
    columns = min(COLUMNS_PER_WARP, n)
    steps = math.ceil(k // piece_width(k) / 32)
    split = split_steps(steps, math.ceil(n / COLUMNS_PER_WARP))
    return QmvPlan(columns, COLUMN_WARPS, split, max(1, min(UNROLL, math.ceil(steps / split))))


def gemv_metal_resources(rows: int, plan: QmvPlan) -> Resources:
    """gemv's threadgroup on Metal: its threads and the SIMD groups' sums (`partials` in `gemv.h`:
    K_SPLIT x COLUMN_WARPS x XM x COLUMNS floats)."""
    return Resources(plan.threads, threadgroup_array(plan.k_split * plan.column_warps * rows * plan.columns_per_warp, 4))


@dataclass(frozen=True)
class Tiles:
    """gemm's tile shape: `rows` x `columns` outputs a threadgroup, `warps_m` x `warps_n` SIMD groups
    each taking a `rows / warps_m` x `columns / warps_n` part, `stages` copies in flight (CUDA)."""
    rows: int
    columns: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def threads(self) -> int: return 32 * self.warps_m * self.warps_n

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """(row tiles, column tiles, 1): a tile of w's threadgroups launch together."""
        return math.ceil(m / self.rows), math.ceil(n / self.columns), 1


GEMM_STEP = 32             # k a step (BK)
GEMM_TILE_LD = GEMM_STEP + 8  # Metal's float tiles' row stride (padding against bank conflicts)
# CUDA, from the H200 sweep (tools/tune_linear.py, benchmarks/linear_h200.md): up to SMALL_ROWS rows,
# 64 x 64 tiles of 4 SIMD groups (32 x 32 each) and 4 stages, so that a short x still makes enough
# threadgroups; up to MEDIUM_ROWS, 64 x 128 tiles of 4 SIMD groups (32 x 64 each), 4 stages (M 512:
# 334 TFLOP/s against 300 for 128 x 128 of 8); beyond, 128 x 128 of 4 SIMD groups (64 x 64 each), 3
# stages (48 KB, the most a kernel declares statically; M 2048: 368 against 349). Metal: 64 x 64
# float tiles of 4 SIMD groups, unstaged, within 32 KB. Tile shapes change no bit (`gemm.h`).
GEMM_LARGE = Tiles(128, 128, 2, 2, 3)
GEMM_MEDIUM = Tiles(64, 128, 2, 2, 4)
GEMM_SMALL = Tiles(64, 64, 2, 2, 4)
GEMM_METAL = Tiles(64, 64, 2, 2, 1)
SMALL_ROWS, MEDIUM_ROWS = 64, 1024
# Tile shapes the source takes (SIMD groups of 16-row and 16-column multiples, whole pieces a
# thread) within 48 KB of stages, which tools/tune_linear.py sweeps: 128 x 128 of 8 or 4 SIMD
# groups; 128 x 256 and 256 x 128 at 2 stages (a third less of L2's bandwidth a FLOP, which 128 x
# 128 tiles need 5.9 TB/s of at 375 TFLOP/s); 128 x 64 and 64 x 128, 64 x 64 at 4 and 6 stages;
# for a short x, whose product reads w at memory's pace, narrow tiles deep in stages (more
# threadgroups, more copies in flight).
TILE_SHAPES = (GEMM_LARGE, Tiles(128, 128, 4, 2, 3), Tiles(128, 128, 2, 4, 3), Tiles(128, 256, 2, 4, 2),
               Tiles(256, 128, 4, 2, 2), Tiles(128, 64, 2, 2, 4),
               GEMM_MEDIUM, GEMM_SMALL, Tiles(64, 64, 2, 2, 6), Tiles(32, 64, 1, 2, 6),
               Tiles(16, 64, 1, 2, 8), Tiles(32, 32, 1, 1, 8))


def gemm_plan(rows: int, backend: str) -> Tiles:
    """gemm's tiles for M rows on `backend`: GEMM_METAL on Metal; on CUDA GEMM_SMALL up to
    SMALL_ROWS rows, GEMM_MEDIUM up to MEDIUM_ROWS, else GEMM_LARGE. Any tile shape gives the same
    bits, so the plan may follow M."""
    if backend == "metal": return GEMM_METAL
    return GEMM_SMALL if rows <= SMALL_ROWS else GEMM_MEDIUM if rows <= MEDIUM_ROWS else GEMM_LARGE


def copy_bytes(k: int) -> int:
    """gemm's copy width on CUDA: the widest of 16, 8 and 4 bytes dividing a 16-bit row of K (4 for
    an odd K, which CUDA's route refuses; Metal reads element by element)."""
    width = 16
    while width > 4 and (2 * k) % width: width //= 2
    return width


def gemm_metal_resources(tiles: Tiles) -> Resources:
    """gemm's threadgroup on Metal: its float tiles of x and w (`x_tile`, `w_tile`: GEMM_TILE_LD
    floats a row)."""
    return Resources(tiles.threads, threadgroup_array(tiles.rows * GEMM_TILE_LD, 4)
                     + threadgroup_array(tiles.columns * GEMM_TILE_LD, 4))


def wgmma_bytes(tiles: WgmmaTiles) -> int:
    """gemm_wgmma's dynamic threadgroup memory: the stages (128-byte rows of x's and w's tiles) and
    1024 bytes to align them."""
    return tiles.stages * (tiles.rows + tiles.columns) * WGMMA_ROW_BYTES + 1024


# From the H200 sweep (tools/tune_linear.py --wgmma, benchmarks/linear_h200.md), K 4096 N 14336: up to
# SMALL_ROWS rows one warpgroup's 64 x 128 tiles, 8 stages (M 64: 32.4 µs against 36.9 for 64 x 64,
# more threadgroups reading w at memory's pace); beyond, two warpgroups' 128 x 256 tiles, 4 stages
# (the fewest bytes of threadgroup memory a product: M 512 516 TFLOP/s against 458 for 128 x 128,
# M 2048 601 against 532).
WGMMA_SMALL = WgmmaTiles(1, 128, 8)
WGMMA_LARGE = WgmmaTiles(2, 256, 4)
# Where 128 x 256 tiles would not give every multiprocessor one (M 512 at N 4096: 64 tiles on 132,
# measured at 0.53x PyTorch's time on an H100 against 0.84x at N 14336), 128 x 128 of 6 stages (the
# sweep's second at M 512 and 2048), twice the tiles; 128 x 64 where even those are few (M 256 at
# N 4096: 24.4 µs against 31.1 on an H100, tools/tune_linear.py --wgmma).
WGMMA_NARROW = WgmmaTiles(2, 128, 6)
WGMMA_NARROWEST = WgmmaTiles(2, 64, 8)
# Where 128 x 256 tiles would leave the last wave part empty (M 512 at N 14336: 224 tiles, 1.7 waves
# on 132 multiprocessors), 128 x 224: N 14336 is 64 of them, 256 tiles, two full waves of 7/8 the
# work (108.2 µs against 115.5 on an H100).
WGMMA_224 = WgmmaTiles(2, 224, 4)
WGMMA_WIDE = (WGMMA_LARGE, WGMMA_224, WGMMA_NARROW, WGMMA_NARROWEST)  # the plan's choices beyond SMALL_ROWS, widest first
WGMMA_SHAPES = (WgmmaTiles(1, 64, 8), WGMMA_SMALL, WgmmaTiles(1, 256, 5), WGMMA_NARROWEST, WGMMA_NARROW,
                WgmmaTiles(2, 128, 4), WGMMA_224, WGMMA_LARGE, WgmmaTiles(2, 256, 3))


def wgmma_plan(rows: int, n: int, multiprocessors: int | None = None) -> WgmmaTiles:
    """gemm_wgmma's tiles for M rows and N columns: WGMMA_SMALL up to SMALL_ROWS rows, else of
    WGMMA_WIDE the tiles whose waves over the device's multiprocessors (the H200's 132 where
    unknown) take the least time (`quant.wgmma_tiles`). Any tile shape gives the same bits, so the
    plan may follow M and N."""
    return wgmma_tiles(rows, n, multiprocessors, WGMMA_SMALL, WGMMA_WIDE, SMALL_ROWS)


def takes_wgmma(k: int, target: Target) -> bool:
    """Whether gemm_wgmma runs a product of more than MAX_ROWS rows on `target` in gemm's place: a
    target with warpgroup products, K a multiple of 8 (16-byte rows: each copy all in or all out).
    It depends on K and the device only, so every row of every M has one kernel's bits."""
    return target.backend == "cuda" and target.warpgroups and k % 8 == 0


def route(x_dtype: DType, w_dtype: DType, bias_dtype: DType | None, out_dtype: DType, rows: int, k: int, n: int,
          target: Target) -> tuple[str, str | None]:
    """`fast.linear`'s kernel on `target` for `rows` rows of x against w `[N, K]`: `("gemv" | "gemm" |
    "gemm_wgmma", reason it cannot run or None)`."""
    kernel = "gemv" if rows <= MAX_ROWS else "gemm_wgmma" if takes_wgmma(k, target) else "gemm"
    if rows == 0 or k == 0 or n == 0: return kernel, "an empty product"
    types = (x_dtype, w_dtype, out_dtype) + (() if bias_dtype is None else (bias_dtype,))
    if any(t not in CTYPES for t in types): return kernel, "a float64 input or result"
    if kernel != "gemv":
        if x_dtype != w_dtype or x_dtype not in GEMM_DTYPES:
            return kernel, (f"{dtype_name(x_dtype)} x and {dtype_name(w_dtype)} w (gemm multiplies x and w of one "
                            "16-bit dtype)")
        if target.backend == "cuda" and k % 2: return kernel, f"K = {k} is odd (gemm's copies need 4-byte aligned rows)"
        columns = (wgmma_plan(rows, n, target.multiprocessors) if kernel == "gemm_wgmma" else gemm_plan(rows, target.backend or "cuda")).columns
        if math.ceil(n / columns) > 65535:
            return kernel, f"N = {n} (more than 65535 column tiles)"
    reason = target.lacks(bfloat=dtypes.bfloat16 in types, matrix_units=kernel != "gemv")
    if reason is None and target.backend == "metal":
        resources = (gemv_metal_resources(rows, gemv_plan(rows, k, n)) if kernel == "gemv"
                     else gemm_metal_resources(GEMM_METAL))
        if (over := metal_limit_reason(resources)) is not None: reason = f"its threadgroup would take {over}"
    return kernel, reason


def gather_route(dtype: DType, out_dtype: DType, entries: int, rows: int, k: int, n: int, batches: int, *,
                 sorted_indices: bool, rows_of_w: bool, target: Target) -> tuple[str, str | None]:
    """`gather_mm`'s kernel on `target` for `entries` entries of `rows` rows of x each over
    `batches` weight batches `[N, K]` (x and w of `dtype`): `("gemm" | "gemm_wgmma" | "gather_gemv",
    reason it cannot run or None)`. Sorted single-row entries averaging more than MAX_ROWS rows a
    batch (`quant.grouped_gather`, the gathered qmm's rule): the tiled kernel `route` gives, with
    GATHER, each weight batch's rows as one product; otherwise up to MAX_ROWS rows an entry and at
    most MAX_ENTRIES entries, `gather_gemv` (gemv's conditions), each entry alone (the decode
    step's few entries). Both read the weights as rows (`rows_of_w`: b is the transpose of a
    `[..., N, K]` bank, as a model's experts are)."""
    grouped = sorted_indices and grouped_gather(entries, rows, batches)
    kernel = ("gemm_wgmma" if takes_wgmma(k, target) else "gemm") if grouped else "gather_gemv"
    if not rows_of_w: return kernel, "b is not the transpose of a [..., N, K] weight (the kernels read w's rows)"
    if batches == 0: return kernel, "no weight batches"
    if grouped: return route(dtype, dtype, None, out_dtype, entries * rows, k, n, target)
    if rows > MAX_ROWS: return kernel, f"{rows} rows an entry (gather_gemv takes at most {MAX_ROWS})"
    if entries > MAX_ENTRIES: return kernel, f"{entries} entries (more than {MAX_ENTRIES})"
    return kernel, route(dtype, dtype, None, out_dtype, rows if entries else 0, k, n, target)[1]


def unsupported(x_dtype: DType, w_dtype: DType, bias_dtype: DType | None, out_dtype: DType, rows: int, k: int, n: int,
                target: Target) -> str | None:
    """Why neither dense kernel takes a call on `target` (None when one does): `route`'s reason."""
    return route(x_dtype, w_dtype, bias_dtype, out_dtype, rows, k, n, target)[1]


GEMV = Family("nuvec_gemv", ("pieces.h", "column_sums.h", "gemv.h"), unsupported, gemv_plan)
GEMM = Family("nuvec_gemm", ("tile_rows.h", "gemm.h"), unsupported, gemm_plan)
GEMM_WGMMA = Family("nuvec_gemm_wgmma", ("tile_rows.h", "wgmma_steps.h", "gemm_wgmma.h"), unsupported, wgmma_plan, backends=("cuda",), arch="sm_90a")


def _params(out_dtype: DType, x_dtype: DType, w_dtype: DType, bias_dtype: DType | None) -> list[Param]:
    """The products' buffer parameters: y, x, w (, bias)."""
    params = [Param("y", "out", CTYPES[out_dtype]), Param("x", "in", CTYPES[x_dtype]), Param("w", "in", CTYPES[w_dtype])]
    if bias_dtype is not None: params.append(Param("bias", "in", CTYPES[bias_dtype]))
    return params


def gemv_program(backend: str, x_dtype: DType, w_dtype: DType, bias_dtype: DType | None, out_dtype: DType, *,
                 rows: int, k: int, n: int, plan: QmvPlan, glu: bool = False, batches: int = 0) -> Program:
    """The gemv specialisation for these arguments (`bias_dtype` None: no bias; `glu`: the product
    with SwiGLU's silu(gate) * up of x `[M, 2K]`; `batches` > 0: the gathered product over that
    many weight batches, `gather_gemv`, with a `picks` parameter and no bias)."""
    if plan.columns_per_warp > n: raise ValueError(f"gemv: {plan.columns_per_warp} columns per SIMD group > N = {n}")
    if batches and bias_dtype is not None: raise ValueError("gemv: a gathered product takes no bias")
    vec = piece_width(k)
    defines: dict[str, object] = dict(TX=CTYPES[x_dtype], TW=CTYPES[w_dtype], TY=CTYPES[out_dtype], BIAS=int(bias_dtype is not None),
                                      GLU=int(glu), GATHER=int(batches > 0), BATCHES=max(batches, 1))
    if bias_dtype is not None: defines["TB"] = CTYPES[bias_dtype]
    defines.update(N_TOTAL=n, K_TOTAL=k, XM=rows, VEC=vec, COLUMNS=plan.columns_per_warp, COLUMN_WARPS=plan.column_warps,
                   K_SPLIT=plan.k_split, UNROLL=plan.unroll)
    defines.update(chunks("W", k * w_dtype.itemsize, vec * w_dtype.itemsize))
    defines.update(chunks("X", k * x_dtype.itemsize, vec * x_dtype.itemsize))
    params = _params(out_dtype, x_dtype, w_dtype, bias_dtype) + ([Param("picks", "in", "int")] if batches else [])
    return GEMV.program(backend, defines, params)


def _tiled_defines(dtype: DType, bias_dtype: DType | None, out_dtype: DType, gather: bool) -> dict[str, object]:
    """The matrix-unit products' shared defines: the types, BIAS, GATHER (a gathered product has
    no bias: a mixture of experts adds its own)."""
    if gather and bias_dtype is not None: raise ValueError("a gathered product takes no bias")
    defines: dict[str, object] = dict(TX=CTYPES[dtype], TY=CTYPES[out_dtype], BIAS=int(bias_dtype is not None), GATHER=int(gather))
    if bias_dtype is not None: defines["TB"] = CTYPES[bias_dtype]
    return defines


def _tiled_params(dtype: DType, bias_dtype: DType | None, out_dtype: DType, gather: bool) -> list[Param]:
    """y, x, w (, bias) (, picks, tile_starts: the gathered row tiles, `quant.gather_tile_starts`),
    ints (M, N, K (, the batches))."""
    gathered = [Param("picks", "in", "int"), Param("tile_starts", "in", "int")] if gather else []
    return _params(out_dtype, dtype, dtype, bias_dtype) + gathered + [Param("ints", "in", "int")]


def gemm_program(backend: str, dtype: DType, bias_dtype: DType | None, out_dtype: DType, *, k: int, tiles: Tiles,
                 gather: bool = False) -> Program:
    """The gemm specialisation: x and w of `dtype` (16-bit), parameters y, x, w (, bias) (, picks and
    tile_starts: `gather`, w a batch of weights), ints (M, N, K (, the batches)). K only picks the width of
    CUDA's copies (its rows' alignment)."""
    defines = _tiled_defines(dtype, bias_dtype, out_dtype, gather)
    defines.update(BM=tiles.rows, BN=tiles.columns, BK=GEMM_STEP, WARPS_M=tiles.warps_m, WARPS_N=tiles.warps_n,
                   STAGES=tiles.stages, COPY_BYTES=copy_bytes(k), TILE_LD=GEMM_TILE_LD)
    return GEMM.program(backend, defines, _tiled_params(dtype, bias_dtype, out_dtype, gather))


def wgmma_program(dtype: DType, bias_dtype: DType | None, out_dtype: DType, *, tiles: WgmmaTiles, gather: bool = False) -> Program:
    """The gemm_wgmma specialisation (CUDA sm_90a): x and w of `dtype` (16-bit), parameters as
    `gemm_program`'s."""
    if wgmma_bytes(tiles) > WGMMA_MAX_DYNAMIC:
        raise ValueError(f"gemm_wgmma: {tiles} takes {wgmma_bytes(tiles)} bytes of threadgroup memory "
                         f"(at most {WGMMA_MAX_DYNAMIC})")
    defines = _tiled_defines(dtype, bias_dtype, out_dtype, gather)
    defines.update(WARPGROUPS=tiles.warpgroups, BM=tiles.rows, BN=tiles.columns, BK=WGMMA_STEP, STAGES=tiles.stages)
    return GEMM_WGMMA.program("cuda", defines, _tiled_params(dtype, bias_dtype, out_dtype, gather),
                              dynamic_bytes=wgmma_bytes(tiles))


def _inputs(x: Tensor, w: Tensor, bias: Tensor | None) -> list[Tensor]:
    return [kernel_input(x), kernel_input(w)] + ([] if bias is None else [kernel_input(bias)])


def _backward(composition, ins: list[Tensor]) -> Backward | None:
    """The call's backward: the gradient of `composition(x, w, bias)` (bias None where there is
    none) in every input."""
    if composition is None: return None

    def composed(x: Tensor, w: Tensor, *bias: Tensor) -> Tensor:
        return composition(x, w, bias[0] if bias else None)
    return Backward("linear", composed, tuple(ins), wrt=tuple(range(len(ins))))


def gemv(x: Tensor, w: Tensor, bias: Tensor | None, *, out_dtype: DType, backend: str, composition=None,
         plan: QmvPlan | None = None, glu: bool = False) -> Tensor:
    """`x [M, K] · wᵀ (+ bias)` for `w [N, K]`, `bias [N]` or None, M at most MAX_ROWS; returns
    `[M, N]` in `out_dtype`. With `glu` x is `[M, 2K]` (a gated MLP's gate and up) and the product
    is taken with silu(gate) * up. composition: `(x, w, bias) -> y`, whose gradient is the
    backward. `plan` overrides `gemv_plan` (tuning)."""
    rows, n, k = x.shape[0], w.shape[0], w.shape[1]
    if x.shape[1] != (2 if glu else 1) * k: raise ValueError(f"gemv: x of {x.shape[1]} columns for w of K = {k}")
    plan = plan or gemv_plan(rows, k, n)
    program = gemv_program(backend, x.dtype, w.dtype, None if bias is None else bias.dtype, out_dtype, rows=rows, k=k, n=n,
                           plan=plan, glu=glu)
    ins = _inputs(x, w, bias)
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(program, x.device, [y], ins, (plan.groups(n), 1, 1), plan.threads, backward=_backward(composition, ins),
                  label=f"{backend} gemv{' swiglu' if glu else ''} M{rows} K{k} N{n} {plan}")[0]


def gather_gemv(x: Tensor, w: Tensor, picks: Tensor, *, out_dtype: DType, backend: str, composition=None,
                plan: QmvPlan | None = None) -> Tensor:
    """Entry p of `x [P, M, K]` (M at most MAX_ROWS) times weight batch `picks[p]` (int32 `[P]`) of
    `w [E, N, K]`, transposed; returns `[P, M, N]` in `out_dtype`, zeros for a pick outside 0..E-1.
    Each row has the bits of a one-row `gemv` against its batch. composition: `(x, w, picks) -> y`,
    whose gradient (in x and w) is the backward."""
    entries, rows, k = x.shape
    batches, n = w.shape[0], w.shape[1]
    plan = plan or gemv_plan(rows, k, n)
    program = gemv_program(backend, x.dtype, w.dtype, None, out_dtype, rows=rows, k=k, n=n, plan=plan, batches=batches)
    ins = [kernel_input(x), kernel_input(w), picks.cast(dtypes.int32).contiguous()]
    backward = None if composition is None else Backward("gather_mm", composition, tuple(ins), wrt=(0, 1))
    y = Tensor.empty(entries, rows, n, dtype=out_dtype, device=x.device)
    return launch(program, x.device, [y], ins, (plan.groups(n), entries, 1), plan.threads, backward=backward,
                  label=f"{backend} gather_gemv M{rows} K{k} N{n} E{batches} {plan}")[0]


def _tiled(program: Program, x: Tensor, w: Tensor, bias: Tensor | None, out_dtype: DType, composition,
           tiles: Tiles | WgmmaTiles, name: str, picks: Tensor | None) -> Tensor:
    """A matrix-unit product's launch (gemm, gemm_wgmma): inputs y, x, w (, bias) (, picks, the
    tile table), the ints (M, N, K (, the batches)), over `tiles`' grid (gathered: over the table's
    slots)."""
    rows, k = x.shape
    n = w.shape[-2]
    ins = _inputs(x, w, bias)
    backward = _backward(composition, ins)
    grid = tiles.grid(rows, n)
    batches = math.prod(w.shape[:-2])
    if picks is not None:
        ins.append(picks.cast(dtypes.int32).contiguous())
        ins.append(gather_tile_starts(ins[-1], tiles.rows, batches))
        grid = (gather_tile_slots(rows, tiles.rows, batches), grid[1], 1)
    ins.append(int_buffer(x.device, (rows, n, k) + (() if picks is None else (batches,))))
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    label = f"{name} M{rows} K{k} N{n} {tiles}" + ("" if picks is None else f" gathered from {batches} batches")
    return launch(program, x.device, [y], ins, grid, tiles.threads, backward=backward, label=label)[0]


def gemm(x: Tensor, w: Tensor, bias: Tensor | None, *, out_dtype: DType, backend: str, composition=None,
         tiles: Tiles | None = None, picks: Tensor | None = None) -> Tensor:
    """`x [M, K] · wᵀ (+ bias)` for x and `w [N, K]` of one 16-bit dtype, `bias [N]` or None;
    returns `[M, N]` in `out_dtype`. With `picks` (int32 `[M]`, no bias) w is a batch of weights
    `[..., N, K]` and row i of x takes batch picks[i] (zeros for a pick outside them). composition:
    as `gemv`'s. `tiles` overrides `gemm_plan` (tuning)."""
    tiles = tiles or gemm_plan(x.shape[0], backend)
    program = gemm_program(backend, x.dtype, None if bias is None else bias.dtype, out_dtype, k=x.shape[1], tiles=tiles,
                           gather=picks is not None)
    return _tiled(program, x, w, bias, out_dtype, composition, tiles, f"{backend} gemm", picks)


def gemm_wgmma(x: Tensor, w: Tensor, bias: Tensor | None, *, out_dtype: DType, backend: str = "cuda", composition=None,
               tiles: WgmmaTiles | None = None, picks: Tensor | None = None) -> Tensor:
    """`gemm`'s product on the warpgroup matrix products (CUDA sm_90a; K a multiple of 8): `x [M,
    K] · wᵀ (+ bias)` for x and `w [N, K]` of one 16-bit dtype (with `picks`, a batch of them, as
    `gemm`'s); returns `[M, N]` in `out_dtype`. `tiles` overrides `wgmma_plan` (tuning)."""
    if backend != "cuda": raise ValueError(f"gemm_wgmma: no {backend} kernel (CUDA sm_90 only)")
    if tiles is None and picks is not None:  # gathered: tiles of the rows a weight batch has (`quant.gathered_tile_rows`)
        tiles = WGMMA_SMALL if gathered_tile_rows(x.shape[0], math.prod(w.shape[:-2])) == 64 else WGMMA_LARGE
    tiles = tiles or wgmma_plan(x.shape[0], w.shape[-2], _target(x.device).multiprocessors)
    program = wgmma_program(x.dtype, None if bias is None else bias.dtype, out_dtype, tiles=tiles, gather=picks is not None)
    return _tiled(program, x, w, bias, out_dtype, composition, tiles, "cuda gemm_wgmma", picks)
