"""gather_mm and gather_qmm (the seeds' gather_*_selects_batches) against numpy float64 products of
the selected batches, with default indices, broadcasting, gradients and errors."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import quant

RNG = np.random.default_rng(0x71)


def array(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def t(values, dtype=None) -> Tensor:
    return Tensor(values, device="CPU") if dtype is None else Tensor(values, device="CPU", dtype=dtype)


def test_gather_mm_selects_batches_and_broadcasts():
    x, w = array(4, 2, 7), array(3, 7, 5)
    lhs, rhs = [3, 0, 2], [1, 2, 0]
    got = quant.gather_mm(t(x), t(w), t(lhs, dtypes.uint32), t(rhs, dtypes.uint32)).numpy()
    assert got.shape == (3, 2, 5)
    for j, (l, r) in enumerate(zip(lhs, rhs)):
        np.testing.assert_allclose(got[j], x[l].astype(np.float64) @ w[r], rtol=1e-5, atol=1e-5)
    x3 = array(3, 2, 7)   # default indices: a batched matmul
    np.testing.assert_allclose(quant.gather_mm(t(x3), t(w)).numpy(), x3.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    # Broadcast indices: [2, 1] against [3] gives [2, 3] products.
    got = quant.gather_mm(t(x), t(w), t([[0], [3]], dtypes.int32), t([0, 1, 2], dtypes.int32)).numpy()
    assert got.shape == (2, 3, 2, 5)
    np.testing.assert_allclose(got[1, 2], x[3].astype(np.float64) @ w[2], rtol=1e-5, atol=1e-5)


def test_indices_outside_the_batches_select_zeros_negative_ones_too():
    """An index past either operand's batches, or negative (tinygrad's indexing would wrap it),
    gives a zero product, as the kernels do; nothing is read out of bounds."""
    x, w = array(2, 2, 64), array(3, 5, 64)
    qw = quant.quantize(t(w), 32, 4)
    lhs, rhs = [0, 1, -1, 0, 5], [2, -2, 0, 3, 1]
    for got in (quant.gather_mm(t(x), t(w.transpose(0, 2, 1).copy()), t(lhs, dtypes.int32), t(rhs, dtypes.int32)).numpy(),
                quant.gather_qmm(t(x), qw, t(lhs, dtypes.int32), t(rhs, dtypes.int32)).numpy()):
        assert got[0].any() and not got[1:].any()


def test_gather_mm_gradients_reach_both_operands():
    x2, w = array(2, 1, 7), array(3, 7, 5)
    xt, wt = t(x2), t(w)
    out = quant.gather_mm(xt, wt, t([1, 1], dtypes.uint32), t([0, 2], dtypes.uint32))
    dx, dw = out.sum().gradient(xt, wt)
    np.testing.assert_allclose(dx.numpy()[0, 0], 0.0)
    np.testing.assert_allclose(dx.numpy()[1, 0], w[0].sum(1) + w[2].sum(1), rtol=1e-5)
    np.testing.assert_allclose(dw.numpy()[0], np.broadcast_to(x2[1, 0][:, None], (7, 5)), rtol=1e-6)
    np.testing.assert_allclose(dw.numpy()[1], 0.0)


@pytest.mark.parametrize("mode", ["affine", "mxfp4", "nvfp4"])
def test_gather_qmm_selects_batches(mode):
    w, x = array(3, 8, 64), array(4, 2, 64)
    qw = quant.quantize(t(w), 32 if mode == "affine" else None, 4 if mode == "affine" else None, mode=mode)
    dense = quant.dequantize(qw, dtypes.float32).numpy().astype(np.float64)
    lhs, rhs = [3, 0, 2], [1, 2, 0]
    got = quant.gather_qmm(t(x), qw, t(lhs, dtypes.uint32), t(rhs, dtypes.uint32)).numpy()
    assert got.shape == (3, 2, 8)
    for j, (l, r) in enumerate(zip(lhs, rhs)):
        np.testing.assert_allclose(got[j], x[l] @ dense[r].T, rtol=1e-5, atol=1e-5)
    all_batches = quant.gather_qmm(t(array(1, 1, 64)), qw).numpy()
    assert all_batches.shape == (3, 1, 8)
    # Not transposed: weights [E, K, N].
    qt = quant.quantize(t(array(3, 64, 64)), mode="mxfp8")
    dense_t = quant.dequantize(qt, dtypes.float32).numpy().astype(np.float64)
    got = quant.gather_qmm(t(x), qt, t(lhs, dtypes.uint32), t(rhs, dtypes.uint32), transpose=False).numpy()
    np.testing.assert_allclose(got[0], x[3] @ dense_t[1], rtol=1e-5, atol=1e-4)


def test_gather_qmm_gradient_sums_a_row_used_twice():
    w = array(3, 8, 64)
    qw = quant.quantize(t(w), 32, 4)
    dense = quant.dequantize(qw, dtypes.float32).numpy().astype(np.float64)
    x = t(array(2, 1, 64))
    (dx,) = quant.gather_qmm(x, qw, t([1, 1], dtypes.uint32), t([0, 1], dtypes.uint32)).sum().gradient(x)
    np.testing.assert_allclose(dx.numpy()[0, 0], 0.0)
    np.testing.assert_allclose(dx.numpy()[1, 0], dense[0].sum(0) + dense[1].sum(0), rtol=1e-5, atol=1e-5)


def test_gather_qmm_with_nvfp4_global_scales_per_expert():
    w, x = array(4, 16, 64), array(2, 1, 64)
    scales = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    parts = [quant.quantize(t(w[e]), mode="nvfp4", global_scale=t(scales[e:e + 1])) for e in range(4)]
    stacked = quant.QuantizedWeight(Tensor.stack(*[p.weight for p in parts]), Tensor.stack(*[p.scales for p in parts]), None,
                                     "nvfp4", 16, 4)
    ids = [0, 3]
    got = quant.gather_qmm(t(x), stacked, None, t(ids, dtypes.uint32), global_scale=t(scales)).numpy()
    for j, e in enumerate(ids):
        dense = quant.dequantize(parts[e], dtypes.float32).numpy().astype(np.float64)
        np.testing.assert_allclose(got[j], x[j] @ dense.T, rtol=1e-5, atol=1e-5)


def test_empty_indices():
    qw = quant.quantize(Tensor.full((2, 8, 64), 0.5, device="CPU"), mode="mxfp4")
    out = quant.gather_qmm(Tensor.zeros(0, 1, 64, device="CPU"), qw, None, Tensor.zeros(0, dtype=dtypes.uint32, device="CPU"))
    assert out.numpy().shape == (0, 1, 8)


def _nv(w):
    return quant.quantize(w, mode="nvfp4")


ERRORS = [
    (TypeError, "gather_mm", "integer", lambda x, w: quant.gather_mm(x, w.transpose(-1, -2), t([0.0]))),
    (ValueError, "gather_mm", "second to last", lambda x, w: quant.gather_mm(x, x)),
    (TypeError, "gather_mm", "float", lambda x, w: quant.gather_mm(x.cast(dtypes.int32), x.cast(dtypes.int32))),
    (ValueError, "gather_qmm", "broadcast", lambda x, w: quant.gather_qmm(x, _nv(w), t([0, 1, 2], dtypes.uint32),
                                                                           t([0, 1], dtypes.uint32))),
    (ValueError, "gather_qmm", "only supported for 'nvfp4'", lambda x, w: quant.gather_qmm(
        x, quant.quantize(w, mode="mxfp4"), None, t([0, 3], dtypes.uint32), global_scale=Tensor.ones(4, device="CPU"))),
    (ValueError, "gather_qmm", "one entry per expert", lambda x, w: quant.gather_qmm(
        x, _nv(w), None, t([0, 3], dtypes.uint32), global_scale=Tensor.ones(3, device="CPU"))),
    (TypeError, "gather_qmm", "dtype float32", lambda x, w: quant.gather_qmm(
        x, _nv(w), None, t([0, 3], dtypes.uint32), global_scale=Tensor.ones(4, device="CPU").cast(dtypes.float16))),
    (ValueError, "gather_qmm", "without indices", lambda x, w: quant.gather_qmm(
        x, _nv(w), global_scale=Tensor.ones(4, device="CPU"))),
]


@pytest.mark.parametrize("error, op, text, call", ERRORS, ids=[row[2] for row in ERRORS])
def test_errors(error, op, text, call):
    with pytest.raises(error, match=f"^{op}: .*{text}"):
        call(Tensor.ones(2, 1, 64, device="CPU"), Tensor.ones(4, 16, 64, device="CPU"))


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_derivatives_in_x_for_every_mode_and_transpose_and_gather(mode):
    """The seeds' fp_derivatives_match_finite_differences: the loss sum(c * product) is linear in
    x, so its exact derivative (c times the dequantized weights, numpy float64) is the reference."""
    group = quant.DEFAULTS[mode][0]
    for transpose in (True, False):
        rows, cols = (12, 4 * group) if transpose else (4 * group, 2 * group)
        qw = quant.quantize(t(array(rows, cols)), mode=mode)
        dense = quant.dequantize(qw, dtypes.float32).numpy().astype(np.float64)
        k, n = (cols, rows) if transpose else (rows, cols)
        x, c = t(array(3, k)), array(3, n)
        (grad,) = (quant.quantized_matmul(x, qw, transpose) * t(c)).sum().gradient(x)
        want = c @ (dense if transpose else dense.T)
        np.testing.assert_allclose(grad.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max(), err_msg=f"{mode} {transpose}")
    # Gathers over 4 experts, unsorted and sorted; nvfp4 also with global scales.
    e, n, k = 4, 16, 2 * group
    weights = array(e, n, k)
    scales = np.array([0.5, 1.0, 1.5, 2.0], np.float32)
    for sorted_ids in (False, True):
        for global_scale in (False, True) if mode == "nvfp4" else (False,):
            ids = sorted([2, 0, 3, 1, 2]) if sorted_ids else [2, 0, 3, 1, 2]
            if global_scale:
                parts = [quant.quantize(t(weights[i]), mode=mode, global_scale=t(scales[i:i + 1])) for i in range(e)]
                qw = quant.QuantizedWeight(Tensor.stack(*[p.weight for p in parts]), Tensor.stack(*[p.scales for p in parts]),
                                           None, mode, *quant.DEFAULTS[mode])
                dense = np.stack([quant.dequantize(p, dtypes.float32).numpy() for p in parts]).astype(np.float64)
            else:
                qw = quant.quantize(t(weights), mode=mode)
                dense = quant.dequantize(qw, dtypes.float32).numpy().astype(np.float64)
            x, c = t(array(5, 1, k)), array(5, 1, n)
            out = quant.gather_qmm(x, qw, None, t(ids, dtypes.uint32), sorted_indices=sorted_ids,
                                   global_scale=t(scales) if global_scale else None)
            (grad,) = (out * t(c)).sum().gradient(x)
            want = np.stack([c[j] @ dense[i] for j, i in enumerate(ids)])
            np.testing.assert_allclose(grad.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max(),
                                       err_msg=f"{mode} gather sorted={sorted_ids} global={global_scale}")


def test_the_grouped_gather_rule():
    """Sorted single-row entries run as one product per expert when experts average more than 8
    rows (qmm's domain); fewer keep qmv's one-row bits (the seeds' few-row case: 8 tokens x top 8
    of 16 experts)."""
    from nuvec_tg.kernels.quant import grouped_gather
    assert grouped_gather(100, 1, 8) and not grouped_gather(20, 1, 8) and not grouped_gather(64, 1, 8)
    assert not grouped_gather(64, 1, 16) and not grouped_gather(100, 2, 8) and not grouped_gather(15, 1, 1)
    assert grouped_gather(16, 1, 1)


def test_the_quantized_gathered_route():
    """gather_qmm's kernels: sorted single-row entries averaging more than 8 rows a batch, and
    entries of more than 8 rows sorted or not (a batched quantized_matmul's), the gathered qmm;
    other entries of up to 8 rows, gather_qmv."""
    from nuvec_tg.kernels import Target
    from nuvec_tg.kernels.quant import gather_route
    bf16, hopper = dtypes.bfloat16, Target("cuda", warpgroups=True)
    route = lambda entries, rows, sorted_indices: gather_route(bf16, bf16, bf16, entries, rows, 256, 64, 4, bits=4,  # noqa: E731
                                                               transpose=True, sorted_indices=sorted_indices, global_scale=False,
                                                               target=hopper)
    assert route(40, 1, True) == ("qmm", None) and route(40, 1, False) == ("gather_qmv", None)
    assert route(3, 9, False) == ("qmm", None) and route(3, 9, True) == ("qmm", None)
    assert route(3, 8, False) == ("gather_qmv", None)


def test_the_dense_gathered_route():
    """gather_mm's kernels read the bank as rows. Sorted single-row entries averaging more than 8
    rows an expert, in 16-bit dtypes: gemm_wgmma on Hopper where K is a multiple of 8, else gemm;
    other entries of up to 8 rows (any kernel dtype): gather_gemv; the rest composes."""
    from nuvec_tg.kernels import Target
    from nuvec_tg.kernels.linear import gather_route
    bf16, hopper, ampere = dtypes.bfloat16, Target("cuda", warpgroups=True), Target("cuda")
    route = lambda entries=300, k=256, sorted_indices=True, rows_of_w=True, target=hopper, dtype=bf16: gather_route(  # noqa: E731
        dtype, dtype, entries, 1, k, 64, 6, sorted_indices=sorted_indices, rows_of_w=rows_of_w, target=target)
    assert route() == ("gemm_wgmma", None) and route(k=98) == ("gemm", None) and route(target=ampere) == ("gemm", None)
    assert route(entries=40) == ("gather_gemv", None) and route(sorted_indices=False) == ("gather_gemv", None)
    assert route(sorted_indices=False, dtype=dtypes.float32) == ("gather_gemv", None)
    assert route(rows_of_w=False)[1] is not None and route(dtype=dtypes.float32)[1] is not None


def test_gathered_products_launch_one_kernel_with_each_rows_pick(monkeypatch):
    """The gathered kernel's call around its launch, on the CPU: the route given a backend, gemm
    replaced by a C stand-in that computes each row with w's batch picks[i] (zeros outside) in
    float32. One launch with the picks per row and the bank read in place; the values, and the
    gradients (the composition's), equal the composition's."""
    from nuvec_tg import kernels
    from nuvec_tg.kernels import Target
    from nuvec_tg.kernels import linear as linear_kernel
    from reference import launched, stand_in_program
    render = linear_kernel.gemm_program

    def stand_in(backend, dtype, bias_dtype, out_dtype, *, k, tiles, gather=False):
        params = render(backend, dtypes.bfloat16, bias_dtype, dtypes.bfloat16, k=k, tiles=tiles, gather=gather).params
        params = tuple(type(p)(p.name, p.kind, "float" if p.ctype != "int" else "int") for p in params)
        body = """
          const int m = ints[0], n = ints[1], k = ints[2], batches = ints[3];
          for (int i = 0; i < m; i++) for (int j = 0; j < n; j++) {
            float sum = 0.0f;
            if (picks[i] >= 0 && picks[i] < batches)
              for (int e = 0; e < k; e++) sum += x[(long)i * k + e] * w[((long)picks[i] * n + j) * k + e];
            y[(long)i * n + j] = sum;
          }"""
        return stand_in_program("stand_in_gathered_gemm", params, body)
    monkeypatch.setattr(kernels, "active_backend", lambda device: "cuda")
    monkeypatch.setattr(kernels, "target", lambda device: Target("cuda"))
    monkeypatch.setattr(linear_kernel, "gemm_program", stand_in)
    monkeypatch.setattr(linear_kernel, "route", lambda *args: ("gemm", None))   # float32 rows, as the stand-in computes them
    bank = t(array(4, 24, 16)).realize()
    x = t(array(40, 1, 16)).realize()
    picks = t(np.sort(RNG.integers(0, 4, 40)).astype(np.int32))
    with kernels.record_launches() as launches:
        got = quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True)
    assert launched(launches) == ["stand_in_gathered_gemm"] and "gathered from 4 batches" in launches[0][1]
    with kernels.compositions_only():
        want = quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    g = t(array(40, 1, 24))
    grads = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True) * g).sum().gradient(x, bank)
    with kernels.compositions_only():
        want_grads = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks, sorted_indices=True) * g).sum().gradient(x, bank)
    for a, e in zip(grads, want_grads):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)


def test_few_gathered_entries_launch_gather_gemv_with_each_entrys_pick(monkeypatch):
    """gather_gemv's call around its launch, on the CPU: gemv replaced by a C stand-in that computes
    each entry's rows with w's batch picks[p] (zeros outside) in float32. One launch over unsorted
    entries with picks outside the bank, the bank read in place; the values, and the gradients (the
    composition's), equal the composition's."""
    from nuvec_tg import kernels
    from nuvec_tg.kernels import Target
    from nuvec_tg.kernels import linear as linear_kernel
    from reference import launched, stand_in_program
    render = linear_kernel.gemv_program
    entries, rows, k, n, batches = 6, 2, 16, 24, 4

    def stand_in(backend, x_dtype, w_dtype, bias_dtype, out_dtype, *, rows, k, n, plan, glu=False, batches=0):
        params = render(backend, dtypes.bfloat16, dtypes.bfloat16, None, dtypes.bfloat16, rows=rows, k=k, n=n, plan=plan,
                        batches=batches).params
        params = tuple(type(p)(p.name, p.kind, "float" if p.ctype != "int" else "int") for p in params)
        body = f"""
          for (int p = 0; p < {entries}; p++) for (int m = 0; m < {rows}; m++) for (int j = 0; j < {n}; j++) {{
            float sum = 0.0f;
            if (picks[p] >= 0 && picks[p] < {batches})
              for (int e = 0; e < {k}; e++) sum += x[((long)p * {rows} + m) * {k} + e] * w[((long)picks[p] * {n} + j) * {k} + e];
            y[((long)p * {rows} + m) * {n} + j] = sum;
          }}"""
        return stand_in_program("stand_in_gather_gemv", params, body)
    monkeypatch.setattr(kernels, "active_backend", lambda device: "cuda")
    monkeypatch.setattr(kernels, "target", lambda device: Target("cuda"))
    monkeypatch.setattr(linear_kernel, "gemv_program", stand_in)
    monkeypatch.setattr(linear_kernel, "route", lambda *args: ("gemv", None))   # float32 rows, as the stand-in computes them
    bank = t(array(batches, n, k)).realize()
    x = t(array(entries, rows, k)).realize()
    picks = t(np.array([3, 0, -1, 3, 9, 1], np.int32))
    with kernels.record_launches() as launches:
        got = quant.gather_mm(x, bank.transpose(-1, -2), None, picks)
    assert launched(launches) == ["stand_in_gather_gemv"] and "gather_gemv" in launches[0][1]
    with kernels.compositions_only():
        want = quant.gather_mm(x, bank.transpose(-1, -2), None, picks)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert not got.numpy()[[2, 4]].any()
    g = t(array(entries, rows, n))
    grads = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks) * g).sum().gradient(x, bank)
    with kernels.compositions_only():
        want_grads = (quant.gather_mm(x, bank.transpose(-1, -2), None, picks) * g).sum().gradient(x, bank)
    for a, e in zip(grads, want_grads):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
