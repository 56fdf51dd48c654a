"""The dense product kernels' CUDA renderings run on the CPU (`kernel_emulator`) against float64
numpy: gemv (1-8 rows) and gemm (more rows, CUDA's staged swizzled tiles at both tile shapes and
Metal's float tiles), every dtype (and mixed ones), with and without a bias, K and N off every
tile and step (K not a multiple of 8: narrower pieces and copies), N below a SIMD group's columns;
each gemv row's bits equal to a one-row launch's, each gemm row's bits equal to that row's in
another row count and another tile shape.

Alignment: gemv reads pieces of 8 elements where 8 divides K, else of 4, 2 or 1 (loads as wide as
the rows' alignment allows); gemm's CUDA copies need K even (4-byte rows: `linear.route` sends an
odd K to the composition there), Metal's layout reads element by element."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import linear, quant
from nuvec_tg.kernels.quant import QmvPlan
from reference import KERNEL_TOLERANCE, assert_rows_close, round_to

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
f16, bf16, f32 = dtypes.float16, dtypes.bfloat16, dtypes.float32


def raw(values: np.ndarray, dtype) -> np.ndarray:
    """Values (representable in `dtype`) as the bytes a kernel reads: float32, or 16-bit patterns."""
    if dtype == f32: return values.astype(np.float32)
    if dtype == f16: return values.astype(np.float16).view(np.uint16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def as_float(bits: np.ndarray, dtype) -> np.ndarray:
    if dtype == f16: return bits.view(np.float16).astype(np.float64)
    if dtype == bf16: return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.float64)


def check_rows(name: str, got: np.ndarray, want: np.ndarray, dtype) -> None:
    """The kernel's raw rows against float64 numpy, each within KERNEL_TOLERANCE of its largest |want|."""
    assert_rows_close(name, as_float(got, dtype), want, KERNEL_TOLERANCE[dtype])


def edited(program, edit):
    """`program`, or `edit(program)` (a planted fault)."""
    return program if edit is None else edit(program)


class Case:
    """A product's inputs, exact in their dtypes: x `[M, K]`, w `[N, K]`, bias `[N]` (or None), the
    result dtype, and the float64 reference `x · wᵀ + bias`."""

    def __init__(self, seed: int, m: int, k: int, n: int, x_dtype, w_dtype=None, bias_dtype=None, out_dtype=None):
        rng = np.random.default_rng(seed)
        self.x_dtype, self.w_dtype = x_dtype, w_dtype or x_dtype
        self.bias_dtype, self.out_dtype = bias_dtype, out_dtype or x_dtype
        self.x = round_to(rng.uniform(-1, 1, (m, k)), self.x_dtype)
        self.w = round_to(rng.uniform(-1, 1, (n, k)), self.w_dtype)
        self.bias = None if bias_dtype is None else round_to(rng.uniform(-1, 1, n), bias_dtype)
        self.want = self.x @ self.w.T + (0 if self.bias is None else self.bias)

    def buffers(self, rows: slice, y: np.ndarray) -> list[np.ndarray]:
        return [y, raw(self.x[rows], self.x_dtype), raw(self.w, self.w_dtype)] + (
            [] if self.bias is None else [raw(self.bias, self.bias_dtype)])

    def empty(self, m: int) -> np.ndarray:
        """y's buffer for `m` rows, filled with NaN patterns: an output the kernel misses shows."""
        return np.full((m, self.w.shape[0]), np.nan if self.out_dtype == f32 else 0xFFFF,
                       np.float32 if self.out_dtype == f32 else np.uint16)


def emulated_gemv(case: Case, rows: slice, plan: QmvPlan | None = None, edit=None, glu: bool = False) -> np.ndarray:
    """y's raw values from the emulated gemv for `case`'s rows `rows` (its program edited first
    where asked; `glu`: case.x is `[M, 2K]`, gate and up, and the product SwiGLU's)."""
    m = len(range(*rows.indices(case.x.shape[0])))
    n, k = case.w.shape
    plan = plan or linear.gemv_plan(m, k, n)
    program = edited(linear.gemv_program("cuda", case.x_dtype, case.w_dtype, case.bias_dtype, case.out_dtype, rows=m, k=k, n=n,
                                         plan=plan, glu=glu), edit)
    y = case.empty(m)
    build(program)(case.buffers(rows, y), plan.groups(n), plan.threads)
    return y


