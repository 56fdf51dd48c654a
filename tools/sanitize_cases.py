"""Small cases over every kernel family and its specialisation axes, for compute-sanitizer.

`scripts/device_check.sh sanitize` runs this script under memcheck, racecheck and initcheck; the
GPU test files take too long there. Each case builds one call through the public API
(`nuvec_tg.fast`, `nuvec_tg.quant`) on `Device.DEFAULT`, realizes it, checks which kernel
families launched (`record_launches`; a family is a launch's name less its hash), and compares
the result with the composition (`compositions_only()`) loosely: memory safety is the
sanitizer's business, but a wrong result fails loudly too. Where hostile inputs leave a result
unspecified (two sequences naming one slot), only its finiteness is checked. The expected
families are CUDA's plan: on CUDA they must be exactly those; on METAL (MLX's plan, no matrix
pass) only whether some launched; on a device without kernels (CPU) none may, and both runs are
the composition.

Covered (shapes small, specialisations few: under memcheck every launch is slow, and nvrtc's
compiles dominate the time):
- decode attention: one pass, two passes, the matrix-unit pass (16-bit, grouped rows, several
  block groups for a large batch); no mask, causal, window, boolean and additive masks, sinks;
  grouped heads; Lq 1-8; head sizes 64, 128, 256 and 96/64; Lk 1, 7, 8, 130, 1000; slices of a
  longer cache read in place; a symbolic length (a bound Variable; on a device without kernels,
  where the API refuses one, the concrete length); no queries, no keys, no batch (the empty calls
  launch nothing: the composition's).
- paged attention: block tables with entries below 0 and past the pool, lengths past the
  capacity and negative, a length shorter than the queries, one sequence, block sizes 16 and 32,
  the three decode passes; no batch.
- gated delta rule: final state, every step's state (another storage dtype), the slot pool in
  place with slots negative, past the pool (an int64 one past int32 too) and duplicated; T 0, 1, 5 and 17 (the other launch
  shape); Dk 32, 64, 128; Dv not a multiple of a threadgroup's rows; grouped Hv; the chunked
  prefill at T 64 and 70 (a partial chunk), its final state and its slot pool.
- qmv: 1, 3 and 8 rows (and a 1-D x) in every mode (affine 2, 3, 4, 8 bits; mxfp4, mxfp8,
  nvfp4), K not a multiple of a SIMD step (split across two SIMD groups), N not a multiple of a
  SIMD group's columns or below them; qvm; gather_qmv with expert and row indices out of range
  (negative, >= E, 2^31 - 1) and one entry; qmv_mma (CUDA) at 2, 3, 5 and 8 rows, N past a tile
  of 16 or exactly one, K ending inside a unit (nvfp4: a half chunk); qmm at M 9, 65, 130 (not multiples of the 64-row
  tile), N 100, batch axes, nvfp4's half chunk; the sorted gathered qmm with out-of-range experts;
  no rows, no columns, no entries.
- row norms: rms_norm with and without a weight, add_rms_norm, layer_norm with a weight and a
  bias or a bias only; rows of 1 and 7 (single elements), 33, 1000 and 4096 (pieces held), 32776
  and 65536 (the row read again each pass); no rows; residual_rms_norm with a scale, a scale
  tensor and the next norm, held and looped.
- softmax, logsumexp and cross_entropy over the last axis: one SIMD group, two, 1024 threads in
  registers, the looped form; rows with -inf elements (a thread's first among them); leading
  batch axes and 1-D logits; targets at both ends of int32, one past either end of the classes,
  and int64 ones outside int32; no rows, no classes.
- dense products (`fast.linear`): gemv at 1, 3 and 8 rows (and a 1-D x) with K off a SIMD step and
  of pieces of 4 and 1 element, N off a SIMD group's columns and below them, mixed dtypes, a bias
  or none; gemv's SwiGLU product; gather_gemv over unsorted experts with out-of-range ones; gathered gemm over sorted experts with out-of-range ones; gemm at M 9, 65 and 257 (both tile shapes and their tails), K off the step of 32 with
  copies of 16, 8 and 4 bytes, N off the tiles, batch axes, a float32 bias; float32 beyond 8 rows
  (the composition); no rows, no columns, no K.
- rope: both pair layouts, 8, 4 and 1 pairs a thread, features past dims, freqs and a scale, rank 5
  with per-batch offsets, positions from 500000 (sincosf's large-angle reduction, its local
  memory) and offsets at both ends of int32; no batch, no rows.
- norm_rope: every launch shape (16 lanes a row, a threadgroup a row, single elements, two pieces
  a lane), units of 4 with the tail, many threadgroups; into caches at an int offset and at
  tensor offsets that put rows before and past the cache and at both ends of int32, in another
  dtype; norm_rope_at into pools with slots negative, past the pool, at both ends of int32 and
  shared; norm_rope_kv fresh and into caches; queries beside the keys into a cache and a pool;
  rows too long for the kernel (the three passes); no rows, no batch.
- take: a bfloat16 table's rows at indices negative, past it, at both ends of int32 and repeated;
  rows of 2-byte chunks; no indices.
- paged_write: rows of 128 (pieces of 8), 12 (of 4) and 7 (single elements), mixed dtypes, slots
  shuffled, negative, past the pool, at both ends of int32 and shared, int64 ones past int32; no rows;
  heads of a projection's output read in place (by norm_rope_at too).

Usage (from the repository root):
    DEV=CUDA PYTHONPATH=. python3 tools/sanitize_cases.py [-k SUBSTR ...] [--list]
    bash scripts/device_check.sh sanitize        # the same under the three sanitizer tools
    CC=.venv/bin/tinygrad-cc DEV=CPU PYTHONPATH=. .venv/bin/python tools/sanitize_cases.py
Prints a line per case and `N cases passed`; exits non-zero when a case fails.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tinygrad import Device, Tensor, UOp, dtypes
from tinygrad.dtype import DType

from nuvec_tg import fast, quant
from nuvec_tg import kernels as nuvec_kernels
from nuvec_tg.kernels import compositions_only, record_launches
from nuvec_tg.kernels import quant as nuvec_quant
from nuvec_tg.kernels.prefill import WGMMA_HEADS

DEVICE = Device.DEFAULT
# The backend whose kernels the calls build here: None on devices without kernels, or with them off.
BACKEND = None if os.environ.get("NUVEC_KERNELS", "1") == "0" else \
    {"CUDA": "cuda", "METAL": "metal"}.get(DEVICE.split(":")[0].upper())
# Hopper (CUDA sm_90): products of more than 8 rows take the wgmma kernels where K allows.
WARPGROUPS = BACKEND == "cuda" and nuvec_kernels.target(DEVICE).warpgroups
# Relative to max(|composition|, 1) over the output: loose, the sanitizer looks for worse.
TOLERANCE = {dtypes.float32: 1e-3, dtypes.float16: 1e-2, dtypes.bfloat16: 6e-2}
INT32_MAX = 2**31 - 1
SHORT = {dtypes.float32: "f32", dtypes.float16: "f16", dtypes.bfloat16: "bf16"}

DECODE_ONE_PASS = ("nuvec_sdpa_decode",)
DECODE_TWO_PASSES = ("nuvec_sdpa_decode", "nuvec_sdpa_merge")
MATRIX = ("nuvec_sdpa_decode_mma", "nuvec_sdpa_merge")
PREFILL = ("nuvec_sdpa_prefill",)
GATED_DELTA = ("nuvec_gated_delta",)
GATED_CHUNKED = ("nuvec_gated_delta_chunks", "nuvec_gated_delta_pass")
QMV, QVM, QMM, QMV_MMA = ("nuvec_qmv",), ("nuvec_qvm",), ("nuvec_qmm",), ("nuvec_qmv_mma",)
GEMV, GEMM = ("nuvec_gemv",), ("nuvec_gemm",)


def qmm_of(k: int, bits: int, rows: int = 0, n: int = 0, mode: str = "affine") -> tuple[str, ...]:
    """The families of a qmm call of `rows` rows, depth K, N outputs over `bits`-bit weights in
    `mode`: on Hopper where K is a multiple of 64, the plan's tiled kernel (`qmm_hopper_family`), or
    where M and N take the dequantized route (`takes_dequantized`; gathered calls pass no rows),
    dequantize then gemm_wgmma."""
    if not (WARPGROUPS and k % 64 == 0): return QMM
    target = nuvec_kernels.target(DEVICE)
    if nuvec_quant.takes_dequantized(rows, k, n, target, mode, bits): return ("nuvec_dequantize", "nuvec_gemm_wgmma")
    return (nuvec_quant.qmm_hopper_family(rows, n, bits, target.multiprocessors, mode=mode, k=k),)


def prefill_of(d: int, dv: int | None = None) -> tuple[str, ...]:
    """The family of a prefill call of head sizes D (and Dv, default D): the warpgroup kernel on
    Hopper where it takes them."""
    return ("nuvec_sdpa_prefill_wgmma",) if WARPGROUPS and (d, d if dv is None else dv) in WGMMA_HEADS else PREFILL


def gemm_of(k: int) -> tuple[str, ...]:
    """The family of more than 8 rows of a dense product of depth K: gemm_wgmma on Hopper where K
    is a multiple of 8."""
    return ("nuvec_gemm_wgmma",) if WARPGROUPS and k % 8 == 0 else GEMM
RMS_NORM, LAYER_NORM, RESIDUAL_NORM = ("nuvec_rms_norm",), ("nuvec_layer_norm",), ("nuvec_residual_norm",)
SOFTMAX, LOGSUMEXP, CROSS_ENTROPY = ("nuvec_softmax",), ("nuvec_logsumexp",), ("nuvec_cross_entropy",)
ROPE = ("nuvec_rope",)
NORM_ROPE = ("nuvec_norm_rope",)
NONE: tuple[str, ...] = ()

# A call's results: (label, tensor, where the contract leaves values unspecified or None).
Outputs = list[tuple[str, Tensor, np.ndarray | None]]
# A case's set-up makes its inputs once; the call it returns runs the API on them (`kernels`:
# whether this run may build kernels, which a symbolic length needs).
Setup = Callable[[np.random.Generator], Callable[[bool], Outputs]]


@dataclass(frozen=True)
class Case:
    name: str
    kernels: tuple[str, ...]  # the families CUDA's plan launches
    setup: Setup


# ---- inputs ----------------------------------------------------------------------------------

def uniform(rng: np.random.Generator, shape, dtype: DType, low: float = -1.0, high: float = 1.0) -> Tensor:
    return Tensor(rng.uniform(low, high, shape).astype(np.float32), device=DEVICE).cast(dtype).realize()


def integers(values) -> Tensor:
    return Tensor(np.asarray(values, np.int32), device=DEVICE).realize()


def as_numpy(t: Tensor) -> np.ndarray:
    """A tensor's values as float64, 16-bit ones through their bits (tinygrad folds a lazy cast
    down to half and back up into nothing)."""
    if t.numel() == 0: return np.zeros(t.shape)
    if t.dtype == dtypes.float16: return t.bitcast(dtypes.uint16).numpy().view(np.float16).astype(np.float64)
    if t.dtype == dtypes.bfloat16:
        return (t.bitcast(dtypes.uint16).numpy().astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return t.numpy().astype(np.float64)


# ---- attention -------------------------------------------------------------------------------

def attention(b: int, hq: int, hkv: int, lq: int, lk: int, d: int, dv: int, dtype: DType, *, mask: str | None = None,
              window: int | None = None, sinks: bool = False, cache: tuple[int, int] | None = None,
              symbolic: bool = False) -> Setup:
    """`scaled_dot_product_attention` over random inputs. mask: None, "causal", "bool" or
    "additive"; cache: (start, capacity): K and V the keys `start..start + lk` of a longer cache;
    symbolic: that slice's end a bound Variable where kernels run."""
    def setup(rng):
        start, capacity = cache or (0, lk)
        q = uniform(rng, (b, hq, lq, d), dtype)
        k_cache, v_cache = uniform(rng, (b, hkv, capacity, d), dtype), uniform(rng, (b, hkv, capacity, dv), dtype)
        options: dict = {}
        if mask == "causal": options["mask"] = "causal"
        if mask == "bool": options["mask"] = Tensor(rng.uniform(size=(b, 1, lq, lk)) > 0.3, device=DEVICE).realize()
        if mask == "additive": options["mask"] = uniform(rng, (1, hq, lq, lk), dtype, -2.0, 2.0)
        if window is not None: options["window"] = window
        if sinks: options["sinks"] = uniform(rng, (hq,), dtype)

        def run(kernels: bool) -> Outputs:
            end = start + lk
            if symbolic and kernels: end = UOp.variable(f"keys_{capacity}", 1, capacity, dtype=dtypes.int32).bind(end)
            k, v = (k_cache, v_cache) if cache is None else (k_cache[:, :, start:end], v_cache[:, :, start:end])
            return [("out", fast.scaled_dot_product_attention(q, k, v, d ** -0.5, **options), None)]
        return run
    return setup


