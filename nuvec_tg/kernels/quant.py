"""The quantized product kernels: `qmv` (`src/qmv.h`), `y = x · wᵀ` for up to 8 rows of x, `qvm`
(`src/qvm.h`), `y = x · w` for untransposed weights, and `qmm` (`src/qmm.h`), `y = x · wᵀ` for
more rows on the matrix units, over packed weights of any affine width or floating-point mode
(`src/quant_codes.h`), float32 accumulation.

Which kernel runs (the same rule on METAL and CUDA; `quant/affine.py` and `quant/gather.py` apply
it, anything else is the composition):
- `quantized_matmul`, 2-D weights: up to MAX_ROWS rows of x, `qmv` (transposed) or `qvm` (not),
  any activation type (`supported`); more rows of float16 or bfloat16 and transposed, `qmm`
  (`qmm_supported`; float32 activations stay on the composition, the tiles are 16-bit).
- `gather_qmm`, transposed, no global scale: sorted single-row entries averaging more than MAX_ROWS
  rows per weight batch, the gathered `qmm` (`grouped_gather`); otherwise up to MAX_ROWS rows per
  entry, `gather_qmv`.

`plan` picks qmv's launch shape (`QmvPlan`); its defaults are the module constants below, meant to
be read off `scripts/tune_qmv.py` on the device. Only `k_split` changes a row's arithmetic order, so
it depends on K and N alone: a row's bits never depend on how many rows share the call (qvm's
`qvm_split` likewise depends on K alone).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .program import CTYPES, Param, int_buffer, launch, prelude, specialise

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
    """SIMD groups per set of columns: a power of two, at most MAX_K_SPLIT and K's step count. K is
    split in two while fewer than TARGET_WARPS SIMD groups run and each would keep 2 steps or more;
    a launch of fewer than FEW_WARPS SIMD groups is split down to one step a SIMD group. H200,
    affine 4-bit, `scripts/tune_qmv.py --quick --rows 1,4 --shape ...` in `benchmarks/quant_h200.md`
    (µs, one row / four rows): K = N = 4096 6.0 / 10.7 at a split of 4 (one step each) against
    5.8 / 9.6 at 2, K 4096 N 6144 8.3 / 13.4 against 7.7 / 12.7; while where few SIMD groups run
    one step each is faster: K 4096 N 1024 (256 column sets) 2.8 / 4.5 at a split of 4 against
    3.5 / 4.9 at 2, K = N = 2048 2.9 / 3.8 at 2 against 3.5 / 4.2 at 1, K 2048 N 4096 (1024 column
    sets) 4.2 / 6.4 at 2 against 4.5 / 6.5 at 1; and K 2048 N 8192 (2048) wants no split (6.0 / 9.4
    against 6.1 / 10.4). A function of K and N only (a row's order)."""
    steps = math.ceil(k / CODES_PER_STEP)
    column_sets = math.ceil(n / COLUMNS_PER_WARP)
    split = 1
    while (split * 2 <= min(MAX_K_SPLIT, steps) and column_sets * split < TARGET_WARPS
           and (math.ceil(steps / (split * 2)) >= 2 or column_sets * split < FEW_WARPS)):
        split *= 2
    return split


def plan(rows: int, k: int, n: int) -> QmvPlan:
    """The default launch shape; columns per SIMD group are at most N. Every row count takes
    COLUMNS_PER_WARP columns. One row takes COLUMNS_PER_WARP_LONG where each SIMD group has 2 steps
    or more and at least LONG_COLUMNS_MIN_WARPS SIMD groups still run: the x values a lane loads and
    widens (and sums, for the bias) then serve more codes. H200, `scripts/tune_qmv.py` in
    `benchmarks/quant_h200.md`, affine 4-bit, one row, µs: K 4096 N 14336 14.1 -> 13.5 with 8
    columns, K 14336 N 4096 13.8 -> 13.3, K 4096 N 6144 7.7 -> 7.4 (1536 SIMD groups), K = N = 8192
    15.2 -> 14.5; but K = N = 4096 (1024 SIMD groups) 5.8 -> 6.1 and K = N = 2048 (one step each)
    2.9 -> 3.0. Four rows 36.3 -> 25.8 and 36.4 -> 25.6 with 4 columns against 2 (and 2 and 8 rows
    alike; at 8 rows and float x a lane holds 204 registers, no spills). One row at 4 columns with
    K split in 2 or less puts two column sets in a threadgroup (`scripts/tune_qmv.py --quick --rows 1
    --column-warps 2`, the two interleaved 3 times, mean µs): K = N = 4096 6.6 -> 6.4, K 2048 N 8192
    6.6 -> 6.2, K 2048 N 512 3.2 -> 2.9, K = N = 2048 3.6 -> 3.5; not at a split of 4 (K 4096
    N 1024 2.7 -> 2.8) nor at 8 columns (K 4096 N 14336 13.9 -> 14.3, K = N = 5120 9.0 -> 10.8).
    Unrolling is at most a SIMD group's steps. None of these changes any row's arithmetic."""
    split = k_split_for(k, n)
    warp_steps = math.ceil(math.ceil(k / CODES_PER_STEP) / split)
    long_rows = warp_steps >= 2 and math.ceil(n / COLUMNS_PER_WARP_LONG) * split >= LONG_COLUMNS_MIN_WARPS
    columns = min(COLUMNS_PER_WARP_LONG if rows == 1 and long_rows else COLUMNS_PER_WARP, n)
    paired = rows == 1 and columns == COLUMNS_PER_WARP and split <= 2 and n >= 2 * columns
    return QmvPlan(columns, COLUMN_WARPS_ONE_ROW if paired else COLUMN_WARPS, split, max(1, min(UNROLL, warp_steps)))


def supported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int) -> bool:
    """Whether qmv (or qvm) takes the call: half/bfloat/float activations and output, 1 to 8 rows of
    x, a non-empty weight of K inputs and N outputs (an empty product is the composition's)."""
    return 0 < rows <= MAX_ROWS and k > 0 and n > 0 and x_dtype in CTYPES and out_dtype in CTYPES and (
        scales_dtype in CTYPES or scales_dtype == dtypes.uint8)