def emulated_gemm_wgmma(case: Case, rows: slice, tiles: linear.WgmmaTiles, edit=None) -> np.ndarray:
    """y's raw values from the emulated gemm_wgmma for `case`'s rows `rows` with `tiles` (the
    warpgroup products computed by each thread from the swizzled tiles, `prelude_emulated.h`)."""
    m = len(range(*rows.indices(case.x.shape[0])))
    n, k = case.w.shape
    program = edited(linear.wgmma_program(case.x_dtype, case.bias_dtype, case.out_dtype, tiles=tiles), edit)
    y = case.empty(m)
    groups, groups_y, _ = tiles.grid(m, n)
    build(program)(case.buffers(rows, y) + [np.array([m, n, k], np.int32)], groups, tiles.threads, groups_y)
    return y


def emulated_gemm(case: Case, rows: slice, tiles: linear.Tiles, metal_tiles: bool = False, edit=None) -> np.ndarray:
    """y's raw values from the emulated gemm for `case`'s rows `rows` with `tiles` (`metal_tiles`:
    in Metal's layout, float tiles widened from memory)."""
    m = len(range(*rows.indices(case.x.shape[0])))
    n, k = case.w.shape
    program = edited(linear.gemm_program("cuda", case.x_dtype, case.bias_dtype, case.out_dtype, k=k, tiles=tiles), edit)
    y = case.empty(m)
    groups, groups_y, _ = tiles.grid(m, n)
    build(program, metal_tiles)(case.buffers(rows, y) + [np.array([m, n, k], np.int32)], groups, tiles.threads, groups_y)
    return y


# (x, w, bias, y) dtypes: each kernel dtype alone, with and without a bias, and mixed ones (float32
# x with bfloat16 w; float16 with bfloat16, which promotes to float32; a float32 bias).
GEMV_DTYPES = [(f32, f32, None, f32), (f16, f16, f16, f16), (bf16, bf16, bf16, bf16), (bf16, bf16, None, bf16),
               (f32, bf16, None, f32), (f16, bf16, f32, f32)]


@pytest.mark.parametrize("x_dtype, w_dtype, bias_dtype, out_dtype", GEMV_DTYPES, ids=str)
def test_emulated_gemv_matches_numpy_and_keeps_one_row_bits(x_dtype, w_dtype, bias_dtype, out_dtype):
    """N = 13 (not a multiple of 4 columns: the last set moved back); K = 2 SIMD steps and 5 pieces,
    split across SIMD groups with a part step; the default plan and one with 3 columns, 2 column
    sets a threadgroup, K split in 2 and 3 steps unrolled. Each row of 1, 3 and 8 rows equals that
    row launched alone, bit for bit."""
    case = Case(0x11A, 8, 2 * 256 + 40, 13, x_dtype, w_dtype, bias_dtype, out_dtype)
    for plan in (None, QmvPlan(3, 2, 2, 3)):
        alone = [emulated_gemv(case, slice(r, r + 1), plan) for r in range(8)]
        for rows in (1, 3, 8):
            got = emulated_gemv(case, slice(0, rows), plan)
            check_rows(f"{plan} rows {rows}", got, case.want[:rows], out_dtype)
            for r in range(rows):
                np.testing.assert_array_equal(got[r], alone[r][0], err_msg=f"{plan} rows {rows} row {r}")