def paged(hq: int, hkv: int, lq: int, d: int, page: int, table: list[list[int]], pool_blocks: int, lengths: list[int],
          dtype: DType, *, window: int | None = None, sinks: bool = False) -> Setup:
    """`paged_attention` of `len(table)` sequences over pools of `pool_blocks` blocks of `page` positions."""
    def setup(rng):
        b = len(table)
        q = uniform(rng, (b, hq, lq, d), dtype)
        k_pool, v_pool = (uniform(rng, (pool_blocks, hkv, page, d), dtype) for _ in range(2))
        tables = integers(np.asarray(table or [[0]], np.int32)[:b])  # [B, max_blocks]; 0 x 1 for no batch
        lens, sink_values = integers(lengths), uniform(rng, (hq,), dtype) if sinks else None

        def run(kernels: bool) -> Outputs:
            out = fast.paged_attention(q, k_pool, v_pool, tables, lens, d ** -0.5, window=window, sinks=sink_values)
            return [("out", out, None)]
        return run
    return setup


# Capacity 4 * 16 = 64 (one pass), entries below 0 and past the 5-block pool.
HOSTILE_TABLE = [[0, 1005, -5, INT32_MAX], [3, 4, -1, 2]]

ATTENTION = [
    # one pass: fewer than 128 keys (CUDA's blocks hold 64 keys at least), few rows per key head
    Case("sdpa one-pass f32 D64 B2 Lk7", DECODE_ONE_PASS, attention(2, 4, 4, 1, 7, 64, 64, dtypes.float32)),
    Case("sdpa one-pass bf16 D128 one row Lk1 causal", DECODE_ONE_PASS,
         attention(1, 1, 1, 1, 1, 128, 128, dtypes.bfloat16, mask="causal")),
    Case("sdpa one-pass f16 D256 Lq2 Lk7 bool", DECODE_ONE_PASS,
         attention(1, 2, 2, 2, 7, 256, 256, dtypes.float16, mask="bool")),
    Case("sdpa one-pass f32 D64 Lq8 Lk8 causal", DECODE_ONE_PASS,
         attention(1, 2, 2, 8, 8, 64, 64, dtypes.float32, mask="causal")),
    # two passes: 128 keys or more
    Case("sdpa two-pass f16 D128 Lk1000 causal sinks", DECODE_TWO_PASSES,
         attention(1, 2, 2, 1, 1000, 128, 128, dtypes.float16, mask="causal", sinks=True)),
    Case("sdpa two-pass f32 D256 gqa4 Lq3 Lk130 bool", DECODE_TWO_PASSES,
         attention(1, 8, 2, 3, 130, 256, 256, dtypes.float32, mask="bool")),
    Case("sdpa two-pass f16 D256 Lk130 additive", DECODE_TWO_PASSES,
         attention(1, 4, 4, 1, 130, 256, 256, dtypes.float16, mask="additive")),
    Case("sdpa two-pass bf16 D64 Lq2 Lk1000 window200", DECODE_TWO_PASSES,
         attention(1, 1, 1, 2, 1000, 64, 64, dtypes.bfloat16, mask="causal", window=200)),
    Case("sdpa two-pass f32 D96/64 gqa2 Lq5 Lk130 causal sinks", DECODE_TWO_PASSES,
         attention(1, 2, 1, 5, 130, 96, 64, dtypes.float32, mask="causal", sinks=True)),
    # the matrix-unit pass: 16-bit, at least 4 rows per key head, D % 32 == 0, DV % 64 == 0, D <= 128
    Case("sdpa matrix f16 D64 gqa8 Lk7", MATRIX, attention(1, 8, 1, 1, 7, 64, 64, dtypes.float16)),
    Case("sdpa matrix bf16 D128 gqa4 Lq8 Lk130 window50 sinks", MATRIX,
         attention(1, 4, 1, 8, 130, 128, 128, dtypes.bfloat16, mask="causal", window=50, sinks=True)),
    Case("sdpa matrix f16 D128 gqa8 B2 Lk1000 bool", MATRIX,
         attention(2, 16, 2, 1, 1000, 128, 128, dtypes.float16, mask="bool")),
    Case("sdpa matrix bf16 D64 Lq4 Lk130 additive sinks", MATRIX,
         attention(1, 4, 4, 4, 130, 64, 64, dtypes.bfloat16, mask="additive", sinks=True)),
    Case("sdpa matrix f16 D96/64 gqa4 Lk1000 causal", MATRIX,
         attention(1, 8, 2, 1, 1000, 96, 64, dtypes.float16, mask="causal")),
    # 17 items x 8 key heads: more threadgroups than a wave, so each takes both blocks in turn
    Case("sdpa matrix block groups f16 D64 B17 gqa4 Lk1000", MATRIX,
         attention(17, 32, 8, 1, 1000, 64, 64, dtypes.float16)),
    # K and V read in place from a longer cache, at an offset and as a prefix; symbolic lengths
    Case("sdpa cache slice f32 D64 keys 3..133 of 200", DECODE_TWO_PASSES,
         attention(1, 2, 2, 1, 130, 64, 64, dtypes.float32, cache=(3, 200))),
    Case("sdpa matrix cache prefix f16 D128 gqa4 130 of 300", MATRIX,
         attention(1, 8, 2, 1, 130, 128, 128, dtypes.float16, mask="causal", cache=(0, 300))),
    Case("sdpa symbolic length f16 D128 130 of 300", DECODE_TWO_PASSES,
         attention(1, 2, 2, 1, 130, 128, 128, dtypes.float16, cache=(0, 300), symbolic=True)),
    # planned for 300 keys (2 blocks), run over 20: a block without keys
    Case("sdpa matrix symbolic length bf16 D64 gqa4 20 of 300", MATRIX,
         attention(1, 4, 1, 1, 20, 64, 64, dtypes.bfloat16, cache=(0, 300), symbolic=True)),
    # empty
    Case("sdpa no queries", NONE, attention(1, 2, 2, 0, 7, 64, 64, dtypes.float32)),
    Case("sdpa no keys", NONE, attention(1, 2, 2, 1, 0, 64, 64, dtypes.float32)),
    Case("sdpa no batch", NONE, attention(0, 2, 2, 1, 7, 64, 64, dtypes.float32)),
    # paged
    Case("paged one-pass f32 D64 page16 hostile table, lengths past capacity and negative", DECODE_ONE_PASS,
         paged(4, 2, 1, 64, 16, HOSTILE_TABLE, 5, [65, -3], dtypes.float32)),
    # lengths 2^31 - 1 (clamped to 160) and 1: the second block of the second sequence holds no key
    Case("paged two-pass bf16 D128 page32 hostile table, lengths 2^31-1 and 1", DECODE_TWO_PASSES,
         paged(2, 2, 1, 128, 32, [[1, 0, 7, -2, 3], [4, 4, 4, 4, 4]], 6, [INT32_MAX, 1], dtypes.bfloat16)),
    Case("paged matrix f16 D64 page16 gqa8 window50 sinks hostile", MATRIX,
         paged(16, 2, 1, 64, 16, [[0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, -1, 99, 3, 2, 1, 0]], 9, [0, 140],
               dtypes.float16, window=50, sinks=True)),
    Case("paged matrix f16 D128 page16 gqa4 two blocks hostile", MATRIX,
         paged(8, 2, 1, 128, 16, [[(5 * i) % 9 - 1 for i in range(20)], [i % 7 for i in range(20)]], 7, [300, -1],
               dtypes.float16)),
    Case("paged matrix bf16 D128 page32 one sequence Lq3 length 2", MATRIX,
         paged(4, 1, 3, 128, 32, [[2, 0, 1]], 4, [2], dtypes.bfloat16)),
    Case("paged one-pass f32 D256 page16 one sequence length 7", DECODE_ONE_PASS,
         paged(2, 2, 1, 256, 16, [[1, 2]], 3, [7], dtypes.float32)),
    Case("paged no batch", NONE, paged(4, 2, 1, 64, 16, [], 3, [], dtypes.float32)),
    # the tiled prefill kernel: rows and keys off the tiles, every option, padded head sizes, grouped
    # rows packed past a tile's end, cache slices, paged pools with hostile tables and lengths
    Case("prefill bf16 D128 gqa4 Lq9 Lk9 causal", prefill_of(128),
         attention(1, 8, 2, 9, 9, 128, 128, dtypes.bfloat16, mask="causal")),
    Case("prefill f16 D64 gqa3 Lq37 Lk100 no mask", prefill_of(64), attention(1, 6, 2, 37, 100, 64, 64, dtypes.float16)),
    Case("prefill bf16 D80 Lq70 Lk70 window13 sinks", prefill_of(80),
         attention(2, 2, 2, 70, 70, 80, 80, dtypes.bfloat16, mask="causal", window=13, sinks=True)),
    Case("prefill f16 D72 gqa8 Lq21 Lk50 bool", prefill_of(72),
         attention(1, 8, 1, 21, 50, 72, 72, dtypes.float16, mask="bool")),
    Case("prefill bf16 D96/64 Lq33 Lk65 additive sinks", prefill_of(96, 64),
         attention(1, 4, 2, 33, 65, 96, 64, dtypes.bfloat16, mask="additive", sinks=True)),
    Case("prefill f16 D256 Lq17 Lk40 causal", prefill_of(256),
         attention(1, 2, 1, 17, 40, 256, 256, dtypes.float16, mask="causal")),
    Case("prefill bf16 D192 Lq20 Lk20 causal", prefill_of(192),
         attention(1, 2, 2, 20, 20, 192, 192, dtypes.bfloat16, mask="causal")),
    Case("prefill bf16 D128 Lq40 keys 5..105 of 200 causal", prefill_of(128),
         attention(1, 4, 2, 40, 100, 128, 128, dtypes.bfloat16, mask="causal", cache=(5, 200))),
    Case("prefill paged f16 D64 page16 Lq12 hostile table, lengths past capacity and negative", prefill_of(64),
         paged(4, 2, 12, 64, 16, HOSTILE_TABLE, 5, [65, -3], dtypes.float16)),
    Case("prefill paged bf16 D128 page32 Lq20 window9 sinks, lengths 2^31-1 and 5", prefill_of(128),
         paged(8, 2, 20, 128, 32, [[1, 0, 7, -2, 3], [4, 4, 4, 4, 4]], 6, [INT32_MAX, 5], dtypes.bfloat16, window=9,
               sinks=True)),
    # the warpgroup kernel's (Hopper; elsewhere these run the mma.sync kernel): several key tiles
    # through both stages, 128-row tiles past the last row, V's 64-column blocks of a 256 head
    Case("prefill bf16 D128 gqa4 Lq300 Lk347 causal (several 128-key tiles)", prefill_of(128),
         attention(1, 8, 2, 300, 347, 128, 128, dtypes.bfloat16, mask="causal")),
    Case("prefill f16 D256 gqa2 Lq150 Lk260 window70 sinks", prefill_of(256),
         attention(1, 4, 2, 150, 260, 256, 256, dtypes.float16, mask="causal", window=70, sinks=True)),
    Case("prefill bf16 D64 Lq99 Lk211 additive", prefill_of(64), attention(2, 2, 2, 99, 211, 64, 64, dtypes.bfloat16, mask="additive")),
    Case("prefill no queries bf16 D128", NONE, attention(1, 2, 2, 0, 20, 128, 128, dtypes.bfloat16)),
    Case("prefill no keys bf16 D128", NONE, attention(1, 2, 2, 20, 0, 128, 128, dtypes.bfloat16)),
]


