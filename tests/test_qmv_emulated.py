"""The qmv kernel's CUDA rendering run on the CPU (`kernel_emulator`): against the composition for
every affine width and floating-point mode, x dtypes and scale dtypes, 1-8 rows, N and K at the
kernel's boundaries (N not a multiple of a SIMD group's columns, K not a multiple of a SIMD step,
nvfp4's K = 16 mod 32, K split across SIMD groups); each row's bits equal to a one-row launch's."""
import dataclasses
import functools

import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from kernel_emulator import COMPILER, build
from nuvec_tg import quant
from nuvec_tg.kernels import quant as qmv
from reference import assert_rows_close, random

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
TOL = {dtypes.float32: 1e-5, dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2}


def raw(t: Tensor) -> np.ndarray:
    """A tensor's bytes as numpy (16-bit floats as uint16)."""
    if t.dtype in (dtypes.float16, dtypes.bfloat16): return t.bitcast(dtypes.uint16).numpy()
    return t.numpy()


def as_float(bits: np.ndarray, dtype) -> np.ndarray:
    if dtype == dtypes.float16: return bits.view(np.float16).astype(np.float64)
    if dtype == dtypes.bfloat16: return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.float64)


def check_rows(name: str, got: np.ndarray, want: np.ndarray, dtype) -> None:
    """The kernel's raw rows against the composition's (float64), each within `TOL` of its largest |want|."""
    assert_rows_close(name, as_float(got, dtype), want, TOL[dtype])


def edited(program, edit):
    """`program`, or `edit(program)` (a planted fault)."""
    return program if edit is None else edit(program)


def quantized(w: Tensor, mode: str, group: int, bits: int) -> quant.QuantizedWeight:
    """`w` quantized, its parts realized as plain buffers (the emulator reads their bytes)."""
    qw = quant.quantize(w, group, bits, mode=mode)
    return quant.QuantizedWeight(*(None if p is None else p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases)),
                                 mode, group, bits)


def emulated_qmv(x: np.ndarray, qw, dtype, plan: qmv.QmvPlan, edit=None, glu: bool = False) -> np.ndarray:
    """y's raw values from the emulated kernel for raw x `[M, K]` (`glu`: `[M, 2K]`, gate and up) in
    `dtype` (its program edited first where asked)."""
    rows, k = x.shape[0], x.shape[1] // (2 if glu else 1)
    n = qw.weight.shape[0]
    kernel = edited(qmv.qmv_program("cuda", dtype, qw.scales.dtype, dtype, mode=qw.mode, group_size=qw.group_size,
                                    bits=qw.bits, rows=rows, k=k, n=n, qmv_plan=plan, glu=glu), edit)
    y = np.zeros((rows, n), dtype=x.dtype)
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    build(kernel)(buffers, plan.groups(n), plan.threads)
    return y


CASES = [("affine", 32, b, dtypes.float32) for b in (1, 2, 3, 4, 5, 6, 8)] + [
    ("affine", 64, 4, dtypes.bfloat16), ("affine", 128, 8, dtypes.float16), ("affine", 64, 3, dtypes.float16),
    ("mxfp4", 32, 4, dtypes.bfloat16), ("mxfp4", 32, 4, dtypes.float32), ("mxfp8", 32, 8, dtypes.float16),
    ("nvfp4", 16, 4, dtypes.float32), ("nvfp4", 16, 4, dtypes.bfloat16)]


def qmv_inputs(mode: str, group: int, bits: int, dtype):
    """A case's weight (N = 13: not a multiple of 4 columns; K: 2 SIMD steps and a bit, nvfp4: and
    a half chunk), raw x of 8 rows and the composition's product (float64)."""
    rng = np.random.default_rng(0x9A9)
    n, k = 13, 2 * 1024 + (48 if mode == "nvfp4" else 3 * group if group < 128 else 128)
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (8, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    return qw, raw(x_tensor), want


@pytest.mark.parametrize("mode, group, bits, dtype", CASES, ids=str)
def test_emulated_qmv_matches_the_composition_and_keeps_one_row_bits(mode, group, bits, dtype):
    qw, x, want = qmv_inputs(mode, group, bits, dtype)
    for plan in (qmv.QmvPlan(4, 1, 2, 1), qmv.QmvPlan(3, 2, 1, 2)):
        alone = [emulated_qmv(x[r:r + 1], qw, dtype, plan) for r in range(8)]
        for rows in (3, 8):  # (one row is `alone`'s)
            got = emulated_qmv(x[:rows], qw, dtype, plan)
            check_rows(f"{plan} rows {rows}", got, want[:rows], dtype)
            for r in range(rows):
                np.testing.assert_array_equal(got[r], alone[r][0], err_msg=f"{plan} rows {rows} row {r}")


@pytest.mark.parametrize("mode, group, bits, dtype", [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 3, dtypes.float16),
                                                     ("mxfp4", 32, 4, dtypes.float32)], ids=str)
def test_emulated_swiglu_qmv_equals_the_product_of_the_activation(mode, group, bits, dtype):
    """SwiGLU's product (x the gate and up halves, the activation in the kernel's loads) against
    the composition `quantized_matmul(silu(gate) * up, w)`, each row's bits a one-row launch's."""
    check_swiglu(mode, group, bits, dtype)


def check_swiglu(mode, group, bits, dtype, edit=None):
    rng = np.random.default_rng(0x5916)
    n, k = 13, 1024 + 3 * 64
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    gate_up = (random(rng, (5, 2 * k), dtype, "CPU")[0] * 3).cast(dtype).realize()
    want = quant.quantized_matmul(gate_up[:, :k].silu() * gate_up[:, k:], qw).cast(dtypes.float32).numpy().astype(np.float64)
    plan = qmv.QmvPlan(4, 1, 2, 1)
    got = emulated_qmv(raw(gate_up), qw, dtype, plan, edit, glu=True)
    check_rows("swiglu", got, want, dtype)
    for r in range(5):
        alone = emulated_qmv(raw(gate_up)[r:r + 1], qw, dtype, plan, edit, glu=True)[0]
        np.testing.assert_array_equal(got[r], alone, err_msg=f"row {r}")