def test_emulated_gemv_keeps_one_row_bits_at_every_row_count():
    """M 1 to 8 with the default plans (one per row count: the K split is the same): every row of
    every count equals that row alone."""
    case = Case(0x11B, 8, 4 * 256 + 8, 21, bf16, bias_dtype=bf16)
    alone = [emulated_gemv(case, slice(r, r + 1)) for r in range(8)]
    for rows in range(2, 9):
        got = emulated_gemv(case, slice(0, rows))
        check_rows(f"rows {rows}", got, case.want[:rows], bf16)
        for r in range(rows): np.testing.assert_array_equal(got[r], alone[r][0], err_msg=f"rows {rows} row {r}")


@pytest.mark.parametrize("k, n", [(300, 13), (258, 5), (257, 3), (4, 7), (9 * 256 + 64, 37)], ids=str)
def test_emulated_gemv_at_its_boundaries(k, n):
    """K a multiple of 4, 2 and neither (pieces of 4, 2 and 1 element: narrower loads); fewer
    columns than a SIMD group serves (N = 3); K shorter than one piece a lane; K split in 8 with a
    part step. The default plans, rows 1, 2 and 5, each row's bits equal to that row alone."""
    case = Case(0x11C, 5, k, n, f16, bias_dtype=f32, out_dtype=f32)
    alone = np.stack([emulated_gemv(case, slice(r, r + 1))[0] for r in range(5)])   # each row launched alone
    check_rows("rows alone", alone, case.want, f32)
    for rows in (2, 5):
        got = emulated_gemv(case, slice(0, rows))
        check_rows(f"rows {rows}", got, case.want[:rows], f32)
        np.testing.assert_array_equal(got, alone[:rows])


def test_default_gemv_plans_split_k_by_k_and_n_alone():
    """The K split (a row's order) comes from K and N, whatever the rows; 4 columns a SIMD group (at
    most N); 2 steps unrolled (at most a SIMD group's); pieces of 8 where K allows."""
    cases = {(4096, 4096): 4, (4096, 14336): 2, (14336, 4096): 4, (4096, 1024): 8, (257, 13): 8, (4, 3): 1}
    for (k, n), split in cases.items():
        plans = {linear.gemv_plan(rows, k, n) for rows in range(1, 9)}
        assert len(plans) == 1, (k, n, plans)
        plan = plans.pop()
        assert (plan.columns_per_warp, plan.column_warps, plan.k_split) == (min(4, n), 1, split), (k, n, plan)
    assert [linear.piece_width(k) for k in (4096, 4100, 4098, 4097)] == [8, 4, 2, 1]


# (x and w, bias, y) dtypes of gemm: both 16-bit types, with and without a bias, a float32 bias (y float32).
GEMM_DTYPES = [(bf16, None, bf16), (f16, f16, f16), (bf16, bf16, bf16), (f16, f32, f32)]


@pytest.mark.parametrize("dtype, bias_dtype, out_dtype", GEMM_DTYPES, ids=str)
def test_emulated_gemm_matches_numpy_at_both_tile_shapes(dtype, bias_dtype, out_dtype):
    """M = 100 (tails of both tile heights), N = 72 (off both tile widths), K = 104 (not a multiple of
    a step of 32): CUDA's 64 x 64, 64 x 128 and 128 x 128 tiles; a row's bits equal in each, and in M = 9 and 13."""
    case = Case(0x11D, 100, 104, 72, dtype, bias_dtype=bias_dtype, out_dtype=out_dtype)
    small = emulated_gemm(case, slice(0, 100), linear.GEMM_SMALL)
    large = emulated_gemm(case, slice(0, 100), linear.GEMM_LARGE)
    check_rows("64 x 64 tiles", small, case.want, out_dtype)
    np.testing.assert_array_equal(small, large)
    np.testing.assert_array_equal(small, emulated_gemm(case, slice(0, 100), linear.GEMM_MEDIUM))
    for m in (9, 13):
        np.testing.assert_array_equal(emulated_gemm(case, slice(100 - m, 100), linear.GEMM_SMALL), small[100 - m:])