# ---- the gated delta rule --------------------------------------------------------------------

def gated(b: int, t: int, hk: int, hv: int, dk: int, dv: int, dtype: DType, state_dtype: DType, *,
          variant: str = "final", storage: DType | None = None, slots: list[int] | None = None,
          pool_size: int = 0, slot_dtype=np.int32) -> Setup:
    """A `gated_delta` call ("final"), `gated_delta_chunked` ("chunked": the decay's logarithm; its
    composition is the chunked one, quick to build for long calls), `gated_delta_steps` ("steps",
    in `storage`) or `gated_delta_slots` ("slots": `slots` into a pool of `pool_size`, updated in
    place)."""
    def setup(rng):
        q = uniform(rng, (b, t, hk, dk), dtype)
        keys = rng.uniform(-1, 1, (b, t, hk, dk))
        keys /= np.maximum(np.linalg.norm(keys, axis=-1, keepdims=True), 1e-6)  # unit keys: the rule is stable
        k = Tensor(keys.astype(np.float32), device=DEVICE).cast(dtype).realize()
        v = uniform(rng, (b, t, hv, dv), dtype)
        g, beta = uniform(rng, (b, t, hv), state_dtype, 0.75, 0.95), uniform(rng, (b, t, hv), dtype, 0.3, 0.7)
        if variant != "slots":
            state = uniform(rng, (b, hv, dv, dk), state_dtype)

            def run(kernels: bool) -> Outputs:
                if variant in ("final", "chunked"):
                    y, s = fast.gated_delta(q, k, v, g, beta, state) if variant == "final" else \
                        fast.gated_delta_chunked(q, k, v, g.log(), beta, state)
                    return [("y", y, None), ("state", s, None)]
                y, states = fast.gated_delta_steps(q, k, v, g, beta, state, storage=storage)
                return [("y", y, None), ("states", states, None)]
            return run
        pool_values = rng.uniform(-1, 1, (pool_size, hv, dv, dk)).astype(np.float32)
        live = [s for s in slots if 0 <= s < pool_size]
        shared = {s for s in live if live.count(s) > 1}  # two sequences racing for one slot
        y_unspecified = np.zeros((b, t, hv, dv), bool)
        y_unspecified[[i for i, s in enumerate(slots) if s in shared]] = True
        pool_unspecified = np.zeros((pool_size, hv, dv, dk), bool)
        pool_unspecified[sorted(shared)] = True
        slot_tensor = Tensor(np.asarray(slots, slot_dtype), device=DEVICE).realize()

        def run(kernels: bool) -> Outputs:
            pool = Tensor(pool_values, device=DEVICE).cast(state_dtype).realize()  # a fresh pool: the kernel updates it
            y, updated = fast.gated_delta_slots(q, k, v, g, beta, pool, slot_tensor)
            return [("y", y, y_unspecified), ("pool", updated, pool_unspecified)]
        return run
    return setup


def deltanet_inputs(b: int, t: int, heads: fast.DeltaNetHeads, taps: int, dtype: DType, *, slots: list[int] | None = None,
                    pool_size: int = 0) -> Setup:
    """A `gated_delta_inputs` call: projection rows of `dtype`, a state (or with `slots` a pool of
    `pool_size` rows) updated in place, float32 gates."""
    def setup(rng):
        projected = uniform(rng, (b, t, heads.width), dtype)
        filters = uniform(rng, (heads.channels, taps), dtype)
        a_log, dt_bias = uniform(rng, (heads.value_heads,), dtypes.float32), uniform(rng, (heads.value_heads,), dtypes.float32)
        rows = pool_size if slots is not None else b
        values = rng.uniform(-1, 1, (rows, taps - 1, heads.channels)).astype(np.float32)
        slot_tensor = integers(slots) if slots is not None else None

        def run(kernels: bool) -> Outputs:
            conv = Tensor(values, device=DEVICE).cast(dtype).realize()   # fresh: the kernel updates it
            outs = fast.gated_delta_inputs(projected, conv, filters, a_log, dt_bias, heads, slots=slot_tensor, log_decay=t > 1)
            # q, k and v come from features rounded to dtype, which the composition's convolution
            # rounds a unit otherwise now and then: compared in dtype
            return [(name, out.cast(dtype) if name in ("q", "k", "v") else out, None)
                    for name, out in zip(("q", "k", "v", "g", "beta", "conv"), outs)]
        return run
    return setup


DELTANET_INPUTS = ("nuvec_gated_delta_inputs",)

GATED = [
    Case("gated_delta final f32 T1 Dk32 Dv17 Hv4/Hk2", GATED_DELTA,
         gated(1, 1, 2, 4, 32, 17, dtypes.float32, dtypes.float32)),
    Case("gated_delta final bf16/f32 B2 T5 Dk64 Dv33 Hv2/Hk1", GATED_DELTA,
         gated(2, 5, 1, 2, 64, 33, dtypes.bfloat16, dtypes.float32)),
    Case("gated_delta final f16 T5 Dk128 Dv16", GATED_DELTA, gated(1, 5, 2, 2, 128, 16, dtypes.float16, dtypes.float16)),
    Case("gated_delta final f32 T17 Dk32 Dv9 (the prefill launch shape)", GATED_DELTA,
         gated(1, 17, 1, 2, 32, 9, dtypes.float32, dtypes.float32)),
    Case("gated_delta_steps f32 T5 Dk128 Dv20 Hv4/Hk2 storage bf16", GATED_DELTA,
         gated(1, 5, 2, 4, 128, 20, dtypes.float32, dtypes.float32, variant="steps", storage=dtypes.bfloat16)),
    Case("gated_delta_steps bf16 T1 Dk32 Dv8", GATED_DELTA,
         gated(1, 1, 1, 1, 32, 8, dtypes.bfloat16, dtypes.bfloat16, variant="steps")),
    Case("gated_delta_slots f32 T1 Dk64 slots 2, -1, 3 (past the pool), 0", GATED_DELTA,
         gated(4, 1, 1, 2, 64, 8, dtypes.float32, dtypes.float32, variant="slots", slots=[2, -1, 3, 0], pool_size=3)),
    Case("gated_delta_slots bf16/f32 T5 Dk128 Hv4/Hk2 slots 1, 1 (duplicate), 7, -2^31", GATED_DELTA,
         gated(4, 5, 2, 4, 128, 16, dtypes.bfloat16, dtypes.float32, variant="slots", slots=[1, 1, 7, -2**31],
               pool_size=4)),
    Case("gated_delta_slots f32 T1 int64 slots 2^32 + 1 (past the pool; 1 as int32), 0", GATED_DELTA,
         gated(2, 1, 1, 1, 32, 8, dtypes.float32, dtypes.float32, variant="slots", slots=[2**32 + 1, 0], pool_size=3,
               slot_dtype=np.int64)),
    Case("gated_delta_inputs bf16 B2 T1 separate Hk2 Hv4 Dk32 Dv16 taps 4", DELTANET_INPUTS,
         deltanet_inputs(2, 1, fast.DeltaNetHeads(2, 4, 32, 16), 4, dtypes.bfloat16)),
    Case("gated_delta_inputs f16 T6 grouped Dk64 Dv40 taps 4 (rows in four groups)", DELTANET_INPUTS,
         deltanet_inputs(1, 6, fast.DeltaNetHeads(1, 2, 64, 40, grouped=True), 4, dtypes.float16)),
    Case("gated_delta_inputs f32 T2 pool slots 1, 3 (past it), -1, 0", DELTANET_INPUTS,
         deltanet_inputs(4, 2, fast.DeltaNetHeads(1, 1, 32, 32), 4, dtypes.float32, slots=[1, 3, -1, 0], pool_size=3)),
    Case("gated_delta no steps", NONE, gated(1, 0, 1, 1, 32, 8, dtypes.float32, dtypes.float32)),
    Case("gated_delta_chunked bf16/f32 B2 T70 Dk128 Dv64 Hv4/Hk2 (chunked, the last chunk partial)", GATED_CHUNKED,
         gated(2, 70, 2, 4, 128, 64, dtypes.bfloat16, dtypes.float32, variant="chunked")),
    Case("gated_delta_chunked f16 T64 Dk32 Dv48 (chunked, Dv past a threadgroup's rows)", GATED_CHUNKED,
         gated(1, 64, 1, 1, 32, 48, dtypes.float16, dtypes.float16, variant="chunked")),
    Case("gated_delta_slots f16/f32 T64 Dk64 Hv2 slots 1, 1 (duplicate), 7, -2^31 (chunked)", GATED_CHUNKED,
         gated(4, 64, 1, 2, 64, 32, dtypes.float16, dtypes.float32, variant="slots", slots=[1, 1, 7, -2**31], pool_size=4)),
]


