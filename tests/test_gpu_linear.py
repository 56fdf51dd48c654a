"""The dense product kernels (`kernels/linear.py`: gemv, gemm) on a GPU (METAL or CUDA) against
float64 numpy and the composition on the same device, row by row (`assert_rows_close`: tolerances
scaled by each row's largest |want|, reference.py): M at the route's boundary (8, 9) and odd (13,
100, 257), K and N off every tile and step, every dtype and promotion, a bias or none, leading
axes, strided x; each gemv row's bits equal to that row alone (M 1-8), each gemm row's bits equal
to that row in another row count (9, 13, 100, 257: both tile shapes); gradients equal to the
composition's; a replayed TinyJit step; what stays a composition (float32 and mixed x and w beyond
8 rows, an odd K on CUDA, float64). On Hopper (CUDA sm_90) more than 8 rows with K a multiple of 8
take gemm_wgmma instead of gemm, and every one of its tile shapes gives the same bits. Every call
meant for a kernel asserts that it launched."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast
from nuvec_tg import kernels
from nuvec_tg.kernels import compositions_only, kernel_backend
from nuvec_tg.kernels import linear as linear_kernels
from reference import COMPOSITION_TOLERANCE, KERNEL_TOLERANCE, assert_rows_close, expect_launches, random, values

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="no GPU")]
gpu = GPU_DEVICES[0] if GPU_DEVICES else None
F16, BF16, F32 = dtypes.float16, dtypes.bfloat16, dtypes.float32
GEMV, WGMMA = "nuvec_gemv", "nuvec_gemm_wgmma"
WARPGROUPS = gpu is not None and kernels.target(gpu).warpgroups


def gemm_for(k: int) -> str:
    """The program more than 8 rows of depth K launch: gemm_wgmma on Hopper where K is a multiple
    of 8, else gemm (a prefix gemm_wgmma's names share: the wgmma cases are the strict ones)."""
    return WGMMA if WARPGROUPS and k % 8 == 0 else "nuvec_gemm"


def bits_of(t: Tensor) -> np.ndarray:
    return t.bitcast({2: dtypes.uint16, 4: dtypes.uint32}[t.dtype.itemsize]).numpy()


def inputs(seed: int, shape: tuple[int, ...], n: int, x_dtype, w_dtype=None, bias_dtype=None):
    """x of `shape` (K its last size), w `[N, K]`, bias `[N]` or None, realized, and the float64
    reference `x · wᵀ + bias` from their exact values."""
    rng = np.random.default_rng(seed)
    x, xv = random(rng, shape, x_dtype, gpu)
    w, wv = random(rng, (n, shape[-1]), w_dtype or x_dtype, gpu)
    b, bv = random(rng, (n,), bias_dtype, gpu) if bias_dtype else (None, 0.0)
    return x.realize(), w.realize(), None if b is None else b.realize(), xv @ wv.T + bv


def assert_matches(name: str, x: Tensor, w: Tensor, bias: Tensor | None, kernel: str | None, want: np.ndarray) -> Tensor:
    """`fast.linear(x, w, bias)` launches the program named `kernel...` (None: nothing) and is
    within the kernels' tolerance of the float64 `want` and within the composition's of the
    composition on the device (which launches nothing), row by row. Returns the result."""
    with expect_launches(gpu, kernel):
        got = fast.linear(x, w, bias).realize()
    with expect_launches(gpu, None), compositions_only():
        composed = fast.linear(x, w, bias).realize()
    assert got.dtype == composed.dtype and got.shape == composed.shape
    assert_rows_close(f"{name} vs numpy", values(got), want, KERNEL_TOLERANCE[got.dtype])
    assert_rows_close(f"{name} vs composition", values(got), values(composed), COMPOSITION_TOLERANCE[got.dtype])
    return got


# (x, w, bias) dtypes: each kernel dtype, with and without a bias; float32 x with bfloat16 w;
# float16 with bfloat16 (float32); a float32 bias on 16-bit x and w (float32).
GEMV_DTYPES = [(F32, F32, F32), (F16, F16, None), (BF16, BF16, BF16), (BF16, BF16, None), (F32, BF16, None),
               (F16, BF16, F16), (BF16, BF16, F32)]


@pytest.mark.parametrize("x_dtype, w_dtype, bias_dtype", GEMV_DTYPES, ids=str)
@pytest.mark.parametrize("k, n", [(552, 13), (4100, 37), (257, 3), (4096, 4096)], ids=str)
def test_gemv_matches_numpy_and_the_composition_and_keeps_one_row_bits(x_dtype, w_dtype, bias_dtype, k, n):
    """1 to 8 rows (at K 552; 1, 3 and 8 elsewhere): K two SIMD steps and a part, pieces of 4 and of
    1 element, the usual square; N off a SIMD group's 4 columns and below them. Each row of each
    row count equals that row alone."""
    x, w, b, want = inputs(0x21, (8, k), n, x_dtype, w_dtype, bias_dtype)
    alone = []
    for row in range(8):
        with expect_launches(gpu, GEMV):
            alone.append(bits_of(fast.linear(x[row:row + 1].contiguous(), w, b)))
    for rows in range(1, 9) if k == 552 else (1, 3, 8):
        y = assert_matches(f"M{rows} K{k} N{n}", x[:rows].contiguous(), w, b, GEMV, want[:rows])
        for row in range(rows):
            np.testing.assert_array_equal(bits_of(y)[row:row + 1], alone[row], err_msg=f"M{rows} row {row}")


@pytest.mark.parametrize("dtype, bias_dtype", [(BF16, BF16), (F16, None), (BF16, F32), (F16, F16)], ids=str)
@pytest.mark.parametrize("k, n", [(104, 130), (100, 200), (98, 72), (4096, 1000)], ids=str)
def test_gemm_matches_numpy_and_the_composition_and_keeps_a_rows_bits(dtype, bias_dtype, k, n):
    """M = 9 (the route's boundary), 13, 100 and 257 (tails of both tile shapes), K off the step of
    32 (copies of 16, 8 and 4 bytes), N off every tile width. A row's bits are the same in every
    row count (and so in both tile shapes: up to 64 rows and more)."""
    x, w, b, want = inputs(0x22, (257, k), n, dtype, bias_dtype=bias_dtype)
    results = {}
    for rows in (9, 13, 100, 257):
        y = assert_matches(f"M{rows} K{k} N{n}", x[257 - rows:].contiguous(), w, b, gemm_for(k), want[257 - rows:])
        results[rows] = bits_of(y)
    for rows in (9, 13, 100):
        np.testing.assert_array_equal(results[rows], results[257][257 - rows:], err_msg=f"the last {rows} rows")


def test_eight_and_nine_rows_take_each_kernel():
    x, w, b, want = inputs(0x23, (9, 256), 64, BF16, bias_dtype=BF16)
    assert_matches("M8", x[:8].contiguous(), w, b, GEMV, want[:8])
    assert_matches("M9", x, w, b, gemm_for(256), want)


@pytest.mark.parametrize("shape", [(2, 50, 320), (3, 1, 320), (4, 2, 3, 320)], ids=str)
def test_leading_axes_are_rows(shape):
    """x `[..., K]`: its leading axes flattened into rows (100, 3 and 24 of them), the result shaped back."""
    x, w, b, want = inputs(0x24, shape, 100, BF16, bias_dtype=BF16)
    rows = int(np.prod(shape[:-1]))
    y = assert_matches(f"{shape}", x, w, b, GEMV if rows <= 8 else gemm_for(320), want)
    assert y.shape == shape[:-1] + (100,)


def test_strided_x_is_copied_to_rows_first():
    """A transposed x (and a slice of one) gives the contiguous x's result, bit for bit."""
    rng = np.random.default_rng(0x25)
    base = random(rng, (320, 40), F16, gpu)[0].realize()
    w, b = (random(rng, shape, F16, gpu)[0].realize() for shape in ((64, 320), (64,)))
    for view, kernel in ((base.T, gemm_for(320)), (base.T[3:7], GEMV)):
        with expect_launches(gpu, kernel):
            strided = bits_of(fast.linear(view, w, b))
        np.testing.assert_array_equal(strided, bits_of(fast.linear(view.contiguous(), w, b)))


@pytest.mark.parametrize("rows", [3, 40], ids=lambda r: f"M{r}")
def test_gradients_equal_the_compositions(rows):
    x, w, b, _ = inputs(0x26, (rows, 96), 48, BF16, bias_dtype=BF16)
    upstream = random(np.random.default_rng(0x27), (rows, 48), BF16, gpu)[0].realize()
    with expect_launches(gpu, GEMV if rows <= 8 else gemm_for(96)):
        grads = [g.realize() for g in (fast.linear(x, w, b) * upstream).sum().gradient(x, w, b)]
    with expect_launches(gpu, None), compositions_only():
        composed = [g.realize() for g in (fast.linear(x, w, b) * upstream).sum().gradient(x, w, b)]
    for name, got, want in zip(("dx", "dw", "dbias"), grads, composed):
        assert_rows_close(name, values(got), values(want), COMPOSITION_TOLERANCE[BF16])


def test_a_jitted_step_replays_the_kernels_with_new_inputs():
    """A decode step under TinyJit (as the models run it): replays with new x give new results."""
    _, w, b, _ = inputs(0x28, (1, 512), 256, BF16, bias_dtype=BF16)
    step = TinyJit(lambda x: fast.linear(x, w, b).realize())
    rng = np.random.default_rng(0x29)
    for i in range(4):
        x, xv = random(rng, (2, 512), BF16, gpu)
        with expect_launches(gpu, GEMV if i < 2 else None):   # captured by the second call, then replayed
            y = step(x.realize())
        assert_rows_close(f"call {i}", values(y), xv @ values(w).T + values(b), KERNEL_TOLERANCE[BF16])


def test_what_no_kernel_takes_is_the_composition():
    """float32 (and mixed) x and w beyond 8 rows, an odd K on CUDA, float64 (not on Metal), empty products."""
    for x_dtype, w_dtype in ((F32, F32), (F16, BF16)):
        x, w, _, want = inputs(0x2A, (20, 64), 32, x_dtype, w_dtype)
        assert_matches(f"{x_dtype} x {w_dtype} w", x, w, None, None, want)
    x, w, _, want = inputs(0x2B, (20, 63), 32, F16)
    assert_matches("odd K", x, w, None, "nuvec_gemm" if kernel_backend(gpu) == "metal" else None, want)
    with expect_launches(gpu, None):
        assert fast.linear(Tensor.zeros(0, 64, device=gpu), Tensor.ones(8, 64, device=gpu)).numpy().shape == (0, 8)
        assert fast.linear(Tensor.ones(20, 64, device=gpu, dtype=F16), Tensor.ones(0, 64, device=gpu, dtype=F16)).numpy().shape == (20, 0)


@pytest.mark.parametrize("rows, k, n", [(1, 4096, 4096), (4, 4096, 14336), (512, 4096, 4096)], ids=str)
def test_the_benchmarks_shapes(rows, k, n):
    """Real sizes: decode rows against a square and a wide weight, a prefill's 512 rows."""
    x, w, b, want = inputs(0x2C + rows, (rows, k), n, BF16)
    assert_matches(f"M{rows} K{k} N{n}", x, w, b, GEMV if rows <= 8 else gemm_for(k), want)


@pytest.mark.skipif(not WARPGROUPS, reason="no warpgroup products (CUDA sm_90)")
@pytest.mark.parametrize("dtype, bias_dtype, k, n", [(BF16, None, 4096, 1000), (F16, F32, 328, 300), (BF16, BF16, 8, 70)],
                         ids=str)
def test_every_wgmma_tile_shape_gives_the_same_bits(dtype, bias_dtype, k, n):
    """Each of gemm_wgmma's tile shapes (`WGMMA_SHAPES`: 64 or 128 rows, 64, 128 or 256 columns,
    3 to 8 stages) on 300 rows: within the kernels' tolerance of float64 numpy and every one bit
    for bit the plan's (which may so follow M). K from one step to 64, N off every tile width."""
    x, w, b, want = inputs(0x2D, (300, k), n, dtype, bias_dtype=bias_dtype)
    results = []
    for tiles in linear_kernels.WGMMA_SHAPES:
        with expect_launches(gpu, WGMMA):
            y = linear_kernels.gemm_wgmma(x, w, b, out_dtype=y_dtype(dtype, bias_dtype), tiles=tiles).realize()
        assert_rows_close(f"{tiles}", values(y), want, KERNEL_TOLERANCE[y.dtype])
        results.append(bits_of(y))
    for tiles, bits in zip(linear_kernels.WGMMA_SHAPES, results):
        np.testing.assert_array_equal(bits, results[0], err_msg=f"{tiles} against {linear_kernels.WGMMA_SHAPES[0]}")


def y_dtype(dtype, bias_dtype):
    return dtype if bias_dtype in (None, dtype) else F32


@pytest.mark.parametrize("rows", [1, 3], ids=lambda r: f"M{r}")
def test_few_gathered_entries_run_gather_gemv_with_each_entrys_bits(rows):
    """A mixture of experts' decode step: a few entries (unsorted, repeated, one pick past the bank)
    through `gather_mm` with b the transpose of the bank, as a model passes it: one gather_gemv
    launch, against float64 numpy and the composition; each entry's rows with the bits of
    fast.linear over them against their expert (gemv), a pick past the bank zeros; gradients
    through the composition."""
    from nuvec_tg import quant
    rng = np.random.default_rng(0x140 + rows)
    experts, n, k = 6, 72, 136
    bank, bank_v = random(rng, (experts, n, k), BF16, gpu)
    picks_v = np.array([4, 0, 4, 6, 2, 1, 5, 0], np.int32)
    x, xv = random(rng, (len(picks_v), rows, k), BF16, gpu)
    picks = Tensor(picks_v, device=gpu)
    with expect_launches(gpu, "nuvec_gemv") as launches:
        got = quant.gather_mm(x, bank.transpose(-1, -2), None, picks).realize()
    assert [label for _, label in launches if "gather_gemv" in label], launches
    chosen = np.stack([bank_v[p] if p < experts else np.zeros((n, k)) for p in picks_v])
    want = np.einsum("emk,enk->emn", xv, chosen)
    assert_rows_close("gather_gemv vs numpy", values(got).reshape(-1, n), want.reshape(-1, n), KERNEL_TOLERANCE[BF16])
    with compositions_only():
        composed = quant.gather_mm(x, bank.transpose(-1, -2), None, picks)
        assert_rows_close("gather_gemv vs the composition", values(got).reshape(-1, n), values(composed).reshape(-1, n),
                          COMPOSITION_TOLERANCE[BF16])
    for entry, pick in enumerate(picks_v):
        if pick >= experts:
            assert (values(got)[entry] == 0).all()
            continue
        alone = fast.linear(Tensor(xv[entry], device=gpu).cast(BF16), bank[int(pick)])
        np.testing.assert_array_equal(bits_of(got)[entry], bits_of(alone), err_msg=f"entry {entry}")
    g = Tensor(rng.uniform(-1, 1, (len(picks_v), rows, n)), device=gpu).cast(BF16)
    dx, dbank = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks).cast(F32) * g.cast(F32)).sum().gradient(x, bank)
    with compositions_only():
        want_dx, want_dbank = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks).cast(F32) * g.cast(F32)).sum().gradient(x, bank)
    assert_rows_close("dx", values(dx).reshape(-1, k), values(want_dx).reshape(-1, k), COMPOSITION_TOLERANCE[BF16])
    assert_rows_close("dbank", values(dbank).reshape(-1, k), values(want_dbank).reshape(-1, k), COMPOSITION_TOLERANCE[BF16])