@pytest.mark.parametrize("k", [100, 98, 4], ids=lambda k: f"K{k}")
def test_emulated_gemm_copies_rows_of_any_even_k(k):
    """K a multiple of 4 and of 2 only (copies of 8 and 4 bytes, the tail's pieces zero past K), and
    K shorter than a piece; M = 257 (past two 128-row tiles), N = 130."""
    case = Case(0x11E, 257, k, 130, bf16, bias_dtype=bf16)
    assert linear.copy_bytes(k) == {100: 8, 98: 4, 4: 8}[k]
    got = emulated_gemm(case, slice(0, 257), linear.GEMM_LARGE)
    check_rows(f"K {k}", got, case.want, bf16)
    np.testing.assert_array_equal(emulated_gemm(case, slice(200, 213), linear.GEMM_SMALL), got[200:213])


@pytest.mark.parametrize("dtype, bias_dtype, out_dtype, k", [(bf16, bf16, bf16, 104), (f16, None, f16, 77),
                                                             (bf16, f32, f32, 33)], ids=str)
def test_emulated_gemm_in_metals_layout_matches_numpy(dtype, bias_dtype, out_dtype, k):
    """gemm as Metal runs it (x and w widened from memory into float tiles, results through each
    SIMD group's scratch): tails of rows and columns, K off the step, odd K (element-wise reads)."""
    case = Case(0x11F, 70, k, 67, dtype, bias_dtype=bias_dtype, out_dtype=out_dtype)
    check_rows("Metal's layout", emulated_gemm(case, slice(0, 70), linear.GEMM_METAL, metal_tiles=True), case.want, out_dtype)


def test_every_tile_shape_gives_the_same_bits():
    """The tile shapes tools/tune_linear.py sweeps (so the plan may pick any by M): a row's bits
    are the same in each, at M = 70, N = 67, K = 72 (off every tile)."""
    case = Case(0x120, 70, 72, 67, bf16, bias_dtype=bf16)
    first = emulated_gemm(case, slice(0, 70), linear.TILE_SHAPES[0])
    check_rows("first tile shape", first, case.want, bf16)
    for tiles in linear.TILE_SHAPES[1:]:
        np.testing.assert_array_equal(emulated_gemm(case, slice(0, 70), tiles), first, err_msg=str(tiles))


def test_gemm_plans_follow_the_rows_and_the_backend():
    assert [linear.gemm_plan(m, "cuda") for m in (9, 64, 65, 1024, 1025, 4096)] == \
        [linear.GEMM_SMALL] * 2 + [linear.GEMM_MEDIUM] * 2 + [linear.GEMM_LARGE] * 2
    assert linear.gemm_plan(4096, "metal") == linear.GEMM_METAL
    assert linear.GEMM_LARGE.grid(257, 130) == (3, 2, 1)



@pytest.mark.parametrize("dtype, bias_dtype, out_dtype", [(bf16, bf16, bf16), (f16, f32, f32)], ids=str)
def test_emulated_gemm_wgmma_matches_numpy_in_every_tile_shape(dtype, bias_dtype, out_dtype):
    """gemm_wgmma's stages (swizzled 128-byte rows, copied STAGES - 2 steps ahead) and its
    accumulators' layout: M = 130 (past a 128-row tile), N = 270 (past a 256-column tile), K = 200
    (a multiple of 8, not of the step of 64: the last step's pieces past K are zeros). Every tile
    shape gives the same bits, and the last 9 rows alone the same bits as among the 130."""
    case = Case(0x121, 130, 200, 270, dtype, bias_dtype=bias_dtype, out_dtype=out_dtype)
    first = emulated_gemm_wgmma(case, slice(0, 130), linear.WGMMA_SHAPES[0])
    check_rows(str(linear.WGMMA_SHAPES[0]), first, case.want, out_dtype)
    for tiles in linear.WGMMA_SHAPES[1:]:
        np.testing.assert_array_equal(emulated_gemm_wgmma(case, slice(0, 130), tiles), first, err_msg=str(tiles))
    np.testing.assert_array_equal(emulated_gemm_wgmma(case, slice(121, 130), linear.wgmma_plan(9, 270)), first[121:])