def test_emulated_qmv_with_scales_of_another_dtype_and_a_column_set_moved_back():
    rng = np.random.default_rng(0x9AA)
    n, k = 6, 1024
    w = random(rng, (n, k), dtypes.float32, "CPU")[0]
    for scales_dtype in (dtypes.float16, dtypes.bfloat16):
        qw = quant.quantize(w.cast(scales_dtype), 64, 4)
        qw = quant.QuantizedWeight(qw.weight.contiguous().realize(), qw.scales.contiguous().realize(),
                                   qw.biases.contiguous().realize(), "affine", 64, 4)
        x_tensor = random(rng, (2, k), dtypes.float32, "CPU")[0].realize()
        want = quant.quantized_matmul(x_tensor, qw).numpy().astype(np.float64)
        got = emulated_qmv(raw(x_tensor), qw, dtypes.float32, qmv.QmvPlan(4, 1, 1, 1))
        check_rows(f"scales {scales_dtype}", got, want, dtypes.float32)


def test_default_plans_split_k_and_widen_one_rows_columns_where_enough_simd_groups_run():
    """The K split keeps 2 steps a SIMD group unless few SIMD groups run; one row takes 8 columns a
    SIMD group where each has 2 steps or more and at least 1536 SIMD groups run, otherwise 4; several
    rows take 4 (at most N). One row at 4 columns with K split in 2 or less puts two column sets in
    a threadgroup where N has two. The K split (a row's order) is the same whatever the rows."""
    # (K, N): (K split, one row's columns, one row's column sets a threadgroup)
    cases = {(4096, 4096): (2, 4, 2), (4096, 6144): (2, 8, 1), (4096, 14336): (2, 8, 1), (14336, 4096): (4, 8, 1),
             (8192, 8192): (2, 8, 1), (4096, 1024): (4, 4, 1), (2048, 2048): (2, 4, 2), (2048, 4096): (2, 4, 2),
             (2048, 8192): (1, 4, 2), (4 * 1024 + 64, 300): (4, 4, 1), (1024, 4): (1, 4, 1), (8192, 4): (8, 4, 1),
             (1024, 7): (1, 4, 1), (1024, 8): (1, 4, 2)}
    for (k, n), (split, columns, column_warps) in cases.items():
        one = qmv.plan(1, k, n)
        assert (one.k_split, one.columns_per_warp, one.column_warps) == (split, min(columns, n), column_warps), (k, n)
        for rows in (2, 4, 8):
            several = qmv.plan(rows, k, n)
            assert (several.k_split, several.columns_per_warp, several.column_warps) == (split, min(4, n), 1), (k, n, rows)


@pytest.mark.parametrize("n, k", [(3, 64), (37, 9 * 1024 + 192), (33, 2 * 1024 + 64)], ids=str)
def test_emulated_qmv_with_the_default_plans_at_their_boundaries(n, k):
    """Fewer columns than a SIMD group serves; K split in 8 with a part step, a column set moved back;
    one row with two column sets a threadgroup, the last set moved back (33 columns: 9 sets)."""
    rng = np.random.default_rng(0x9AB)
    w = random(rng, (n, k), dtypes.float32, "CPU")[0]
    qw = quant.quantize(w, 64, 4)
    qw = quant.QuantizedWeight(qw.weight.contiguous().realize(), qw.scales.contiguous().realize(),
                               qw.biases.contiguous().realize(), "affine", 64, 4)
    x_tensor = random(rng, (5, k), dtypes.float32, "CPU")[0].realize()
    x = raw(x_tensor)
    want = quant.quantized_matmul(x_tensor, qw).numpy().astype(np.float64)
    alone = np.stack([emulated_qmv(x[r:r + 1], qw, dtypes.float32, qmv.plan(1, k, n))[0] for r in range(5)])
    check_rows("rows alone", alone, want, dtypes.float32)
    for rows in (2, 5):
        got = emulated_qmv(x[:rows], qw, dtypes.float32, qmv.plan(rows, k, n))
        check_rows(f"rows {rows}", got, want[:rows], dtypes.float32)
        np.testing.assert_array_equal(got, alone[:rows])


QVM_CASES = [("affine", 32, 3, dtypes.float32), ("affine", 64, 4, dtypes.bfloat16), ("affine", 128, 8, dtypes.float16),
             ("affine", 32, 6, dtypes.float32), ("mxfp4", 32, 4, dtypes.float32), ("mxfp8", 32, 8, dtypes.bfloat16),
             ("nvfp4", 16, 4, dtypes.float32)]