@pytest.mark.parametrize("k", [256, 136, 98], ids=lambda k: f"K{k}")
def test_sorted_gathered_products_run_the_gathered_kernel_with_each_experts_bits(k):
    """A mixture of experts' prefill: 300 single-row entries sorted by expert over 6 experts (one of
    them unused, one pick past the bank) through `gather_mm` with b the transpose of the bank
    `[E, N, K]`, as a model passes it: one gathered launch (gemm_wgmma where K is a multiple of 8
    on Hopper, else gemm), against float64 numpy and the composition; each expert's rows with the
    bits of fast.linear over those rows (more than 8 of them: the same kernel), a pick past the
    bank zeros; gradients through the composition."""
    from nuvec_tg import quant
    rng = np.random.default_rng(0x130 + k)
    experts, n, entries = 6, 72, 300
    bank, bank_v = random(rng, (experts, n, k), BF16, gpu)
    x, xv = random(rng, (entries, 1, k), BF16, gpu)
    picks_v = np.sort(rng.choice([0, 1, 2, 4, 5], entries)).astype(np.int32)
    picks_v[-3:] = experts   # past the bank: zeros
    picks = Tensor(picks_v, device=gpu)
    with expect_launches(gpu, gemm_for(k)) as launches:
        got = quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True).realize()
    assert [label for _, label in launches if "gathered" in label], launches
    chosen = np.stack([bank_v[p] if p < experts else np.zeros((n, k)) for p in picks_v])
    want = np.einsum("ek,enk->en", xv[:, 0], chosen)[:, None]
    assert_rows_close("gathered vs numpy", values(got), want, KERNEL_TOLERANCE[BF16])
    with compositions_only():
        composed = quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True)
        assert_rows_close("gathered vs the composition", values(got), values(composed), COMPOSITION_TOLERANCE[BF16])
    got_bits = bits_of(got)
    for expert in (0, 2, 5):
        rows = np.flatnonzero(picks_v == expert)
        alone = fast.linear(Tensor(xv[rows, 0], device=gpu).cast(BF16), bank[expert])
        np.testing.assert_array_equal(got_bits[rows, 0], bits_of(alone), err_msg=f"expert {expert}")
    assert (values(got)[-3:] == 0).all()
    g = Tensor(rng.uniform(-1, 1, (entries, 1, n)), device=gpu).cast(BF16)
    dx, dbank = ((quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True).cast(F32) * g.cast(F32)).sum()
                 .gradient(x, bank))
    with compositions_only():
        want_dx, want_dbank = ((quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True).cast(F32)
                                * g.cast(F32)).sum().gradient(x, bank))
    assert_rows_close("dx", values(dx), values(want_dx), COMPOSITION_TOLERANCE[BF16])
    assert_rows_close("dbank", values(dbank), values(want_dbank), COMPOSITION_TOLERANCE[BF16])