def test_emulated_gemm_wgmma_at_one_short_step():
    """K = 8 (one piece of one step) and M = 9, N = 3: tiles almost all zeros."""
    case = Case(0x122, 9, 8, 3, bf16)
    check_rows("K 8", emulated_gemm_wgmma(case, slice(0, 9), linear.wgmma_plan(9, 270)), case.want, bf16)


def test_wgmma_plans_and_routes():
    """The plan follows M (any shape has the same bits); every shape fits an sm_90 threadgroup; the
    route takes gemm_wgmma only on a target with warpgroup products and K a multiple of 8."""
    from nuvec_tg.kernels import Target
    assert [linear.wgmma_plan(m, 14336) for m in (9, 64, 65, 256, 512, 4096)] == [
        linear.WGMMA_SMALL, linear.WGMMA_SMALL, linear.WGMMA_NARROW, linear.WGMMA_224, linear.WGMMA_224, linear.WGMMA_LARGE]
    # M 512 at N 14336: 224 tiles of 128 x 256 are 1.7 waves on 132 multiprocessors, 256 of 128 x 224 two full ones
    # M 512 at N 4096: 64 tiles of 128 x 256 on 132 multiprocessors, so 128 of 128 x 128; M 2048 fills them
    assert linear.wgmma_plan(512, 4096, 132) == linear.WGMMA_NARROW and linear.wgmma_plan(2048, 4096, 132) == linear.WGMMA_LARGE
    assert linear.wgmma_plan(512, 4096, 64) == linear.WGMMA_LARGE
    # M 256 at N 4096: 64 tiles of 128 x 128, 128 of 128 x 64
    assert linear.wgmma_plan(256, 4096, 132) == linear.WGMMA_NARROWEST
    assert all(linear.wgmma_bytes(t) <= linear.WGMMA_MAX_DYNAMIC for t in linear.WGMMA_SHAPES)
    hopper, ampere = Target("cuda", warpgroups=True), Target("cuda")
    assert linear.route(bf16, bf16, None, bf16, 9, 4096, 64, hopper) == ("gemm_wgmma", None)
    assert linear.route(bf16, bf16, None, bf16, 9, 4100, 64, hopper) == ("gemm", None)
    assert linear.route(bf16, bf16, None, bf16, 8, 4096, 64, hopper) == ("gemv", None)
    assert linear.route(bf16, bf16, None, bf16, 9, 4096, 64, ampere) == ("gemm", None)
    assert linear.route(f32, f32, None, f32, 9, 4096, 64, hopper)[1] is not None
    with pytest.raises(ValueError, match="threadgroup memory"):
        linear.wgmma_program(bf16, None, bf16, tiles=linear.WgmmaTiles(2, 256, 5))


# ---- the gathered products (GATHER: a mixture of experts' rows, each with its expert's weights) ----