def qvm_inputs(mode: str, group: int, bits: int, dtype):
    """A case's weight (w [K, N] packed along N: N past one threadgroup's 256 columns and not a
    multiple of them, nvfp4: a half chunk; K = 300 split across 4 SIMD groups with a part), raw x
    of 8 rows and the composition's product (float64)."""
    rng = np.random.default_rng(0x9AF)
    k, n = 300, 256 + (48 if mode == "nvfp4" else 2 * group if group < 128 else 128)
    qw = quantized(random(rng, (k, n), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (8, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw, transpose=False).cast(dtypes.float32).numpy().astype(np.float64)
    return qw, raw(x_tensor), want


def emulated_qvm(x: np.ndarray, qw, dtype, edit=None) -> np.ndarray:
    """y's raw values from the emulated qvm for raw x `[M, K]` in `dtype` (its program edited first where asked)."""
    rows, k = x.shape
    n = qw.weight.shape[1] * 32 // qw.bits
    kernel = edited(qmv.qvm_program("cuda", dtype, qw.scales.dtype, dtype, mode=qw.mode, group_size=qw.group_size, bits=qw.bits,
                                    rows=rows, k=k, n=n), edit)
    y = np.full((rows, n), 7, dtype=x.dtype)   # not zeros: every column must be written
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    build(kernel)(buffers, -(-n // qmv.QVM_COLUMNS), 32 * qmv.qvm_split(k))
    return y


@pytest.mark.parametrize("mode, group, bits, dtype", QVM_CASES, ids=str)
def test_emulated_qvm_matches_the_composition_and_keeps_one_row_bits(mode, group, bits, dtype):
    """The untransposed product (w [K, N] packed along N), `qvm_inputs`' boundaries."""
    qw, x, want = qvm_inputs(mode, group, bits, dtype)
    assert qmv.qvm_split(x.shape[1]) == 4
    alone = [emulated_qvm(x[r:r + 1], qw, dtype) for r in range(8)]
    for rows in (1, 3, 8):
        got = emulated_qvm(x[:rows], qw, dtype)
        check_rows(f"rows {rows}", got, want[:rows], dtype)
        for r in range(rows):
            np.testing.assert_array_equal(got[r], alone[r][0], err_msg=f"rows {rows} row {r}")


@pytest.mark.parametrize("mode, group, bits, dtype", [("affine", 64, 4, dtypes.float32), ("affine", 32, 3, dtypes.bfloat16),
                                                      ("mxfp4", 32, 4, dtypes.float16)], ids=str)
def test_emulated_gather_qmv_keeps_one_row_bits_and_zeros_unpicked_entries(mode, group, bits, dtype):
    """The gathered product (mixture-of-experts rows): entry p is x[p] times batch picks[p], each
    row with the bits of a one-row product of that batch; picks outside the batches give zeros."""
    rng = np.random.default_rng(0x9AC)
    batches, n, k, rows = 3, 13, 1024 + 2 * group, 2
    w = random(rng, (batches, n, k), dtype, "CPU")[0]
    qw = quant.quantize(w, group, bits, mode=mode)
    qw = quant.QuantizedWeight(*(None if p is None else p.contiguous().realize() for p in (qw.weight, qw.scales, qw.biases)),
                               mode, group, bits)
    picks = np.array([2, 0, -1, 3, 2, 1], dtype=np.int32)  # sorted or not, two hostile
    x = raw(random(rng, (len(picks), rows, k), dtype, "CPU")[0].realize())
    plan = qmv.plan(rows, k, n)
    kernel = qmv.qmv_program("cuda", dtype, qw.scales.dtype, dtype, mode=mode, group_size=group, bits=bits, rows=rows, k=k, n=n,
                               qmv_plan=plan, batches=batches)
    y = np.full((len(picks), rows, n), 7, dtype=x.dtype)  # not zeros: the kernel must write every entry
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else []) + [picks]
    build(kernel)(buffers, plan.groups(n), plan.threads, groups_y=len(picks))
    for p, pick in enumerate(picks.tolist()):
        if not 0 <= pick < batches:
            assert not as_float(y[p], dtype).any(), p
            continue
        one = quant.QuantizedWeight(*(None if t is None else t[pick].clone().realize() for t in (qw.weight, qw.scales, qw.biases)),
                                    mode, group, bits)
        for r in range(rows):
            np.testing.assert_array_equal(y[p, r], emulated_qmv(x[p, r:r + 1], one, dtype, qmv.plan(1, k, n))[0],
                                          err_msg=f"entry {p} row {r}")


def emulated_qmm(x: np.ndarray, qw, dtype, metal_tiles: bool = False, edit=None) -> np.ndarray:
    """y's raw values from the emulated qmm for raw x `[M, K]` in `dtype` (16-bit; its program
    edited first where asked); `metal_tiles`: with Metal's tiles (`metal_layout`)."""
    rows, k = x.shape
    n = qw.weight.shape[0]
    kernel = edited(qmv.qmm_program("cuda", dtype, qw.scales.dtype, dtype, mode=qw.mode, group_size=qw.group_size, bits=qw.bits,
                                    k=k), edit)
    y = np.full((rows, n), 0xFFFF, dtype=x.dtype)  # NaN patterns: an output the kernel misses shows
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    buffers.append(np.array([rows, n, k], dtype=np.int32))
    build(kernel, metal_tiles)(buffers, -(-n // qmv.QMM_COLUMNS), qmv.QMM_THREADS, -(-rows // qmv.QMM_ROWS))
    return y


@pytest.fixture
def metal_layout(monkeypatch):
    """qmm's CUDA rendering laid out as its Metal one: Metal's stage count (with `metal_tiles`,
    the emulator's float tiles and unstaged x complete the Metal layout)."""
    monkeypatch.setitem(qmv.QMM_STAGES, "cuda", qmv.QMM_STAGES["metal"])


QMM_CASES = [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 3, dtypes.float16), ("affine", 128, 8, dtypes.bfloat16),
             ("affine", 32, 5, dtypes.bfloat16), ("mxfp4", 32, 4, dtypes.bfloat16), ("mxfp8", 32, 8, dtypes.float16),
             ("nvfp4", 16, 4, dtypes.bfloat16)]


def qmm_inputs(mode: str, group: int, bits: int, dtype):
    """A case's weight and raw x for row and column tiles with tails (M = 70, N = 67), K over several
    steps (nvfp4: a half chunk at the end), and the composition's product (float64)."""
    rng = np.random.default_rng(0x9B5)
    n, k = 67, 176 if mode == "nvfp4" else 4 * group if group < 128 else 256
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (70, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    return qw, raw(x_tensor), want


@pytest.mark.parametrize("mode, group, bits, dtype", QMM_CASES, ids=str)
def test_emulated_qmm_matches_the_composition(mode, group, bits, dtype):
    """`qmm_inputs`' tails; the composition dequantizes into x's type too, so only the order of sums differs."""
    qw, x, want = qmm_inputs(mode, group, bits, dtype)
    check_rows("qmm", emulated_qmm(x, qw, dtype), want, dtype)


@pytest.mark.parametrize("mode, group, bits, dtype", [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 3, dtypes.float16),
                                                      ("nvfp4", 16, 4, dtypes.bfloat16)], ids=str)
def test_emulated_qmm_with_metals_layout_matches_the_composition(mode, group, bits, dtype, metal_layout):
    """qmm as Metal runs it (two stage buffers of packed words, x widened from memory into a float
    tile, float tiles of w): tails of rows and columns, K over several steps, nvfp4's half chunk."""
    rng = np.random.default_rng(0x9B6)
    n, k = 67, 176 if mode == "nvfp4" else 4 * group
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (70, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    check_rows("qmm (Metal's layout)", emulated_qmm(raw(x_tensor), qw, dtype, metal_tiles=True), want, dtype)


@pytest.mark.parametrize("mode, group, bits, dtype, metal_tiles, unsorted", [
    ("affine", 64, 4, dtypes.bfloat16, False, True), ("mxfp4", 32, 4, dtypes.float16, False, False),
    ("nvfp4", 16, 4, dtypes.bfloat16, False, True), ("affine", 64, 4, dtypes.bfloat16, True, False)], ids=str)
def test_emulated_gathered_qmm_takes_each_rows_batch(mode, group, bits, dtype, metal_tiles, unsorted, monkeypatch):
    """Rows with their own weight batch: sorted runs longer than a row tile, picks outside the
    batches giving zeros, and (`unsorted`) an unsorted stretch (more runs than the tile table's
    slots: fixed tiles; sorted, a run's own tiles); also in Metal's layout."""
    if metal_tiles: monkeypatch.setitem(qmv.QMM_STAGES, "cuda", qmv.QMM_STAGES["metal"])
    rng = np.random.default_rng(0x9B8)
    batches, n, k, rows = 4, 67, 176 if mode == "nvfp4" else 3 * group, 150
    qw = quantized(random(rng, (batches, n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (rows, k), dtype, "CPU")[0].realize()
    picks = np.sort(rng.integers(0, batches, rows)).astype(np.int32)
    picks[:3], picks[-2:] = -1, batches + 2          # hostile, at both ends (still sorted)
    if unsorted: picks[100:110] = rng.integers(0, batches, 10)
    kernel = qmv.qmm_program("cuda", dtype, qw.scales.dtype, dtype, mode=mode, group_size=group, bits=bits, k=k, gather=True)
    y = np.full((rows, n), 0xFFFF, dtype=np.uint16)
    buffers = [y, raw(x_tensor), raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    buffers += [picks, qmv.gather_tile_starts(Tensor(picks), qmv.QMM_ROWS, batches).numpy(),
                np.array([rows, n, k, batches], dtype=np.int32)]
    build(kernel, metal_tiles)(buffers, -(-n // qmv.QMM_COLUMNS), qmv.QMM_THREADS, qmv.gather_tile_slots(rows, qmv.QMM_ROWS, batches))
    got = as_float(y, dtype)
    for batch in range(batches):
        one = quant.QuantizedWeight(*(None if t is None else t[batch].contiguous() for t in (qw.weight, qw.scales, qw.biases)),
                                    mode, group, bits)
        want = quant.quantized_matmul(x_tensor, one).cast(dtypes.float32).numpy().astype(np.float64)
        mine = picks == batch
        assert_rows_close(f"batch {batch}", got[mine], want[mine], TOL[dtype])
    assert not got[(picks < 0) | (picks >= batches)].any()


def emulated_qmm_wgmma(x: np.ndarray, qw, dtype, tiles, picks: np.ndarray | None = None, edit=None,
                       tile_starts: np.ndarray | None = None, out_dtype=None) -> np.ndarray:
    """y's raw values from the emulated qmm_wgmma (Hopper's warpgroup products computed by each
    thread from the swizzled tiles) for raw x `[M, K]` in `dtype` with `tiles` (RegisterTiles:
    qmm_wgmma_rs, whose K split gives float32 parts `[k_split, M, N]` unless its cluster adds them; ProducerTiles:
    qmm_wgmma_ws); `out_dtype` float32: y in float32 (else x's dtype); `picks`: gathered,
    each row with its own weight batch of `qw` `[E, N, ...]`, over `tile_starts` where given (else
    `gather_tile_starts`'s table)."""
    rows, k = x.shape
    n = qw.weight.shape[-2]
    make = (qmv.qmm_wgmma_rs_program if isinstance(tiles, qmv.RegisterTiles) else
            functools.partial(qmv.qmm_wgmma_ws_program, k=k) if isinstance(tiles, qmv.ProducerTiles) else qmv.qmm_wgmma_program)
    # a K split: float32 parts [k_split, M, N] (`out_dtype` float32 too: one part), unless added in the cluster
    parts = 1 if getattr(tiles, "cluster_sum", False) else getattr(tiles, "k_split", 1)
    out = dtypes.float32 if parts > 1 or out_dtype == dtypes.float32 else dtype
    kernel = edited(make(dtype, qw.scales.dtype, out, mode=qw.mode, group_size=qw.group_size, bits=qw.bits, tiles=tiles,
                         gather=picks is not None), edit)
    # NaN patterns: an output the kernel misses shows
    y = np.full((parts, rows, n) if parts > 1 else (rows, n), np.nan if out == dtypes.float32 else 0xFFFF,
                dtype=np.float32 if out == dtypes.float32 else x.dtype)
    buffers = [y, x, raw(qw.weight), raw(qw.scales)] + ([raw(qw.biases)] if qw.biases is not None else [])
    groups, groups_y, groups_z = tiles.grid(rows, n)
    if picks is not None:
        batches = qw.weight.shape[0]
        if tile_starts is None: tile_starts = qmv.gather_tile_starts(Tensor(picks), tiles.rows, batches).numpy()
        buffers += [picks, tile_starts]
        groups = len(tile_starts) - 1
    buffers.append(np.array([rows, n, k] + ([qw.weight.shape[0]] if picks is not None else []), dtype=np.int32))
    build(kernel)(buffers, groups, tiles.threads, groups_y, groups_z)
    return y


QMM_WGMMA_CASES = [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 3, dtypes.float16), ("affine", 128, 8, dtypes.bfloat16),
                   ("affine", 32, 6, dtypes.bfloat16), ("mxfp4", 32, 4, dtypes.bfloat16), ("mxfp8", 32, 8, dtypes.float16),
                   ("nvfp4", 16, 4, dtypes.bfloat16)]


@pytest.mark.parametrize("mode, group, bits, dtype", QMM_WGMMA_CASES, ids=str)
def test_emulated_qmm_wgmma_matches_the_composition_in_both_plans(mode, group, bits, dtype):
    """M = 70 (past a 64-row tile), N = 267 (past a 256-column tile), K = 192 (three steps of two
    chunks; 256 for groups of 128; nvfp4: two groups a chunk), odd widths (8-byte copies of words)
    and even: both plans' tiles within tolerance of the composition and equal bit for bit."""
    rng = np.random.default_rng(0x9BD)
    n, k = 267, 256 if group == 128 else 192
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (70, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    small = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, qmv.QMM_WGMMA_SMALL)
    check_rows("qmm_wgmma", small, want, dtype)
    np.testing.assert_array_equal(emulated_qmm_wgmma(raw(x_tensor), qw, dtype, qmv.QMM_WGMMA_LARGE), small)


QMM_WGMMA_RS_CASES = [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 2, dtypes.float16), ("affine", 128, 8, dtypes.bfloat16),
                      ("mxfp4", 32, 4, dtypes.bfloat16), ("mxfp8", 32, 8, dtypes.float16), ("nvfp4", 16, 4, dtypes.bfloat16)]


def check_the_other_forms_give_qmm_wgmmas_bits(seed: int, mode: str, group: int, bits: int, dtype, name: str, tiles,
                                               k: int | None = None, scales_dtype=None) -> None:
    """M = 70 (past a 64-row tile), N = 267 (past 128- and 256-wide tiles, odd), K = 192 (three
    steps; 256 for groups of 128) unless given: the first of `tiles` (kernel `name`) within
    tolerance of the composition, and every one of them, the same rounded weights summed in the
    same order, with qmm_wgmma's bits. scales_dtype: the weights' (and so the scales') dtype, x's
    unless given."""
    rng = np.random.default_rng(seed)
    n, k = 267, k or (256 if group == 128 else 192)
    qw = quantized(random(rng, (n, k), scales_dtype or dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (70, k), dtype, "CPU")[0].realize()
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    got = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, tiles[0])
    check_rows(name, got, want, dtype)
    np.testing.assert_array_equal(got, emulated_qmm_wgmma(raw(x_tensor), qw, dtype, qmv.QMM_WGMMA_SMALL))
    for other in tiles[1:]: np.testing.assert_array_equal(got, emulated_qmm_wgmma(raw(x_tensor), qw, dtype, other), err_msg=str(other))


@pytest.mark.parametrize("mode, group, bits, dtype", QMM_WGMMA_RS_CASES, ids=str)
def test_emulated_qmm_wgmma_rs_equals_qmm_wgmma(mode, group, bits, dtype):
    """qmm_wgmma_rs (weights dequantized into the A registers, the product as its transpose), one
    warpgroup of 64 weight rows or two."""
    check_the_other_forms_give_qmm_wgmmas_bits(0x9BF, mode, group, bits, dtype, "qmm_wgmma_rs",
                                               (qmv.QMM_WGMMA_RS_SMALL, qmv.RegisterTiles(128, 1, 3)))


# The few rows' K split: uneven parts (7 steps in 4: 1, 2, 2, 2; in 3: 2, 2, 3), even ones at groups of 128 (a part's
# first k a multiple of the group), each width of x rows (16, 32, 64), 8 bits, each mode's scales
FEW_ROWS_CASES = [("affine", 64, 4, dtypes.bfloat16, 13, 7, 4), ("affine", 128, 8, dtypes.bfloat16, 30, 8, 2),
                  ("mxfp4", 32, 4, dtypes.float16, 64, 7, 3)]


def k_slice(qw, first: int, end: int) -> quant.QuantizedWeight:
    """The columns first .. end - 1 of quantized `qw` (whole groups; packed words whole at every width: multiples of 32)."""
    words, groups = (lambda k: k * qw.bits // 32), (lambda k: k // qw.group_size)
    parts = [qw.weight[:, words(first):words(end)], qw.scales[:, groups(first):groups(end)]]
    parts.append(None if qw.biases is None else qw.biases[:, groups(first):groups(end)])
    return quant.QuantizedWeight(*(None if p is None else p.contiguous().realize() for p in parts), qw.mode, qw.group_size, qw.bits)


@pytest.mark.parametrize("mode, group, bits, dtype, rows, steps, split", FEW_ROWS_CASES, ids=str)
def test_emulated_few_rows_split_k_into_parts_each_its_slices_product(mode, group, bits, dtype, rows, steps, split):
    """qmm_wgmma_rs's few-row tiles (`few_rows_tiles`) with K split in parts: part z is, bit for
    bit, the float32 product of its steps' slice of x and w (the kernel unsplit over that slice),
    the parts added in order (`sum_parts`) are within tolerance of the composition, and unsplit the
    tiles give qmm_wgmma's bits. N = 100: a whole tile of 64 weight rows and a part one."""
    rng = np.random.default_rng(0x9C3)
    n, k = 100, 64 * steps
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x_tensor = random(rng, (rows, k), dtype, "CPU")[0].realize()
    planned = qmv.few_rows_tiles(rows, k, n)
    tiles = qmv.RegisterTiles(planned.rows, 1, planned.stages, split)
    got = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, tiles)
    assert got.shape == (split, rows, n) and tiles.rows == (16 if rows <= 16 else 32 if rows <= 32 else 64)
    for z in range(split):
        first, end = 64 * (z * steps // split), 64 * ((z + 1) * steps // split)
        part = emulated_qmm_wgmma(raw(x_tensor[:, first:end].contiguous().realize()), k_slice(qw, first, end), dtype,
                                  qmv.RegisterTiles(planned.rows, 1, planned.stages), out_dtype=dtypes.float32)
        np.testing.assert_array_equal(got[z], part, err_msg=f"part {z}: k {first}..{end}")
    total = qmv.sum_parts(Tensor(got)).numpy()
    np.testing.assert_array_equal(total, functools.reduce(lambda a, b: a + b, list(got)))  # in order, float32
    want = quant.quantized_matmul(x_tensor, qw).cast(dtypes.float32).numpy().astype(np.float64)
    assert_rows_close("few rows, K split", total.astype(np.float64), want, TOL[dtype])
    whole = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, qmv.RegisterTiles(planned.rows, 1, planned.stages))
    np.testing.assert_array_equal(whole, emulated_qmm_wgmma(raw(x_tensor), qw, dtype, qmv.QMM_WGMMA_SMALL))


@pytest.mark.parametrize("mode, group, bits, dtype, rows, steps, split", FEW_ROWS_CASES, ids=str)
def test_emulated_few_rows_parts_added_in_the_cluster_equal_the_parts_summed(mode, group, bits, dtype, rows, steps, split):
    """The few rows' K split with its parts added in the kernel (`cluster_sum`: the tile's
    threadgroups a cluster, each adding a share of the tile from every one's threadgroup memory):
    y in x's dtype and in float32 equal, bit for bit, the float32 parts added in order then rounded
    (`sum_parts`, what qmm does without the cluster). N = 100: a whole tile of 64 weight rows and a
    part one, whose pieces of four columns past N are not stored."""
    rng = np.random.default_rng(0x9C4)
    n, k = 100, 64 * steps
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x = raw(random(rng, (rows, k), dtype, "CPU")[0].realize())
    planned = qmv.few_rows_tiles(rows, k, n)
    parts = emulated_qmm_wgmma(x, qw, dtype, qmv.RegisterTiles(planned.rows, 1, planned.stages, split))
    total = functools.reduce(lambda a, b: a + b, list(parts))  # in order, float32
    clustered = qmv.RegisterTiles(planned.rows, 1, planned.stages, split, cluster_sum=True)
    assert qmv.qmm_wgmma_rs_program(dtype, qw.scales.dtype, dtype, mode=mode, group_size=group, bits=bits,
                                    tiles=clustered).cluster == (1, 1, split)
    np.testing.assert_array_equal(emulated_qmm_wgmma(x, qw, dtype, clustered, out_dtype=dtypes.float32), total)
    rounded = Tensor(total).cast(dtype).realize()
    np.testing.assert_array_equal(emulated_qmm_wgmma(x, qw, dtype, clustered), raw(rounded))
    for bad in (dataclasses.replace(clustered, k_split=1), dataclasses.replace(clustered, k_split=16)):  # a cluster holds 2 to 8
        with pytest.raises(ValueError, match="cluster of 2 to 8"):
            qmv.qmm_wgmma_rs_program(dtype, qw.scales.dtype, dtype, mode=mode, group_size=group, bits=bits, tiles=bad)


# qmm_wgmma_ws's cases: words two steps ahead (4 bits) and one (8), odd words (3 bits), each mode
QMM_WGMMA_WS_CASES = [case for case in QMM_WGMMA_CASES if case[:3] not in (("affine", 128, 8), ("affine", 32, 6))]


@pytest.mark.parametrize("mode, group, bits, dtype", QMM_WGMMA_WS_CASES, ids=str)
def test_emulated_qmm_wgmma_ws_equals_qmm_wgmma(mode, group, bits, dtype):
    """qmm_wgmma_ws (a producer warpgroup decodes, the consumers only multiply), words two steps
    ahead and one, odd widths, each mode, one producer warpgroup and two (for one consumer, and for
    two over 128 columns: 512 threads), 3 buffers over 3 steps (128 x 128: the buffers wrap)."""
    check_the_other_forms_give_qmm_wgmmas_bits(0x9C0, mode, group, bits, dtype, "qmm_wgmma_ws",
                                               (qmv.QMM_WGMMA_WS_LARGE, qmv.ProducerTiles(1, 128, 3), qmv.QMM_WGMMA_WS_SMALL,
                                                qmv.ProducerTiles(2, 128, 3, producers=2)))


# K 512 and 1024: a row's groups in whole fours (twos of float32 scales), so qmm_wgmma_ws loads its
# scales a vector at a time (SCALE_VECTORS), over one step a vector (nvfp4) to eight (groups of 128)
QMM_WGMMA_WS_VECTOR_CASES = [("affine", 64, 4, dtypes.bfloat16, None, 512), ("affine", 64, 4, dtypes.bfloat16, dtypes.float32, 512),
                             ("affine", 128, 8, dtypes.bfloat16, None, 1024), ("mxfp4", 32, 4, dtypes.bfloat16, None, 512),
                             ("nvfp4", 16, 4, dtypes.bfloat16, None, 512)]


@pytest.mark.parametrize("mode, group, bits, dtype, scales_dtype, k", QMM_WGMMA_WS_VECTOR_CASES, ids=str)
def test_emulated_qmm_wgmma_ws_loads_scales_in_vectors_with_qmm_wgmmas_bits(mode, group, bits, dtype, scales_dtype, k):
    """Where K / group is a multiple of 4, qmm_wgmma_ws's producer loads four groups' scales at once
    and shifts them down as its chunk moves on: the same weights, so qmm_wgmma's bits."""
    assert qmv.whole_scale_vectors(k, group)
    check_the_other_forms_give_qmm_wgmmas_bits(0x9C2, mode, group, bits, dtype, "qmm_wgmma_ws", (qmv.QMM_WGMMA_WS_LARGE,), k=k,
                                               scales_dtype=scales_dtype)


def emulated_gathered_check(tiles, unsorted: bool = True) -> np.ndarray:
    """The emulated gathered qmm_wgmma (or _rs, by `tiles`) over sorted runs crossing row tiles,
    hostile picks at both ends and (`unsorted`) an unsorted stretch, whose runs outnumber the tile
    table's slots (so the tiles are every BM rows; sorted, each run's own): each row within
    tolerance of its batch's composition, the hostile rows zeros. Returns y's raw values."""
    rng = np.random.default_rng(0x9BE)
    batches, n, k, rows, dtype = 3, 130, 128, 150, dtypes.bfloat16
    qw = quantized(random(rng, (batches, n, k), dtype, "CPU")[0], "affine", 64, 4)
    x_tensor = random(rng, (rows, k), dtype, "CPU")[0].realize()
    picks = np.sort(rng.integers(0, batches, rows)).astype(np.int32)
    picks[:3], picks[-2:] = -1, batches + 2
    if unsorted: picks[100:110] = rng.integers(0, batches, 10)
    y = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, tiles, picks)
    got = as_float(y, dtype)
    for batch in range(batches):
        one = quant.QuantizedWeight(*(t[batch].contiguous() for t in (qw.weight, qw.scales, qw.biases)), "affine", 64, 4)
        want = quant.quantized_matmul(x_tensor, one).cast(dtypes.float32).numpy().astype(np.float64)
        assert_rows_close(f"batch {batch}", got[picks == batch], want[picks == batch], TOL[dtype])
    assert not got[(picks < 0) | (picks >= batches)].any()
    return y


def test_emulated_gathered_qmm_wgmma_takes_each_rows_batch():
    emulated_gathered_check(qmv.QMM_WGMMA_LARGE)


def test_emulated_gathered_qmm_wgmma_rs_takes_each_rows_batch_with_qmm_wgmmas_bits():
    np.testing.assert_array_equal(emulated_gathered_check(qmv.RegisterTiles(128, 2, 4)), emulated_gathered_check(qmv.QMM_WGMMA_LARGE))


def test_emulated_gathered_qmm_wgmma_ws_takes_each_rows_batch_with_qmm_wgmmas_bits():
    """The producer and the consumers walk the same runs; the buffers' phases carry over from run to run."""
    np.testing.assert_array_equal(emulated_gathered_check(qmv.ProducerTiles(2, 128, 3)), emulated_gathered_check(qmv.QMM_WGMMA_LARGE))


@pytest.mark.parametrize("tiles", [qmv.QMM_WGMMA_SMALL, qmv.QMM_WGMMA_RS_SMALL, qmv.ProducerTiles(1, 128, 3)], ids=str)
def test_emulated_gathered_tiles_are_the_tables(tiles):
    """A gathered tiled kernel takes its rows from the tile table, not from fixed tiles of BM rows:
    a table of two 40-row tiles computes rows 0-79 and leaves the rest unwritten (a kernel reading
    its GATHER before the define, as the prelude would, writes fixed tiles 0-63 and 64-127)."""
    rng = np.random.default_rng(0x9C1)
    batches, n, k, rows, dtype = 2, 40, 128, 150, dtypes.bfloat16
    qw = quantized(random(rng, (batches, n, k), dtype, "CPU")[0], "affine", 64, 4)
    x_tensor = random(rng, (rows, k), dtype, "CPU")[0].realize()
    picks = np.sort(rng.integers(0, batches, rows)).astype(np.int32)
    y = emulated_qmm_wgmma(raw(x_tensor), qw, dtype, tiles, picks, tile_starts=np.array([0, 40, 80], dtype=np.int32))
    assert (y[80:] == 0xFFFF).all(), "rows outside the table's tiles were written"
    got = as_float(y[:80], dtype)
    for batch in range(batches):
        one = quant.QuantizedWeight(*(t[batch].contiguous() for t in (qw.weight, qw.scales, qw.biases)), "affine", 64, 4)
        want = quant.quantized_matmul(x_tensor[:80], one).cast(dtypes.float32).numpy().astype(np.float64)
        assert_rows_close(f"batch {batch}", got[picks[:80] == batch], want[picks[:80] == batch], TOL[dtype])


def test_emulated_gathered_products_over_sorted_runs_take_a_tile_a_run_with_the_same_bits():
    """Sorted picks: the tile table gives each run its own tiles (64 rows: the plan's for few rows
    a batch), and the rows keep the bits of fixed tiles (the unsorted check's tiles)."""
    sorted_bits = emulated_gathered_check(qmv.QMM_WGMMA_RS_SMALL, unsorted=False)
    np.testing.assert_array_equal(sorted_bits, emulated_gathered_check(qmv.QMM_WGMMA_SMALL, unsorted=False))


def test_gather_tile_starts_cut_each_run_into_tiles_and_fall_back_to_fixed_tiles():
    """The table over sorted picks (runs of 5, 70, 30 and 25 rows, one past the batches): each
    run's tiles of at most 64 rows, the slots left over empty; over unsorted picks whose runs need
    more tiles than the slots: every 64 rows."""
    sorted_picks = np.array([0] * 5 + [1] * 70 + [3] * 30 + [9] * 25, np.int32)
    starts = qmv.gather_tile_starts(Tensor(sorted_picks), 64, 4).numpy()
    assert qmv.gather_tile_slots(130, 64, 4) == 8 and starts.tolist() == [0, 5, 69, 75, 105, 130, 130, 130, 130]
    unsorted = np.array([2, 0, -1, 3, 3, 1, 7, 0, 2, 2, 1, -5, 0, 3] * 10, np.int32)
    starts = qmv.gather_tile_starts(Tensor(unsorted), 64, 4).numpy()
    assert starts.tolist() == [0, 64, 128, 140, 140, 140, 140, 140, 140]
    assert [qmv.gathered_tile_rows(m, e) for m, e in ((4096, 128), (2048, 32), (2048, 40), (100, 1))] == [64, 128, 64, 128]


def test_qmm_wgmma_routes_and_plans():
    """qmm_wgmma takes qmm's calls on a target with warpgroup products and K a multiple of 64; its
    plan follows M; every shape fits an sm_90 threadgroup at 4 bits."""
    from nuvec_tg.kernels import Target
    assert qmv.takes_qmm_wgmma(4096, Target("cuda", warpgroups=True))
    assert not qmv.takes_qmm_wgmma(4096 + 32, Target("cuda", warpgroups=True))
    assert not qmv.takes_qmm_wgmma(4096, Target("cuda"))
    assert not qmv.takes_qmm_wgmma(4096, Target("metal"))
    assert [qmv.qmm_wgmma_plan(m, 14336) for m in (9, 64, 65, 512)] == [qmv.QMM_WGMMA_SMALL, qmv.QMM_WGMMA_SMALL,
                                                                         qmv.QMM_WGMMA_NARROW, qmv.QMM_WGMMA_LARGE]
    assert qmv.qmm_wgmma_plan(512, 4096, 132) == qmv.QMM_WGMMA_NARROW
    assert all(qmv.qmm_wgmma_bytes(t, 4) <= qmv.WGMMA_MAX_DYNAMIC for t in qmv.QMM_WGMMA_SHAPES)
    # qmm_wgmma_rs: 64 rows of x up to 64 rows; beyond, the tiles of x rows whose waves cost least
    assert [qmv.qmm_wgmma_rs_plan(m, 14336).rows for m in (9, 64, 65, 512, 2048)] == [64, 64, 128, 256, 256]
    assert qmv.qmm_wgmma_rs_plan(512, 4096, 132).rows == 128
    # gathered: qmm_wgmma's 64-row tiles where a batch has few rows, else its 128
    assert qmv.qmm_hopper_tiles(4096, 1536, 4, 132, batches=128, k=4096) == qmv.QMM_WGMMA_SMALL
    assert qmv.qmm_hopper_tiles(2048, 5760, 4, 132, batches=32, k=4096) == qmv.QMM_WGMMA_LARGE
    assert qmv.qmm_hopper_tiles(4096, 1536, 3, 132, batches=128, k=4096) == qmv.QMM_WGMMA_SMALL
    # not gathered, past 64 rows: qmm_wgmma_rs's plan for affine 4-bit, qmm_wgmma_ws's where routed,
    # other formats (not yet timed) qmm_wgmma's
    assert qmv.qmm_hopper_tiles(65, 14336, 4, 132, k=4096) == qmv.qmm_wgmma_rs_plan(65, 14336, 132)
    assert qmv.qmm_hopper_family(256, 14336, 4, 132, k=4096) == "nuvec_qmm_wgmma_rs"
    ws = qmv.QMM_WGMMA_WS_ROUTED and qmv.takes_qmm_wgmma_ws("mxfp4", 4)
    assert qmv.qmm_hopper_family(256, 14336, 4, 132, mode="mxfp4", k=4096) == ("nuvec_qmm_wgmma_ws" if ws else "nuvec_qmm_wgmma")
    assert qmv.qmm_hopper_family(256, 14336, 3, 132, k=4096) == "nuvec_qmm_wgmma"
    # up to 64 rows (not gathered, qmm_wgmma_rs's widths): the few rows' tiles, K split by K and N only,
    # a split of 2 added in a cluster, of 4 by the second kernel
    assert qmv.qmm_hopper_tiles(64, 14336, 4, 132, k=4096) == qmv.RegisterTiles(64, 1, 4, 2, cluster_sum=True)
    assert qmv.qmm_hopper_tiles(9, 4096, 4, 132, k=4096) == qmv.RegisterTiles(16, 1, 4, 4)
    assert qmv.qmm_hopper_tiles(17, 4096, 8, 132, k=14336) == qmv.RegisterTiles(32, 1, 4, 4)
    assert qmv.qmm_hopper_tiles(64, 4096, 8, 132, k=4096) == qmv.RegisterTiles(64, 1, 4, 4)
    assert qmv.qmm_hopper_family(64, 4096, 3, 132, k=4096) == "nuvec_qmm_wgmma"   # 3 bits: not the register kernel's
    assert [qmv.few_rows_split(k, n) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096), (1024, 4096), (2048, 256), (128, 64))] == \
        [4, 2, 4, 1, 2, 1]
    assert qmv.qmm_hopper_family(4096, 1536, 4, 132, batches=128, k=4096) in ("nuvec_qmm_wgmma", "nuvec_qmm_wgmma_rs")
    assert all(qmv.qmm_wgmma_rs_bytes(t, bits) <= qmv.WGMMA_MAX_DYNAMIC for t in qmv.QMM_WGMMA_RS_SHAPES for bits in (2, 4, 8))
    with pytest.raises(ValueError, match="qmm_wgmma_rs: 3-bit"):
        qmv.qmm_wgmma_rs_program(dtypes.bfloat16, dtypes.bfloat16, dtypes.bfloat16, mode="affine", group_size=64, bits=3,
                                 tiles=qmv.QMM_WGMMA_RS_SMALL)
