"""The kernel mechanism (`kernels/program.py`, `kernels/__init__.py`) on the CPU, with C programs:
an in-place update runs once; a call's backward is its composition's gradient, matched to the
outputs that have one; families name their specialisations once; `choose` says which program runs
and why not."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import kernels
from nuvec_tg.kernels.program import FAMILIES, Backward, Family, Param, Program, StridedView, launch, strided_view

READ_THEN_ADD = Program("read_then_add", """void read_then_add(float* restrict y, float* restrict pool, const float* restrict x) {
  for (int i = 0; i < 8; i++) { y[i] = pool[i]; pool[i] = pool[i] + x[i]; }
}""", (), None)
# y = x * w (elementwise, 6 values) and z = x + 1 (6 values) in one program.
PRODUCT_AND_SHIFT = Program("product_and_shift", """void product_and_shift(float* restrict y, float* restrict z,
    const float* restrict x, const float* restrict w) {
  for (int i = 0; i < 6; i++) { y[i] = x[i] * w[i]; z[i] = x[i] + 1.0f; }
}""", (), None)


def cpu(values) -> Tensor:
    return Tensor(np.asarray(values, dtype=np.float32), device="CPU").realize()


def test_an_in_place_update_runs_once():
    pool, x = cpu(np.arange(8)), cpu(np.ones(8))
    y, updated = launch(READ_THEN_ADD, "CPU", [Tensor.empty(8, dtype=dtypes.float32, device="CPU"), pool], [x], (1, 1, 1), 1,
                        in_place=True)
    np.testing.assert_array_equal(y.numpy(), np.arange(8))            # read before the update
    np.testing.assert_array_equal(updated.numpy(), np.arange(8) + 1)  # updated once
    np.testing.assert_array_equal(pool.numpy(), np.arange(8) + 1)     # in the caller's buffer


def product_and_shift(x: Tensor, w: Tensor, z_shape=(2, 3)):
    """The program through `launch` (z shaped `z_shape`), its backward the composition `(x * w, x + 1)`."""
    x_in, w_in = x.contiguous(), w.contiguous()
    backward = Backward("product_and_shift", lambda x, w: (x * w, (x + 1).reshape(z_shape)), (x_in, w_in), wrt=(0, 1))
    outs = [Tensor.empty(6, dtype=dtypes.float32, device="CPU"), Tensor.empty(*z_shape, dtype=dtypes.float32, device="CPU")]
    return launch(PRODUCT_AND_SHIFT, "CPU", outs, [x_in, w_in], (1, 1, 1), 1, backward=backward)


def test_the_backward_is_the_compositions_gradient_for_each_output():
    rng = np.random.default_rng(0)
    x0, w0, a, b = (rng.standard_normal(6).astype(np.float32) for _ in range(4))
    x, w = cpu(x0), cpu(w0)
    y, z = product_and_shift(x * 2, w)   # x reaches the call through an operation
    np.testing.assert_array_equal(y.numpy(), (x0 * 2) * w0)
    # both outputs, then each alone (tinygrad passes only the gradients that exist); a fresh call
    # each time, since a realized output keeps no graph to differentiate
    y, z = product_and_shift(x * 2, w)
    gx, gw = ((y * cpu(a)).sum() + (z * cpu(b).reshape(2, 3)).sum()).gradient(x, w)
    np.testing.assert_allclose(gx.numpy(), 2 * (a * w0 + b), rtol=1e-6)
    np.testing.assert_allclose(gw.numpy(), a * x0 * 2, rtol=1e-6)
    gx, = (product_and_shift(x * 2, w)[1] * cpu(b).reshape(2, 3)).sum().gradient(x)
    np.testing.assert_allclose(gx.numpy(), 2 * b, rtol=1e-6)
    gx, gw = (product_and_shift(x * 2, w)[0] * cpu(a)).sum().gradient(x, w)
    np.testing.assert_allclose(gx.numpy(), 2 * a * w0, rtol=1e-6)
    np.testing.assert_allclose(gw.numpy(), 2 * a * x0, rtol=1e-6)


def test_one_tensor_passed_twice_gets_its_gradient_once():
    x0 = np.arange(1, 7, dtype=np.float32)
    x = cpu(x0)
    x_in = x.contiguous()
    backward = Backward("product_and_shift", lambda x, w: (x * w, (x + 1).reshape(2, 3)), (x_in, x_in), wrt=(0, 1))
    outs = [Tensor.empty(6, dtype=dtypes.float32, device="CPU"), Tensor.empty(2, 3, dtype=dtypes.float32, device="CPU")]
    y, _ = launch(PRODUCT_AND_SHIFT, "CPU", outs, [x_in, x_in], (1, 1, 1), 1, backward=backward)
    gx, = y.sum().gradient(x)
    np.testing.assert_allclose(gx.numpy(), 2 * x0)   # d(x * x)/dx, not twice that


def test_a_gradient_that_fits_two_outputs_is_ambiguous():
    x, w = cpu(np.ones(6)), cpu(np.ones(6))
    y, _ = product_and_shift(x, w, z_shape=(6,))
    with pytest.raises(ValueError, match="^product_and_shift: a gradient of one output"):
        y.sum().gradient(x)


def test_a_backward_needs_the_calls_own_inputs():
    x = cpu(np.ones(6))
    backward = Backward("product_and_shift", lambda x, w: (x * w, x + 1), (x, x + 1), wrt=(0,))
    with pytest.raises(ValueError, match="^product_and_shift: a backward's inputs"):
        launch(PRODUCT_AND_SHIFT, "CPU", [Tensor.empty(6, device="CPU") for _ in range(2)], [x, x], (1, 1, 1), 1,
               backward=backward)


def test_a_family_names_each_specialisation_by_its_text():
    params = [Param("y", "out", "float"), Param("x", "in", "T")]
    family = next(f for f in FAMILIES if f.stem == "nuvec_gated_delta")
    first = family.program("cuda", {"T": "half", "DK": 64}, params)
    assert first == family.program("cuda", {"T": "half", "DK": 64}, params)
    other = family.program("cuda", {"T": "half", "DK": 128}, params)
    assert first.name != other.name and first.name.startswith("nuvec_gated_delta_") and len(first.name) == 30
    assert f"void {first.name}(" in first.text and "#define DK 64" in first.text
    assert first.source.startswith(kernels.program.prelude("cuda"))
    assert f"kernel void {family.program('metal', {}, params).name}(" in family.program("metal", {}, params).text
    with pytest.raises(ValueError, match="no rocm kernel"):
        family.program("rocm", {}, params)
    with pytest.raises(ValueError, match="no metal kernel"):
        Family("nuvec_test_only", ("sdpa_merge.h",), family.unsupported, family.plan, ("cuda",)).program("metal", {}, params)
    FAMILIES.pop()   # the test's own family


def test_a_family_of_its_own_architecture_says_so_in_its_cuda_programs():
    """A family built for an architecture of its own (the wgmma kernels: sm_90a) marks its CUDA
    programs with it, so that `launch` compiles them for it; each carries the dynamic threadgroup
    memory its launches need."""
    params = [Param("y", "out", "float"), Param("ints", "in", "int")]
    family = Family("nuvec_test_only", ("sdpa_merge.h",), lambda *a: None, lambda *a: None, ("cuda", "metal"), arch="sm_90a")
    try:
        cuda = family.program("cuda", {}, params, dynamic_bytes=4096)
        assert (cuda.arch, cuda.dynamic_bytes) == ("sm_90a", 4096)
        assert family.program("metal", {}, params).arch is None
        assert next(f for f in FAMILIES if f.stem == "nuvec_gemm").program("cuda", {}, params).arch is None
    finally:
        FAMILIES.pop()   # the test's own family
    wgmma = {f.stem: f for f in FAMILIES if f.arch == "sm_90a"}
    assert set(wgmma) == {"nuvec_gemm_wgmma", "nuvec_qmm_wgmma", "nuvec_qmm_wgmma_rs", "nuvec_qmm_wgmma_ws", "nuvec_sdpa_prefill_wgmma"} and all(f.backends == ("cuda",) for f in wgmma.values())


def test_a_program_in_clusters_names_them_in_its_signature_and_launches_only_over_whole_clusters():
    """A CUDA program whose threadgroups work as clusters carries them (`Program.cluster`) and its
    signature fixes them at compile time (`__cluster_dims__`), so a plain launch runs them; Metal
    has none; `launch` refuses a grid the clusters do not divide before compiling anything."""
    params = [Param("y", "out", "float"), Param("ints", "in", "int")]
    family = Family("nuvec_test_only", ("sdpa_merge.h",), lambda *a: None, lambda *a: None, ("cuda", "metal"))
    try:
        clustered = family.program("cuda", {}, params, cluster=(1, 1, 4))
        assert clustered.cluster == (1, 1, 4) and f"__cluster_dims__(1, 1, 4) {clustered.name}(" in clustered.text
        plain = family.program("cuda", {}, params)
        assert plain.cluster is None and "__cluster_dims__" not in plain.text and plain.name != clustered.name
        with pytest.raises(ValueError, match="clusters of threadgroups are CUDA's"):
            family.program("metal", {}, params, cluster=(2, 1, 1))
    finally:
        FAMILIES.pop()   # the test's own family
    y, ints = Tensor.empty(4, dtype=dtypes.float32), Tensor([1], dtype=dtypes.int32)
    with pytest.raises(ValueError, match=r"a grid of \(1, 1, 6\) threadgroups in clusters of \(1, 1, 4\)"):
        launch(clustered, "CPU", [y], [ints], (1, 1, 6), 32)


def test_every_family_is_registered_once():
    stems = [f.stem for f in FAMILIES]
    assert sorted(stems) == sorted(set(stems))
    assert {"nuvec_sdpa_decode", "nuvec_sdpa_decode_mma", "nuvec_sdpa_merge", "nuvec_gated_delta", "nuvec_qmv", "nuvec_qvm",
            "nuvec_qmm"} <= set(stems)


def test_kernel_backends():
    assert kernels.kernel_backend("METAL") == "metal"
    assert kernels.kernel_backend("CUDA:1") == "cuda"
    assert kernels.kernel_backend("CPU") is None and kernels.kernel_backend("NULL") is None
    assert kernels.kernel_backend(Tensor([1.0], device="CPU")) is None
    assert kernels.gpu_class_from_name("Apple M2 Ultra") == "d"
    assert kernels.gpu_class_from_name("Apple M3 Max") == "s"
    assert kernels.gpu_class_from_name("Apple M1 Pro") == "g" and kernels.gpu_class_from_name("Apple M4") == "g"
    assert kernels.gpu_class_from_name("Apple A17 Pro GPU") == "g" and kernels.gpu_class_from_name("Apple A16 GPU") == "p"


def test_choose_says_which_program_runs_and_why_not(monkeypatch, capsys):
    monkeypatch.setenv("NUVEC_DEBUG", "1")
    assert kernels.choose("op", "(2, 3)", "CPU", "qmv") is None
    assert kernels.choose("op", "(2, 3)", "CUDA", "qmv", lambda backend: f"{backend}: too many rows") is None
    assert kernels.choose("op", "(2, 3)", "CUDA:1", "qmv") == "cuda"
    with kernels.compositions_only():
        assert kernels.choose("op", "(2, 3)", "METAL", "qmv") is None
    assert capsys.readouterr().out.splitlines() == [
        "nuvec_tg: op (2, 3): composition (CPU has no kernels)",
        "nuvec_tg: op (2, 3): composition (cuda: too many rows)",
        "nuvec_tg: op (2, 3): the qmv kernel",
        "nuvec_tg: op (2, 3): composition (kernels are off (NUVEC_KERNELS=0 or compositions_only()))"]


def strided_elements(view: StridedView, shape) -> np.ndarray:
    """The elements a kernel reads through `view` (numpy's strides over the base's values)."""
    base = view.base.numpy().reshape(-1)
    return np.lib.stride_tricks.as_strided(base[view.offset:], shape, [base.itemsize * s for s in view.strides])


def test_strided_views_of_a_projection_read_its_heads_in_place():
    """q, k and v of a fused product's realized output, as heads `[B, H, T, D]` or rows `[B * T,
    H, D]`; a transposed slice; and what cannot be read so (a merge across a slice, an expand)."""
    out = Tensor(np.arange(4 * 3 * 40, dtype=np.float32).reshape(4, 3, 40)).realize()
    q, k, v = out.split([24, 8, 8], dim=-1)
    cases = [(q.reshape(4, 3, 3, 8).transpose(1, 2), 0, (120, 8, 40, 1)),
             (k.reshape(4, 3, 1, 8).transpose(1, 2), 24, (120, 8, 40, 1)),
             (v.reshape(12, 1, 8), 32, (40, 8, 1)),
             (out.reshape(12, 40)[2:5, 10:20].permute(1, 0), 90, (1, 40))]
    for t, offset, strides in cases:
        view = strided_view(t)
        assert (view.offset, view.strides) == (offset, strides), t.shape
        np.testing.assert_array_equal(strided_elements(view, t.shape), t.numpy())
        np.testing.assert_array_equal(view.of(view.base).numpy(), t.numpy())
    assert strided_view(out.reshape(12, 40)[2:5, 10:20].reshape(30)) is None      # a slice's rows merged: a copy
    assert strided_view(v.reshape(4, 3, 1, 8).expand(4, 3, 2, 8)) is None
    assert strided_view(q * 2) is None                                           # not a view of a buffer