class GatherCase:
    """Rows of x `[M, K]` each with its weight batch `picks[i]` of w `[E, N, K]` (a pick outside
    the batches gives zeros), the float64 reference, and each row's product with its batch alone
    (`alone`: M rows against one batch, the bits a gathered row must have)."""

    def __init__(self, seed: int, picks: list[int], k: int, n: int, batches: int, dtype=bf16):
        rng = np.random.default_rng(seed)
        self.dtype, self.picks = dtype, np.asarray(picks, np.int32)
        self.x = round_to(rng.uniform(-1, 1, (len(picks), k)), dtype)
        self.w = round_to(rng.uniform(-1, 1, (batches, n, k)), dtype)
        chosen = np.stack([self.w[p] if 0 <= p < batches else np.zeros((n, k)) for p in self.picks])
        self.want = np.einsum("mk,mnk->mn", self.x, chosen)

    def run(self, kernel: str, tiles, metal_tiles: bool = False, edit=None) -> np.ndarray:
        """y's raw values from the emulated gathered `kernel` ("gemm" or "gemm_wgmma") with `tiles`."""
        m, (batches, n, k) = len(self.picks), self.w.shape
        program = linear.gemm_program("cuda", self.dtype, None, self.dtype, k=k, tiles=tiles, gather=True) if kernel == "gemm" \
            else linear.wgmma_program(self.dtype, None, self.dtype, tiles=tiles, gather=True)
        program = edited(program, edit)
        y = np.full((m, n), 0xFFFF, np.uint16)
        groups, groups_y, _ = tiles.grid(m, n)
        # the tile table: each run's own tiles where the slots allow
        buffers = [y, raw(self.x, self.dtype), raw(self.w, self.dtype), self.picks,
                   quant.gather_tile_starts(Tensor(self.picks), tiles.rows, batches).numpy(), np.array([m, n, k, batches], np.int32)]
        groups = quant.gather_tile_slots(m, tiles.rows, batches)
        build(program, metal_tiles)(buffers, groups, tiles.threads, groups_y)
        return y

    def alone(self, kernel: str, tiles, metal_tiles: bool = False) -> np.ndarray:
        """Each row's bits in an ungathered launch with its own batch (zeros for a pick outside)."""
        out = np.zeros((len(self.picks), self.w.shape[1]), np.uint16)
        for batch in set(self.picks.tolist()):
            if not 0 <= batch < self.w.shape[0]: continue
            rows = np.flatnonzero(self.picks == batch)
            case = Case(0, 1, 1, 1, self.dtype)
            case.x, case.w, case.bias = self.x[rows], self.w[batch], None
            got = emulated_gemm(case, slice(0, len(rows)), tiles, metal_tiles) if kernel == "gemm" \
                else emulated_gemm_wgmma(case, slice(0, len(rows)), tiles)
            out[rows] = got
        return out


# Sorted picks with runs that cross tiles and runs inside one; unsorted ones (every row its own run);
# picks outside the batches (negative, past the last).
GATHER_PICKS = {
    "sorted": [0] * 5 + [1] * 70 + [3] * 30 + [2] * 25,
    "unsorted_and_outside": [2, 0, -1, 3, 3, 1, 7, 0, 2, 2, 1, -5, 0, 3],
}


@pytest.mark.parametrize("picks", GATHER_PICKS)
@pytest.mark.parametrize("kernel, tiles, metal_tiles", [("gemm", linear.GEMM_SMALL, False), ("gemm", linear.GEMM_LARGE, False),
                                                        ("gemm", linear.GEMM_METAL, True), ("gemm_wgmma", linear.WGMMA_SMALL, False),
                                                        ("gemm_wgmma", linear.WGMMA_LARGE, False)], ids=str)
def test_emulated_gathered_products_match_numpy_and_each_batch_alone(picks, kernel, tiles, metal_tiles):
    """Each row against float64 numpy with its batch (zeros outside the batches), and bit for bit
    the row in an ungathered launch of its batch's rows: K = 136 (off the steps of 32 and 64), N =
    72 (off every tile width), four batches."""
    case = GatherCase(0x123, GATHER_PICKS[picks], 136, 72, 4)
    got = case.run(kernel, tiles, metal_tiles)
    check_rows(f"gathered {kernel}", got, case.want, bf16)
    np.testing.assert_array_equal(got, case.alone(kernel, tiles, metal_tiles))