def load_words(bits: int, words_per_row: int) -> int:
    """Words per vector load of a chunk (`bits` words at a multiple of `bits` in its row): 4 (16
    bytes) for 4 and 8 bits, 2 for 2 and 6, 1 otherwise, less where rows are not that aligned."""
    width = 4 if bits in (4, 8) else 2 if bits in (2, 6) else 1
    while words_per_row % width: width //= 2
    return width


def program(backend: str, *, x_ctype: str, scales_ctype: str, out_ctype: str, mode: str, group_size: int, bits: int,
            rows: int, k: int, n: int, qmv_plan: QmvPlan, batches: int = 0) -> tuple[str, list[Param]]:
    """The kernel's text for `backend` without the prelude (see `program.specialise`) and its
    parameters: y, x, w, scales (, biases) (, picks). `batches` > 0: the gathered product over that
    many weight batches (`gather_qmv`)."""
    if qmv_plan.columns_per_warp > n: raise ValueError(f"qmv: {qmv_plan.columns_per_warp} columns per SIMD group > N = {n}")
    defines = dict(TX=x_ctype, TS=scales_ctype, TY=out_ctype, BITS=bits, GROUP=group_size, MODE=_MODES[mode], N_TOTAL=n,
                   K_TOTAL=k, XM=rows, COLUMNS=qmv_plan.columns_per_warp, COLUMN_WARPS=qmv_plan.column_warps,
                   K_SPLIT=qmv_plan.k_split, UNROLL=qmv_plan.unroll, LOAD_WORDS=load_words(bits, k * bits // 32),
                   GATHER=int(batches > 0), BATCHES=max(batches, 1))
    params = [Param("y", "out", out_ctype), Param("x", "in", x_ctype), Param("w", "in", "uint"),
              Param("scales", "in", scales_ctype)]
    if mode == "affine": params.append(Param("biases", "in", scales_ctype))
    if batches: params.append(Param("picks", "in", "int"))
    return specialise(backend, "nuvec_qmv", ("quant_codes.h", "qmv.h"), defines, params), params


def source(backend: str, x_dtype: DType, scales_dtype: DType, out_dtype: DType, *, mode: str, group_size: int, bits: int,
           rows: int, k: int, n: int, qmv_plan: QmvPlan, batches: int = 0) -> tuple[str, str]:
    """(kernel name, full program text) of the launch `qmv` or `gather_qmv` builds for these arguments."""
    text, _ = program(backend, x_ctype=CTYPES[x_dtype], scales_ctype=CTYPES.get(scales_dtype, "uchar"),
                      out_ctype=CTYPES[out_dtype], mode=mode, group_size=group_size, bits=bits, rows=rows, k=k, n=n,
                      qmv_plan=qmv_plan, batches=batches)
    name = f"nuvec_qmv_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return name, prelude(backend) + text.replace("nuvec_qmv(", f"{name}(")


def qmv(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, grad_fxn=None, qmv_plan: QmvPlan | None = None) -> Tensor:
    """`x [M, K] · wᵀ` for packed `weight [N, K * bits / 32]`, `scales` (and affine `biases`)
    `[N, K / group_size]`; returns `[M, N]` in `out_dtype`. `qmv_plan` overrides `plan`."""
    rows, k = x.shape
    n = weight.shape[0]
    qmv_plan = qmv_plan or plan(rows, k, n)
    name, text = source(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows,
                        k=k, n=n, qmv_plan=qmv_plan)
    ins = [x.contiguous(), weight.contiguous(), scales.contiguous()]
    if biases is not None: ins.append(biases.contiguous())
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(name, text, x.device, [y], ins, [], (qmv_plan.groups(n), 1, 1), (qmv_plan.threads, 1, 1),
                  grad_fxn=grad_fxn, label=f"{backend} qmv {mode} {bits}-bit g{group_size} M{rows} {qmv_plan}")[0]


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


def qvm_program(backend: str, *, x_ctype: str, scales_ctype: str, out_ctype: str, mode: str, group_size: int, bits: int,
                rows: int, k: int, n: int) -> tuple[str, list[Param]]:
    """`qvm`'s text for `backend` without the prelude, and its parameters: y, x, w, scales (, biases)."""
    defines = dict(TX=x_ctype, TS=scales_ctype, TY=out_ctype, BITS=bits, GROUP=group_size, MODE=_MODES[mode], N_TOTAL=n,
                   K_TOTAL=k, XM=rows, K_SPLIT=qvm_split(k), LOAD_WORDS=load_words(bits, n * bits // 32))
    params = [Param("y", "out", out_ctype), Param("x", "in", x_ctype), Param("w", "in", "uint"),
              Param("scales", "in", scales_ctype)]
    if mode == "affine": params.append(Param("biases", "in", scales_ctype))
    return specialise(backend, "nuvec_qvm", ("quant_codes.h", "qvm.h"), defines, params), params


def qvm(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, grad_fxn=None) -> Tensor:
    """`x [M, K] · w` for `weight [K, N * bits / 32]` packed along N, `scales` (and affine `biases`)
    `[K, N / group_size]`; returns `[M, N]` in `out_dtype`. Each row has a one-row product's bits."""
    rows, k = x.shape
    n = weight.shape[1] * 32 // bits
    text, _ = qvm_program(backend, x_ctype=CTYPES[x.dtype], scales_ctype=CTYPES.get(scales.dtype, "uchar"),
                          out_ctype=CTYPES[out_dtype], mode=mode, group_size=group_size, bits=bits, rows=rows, k=k, n=n)
    name = f"nuvec_qvm_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    ins = [x.contiguous(), weight.contiguous(), scales.contiguous()]
    if biases is not None: ins.append(biases.contiguous())
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(name, prelude(backend) + text.replace("nuvec_qvm(", f"{name}("), x.device, [y], ins, [],
                  (math.ceil(n / QVM_COLUMNS), 1, 1), (32 * qvm_split(k), 1, 1), grad_fxn=grad_fxn,
                  label=f"{backend} qvm {mode} {bits}-bit g{group_size} M{rows} K{k} N{n}")[0]


MAX_ENTRIES = 65535  # a gathered product's entries are the grid's second axis (CUDA's limit)


def gather_qmv(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, picks: Tensor, *, mode: str,
               group_size: int, bits: int, out_dtype: DType, backend: str, grad_fxn=None,
               qmv_plan: QmvPlan | None = None) -> Tensor:
    """Entry p of `x [P, M, K]` times weight batch `picks[p]` (int32 `[P]`) of `weight [E, N, K *
    bits / 32]`, `scales` (and affine `biases`) `[E, N, K / group_size]`; returns `[P, M, N]` in
    `out_dtype`, zeros for a pick outside 0..E-1. Each row has the bits of a one-row `qmv`."""
    entries, rows, k = x.shape
    batches, n = weight.shape[0], weight.shape[1]
    qmv_plan = qmv_plan or plan(rows, k, n)
    name, text = source(backend, x.dtype, scales.dtype, out_dtype, mode=mode, group_size=group_size, bits=bits, rows=rows,
                        k=k, n=n, qmv_plan=qmv_plan, batches=batches)
    ins = [x.contiguous(), weight.contiguous(), scales.contiguous()]
    if biases is not None: ins.append(biases.contiguous())
    ins.append(picks.cast(dtypes.int32).contiguous())
    y = Tensor.empty(entries, rows, n, dtype=out_dtype, device=x.device)
    return launch(name, text, x.device, [y], ins, [], (qmv_plan.groups(n), entries, 1), (qmv_plan.threads, 1, 1),
                  grad_fxn=grad_fxn, label=f"{backend} gather_qmv {mode} {bits}-bit g{group_size} M{rows} E{batches} {qmv_plan}")[0]


# The matrix-matrix kernel (`src/qmm.h`): y = x · wᵀ for more rows than qmv takes (prefill), on the
# matrix units; tiles of QMM_ROWS x QMM_COLUMNS outputs, 4 SIMD groups each.
QMM_ROWS, QMM_COLUMNS, QMM_THREADS = 64, 64, 128
QMM_DTYPES = (dtypes.float16, dtypes.bfloat16)  # the mma's inputs: x (and the dequantized tiles) in x's type


def qmm_supported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int, k: int, n: int) -> bool:
    """Whether qmm takes the call: more than MAX_ROWS rows of 16-bit activations (float32 and the
    few-row products go elsewhere), a non-empty weight, at most 65535 row tiles (the grid's axis)."""
    return (rows > MAX_ROWS and k > 0 and n > 0 and x_dtype in QMM_DTYPES and out_dtype in CTYPES
            and (scales_dtype in CTYPES or scales_dtype == dtypes.uint8) and math.ceil(rows / QMM_ROWS) <= 65535)


def grouped_gather(entries: int, rows_per_entry: int, batches: int) -> bool:
    """Whether a sorted gathered product runs as the gathered qmm (each weight batch's rows as one
    product) rather than gather_qmv (each row alone): single-row entries (MLX's rule), at least 16
    of them, more than MAX_ROWS per weight batch on average. Below that an expert's rows are few,
    qmv's domain, and keep the bits of one-row products (the seeds'
    `sorted_few_row_gathers_keep_the_one_row_bits`)."""
    return rows_per_entry == 1 and entries >= 16 and entries > MAX_ROWS * batches


def qmm_program(backend: str, *, x_ctype: str, scales_ctype: str, out_ctype: str, mode: str, group_size: int, bits: int,
                k: int, gather: bool = False) -> tuple[str, list[Param]]:
    """`qmm`'s text for `backend` without the prelude, and its parameters: y, x, w, scales (, biases)
    (, picks), ints (M, N, K (, batches)). K only picks the width of the weight loads (its rows'
    alignment). `gather`: each row of x with its own weight batch (sorted gathers of `gather_qmm`)."""
    defines = dict(TX=x_ctype, TS=scales_ctype, TY=out_ctype, BITS=bits, GROUP=group_size, MODE=_MODES[mode],
                   LOAD_WORDS=load_words(bits, k * bits // 32), GATHER=int(gather))
    params = [Param("y", "out", out_ctype), Param("x", "in", x_ctype), Param("w", "in", "uint"),
              Param("scales", "in", scales_ctype)]
    if mode == "affine": params.append(Param("biases", "in", scales_ctype))
    if gather: params.append(Param("picks", "in", "int"))
    params.append(Param("ints", "in", "int"))
    return specialise(backend, "nuvec_qmm", ("quant_codes.h", "qmm.h"), defines, params), params


def qmm(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, grad_fxn=None, picks: Tensor | None = None) -> Tensor:
    """`x [M, K] · wᵀ` (x float16 or bfloat16) for packed `weight [N, K * bits / 32]`, `scales`
    (and affine `biases`) `[N, K / group_size]`; returns `[M, N]` in `out_dtype`. The weights are
    dequantized into x's type (MLX's rounding), the products accumulate in float32.

    picks (int32 `[M]`): row i of x times weight batch `picks[i]` of `weight [E, N, ...]`, `scales`
    (and `biases`) `[E, N, ...]`, zeros for a pick outside 0..E-1; rows grouped by batch (sorted
    picks) run as one product per batch and row tile (a mixture of experts' prefill)."""
    rows, k = x.shape
    n = weight.shape[-2]
    text, _ = qmm_program(backend, x_ctype=CTYPES[x.dtype], scales_ctype=CTYPES.get(scales.dtype, "uchar"),
                          out_ctype=CTYPES[out_dtype], mode=mode, group_size=group_size, bits=bits, k=k,
                          gather=picks is not None)
    name = f"nuvec_qmm_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    ins = [x.contiguous(), weight.contiguous(), scales.contiguous()]
    if biases is not None: ins.append(biases.contiguous())
    if picks is not None: ins.append(picks.cast(dtypes.int32).contiguous())
    ins.append(int_buffer(x.device, (rows, n, k) + ((weight.shape[0],) if picks is not None else ())))
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(name, prelude(backend) + text.replace("nuvec_qmm(", f"{name}("), x.device, [y], ins, [],
                  (math.ceil(n / QMM_COLUMNS), math.ceil(rows / QMM_ROWS), 1), (QMM_THREADS, 1, 1), grad_fxn=grad_fxn,
                  label=f"{backend} qmm {mode} {bits}-bit g{group_size} M{rows} K{k} N{n}{' gather' if picks is not None else ''}")[0]