# ---- quantized products ----------------------------------------------------------------------

def quantized(rng: np.random.Generator, shape, dtype: DType, mode: str, group: int, bits: int) -> quant.QuantizedWeight:
    """Weights of dense `shape` `[..., rows, columns]` (packed along the columns) in `mode`'s layout,
    every code drawn at random (e4m3 elements all but NaN's two codes), scales near 1 (affine: in
    `dtype`). Drawn, not `quantize`d: quantizing compiles a long composition, and draws fewer
    distinct codes."""
    *lead, rows, columns = shape
    if mode == "mxfp8":
        codes = rng.integers(0, 256, (*lead, rows, columns), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] ^= 1  # e4m3 (fn) has no infinity; 0x7F and 0xFF are NaN
        words = codes.view(np.uint32)       # four codes a word, the first in the low byte
    else:
        words = rng.integers(0, 2**32, (*lead, rows, columns * bits // 32), dtype=np.uint32)
    words = Tensor(words, device=DEVICE).realize()
    groups = (*lead, rows, columns // group)
    if mode == "affine":
        scales = uniform(rng, groups, dtype, 0.5 / 2**bits, 1.5 / 2**bits)
        return quant.QuantizedWeight(words, scales, uniform(rng, groups, dtype, -0.5, 0.5), mode, group, bits)
    # e8m0 scales 2^-6 .. 2^-1 (sums of mxfp8's values up to 448 stay within float16); e4m3 0.125 .. 1.75
    scale_codes = rng.integers(121, 127, groups) if mode != "nvfp4" else rng.integers(0x20, 0x3F, groups)
    return quant.QuantizedWeight(words, integers(scale_codes).cast(dtypes.uint8).realize(), None, mode, group, bits)


def swiglu_product(mode: str, group: int, bits: int, rows: int, k: int, n: int, dtype: DType) -> Setup:
    """`swiglu_matmul(gate_up, w)` for gate_up `[rows, 2K]` and w `[n, K]`."""
    def setup(rng):
        qw = quantized(rng, (n, k), dtype, mode, group, bits)
        gate_up = uniform(rng, (rows, 2 * k), dtype, -3.0, 3.0)
        return lambda kernels: [("y", quant.swiglu_matmul(gate_up, qw), None)]
    return setup


def product(mode: str, group: int, bits: int, x_shape: tuple[int, ...], n: int, dtype: DType, *,
            transpose: bool = True) -> Setup:
    """`quantized_matmul(x, w)` for x of `x_shape` (K its last size) and w `[n, K]` (`[K, n]` untransposed)."""
    def setup(rng):
        k = x_shape[-1]
        qw = quantized(rng, (n, k) if transpose else (k, n), dtype, mode, group, bits)
        x = uniform(rng, x_shape, dtype)
        return lambda kernels: [("y", quant.quantized_matmul(x, qw, transpose=transpose), None)]
    return setup


def unrouted_product(mode: str, group: int, bits: int, rows: int, k: int, n: int, dtype: DType, kernel: Callable,
                     **launch) -> Setup:
    """A CUDA product kernel that `quantized_matmul` does not route to yet (`kernel`: `quant.qmm` with
    its `tiles=` for the tiles the plan does not give, `quant.qmv_mma` until
    `QMV_MMA_ROUTED`), asked for directly with `launch`, for x `[rows, k]` and w `[n, k]`; the
    composition otherwise."""
    def setup(rng):
        qw = quantized(rng, (n, k), dtype, mode, group, bits)
        x = uniform(rng, (rows, k), dtype)
        def run(kernels: bool) -> Outputs:
            if not kernels: return [("y", quant.quantized_matmul(x, qw), None)]
            return [("y", kernel(x, qw.weight, qw.scales, qw.biases, mode=mode, group_size=group, bits=bits, out_dtype=dtype,
                                 backend="cuda", **launch), None)]
        return run
    return setup


def dequantized(mode: str, group: int, bits: int, shape: tuple[int, ...], dtype: DType) -> Setup:
    """`quant.dequantize(w, dtype)` for w of dense `shape` (affine scales in `dtype`)."""
    def setup(rng):
        qw = quantized(rng, shape, dtype, mode, group, bits)
        return lambda kernels: [("w", quant.dequantize(qw, dtype), None)]
    return setup


def gather(mode: str, group: int, bits: int, x_shape: tuple[int, int, int], experts: int, n: int, dtype: DType,
           lhs: list[int] | None, rhs: list[int], *, sorted_indices: bool = False) -> Setup:
    """`gather_qmm(x, w, lhs, rhs)` over `experts` weights `[n, K]`."""
    def setup(rng):
        qw = quantized(rng, (experts, n, x_shape[-1]), dtype, mode, group, bits)
        x = uniform(rng, x_shape, dtype)
        left, right = (None if lhs is None else integers(lhs)), integers(rhs)
        return lambda kernels: [("y", quant.gather_qmm(x, qw, left, right, sorted_indices=sorted_indices), None)]
    return setup


def fmt(mode: str, group: int, bits: int) -> str:
    return f"affine{bits} g{group}" if mode == "affine" else mode


def sorted_experts(rng: np.random.Generator, experts: int, entries: int) -> list[int]:
    """`entries` expert indices in order, led by a negative one and ending past the experts."""
    return [-1, *sorted(rng.integers(0, experts, entries - 4).tolist()), experts, experts + 5, INT32_MAX]


# qmv's K: a SIMD step (1024 codes) and a part, split across two SIMD groups; N = 13: not a
# multiple of a SIMD group's 4 columns. (mode, group, bits, dtype, rows)
QMV_FORMATS = [("affine", 32, 2, dtypes.float32, (1, 8)), ("affine", 64, 3, dtypes.bfloat16, (1, 3)),
               ("affine", 64, 4, dtypes.float16, (1, 3, 8)), ("affine", 128, 8, dtypes.float32, (1, 8)),
               ("mxfp4", 32, 4, dtypes.bfloat16, (1, 3)), ("mxfp8", 32, 8, dtypes.float16, (1, 8)),
               ("nvfp4", 16, 4, dtypes.bfloat16, (1, 3))]
QUANT = [Case(f"qmv {fmt(mode, group, bits)} {SHORT[dtype]} M{rows} K{1024 + 3 * group} N13", QMV,
              product(mode, group, bits, (rows, 1024 + 3 * group), 13, dtype))
         for mode, group, bits, dtype, row_counts in QMV_FORMATS for rows in row_counts] + [
    Case("qmv affine4 g64 f32 1-D x K320 N3 (fewer columns than a SIMD group's)", QMV,
         product("affine", 64, 4, (320,), 3, dtypes.float32)),
    Case("qmv swiglu bf16 affine4 g64 M3 K1216 N13 (gate and up read, the last set moved back)", QMV,
         swiglu_product("affine", 64, 4, 3, 1216, 13, dtypes.bfloat16)),
    Case("qmv no rows", NONE, product("affine", 64, 4, (0, 320), 13, dtypes.float32)),
    Case("qmv no columns", NONE, product("affine", 32, 4, (2, 64), 0, dtypes.float32)),
    # qvm: N past a threadgroup's 256 columns and not a multiple of them; K 300 over 4 SIMD groups
    Case("qvm affine4 g64 f32 M1 K300 N448", QVM, product("affine", 64, 4, (1, 300), 448, dtypes.float32, transpose=False)),
    Case("qvm affine3 g32 bf16 M5 K300 N352", QVM, product("affine", 32, 3, (5, 300), 352, dtypes.bfloat16, transpose=False)),
    Case("qvm mxfp4 f16 M8 K300 N352", QVM, product("mxfp4", 32, 4, (8, 300), 352, dtypes.float16, transpose=False)),
    Case("qvm nvfp4 bf16 M3 K300 N304", QVM, product("nvfp4", 16, 4, (3, 300), 304, dtypes.bfloat16, transpose=False)),
    Case("qvm no rows", NONE, product("affine", 64, 4, (0, 300), 448, dtypes.float32, transpose=False)),
    # gather_qmv: row and expert indices out of range give zeros
    Case("gather_qmv affine4 g64 f32 M2 E4 hostile experts and rows", QMV,
         gather("affine", 64, 4, (3, 2, 320), 4, 13, dtypes.float32, [0, 0, 1, 2, 2, -1, 7], [0, 1, 1, 3, -2, 0, 4])),
    Case("gather_qmv mxfp4 bf16 M1 E3 experts -1, 3, 2^31-1", QMV,
         gather("mxfp4", 32, 4, (4, 1, 320), 3, 13, dtypes.bfloat16, None, [2, -1, 3, INT32_MAX])),
    Case("gather_qmv nvfp4 f16 M1 E3 sorted few rows", QMV,
         gather("nvfp4", 16, 4, (5, 1, 272), 3, 13, dtypes.float16, None, [0, 0, 1, 2, 3], sorted_indices=True)),
    Case("gather_qmv affine8 g32 f32 one entry", QMV,
         gather("affine", 32, 8, (1, 1, 320), 3, 13, dtypes.float32, None, [2])),
    Case("gather_qmm no entries", NONE, gather("affine", 64, 4, (2, 1, 320), 3, 13, dtypes.float32, [], [])),
    # qmm: M not a multiple of the 64-row tile, N = 100 not a multiple of the 64-column tile
    *[Case(f"qmm affine4 g64 bf16 M{m} K320 N100", qmm_of(320, 4, m, 100), product("affine", 64, 4, (m, 320), 100, dtypes.bfloat16))
      for m in (9, 65, 130)],
    Case("qmm affine3 g32 f16 M65 K320 N100", qmm_of(320, 3), product("affine", 32, 3, (65, 320), 100, dtypes.float16)),
    Case("qmm affine8 g128 f16 M9 K384 N100", qmm_of(384, 8), product("affine", 128, 8, (9, 384), 100, dtypes.float16)),
    Case("qmm mxfp8 bf16 M9 K320 N100", qmm_of(320, 8, mode="mxfp8"), product("mxfp8", 32, 8, (9, 320), 100, dtypes.bfloat16)),
    Case("qmm mxfp4 bf16 batch 5x13 K320 N100", qmm_of(320, 4, mode="mxfp4"), product("mxfp4", 32, 4, (5, 13, 320), 100, dtypes.bfloat16)),
    Case("qmm affine3 g64 bf16 M130 K192 N267 (odd width, past 128-row and 256-column tiles)", qmm_of(192, 3, 130, 267),
         product("affine", 64, 3, (130, 192), 267, dtypes.bfloat16)),
    Case("qmm affine2 g32 bf16 M120 K192 N267 (inside a 128-row tile of x, past 128-row tiles of w)", qmm_of(192, 2),
         product("affine", 32, 2, (120, 192), 267, dtypes.bfloat16)),
    Case("qmm nvfp4 f16 M130 K272 (a half chunk) N100", qmm_of(272, 4, 130, 100, "nvfp4"), product("nvfp4", 16, 4, (130, 272), 100, dtypes.float16)),
    # qmm's dequantized route on Hopper (from DEQUANTIZED_ROWS rows): dequantize, then gemm_wgmma
    Case("qmm affine4 g64 bf16 M520 K320 N100 (dequantized on Hopper)",
         ("nuvec_dequantize", "nuvec_gemm_wgmma") if WARPGROUPS else QMM, product("affine", 64, 4, (520, 320), 100, dtypes.bfloat16)),
    Case("dequantize affine3 g32 f16 3x5x96", ("nuvec_dequantize",), dequantized("affine", 32, 3, (3, 5, 96), dtypes.float16)),
    Case("dequantize nvfp4 bf16 7x48 (a half chunk)", ("nuvec_dequantize",), dequantized("nvfp4", 16, 4, (7, 48), dtypes.bfloat16)),
    Case("dequantize mxfp8 f32 9x64", ("nuvec_dequantize",), dequantized("mxfp8", 32, 8, (9, 64), dtypes.float32)),
]


def sorted_gather(mode: str, group: int, bits: int, k: int, dtype: DType) -> Setup:
    """The gathered qmm: 40 single-row entries sorted over 3 experts (more than 8 a batch), with
    out-of-range experts at both ends."""
    def setup(rng):
        return gather(mode, group, bits, (40, 1, k), 3, 100, dtype, None, sorted_experts(rng, 3, 40),
                      sorted_indices=True)(rng)
    return setup


# qmv_mma (CUDA): N past a 16-column tile (the last moved back) or exactly one; K ending inside a
# unit of 128 (nvfp4: in a half chunk), split over SIMD groups with rounds partly past K
if BACKEND == "cuda":
    QUANT += [
        Case("qmv_mma affine4 g64 bf16 M3 K448 N37 split 2 unroll 2", QMV_MMA,
             unrouted_product("affine", 64, 4, 3, 448, 37, dtypes.bfloat16, nuvec_quant.qmv_mma,
                              mma_plan=nuvec_quant.QmvMmaPlan(2, 2))),
        Case("qmv_mma nvfp4 f16 M8 K432 N37 split 2 unroll 4", QMV_MMA,
             unrouted_product("nvfp4", 16, 4, 8, 432, 37, dtypes.float16, nuvec_quant.qmv_mma,
                              mma_plan=nuvec_quant.QmvMmaPlan(2, 4))),
        Case("qmv_mma affine3 g32 bf16 M2 K320 N16 (one tile)", QMV_MMA,
             unrouted_product("affine", 32, 3, 2, 320, 16, dtypes.bfloat16, nuvec_quant.qmv_mma)),
        Case("qmv_mma mxfp8 bf16 M5 K1088 N40", QMV_MMA,
             unrouted_product("mxfp8", 32, 8, 5, 1088, 40, dtypes.bfloat16, nuvec_quant.qmv_mma))]

# qmm_wgmma_rs by its tiles on Hopper: x rows past a tile (256, 128 and partial 64-row tiles), N past
# the 128 weight rows of a tile
if WARPGROUPS:
    QUANT += [Case(f"qmm_wgmma_rs {fmt(mode, group, bits)} {SHORT[dtype]} M{rows} K192 N267 {tiles}", ("nuvec_qmm_wgmma_rs",),
                   unrouted_product(mode, group, bits, rows, 192, 267, dtype, nuvec_quant.qmm, tiles=tiles))
              for mode, group, bits, dtype, rows, tiles in (
                  ("affine", 64, 4, dtypes.bfloat16, 300, nuvec_quant.RegisterTiles(256, 2, 4)),
                  ("affine", 32, 2, dtypes.float16, 130, nuvec_quant.RegisterTiles(128, 2, 4)),
                  ("mxfp8", 32, 8, dtypes.bfloat16, 70, nuvec_quant.QMM_WGMMA_RS_SMALL),
                  ("nvfp4", 16, 4, dtypes.bfloat16, 70, nuvec_quant.QMM_WGMMA_RS_SMALL))]

# qmm_wgmma_rs's few rows: x rows within a 16-, 32- and 64-row product, N past a 64-row tile, K in
# uneven parts (7 steps in 4) and even ones, the parts added by the second kernel and in the cluster
if WARPGROUPS:
    QUANT += [Case(f"qmm_wgmma_rs few rows {fmt(mode, group, bits)} {SHORT[dtype]} M{rows} K{64 * steps} N100 {tiles}",
                   ("nuvec_qmm_wgmma_rs",), unrouted_product(mode, group, bits, rows, 64 * steps, 100, dtype, nuvec_quant.qmm, tiles=tiles))
              for mode, group, bits, dtype, rows, steps, tiles in (
                  ("affine", 64, 4, dtypes.bfloat16, 9, 7, nuvec_quant.RegisterTiles(16, 1, 8, 4)),
                  ("mxfp4", 32, 4, dtypes.float16, 30, 8, nuvec_quant.RegisterTiles(32, 1, 8, 2)),
                  ("affine", 128, 8, dtypes.bfloat16, 64, 8, nuvec_quant.RegisterTiles(64, 1, 4, 4)),
                  ("affine", 64, 4, dtypes.bfloat16, 9, 7, nuvec_quant.RegisterTiles(16, 1, 4, 4, cluster_sum=True)),
                  ("mxfp4", 32, 4, dtypes.float16, 64, 8, nuvec_quant.RegisterTiles(64, 1, 4, 8, cluster_sum=True)))]

# qmm_wgmma_ws by its tiles on Hopper: x rows past a tile, N past a 256- and a 128-column tile, K
# past the buffers (7 steps: every buffer refilled)
if WARPGROUPS:
    QUANT += [Case(f"qmm_wgmma_ws {fmt(mode, group, bits)} {SHORT[dtype]} M{rows} K448 N267 {tiles}", ("nuvec_qmm_wgmma_ws",),
                   unrouted_product(mode, group, bits, rows, 448, 267, dtype, nuvec_quant.qmm, tiles=tiles))
              for mode, group, bits, dtype, rows, tiles in (
                  ("affine", 64, 4, dtypes.bfloat16, 300, nuvec_quant.QMM_WGMMA_WS_LARGE),
                  ("affine", 32, 3, dtypes.float16, 70, nuvec_quant.ProducerTiles(1, 128, 3)),
                  ("mxfp8", 32, 8, dtypes.bfloat16, 130, nuvec_quant.ProducerTiles(2, 128, 4)),
                  ("nvfp4", 16, 4, dtypes.bfloat16, 70, nuvec_quant.ProducerTiles(1, 256, 4)),
                  ("affine", 64, 4, dtypes.bfloat16, 130, nuvec_quant.ProducerTiles(2, 128, 4, producers=2)))]
    # K 512: each row's groups in whole fours, so the producer loads its scales a vector at a time
    QUANT += [Case(f"qmm_wgmma_ws {fmt(mode, group, bits)} {SHORT[dtype]} M{rows} K512 N267 {tiles} scale vectors", ("nuvec_qmm_wgmma_ws",),
                   unrouted_product(mode, group, bits, rows, 512, 267, dtype, nuvec_quant.qmm, tiles=tiles))
              for mode, group, bits, dtype, rows, tiles in (
                  ("affine", 64, 4, dtypes.bfloat16, 300, nuvec_quant.QMM_WGMMA_WS_LARGE),
                  ("mxfp4", 32, 4, dtypes.bfloat16, 130, nuvec_quant.ProducerTiles(2, 128, 4)))]

QUANT += [Case(f"gathered qmm {fmt(mode, group, bits)} {SHORT[dtype]} 40 sorted entries E3, experts out of range, K{k} N100",
               qmm_of(k, bits), sorted_gather(mode, group, bits, k, dtype))
          for mode, group, bits, k, dtype in (("affine", 64, 4, 320, dtypes.bfloat16),
                                              ("mxfp4", 32, 4, 320, dtypes.float16), ("nvfp4", 16, 4, 272, dtypes.bfloat16))]


# ---- dense products ---------------------------------------------------------------------------

def dense(x_shape: tuple[int, ...], n: int, x_dtype: DType, w_dtype: DType | None = None,
          bias_dtype: DType | None = None) -> Setup:
    """`fast.linear(x, w, bias)` for x of `x_shape` (K its last size), w `[n, K]`, bias `[n]` or None."""
    def setup(rng):
        x = uniform(rng, x_shape, x_dtype)
        w = uniform(rng, (n, x_shape[-1]), w_dtype or x_dtype)
        bias = None if bias_dtype is None else uniform(rng, (n,), bias_dtype)
        return lambda kernels: [("y", fast.linear(x, w, bias), None)]
    return setup


def dense_gather(entries: int, k: int, n: int, experts: int, dtype: DType) -> Setup:
    """`gather_mm` of `entries` single-row entries sorted over `experts` weights `[n, K]` (a bank
    passed transposed, as a model's experts), with out-of-range experts at both ends."""
    def setup(rng):
        x = uniform(rng, (entries, 1, k), dtype)
        bank = uniform(rng, (experts, n, k), dtype)
        picks = integers(sorted_experts(rng, experts, entries))
        return lambda kernels: [("y", quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True), None)]
    return setup


def dense_few_gather(picks: list[int], rows: int, k: int, n: int, experts: int, dtype: DType) -> Setup:
    """`gather_mm` of entries of `rows` rows over `experts` weights `[n, K]` (a bank passed
    transposed), `picks` unsorted (the decode step's few entries: gather_gemv)."""
    def setup(rng):
        x = uniform(rng, (len(picks), rows, k), dtype)
        bank = uniform(rng, (experts, n, k), dtype)
        return lambda kernels: [("y", quant.gather_mm(x, bank.transpose(-1, -2), None, integers(picks)), None)]
    return setup


def dense_swiglu(rows: int, k: int, n: int, dtype: DType) -> Setup:
    """`quant.swiglu_matmul(gate_up, w)` of a dense w `[n, K]`, gate_up `[rows, 2K]`."""
    def setup(rng):
        gate_up, w = uniform(rng, (rows, 2 * k), dtype, -3.0, 3.0), uniform(rng, (n, k), dtype)
        return lambda kernels: [("y", quant.swiglu_matmul(gate_up, w), None)]
    return setup


DENSE = [
    Case("swiglu gemv bf16 M3 K264 N13 (gate and up read)", GEMV, dense_swiglu(3, 264, 13, dtypes.bfloat16)),
    Case("swiglu gemv f32 M8 K257 (pieces of 1) N5", GEMV, dense_swiglu(8, 257, 5, dtypes.float32)),
    Case("gathered gemm bf16 40 sorted entries E3, experts out of range, K104 N130", gemm_of(104),
         dense_gather(40, 104, 130, 3, dtypes.bfloat16)),
    Case("gathered gemm f16 300 sorted entries E5 K98 (copies of 4 bytes) N72", gemm_of(98), dense_gather(300, 98, 72, 5, dtypes.float16)),
    Case("gather_gemv bf16 M1 8 entries E4 experts -1, 7, 2^31-1 K136 N13", GEMV,
         dense_few_gather([2, 0, -1, 3, 7, 1, INT32_MAX, 0], 1, 136, 13, 4, dtypes.bfloat16)),
    Case("gather_gemv f32 M3 4 entries E3 K257 (pieces of 1) N5", GEMV, dense_few_gather([1, 1, 0, 2], 3, 257, 5, 3, dtypes.float32)),
    Case("gemv bf16 M1 K552 N13 bias", GEMV, dense((1, 552), 13, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)),
    Case("gemv f16 x bf16 w M3 K4100 (pieces of 4) N37", GEMV, dense((3, 4100), 37, dtypes.float16, dtypes.bfloat16)),
    Case("gemv f32 M8 K257 (pieces of 1) N3 bias", GEMV, dense((8, 257), 3, dtypes.float32, bias_dtype=dtypes.float32)),
    Case("gemv f32 x bf16 w 1-D x K320 N5", GEMV, dense((320,), 5, dtypes.float32, dtypes.bfloat16)),
    Case("gemm bf16 M9 K104 N130 bias", gemm_of(104), dense((9, 104), 130, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)),
    Case("gemm f16 M65 K100 (copies of 8 bytes) N200", gemm_of(100), dense((65, 100), 200, dtypes.float16)),
    Case("gemm bf16 M257 K98 (copies of 4 bytes) N72 f32 bias", gemm_of(98),
         dense((257, 98), 72, dtypes.bfloat16, bias_dtype=dtypes.float32)),
    Case("gemm f16 batch 5x13 K320 N100 bias", gemm_of(320), dense((5, 13, 320), 100, dtypes.float16, bias_dtype=dtypes.float16)),
    Case("gemm bf16 M130 K200 N270 bias (past 128-row and 256-column tiles)", gemm_of(200),
         dense((130, 200), 270, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)),
    Case("linear f32 M20 (the composition)", NONE, dense((20, 64), 32, dtypes.float32)),
    Case("linear no rows", NONE, dense((0, 64), 32, dtypes.bfloat16)),
    Case("linear no columns", NONE, dense((20, 64), 0, dtypes.bfloat16)),
    Case("linear no K", NONE, dense((3, 0), 16, dtypes.bfloat16, bias_dtype=dtypes.bfloat16)),
]


# ---- row norms -------------------------------------------------------------------------------

def norm(kind: str, rows: int, length: int, dtype: DType, *, weight: bool = True, bias: bool = False,
         residual: bool = False) -> Setup:
    """An `rms_norm` (`add_rms_norm` with `residual`) or `layer_norm` call over `rows` rows."""
    def setup(rng):
        x = uniform(rng, (rows, length), dtype, -3.0, 3.0)
        r = uniform(rng, (rows, length), dtype) if residual else None
        w = uniform(rng, (length,), dtype, 0.5, 1.5) if weight else None
        b = uniform(rng, (length,), dtype) if bias else None

        def run(kernels: bool) -> Outputs:
            if kind == "layer": return [("y", fast.layer_norm(x, w, b), None)]
            if not residual: return [("y", fast.rms_norm(x, w), None)]
            h, y = fast.add_rms_norm(x, r, w)
            return [("h", h, None), ("y", y, None)]
        return run
    return setup


def residual_norm(rows: int, length: int, dtype: DType, *, scale=None, next_norm: bool = False) -> Setup:
    """A `residual_rms_norm` call: `scale` None, a number or "tensor"; with the next norm or not."""
    def setup(rng):
        h, x = uniform(rng, (rows, length), dtype), uniform(rng, (rows, length), dtype, -3.0, 3.0)
        w, w2 = uniform(rng, (length,), dtype, 0.5, 1.5), uniform(rng, (length,), dtype, 0.5, 1.5)
        factor = Tensor([0.75], device=DEVICE).realize() if scale == "tensor" else scale

        def run(kernels: bool) -> Outputs:
            s, y = fast.residual_rms_norm(h, x, w, 1e-6, scale=factor, next=(w2, 1e-5) if next_norm else None)
            return [("s", s, None)] + ([("y", y, None)] if next_norm else [])
        return run
    return setup


# ---- the softmax family ----------------------------------------------------------------------

def row_op(op: str, shape: tuple[int, ...], dtype: DType, *, targets=None, minus_infinity: bool = False) -> Setup:
    """`fast.softmax`, `logsumexp` or `cross_entropy` over the last axis of random logits of
    `shape`. targets: the cross-entropy's, shaped as `shape[:-1]` (int64 where one is outside
    int32). minus_infinity: every fifth element -inf, each row's first among them (the row's
    maximum stays finite)."""
    def setup(rng):
        logits = rng.uniform(-8, 8, shape).astype(np.float32)
        if minus_infinity: logits[..., ::5] = -np.inf
        x = Tensor(logits, device=DEVICE).cast(dtype).realize()
        given = None if targets is None else np.asarray(targets, np.int64).reshape(shape[:-1])
        wide = given is not None and given.size and (given.min() < -2**31 or given.max() > INT32_MAX)
        t = None if given is None else Tensor(given if wide else given.astype(np.int32), device=DEVICE).realize()

        def run(kernels: bool) -> Outputs:
            out = fast.softmax(x) if op == "softmax" else fast.logsumexp(x) if op == "logsumexp" else fast.cross_entropy(x, t)
            return [(op, out, None)]
        return run
    return setup


NORMS = [
    Case("rms_norm f32 3x7 (single elements)", RMS_NORM, norm("rms", 3, 7, dtypes.float32)),
    Case("rms_norm bf16 5x33 no weight", RMS_NORM, norm("rms", 5, 33, dtypes.bfloat16, weight=False)),
    Case("add_rms_norm f16 4x1000 (pieces of 8 held)", RMS_NORM, norm("rms", 4, 1000, dtypes.float16, residual=True)),
    Case("add_rms_norm bf16 2x32776 (the row read again)", RMS_NORM, norm("rms", 2, 32776, dtypes.bfloat16, residual=True)),
    Case("layer_norm bf16 3x4096 weight and bias", LAYER_NORM, norm("layer", 3, 4096, dtypes.bfloat16, bias=True)),
    Case("layer_norm f32 2x65536 bias only (looped)", LAYER_NORM, norm("layer", 2, 65536, dtypes.float32, weight=False, bias=True)),
    Case("layer_norm f32 1x1", LAYER_NORM, norm("layer", 1, 1, dtypes.float32)),
    Case("rms_norm no rows", NONE, norm("rms", 0, 64, dtypes.float32)),
    Case("residual_rms_norm bf16 3x7 next", RESIDUAL_NORM, residual_norm(3, 7, dtypes.bfloat16, next_norm=True)),
    Case("residual_rms_norm f16 4x1000 scale 0.5", RESIDUAL_NORM, residual_norm(4, 1000, dtypes.float16, scale=0.5)),
    Case("residual_rms_norm bf16 2x65536 scale tensor, next (looped)", RESIDUAL_NORM,
         residual_norm(2, 65536, dtypes.bfloat16, scale="tensor", next_norm=True)),
]

ROWS = [
    Case("softmax f32 3x7 (one SIMD group)", SOFTMAX, row_op("softmax", (3, 7), dtypes.float32)),
    Case("softmax f16 2x257 (two SIMD groups) with -inf", SOFTMAX,
         row_op("softmax", (2, 257), dtypes.float16, minus_infinity=True)),
    Case("softmax bf16 batch 2x3x1000", SOFTMAX, row_op("softmax", (2, 3, 1000), dtypes.bfloat16)),
    Case("softmax f32 2x8193 (looped) with -inf", SOFTMAX, row_op("softmax", (2, 8193), dtypes.float32, minus_infinity=True)),
    Case("logsumexp f32 5x33", LOGSUMEXP, row_op("logsumexp", (5, 33), dtypes.float32)),
    Case("logsumexp bf16 2x8192 (1024 threads, in registers)", LOGSUMEXP, row_op("logsumexp", (2, 8192), dtypes.bfloat16)),
    Case("logsumexp f16 2x9000 (looped) with -inf", LOGSUMEXP,
         row_op("logsumexp", (2, 9000), dtypes.float16, minus_infinity=True)),
    Case("cross_entropy f32 6x7 targets -2^31, 2^31-1, -8, 7, -7, -1", CROSS_ENTROPY,
         row_op("cross_entropy", (6, 7), dtypes.float32, targets=[-2**31, INT32_MAX, -8, 7, -7, -1])),
    Case("cross_entropy bf16 4x9000 (looped) int64 targets 2^40, -2^40, 8999, -9000", CROSS_ENTROPY,
         row_op("cross_entropy", (4, 9000), dtypes.bfloat16, targets=[2**40, -2**40, 8999, -9000])),
    Case("cross_entropy f16 1-D logits 300", CROSS_ENTROPY, row_op("cross_entropy", (300,), dtypes.float16, targets=5)),
    Case("softmax no rows", NONE, row_op("softmax", (0, 7), dtypes.float32)),
    Case("softmax no classes", NONE, row_op("softmax", (3, 0), dtypes.float32)),
    Case("cross_entropy no rows", NONE, row_op("cross_entropy", (0, 7), dtypes.float32, targets=[])),
]


# ---- rope ------------------------------------------------------------------------------------

def rope_call(shape: tuple[int, ...], dims: int, dtype: DType, *, traditional: bool = False, offsets=None,
              freqs: bool = False, scale: float = 1.0) -> Setup:
    """`fast.rope` of random rows: offsets an int32 tensor (one, or one per batch item), or 0;
    freqs: periods rather than a base. Offsets past 2^16 leave the values unspecified (the
    composition's own sine loses its range reduction there; the GPU tests hold the kernel to
    numpy), so only their finiteness is checked."""
    def setup(rng):
        x = uniform(rng, shape, dtype, -2.0, 2.0)
        offset = 0 if offsets is None else integers(offsets)
        periods = Tensor((1.0 + 3.0 * np.arange(dims // 2)).astype(np.float32), device=DEVICE).realize() if freqs else None
        huge = offsets is not None and max(abs(int(o)) for o in np.reshape(offsets, -1)) > 2**16

        def run(kernels: bool) -> Outputs:
            y = fast.rope(x, dims, traditional=traditional, base=None if freqs else 10000.0, scale=scale, offset=offset,
                          freqs=periods)
            return [("rope", y, np.ones(shape, bool) if huge else None)]
        return run
    return setup


ROPES = [
    Case("rope f32 2x3x5x128 (8 pairs a thread)", ROPE, rope_call((2, 3, 5, 128), 128, dtypes.float32, offsets=[7])),
    Case("rope bf16 traditional 2x2x4x80 dims 40 freqs (4 pairs, the tail copied)", ROPE,
         rope_call((2, 2, 4, 80), 40, dtypes.bfloat16, traditional=True, freqs=True, scale=0.5)),
    Case("rope f16 traditional 1x3x7 dims 6 (single pairs)", ROPE, rope_call((1, 3, 7), 6, dtypes.float16, traditional=True)),
    Case("rope f32 rank 5 per-batch offsets", ROPE, rope_call((2, 2, 3, 6, 16), 16, dtypes.float32, offsets=[1, 4])),
    Case("rope f32 positions from 500000 (the large-angle reduction)", ROPE,
         rope_call((1, 2, 4, 64), 64, dtypes.float32, offsets=[500000])),
    Case("rope bf16 per-batch offsets 2^31-1, -2^31, -1", ROPE,
         rope_call((3, 2, 4, 64), 64, dtypes.bfloat16, offsets=[INT32_MAX, -2**31, -1])),
    Case("rope no batch", NONE, rope_call((0, 2, 4, 64), 64, dtypes.float32)),
    Case("rope no rows", NONE, rope_call((2, 2, 0, 64), 64, dtypes.float32)),
]


# ---- norm_rope -------------------------------------------------------------------------------

def norm_rope_call(shape: tuple[int, ...], dims: int, dtype: DType, *, weight: bool = True, traditional: bool = False,
                   offsets=None, freqs: bool = False, cache: int | None = None, pool: tuple[int, int] | None = None,
                   slots=None, values: bool = False, into: DType | None = None, queries: int = 0) -> Setup:
    """`fast.norm_rope` of random rows (norm_rope_kv's keys and values with `values`, norm_rope_at
    with `pool`): offsets an int32 tensor (one, or one per batch item) or an int; freqs: periods
    rather than a base; cache: its positions (`[B, H, cache, D]`), pool: (blocks, block_size) at
    `slots` `[B, T]`, both in `into` (default the rows' dtype) and fresh for each run (the kernel
    updates them in place). The slot two rows share is unspecified (the kernel's rows race).
    queries: with a cache or pool, that many heads of queries turned in the same launch."""
    def setup(rng):
        x = uniform(rng, shape, dtype, -2.0, 2.0)
        w = uniform(rng, shape[-1:], dtype, 0.5, 1.5) if weight else None
        q = uniform(rng, (shape[0], queries, *shape[2:]), dtype, -2.0, 2.0) if queries else None
        q_pair = None if q is None else (q, uniform(rng, shape[-1:], dtype, 0.5, 1.5) if weight else None)
        offset = offsets if isinstance(offsets, int) else 0 if offsets is None else integers(offsets)
        periods = Tensor((1.0 + 3.0 * np.arange(dims // 2)).astype(np.float32), device=DEVICE).realize() if freqs else None
        rotation = fast.Rotation(dims, traditional, None if freqs else 10000.0, 0.5, periods)
        b, h, t, d = shape if len(shape) == 4 else (0, 0, 0, 0)
        where = (b, h, cache, d) if cache is not None else (pool[0], h, pool[1], d) if pool is not None else None
        before = None if where is None else rng.uniform(-1, 1, where).astype(np.float32)
        unspecified = None
        if pool is not None:
            live = [s for s in np.reshape(slots, -1) if 0 <= s < pool[0] * pool[1]]
            unspecified = np.zeros(where, bool)
            for shared in {s for s in live if live.count(s) > 1}: unspecified[shared // pool[1], :, shared % pool[1]] = True
        positions = integers(offsets) if pool is not None else None

        def buffer() -> Tensor:
            return Tensor(before, device=DEVICE).cast(into or dtype).realize()

        def run(kernels: bool) -> Outputs:
            if q_pair is not None:
                turned, written = fast.norm_rope_at(x, w, 1e-6, rotation, positions, buffer(), integers(slots), queries=q_pair) \
                    if pool is not None else fast.norm_rope(x, w, 1e-6, rotation, offset, buffer(), queries=q_pair)
                return [("queries", turned, None), ("pool" if pool is not None else "cache", written, unspecified)]
            if pool is not None:
                return [("pool", fast.norm_rope_at(x, w, 1e-6, rotation, positions, buffer(), integers(slots)), unspecified)]
            if values:
                k, v = fast.norm_rope_kv(x, w, 1e-6, 1e-5, rotation, offset, *((buffer(), buffer()) if cache else ()))
                return [("k", k, None), ("v", v, None)]
            return [("rows", fast.norm_rope(x, w, 1e-6, rotation, offset, buffer() if cache else None), None)]
        return run
    return setup


NORM_ROPES = [
    Case("norm_rope bf16 2x8x5x128 per-batch offsets (16 rows of 16 lanes)", NORM_ROPE,
         norm_rope_call((2, 8, 5, 128), 128, dtypes.bfloat16, offsets=[3, 70])),
    Case("norm_rope f16 traditional 3x2x4x80 dims 40 freqs (units of 4, the tail)", NORM_ROPE,
         norm_rope_call((3, 2, 4, 80), 40, dtypes.float16, traditional=True, freqs=True, offsets=[5])),
    Case("norm_rope f32 1x3x4x1024 (a threadgroup a row)", NORM_ROPE, norm_rope_call((1, 3, 4, 1024), 1024, dtypes.float32)),
    Case("norm_rope f32 1x2x3x100 (single elements, two SIMD groups)", NORM_ROPE, norm_rope_call((1, 2, 3, 100), 100, dtypes.float32)),
    Case("norm_rope bf16 2x2x3x512 (two pieces a lane)", NORM_ROPE, norm_rope_call((2, 2, 3, 512), 256, dtypes.bfloat16)),
    Case("norm_rope bf16 decode 64x8x1x128 per-batch offsets (many threadgroups)", NORM_ROPE,
         norm_rope_call((64, 8, 1, 128), 128, dtypes.bfloat16, offsets=list(range(0, 640, 10)))),
    Case("norm_rope bf16 into a cache at 9", NORM_ROPE, norm_rope_call((2, 4, 5, 128), 128, dtypes.bfloat16, offsets=9, cache=16)),
    *[Case(f"norm_rope f16 into a cache at tensor offset {o}", NORM_ROPE,
           norm_rope_call((1, 4, 5, 64), 64, dtypes.float16, offsets=[o], cache=8))
      for o in (-3, 6, INT32_MAX, -2**31)],
    Case("norm_rope no weight f32 into a bf16 cache at -1", NORM_ROPE,
         norm_rope_call((2, 2, 3, 64), 32, dtypes.float32, weight=False, offsets=[-1], cache=4, into=dtypes.bfloat16)),
    Case("norm_rope_at bf16 pool slots -1, past the pool, 2^31-1, -2^31, shared", NORM_ROPE,
         norm_rope_call((2, 2, 4, 128), 128, dtypes.bfloat16, offsets=[0, 40], pool=(3, 4),
                        slots=[[-1, 12, INT32_MAX, 5], [-2**31, 5, 11, 0]])),
    Case("norm_rope_at f32 traditional pool into f16 (a threadgroup a row)", NORM_ROPE,
         norm_rope_call((1, 2, 3, 1024), 512, dtypes.float32, traditional=True, offsets=[2], pool=(2, 2), slots=[[3, 0, 4]],
                        into=dtypes.float16)),
    Case("norm_rope_kv bf16 fresh", NORM_ROPE, norm_rope_call((1, 2, 3, 256), 128, dtypes.bfloat16, values=True, offsets=[7])),
    Case("norm_rope_kv f32 into bf16 caches at 4", NORM_ROPE,
         norm_rope_call((1, 2, 3, 128), 64, dtypes.float32, values=True, offsets=[4], cache=6, into=dtypes.bfloat16)),
    Case("norm_rope bf16 32 query heads beside 8 key heads into a cache at tensor offset 6 (rows past it)", NORM_ROPE,
         norm_rope_call((2, 8, 3, 128), 128, dtypes.bfloat16, offsets=[6], cache=8, queries=32)),
    Case("norm_rope_at f16 no weight 5 query heads beside 1 into a pool, hostile slots", NORM_ROPE,
         norm_rope_call((2, 1, 3, 64), 64, dtypes.float16, weight=False, offsets=[1, 30], pool=(2, 4), slots=[[-1, 9, 3], [7, 2**31 - 1, 0]],
                        queries=5)),
    Case("norm_rope f32 8192 features (the three passes)", RMS_NORM + ROPE, norm_rope_call((1, 1, 2, 8192), 128, dtypes.float32)),
    Case("norm_rope no rows", NONE, norm_rope_call((2, 2, 0, 64), 64, dtypes.float32)),
    Case("norm_rope into a cache, no rows", NONE, norm_rope_call((2, 2, 0, 64), 64, dtypes.float32, offsets=1, cache=4)),
    Case("norm_rope_at no batch", NONE, norm_rope_call((0, 2, 3, 64), 64, dtypes.float32, offsets=[], pool=(2, 4),
                                                       slots=np.zeros((0, 3), np.int32))),
]


# ---- paged_write -----------------------------------------------------------------------------

PAGED_WRITE = ("nuvec_paged_write",)


def paged_write_call(count: int, heads: int, length: int, dtype: DType, blocks: int, block_size: int, slots,
                     into: DType | None = None, slot_dtype=np.int32) -> Setup:
    """`fast.paged_write` of `count` random rows `[count, heads, length]` into a fresh pool of
    `blocks` blocks of `block_size` (in `into`, default the rows' dtype) at `slots`; the slot two
    rows share is unspecified (the kernel's rows race)."""
    def setup(rng):
        rows = uniform(rng, (count, heads, length), dtype)
        before = rng.uniform(-1, 1, (blocks, heads, block_size, length)).astype(np.float32)
        live = [s for s in slots if 0 <= s < blocks * block_size]
        unspecified = np.zeros(before.shape, bool)
        for shared in {s for s in live if live.count(s) > 1}: unspecified[shared // block_size, :, shared % block_size] = True
        slot_tensor = Tensor(np.asarray(slots, slot_dtype), device=DEVICE).realize()

        def run(kernels: bool) -> Outputs:
            pool = Tensor(before, device=DEVICE).cast(into or dtype).realize()   # fresh: the kernel writes it in place
            return [("pool", fast.paged_write(pool, rows, slot_tensor), unspecified)]
        return run
    return setup


def projection_heads_call(dtype: DType, into: str) -> Setup:
    """Heads read in place from a fused projection's realized output `[2, 3, 96]` (its columns 32
    to 64, two heads of 16): into a pool by `norm_rope_at` ("keys") or `paged_write` ("values")."""
    def setup(rng):
        projection = uniform(rng, (2, 3, 96), dtype)
        heads = projection[:, :, 32:64].reshape(2, 3, 2, 16)
        w = uniform(rng, (16,), dtype, 0.5, 1.5)
        before = rng.uniform(-1, 1, (3, 2, 4, 16)).astype(np.float32)
        slots = integers([[5, 0, 11], [2, -1, 9]])

        def run(kernels: bool) -> Outputs:
            pool = Tensor(before, device=DEVICE).cast(dtype).realize()
            if into == "keys":
                return [("pool", fast.norm_rope_at(heads.transpose(1, 2), w, 1e-6, fast.Rotation(16), integers([3, 8]),
                                                   pool, slots), None)]
            return [("pool", fast.paged_write(pool, heads, slots), None)]
        return run
    return setup


PAGED_WRITES = [
    Case("norm_rope_at bf16 keys of a projection read in place into a pool", NORM_ROPE, projection_heads_call(dtypes.bfloat16, "keys")),
    Case("paged_write f16 values of a projection read in place", PAGED_WRITE, projection_heads_call(dtypes.float16, "values")),
    Case("paged_write bf16 2 heads of 128, slots shuffled, -1, past the pool, 2^31-1, -2^31, shared", PAGED_WRITE,
         paged_write_call(7, 2, 128, dtypes.bfloat16, 3, 4, [5, -1, 12, INT32_MAX, 5, -2**31, 0])),
    Case("paged_write f32 into bf16, rows of 12 (pieces of 4), int64 slots past int32", PAGED_WRITE,
         paged_write_call(3, 3, 12, dtypes.float32, 2, 2, [2**32 + 1, 3, 0], into=dtypes.bfloat16, slot_dtype=np.int64)),
    Case("paged_write f16 rows of 7 (single elements) into f32", PAGED_WRITE,
         paged_write_call(2, 1, 7, dtypes.float16, 2, 16, [31, 16], into=dtypes.float32)),
    Case("paged_write no rows", NONE, paged_write_call(0, 2, 64, dtypes.float32, 2, 4, [])),
]

# ---- take ------------------------------------------------------------------------------------

TAKE = ("nuvec_take_rows",)


def take_call(shape: tuple[int, ...], dtype: DType, indices) -> Setup:
    """`fast.take` of a random table of `shape` at `indices` (out-of-range ones give zeros)."""
    def setup(rng):
        x = uniform(rng, shape, dtype)
        named = Tensor(np.asarray(indices, np.int64), device=DEVICE).realize()
        return lambda kernels: [("rows", fast.take(x, named), None)]
    return setup


TAKES = [
    Case("take bf16 table 50x64 indices -1, past it, 2^31-1, -2^31, repeated", TAKE,
         take_call((50, 64), dtypes.bfloat16, [[3, -1, 50], [2**31 - 1, -2**31, 3]])),
    Case("take f16 rows of 3 (chunks of 2 bytes)", TAKE, take_call((7, 3), dtypes.float16, [6, 0, 7])),
    Case("take no indices", NONE, take_call((7, 4), dtypes.float32, np.zeros((0,), np.int64))),
]

CASES = ATTENTION + GATED + QUANT + DENSE + NORMS + ROWS + ROPES + NORM_ROPES + PAGED_WRITES + TAKES


# ---- running ---------------------------------------------------------------------------------

def family(name: str) -> str:
    """A launch's kernel family: its name less the specialisation's hash."""
    return re.sub(r"_[0-9a-f]{12}$", "", name)


def check_launches(case: Case, launched: set[str]) -> None:
    """On CUDA exactly the case's families; on METAL (MLX's plans: other passes, no matrix pass)
    only whether any launched; on a device without kernels none."""
    expected = set(case.kernels) if BACKEND else set()
    same = launched == expected if BACKEND in (None, "cuda") else bool(launched) == bool(expected)
    assert same, f"launched {sorted(launched) or 'no kernel'}, expected {sorted(expected) or 'none'}"


def compare(label: str, got: Tensor, want: Tensor, unspecified: np.ndarray | None) -> float:
    """Check `got` against the composition's `want`; return the worst error relative to the scale."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{label}: {got.dtype.name}{tuple(got.shape)} against the composition's {want.dtype.name}{tuple(want.shape)}"
    a, e = as_numpy(got), as_numpy(want)
    assert np.isfinite(a).all(), f"{label}: {np.size(a) - np.isfinite(a).sum()} values not finite"
    specified = np.ones(a.shape, bool) if unspecified is None else ~unspecified
    if not specified.any(): return 0.0
    scale = max(float(np.abs(e[specified]).max()), 1.0)
    worst = float(np.abs(a - e)[specified].max()) / scale
    assert worst <= TOLERANCE[got.dtype], f"{label}: differs from the composition by {worst:.2e} of {scale:.3g}"
    return worst


def run_case(case: Case) -> str:
    """Run `case` through the kernels and through the composition; return a summary or raise."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    call = case.setup(rng)
    with record_launches() as launches:
        got = call(BACKEND is not None)
        Tensor.realize(*(t for _, t, _ in got))
    with compositions_only():
        want = call(False)
        Tensor.realize(*(t for _, t, _ in want))
    launched = {family(name) for name, _ in launches}
    check_launches(case, launched)
    worst = max((compare(label, g, w, unspecified) for (label, g, unspecified), (_, w, _) in zip(got, want)), default=0.0)
    return f"{', '.join(sorted(launched)) or 'no kernel'}; worst {worst:.1e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the cases and the kernels each expects, run nothing")
    parser.add_argument("-k", action="append", default=[], metavar="SUBSTR", help="run only cases whose name contains SUBSTR")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.k or any(s in c.name for s in args.k)]
    if args.list:
        for c in cases: print(f"{c.name}  [{', '.join(c.kernels) or 'no kernel'}]")
        return 0
    print(f"{len(cases)} cases on {DEVICE} ({BACKEND or 'no'} kernels)")
    failed = []
    start = time.perf_counter()
    for c in cases:
        began = time.perf_counter()
        try:
            summary = run_case(c)
            print(f"ok   {time.perf_counter() - began:5.1f}s  {c.name}: {summary}")
        except Exception as error:  # noqa: BLE001 - every case runs; each failure is reported
            failed.append(c.name)
            print(f"FAIL {time.perf_counter() - began:5.1f}s  {c.name}: {type(error).__name__}: {error}")
            traceback.print_exc(limit=-3, file=sys.stdout)
    print(f"{len(cases) - len(failed)} cases passed" + (f", {len(failed)} failed: {'; '.join(failed)}" if failed else "")
          + f" in {time.perf_counter() - start:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