@pytest.mark.parametrize("dtype, k, rows", [(bf16, 136, 1), (f32, 257, 3)], ids=str)
def test_emulated_gather_gemv_matches_numpy_and_each_entry_alone(dtype, k, rows):
    """The decode step's gathered product: entries of `rows` rows of x, each against its weight
    batch (picks unsorted, repeated, negative and past the batches: zeros), K = 136 (pieces of 8) or
    257 (pieces of 1), N = 13 (the last column set moved back); each entry's rows bit for bit a
    plain gemv of them against their batch."""
    rng = np.random.default_rng(0x6E7)
    picks = np.array([2, 0, -1, 3, 3, 1, 7, 0], np.int32)
    batches, n = 4, 13
    x = round_to(rng.uniform(-1, 1, (len(picks), rows, k)), dtype)
    w = round_to(rng.uniform(-1, 1, (batches, n, k)), dtype)
    plan = linear.gemv_plan(rows, k, n)
    program = linear.gemv_program("cuda", dtype, dtype, None, dtype, rows=rows, k=k, n=n, plan=plan, batches=batches)
    y = np.full((len(picks), rows, n), np.nan if dtype == f32 else 0xFFFF, np.float32 if dtype == f32 else np.uint16)
    build(program)([y, raw(x, dtype), raw(w, dtype), picks], plan.groups(n), plan.threads, len(picks))
    for entry, pick in enumerate(picks):
        if not 0 <= pick < batches:
            assert not as_float(y[entry], dtype).any(), f"entry {entry}: a pick outside the batches gives zeros"
            continue
        case = Case(0, 1, 1, 1, dtype)
        case.x, case.w, case.bias = x[entry], w[pick], None
        check_rows(f"entry {entry}", y[entry], x[entry] @ w[pick].T, dtype)
        np.testing.assert_array_equal(y[entry], emulated_gemv(case, slice(0, rows)), err_msg=f"entry {entry}")


def test_gather_mm_routes_few_entries_to_gather_gemv():
    """gather_mm's route: sorted single-row entries past 8 a batch, the tiled kernel; anything else
    of up to 8 rows an entry, gather_gemv, where w is read as rows."""
    from nuvec_tg.kernels import Target
    hopper = Target("cuda", warpgroups=True)
    route = lambda entries, rows, sorted_indices=False, rows_of_w=True: linear.gather_route(  # noqa: E731
        bf16, bf16, entries, rows, 2048, 768, 128, sorted_indices=sorted_indices, rows_of_w=rows_of_w, target=hopper)
    assert route(8, 1) == ("gather_gemv", None)
    assert route(64, 1, sorted_indices=True) == ("gather_gemv", None)   # 64 entries over 128 batches: few a batch
    assert route(4096, 1, sorted_indices=True) == ("gemm_wgmma", None)
    assert route(4, 8) == ("gather_gemv", None)
    assert "rows an entry" in route(4, 9)[1]
    assert "transpose" in route(8, 1, rows_of_w=False)[1]


@pytest.mark.parametrize("x_dtype, w_dtype, k", [(bf16, bf16, 4096 + 64), (f16, f16, 300), (f32, bf16, 257)], ids=str)
def test_emulated_swiglu_gemv_equals_the_product_of_the_activation(x_dtype, w_dtype, k):
    """SwiGLU's product (x a gated MLP's gate and up, the activation in gemv's loads) against
    float64 numpy of the activation as the composition rounds it (silu(gate) * up in x's dtype),
    at pieces of 8, 4 and 1 elements; each row's bits a one-row launch's."""
    check_swiglu_gemv(x_dtype, w_dtype, k)


def check_swiglu_gemv(x_dtype, w_dtype, k, edit=None):
    """The planted faults' entry too."""
    from tinygrad import Tensor
    rng = np.random.default_rng(0x5917)
    n = 13
    case = Case(0x5917, 5, k, n, x_dtype, w_dtype)
    case.x = round_to(rng.uniform(-3, 3, (5, 2 * k)), x_dtype)
    gate_up = Tensor(case.x, device="CPU").cast(x_dtype)
    activated = (gate_up[:, :k].silu() * gate_up[:, k:]).cast(f32).numpy().astype(np.float64)  # in x's dtype, as the composition
    want = activated @ case.w.T
    got = emulated_gemv(case, slice(0, 5), edit=edit, glu=True)
    check_rows("swiglu gemv", got, want, case.out_dtype)
    for r in range(5):
        np.testing.assert_array_equal(emulated_gemv(case, slice(r, r + 1), edit=edit, glu=True)[0], got[r], err_msg=f"row {r}")
