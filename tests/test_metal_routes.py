"""What Metal's routes give a kernel: bfloat16 only where the Metal language has bfloat (3.1, macOS
14, and later), qmm only on GPUs with simdgroup matrices (Apple7: A14, M1, and later), and no kernel
whose threadgroup exceeds an Apple GPU's limits; everything else routes to the composition with a
reason. The routes and plans are functions of a `kernels.Target`, so these run on the CPU; the
detection that builds a Metal device's target is checked against tinygrad's own rule."""
import importlib.util
import pathlib
import platform

from tinygrad import dtypes

from nuvec_tg import fast, kernels
from nuvec_tg.kernels import gated_delta, linear, program, rope, softmax
from nuvec_tg.kernels import quant as qmv

bf16, f16, f32 = dtypes.bfloat16, dtypes.float16, dtypes.float32
METAL = kernels.Target("metal", "g")
METAL_3_0 = kernels.Target("metal", "g", bfloat=False)            # macOS 13
BEFORE_APPLE7 = kernels.Target("metal", "p", matrix_units=False)  # A13 and older
CUDA = kernels.Target("cuda", multiprocessors=132)
NO_BFLOAT = "bfloat16 kernels need Metal 3.1 (macOS 14) or later"
NO_MATRICES = "simdgroup matrices need an Apple7 GPU (A14, M1) or later"


def decode(dtype, target):
    """The plan of one decode step: 8 query heads over 2 key heads, 4096 keys of 128."""
    return fast.plan_attention((1, 8, 1, 128), (1, 2, 4096, 128), (1, 2, 4096, 128), dtype, device=target)


def product(dtype, rows, target, bits=4, mode="affine", transpose=True):
    """quantized_matmul's route for `rows` rows of x against a 4096 x 4096 weight."""
    return qmv.product_route(dtype, dtype, dtype, rows, 4096, 4096, bits=bits, mode=mode, transpose=transpose, batched=False,
                             target=target)


def test_bfloat16_attention_decodes_only_where_metal_has_bfloat():
    assert decode(bf16, METAL).kernel == fast.Vector(2, 64, 2)
    plan = decode(bf16, METAL_3_0)
    assert plan.kernel == fast.Composed() and plan.reason == NO_BFLOAT
    assert decode(f16, METAL_3_0).kernel == decode(f32, METAL_3_0).kernel == fast.Vector(2, 64, 2)
    assert decode(bf16, CUDA).kernel.passes == 2


def gathered(dtype, entries, batches, target, sorted_indices):
    """gather_qmm's route for `entries` single-row entries over `batches` 4096 x 4096 weights."""
    return qmv.gather_route(dtype, dtype, dtype, entries, 1, 4096, 4096, batches, bits=4, transpose=True,
                            sorted_indices=sorted_indices, global_scale=False, target=target)


def test_bfloat16_products_take_kernels_only_where_metal_has_bfloat():
    for rows, transpose, kernel in ((1, True, "qmv"), (4, False, "qvm"), (64, True, "qmm")):
        assert product(bf16, rows, METAL, transpose=transpose) == (kernel, None)
        assert product(bf16, rows, METAL_3_0, transpose=transpose) == (kernel, NO_BFLOAT)
        assert product(f16, rows, METAL_3_0, transpose=transpose) == (kernel, None)
    # bfloat16 scales under float32 activations: the kernel still reads bfloat.
    assert qmv.product_route(f32, bf16, f32, 1, 4096, 4096, bits=4, mode="affine", transpose=True, batched=False,
                             target=METAL_3_0) == ("qmv", NO_BFLOAT)
    assert gathered(bf16, 4, 8, METAL_3_0, False) == ("gather_qmv", NO_BFLOAT)
    assert gathered(f16, 4, 8, METAL_3_0, False) == ("gather_qmv", None)


def test_qmm_runs_only_on_gpus_with_simdgroup_matrices():
    assert product(f16, 64, METAL) == ("qmm", None)
    assert product(f16, 64, BEFORE_APPLE7) == ("qmm", NO_MATRICES)
    assert gathered(f16, 64, 2, METAL, True) == ("qmm", None)
    assert gathered(f16, 64, 2, BEFORE_APPLE7, True) == ("qmm", NO_MATRICES)
    assert product(f16, 1, BEFORE_APPLE7) == ("qmv", None)  # the vector kernels use no matrix units
    assert isinstance(decode(f16, BEFORE_APPLE7).kernel, fast.Vector)


def dense(dtype, rows, target, k=4096, bias=None):
    """fast.linear's route for `rows` rows of x against a [4096, K] weight of one dtype."""
    return linear.route(dtype, dtype, bias, dtype, rows, k, 4096, target)


def test_dense_products_take_bfloat16_only_where_metal_has_it_and_gemm_only_with_simdgroup_matrices():
    for rows, kernel in ((1, "gemv"), (8, "gemv"), (9, "gemm")):
        assert dense(bf16, rows, METAL) == (kernel, None)
        assert dense(bf16, rows, METAL_3_0) == (kernel, NO_BFLOAT)
        assert dense(f16, rows, METAL_3_0) == (kernel, None)
    assert dense(f16, 1, BEFORE_APPLE7) == ("gemv", None)     # the vector kernel uses no matrix units
    assert dense(f16, 64, BEFORE_APPLE7) == ("gemm", NO_MATRICES)
    assert linear.route(f16, f16, bf16, f32, 2, 64, 64, METAL_3_0) == ("gemv", NO_BFLOAT)  # a bfloat16 bias alone
    # Metal reads gemm's rows element by element: an odd K runs there, not on CUDA (4-byte copies)
    assert dense(f16, 64, METAL, k=4097) == ("gemm", None)
    assert dense(f16, 64, CUDA, k=4097) == ("gemm", "K = 4097 is odd (gemm's copies need 4-byte aligned rows)")
    assert linear.gemm_metal_resources(linear.GEMM_METAL).threadgroup_bytes == 20480


def test_dense_products_that_no_kernel_takes_say_why():
    assert linear.route(f32, f32, None, f32, 64, 64, 64, CUDA) == (
        "gemm", "float32 x and float32 w (gemm multiplies x and w of one 16-bit dtype)")
    assert linear.route(f16, bf16, None, f32, 64, 64, 64, CUDA)[1].startswith("float16 x and bfloat16 w")
    assert linear.route(f32, f32, None, f32, 8, 64, 64, CUDA) == ("gemv", None)
    assert linear.route(dtypes.float64, f32, None, dtypes.float64, 1, 64, 64, CUDA) == ("gemv", "a float64 input or result")
    assert linear.route(f16, f16, None, f16, 0, 64, 64, CUDA) == ("gemv", "an empty product")
    assert linear.route(f16, f16, None, f16, 9, 64, 0, CUDA) == ("gemm", "an empty product")


def test_gated_delta_takes_bfloat16_only_where_metal_has_it():
    assert gated_delta.unsupported((bf16,) * 6, 1, 1, 4, 128, 128, METAL) is None
    assert gated_delta.unsupported((f16,) * 5 + (bf16,), 1, 1, 4, 128, 128, METAL_3_0) == NO_BFLOAT
    assert gated_delta.unsupported((f16,) * 5 + (f32,), 1, 1, 4, 128, 128, METAL_3_0) is None


def test_the_softmax_family_takes_bfloat16_only_where_metal_has_it():
    assert softmax.unsupported(bf16, 4, 1000, METAL) is None
    assert softmax.unsupported(bf16, 4, 1000, METAL_3_0) == NO_BFLOAT
    assert softmax.unsupported(f16, 4, 1000, METAL_3_0) is None and softmax.unsupported(f32, 4, 100000, METAL_3_0) is None
    assert softmax.unsupported(dtypes.float64, 4, 1000, CUDA) == "float64 has no kernel (float16, bfloat16 and float32 do)"
    assert softmax.unsupported(f32, 0, 1000, CUDA) == softmax.unsupported(f32, 4, 0, CUDA) == "an empty call"
    assert softmax.unsupported(f32, 2**20, 2**11, CUDA) == f"{2**20} rows of {2**11} exceed int32 indexing"


def test_norm_rope_takes_bfloat16_only_where_metal_has_it_and_a_threadgroup_that_fits():
    """norm_rope's kernel: bfloat16 anywhere in the call (x, the rows, a cache) only with Metal's
    bfloat; rows whose threadgroup would keep more than 16 KB go to the three passes."""
    assert rope.norm_rope_unsupported((bf16, bf16, bf16), 64, 128, 128, 0, METAL) is None
    assert rope.norm_rope_unsupported((bf16, bf16, bf16), 64, 128, 128, 0, METAL_3_0) == NO_BFLOAT
    assert rope.norm_rope_unsupported((f16, f16, f16, bf16), 64, 128, 128, 32, METAL_3_0) == NO_BFLOAT   # a bfloat16 cache
    assert rope.norm_rope_unsupported((f16, f32, f32), 64, 128, 64, 32, METAL_3_0) is None
    assert rope.norm_rope_unsupported((f32, f32), 4, 8192, 128, 0, METAL) == \
        "rows of 8192 take 32768 bytes of threadgroup memory (at most 16384)"
    assert rope.norm_rope_unsupported((bf16, bf16), 4, 8192, 128, 0, METAL) is None
    assert rope.norm_rope_unsupported((dtypes.float64, dtypes.float64), 4, 128, 128, 0, CUDA) == "a float64 input or destination"
    assert rope.norm_rope_unsupported((f32, f32), 0, 128, 128, 0, CUDA) == "an empty call"


def test_qmm_fits_metals_threadgroup_memory_and_one_that_does_not_routes_away(monkeypatch):
    """qmm's Metal tiles (two stage buffers of words, float tiles of w and x, no stage for x) take
    22.5-26 KB; with the CUDA build's four stages and x staged they took 44-50 KB."""
    assert [qmv.qmm_metal_resources(bits).threadgroup_bytes for bits in (1, 4, 8)] == [23040, 24576, 26624]
    monkeypatch.setitem(qmv.QMM_STAGES, "metal", 16)
    assert product(f16, 64, METAL, bits=8) == ("qmm", "its threadgroup would take 55296 bytes of threadgroup memory "
                                                      "(Metal allows 32768)")
    assert product(f16, 64, METAL, bits=1) == ("qmm", None)   # 16 stages of 1-bit words fit
    assert product(f16, 64, CUDA, bits=8) == ("qmm", None)    # Metal's limits are Metal's


def test_every_route_checks_metals_limits(monkeypatch):
    """With smaller limits, the decode kernels, qvm, the gated delta, softmax and norm_rope kernels route away saying
    what they would take; what still fits keeps its kernel."""
    monkeypatch.setattr(program, "METAL_LIMITS", program.Resources(threads=128, threadgroup_bytes=4096))
    plan = decode(f16, METAL)   # 4 SIMD groups of 4 rows of 128 floats, and their maxima and sums
    assert plan.kernel == fast.Composed()
    assert plan.reason == "the decode kernels would take 8320 bytes of threadgroup memory (Metal allows 4096)"
    assert decode(f16, CUDA).kernel.passes == 2
    assert product(f16, 1, METAL) == ("qmv", None)   # 4 SIMD groups, 64 bytes of sums
    assert product(f16, 4, METAL, transpose=False) == ("qvm", "its threadgroup would take 1024 threads per threadgroup "
                                                                "(Metal allows 128)")
    monkeypatch.setattr(program, "METAL_LIMITS", program.Resources(threads=64, threadgroup_bytes=4096))
    assert gated_delta.unsupported((f16,) * 6, 1, 1, 4, 128, 128, METAL) is None   # decode: 2 SIMD groups
    assert gated_delta.unsupported((f16,) * 6, 1, 512, 4, 128, 128, METAL) == \
        "its threadgroup would take 128 threads per threadgroup (Metal allows 64)"
    assert softmax.unsupported(f16, 1, 1024, METAL) is None   # 64 threads of 16 elements
    assert softmax.unsupported(f16, 1, 1025, METAL) == "its threadgroup would take 96 threads per threadgroup (Metal allows 64)"
    assert softmax.unsupported(f32, 1, 513, METAL) == "its threadgroup would take 96 threads per threadgroup (Metal allows 64)"
    assert rope.norm_rope_unsupported((f16, f16), 1, 128, 128, 0, METAL) == \
        "its threadgroup would take 256 threads per threadgroup (Metal allows 64)"
    assert rope.norm_rope_unsupported((f16, f16), 1, 128, 128, 0, CUDA) is None


def test_only_bfloat_programs_ask_the_prelude_for_bfloat():
    """A program names bfloat (and its source defines NUVEC_BFLOAT before the prelude) only where
    one of its types is bfloat: the Metal prelude names bfloat only then."""
    def qmv_program(x, scales):
        return qmv.qmv_program("metal", x, scales, x, mode="affine", group_size=64, bits=4, rows=1, k=4096, n=4096,
                               qmv_plan=qmv.plan(1, 4096, 4096))
    for x, scales, wanted in ((f16, f16, False), (f32, f32, False), (bf16, bf16, True), (f32, bf16, True)):
        kernel = qmv_program(x, scales)
        assert kernel.bfloat is wanted
        assert kernel.source.startswith("#define NUVEC_BFLOAT 1\n") is wanted
    types = dict(q=f16, k=f16, v=f16, g=f32, beta=f16, state=f32, storage=bf16)   # only the steps' storage is bfloat
    assert gated_delta.program("metal", types, "steps", 128, 128, 2, 4, gated_delta.plan(1)).bfloat


def test_the_metal_language_is_the_one_tinygrad_compiles(monkeypatch):
    """tinygrad 0.14 passes one option, `-std=`, chosen from the macOS version: the package's copy
    of that rule matches tinygrad's source, and bfloat follows the language."""
    assert [kernels.metal_language(v) for v in ("12.7", "13.6.1", "14.0", "15.3", "26.1")] == [
        "macos-metal2.0", "metal3.0", "metal3.1", "metal3.1", "metal4.0"]
    ops_metal = pathlib.Path(importlib.util.find_spec("tinygrad").submodule_search_locations[0], "runtime", "ops_metal.py")
    assert ('metal_version = "metal4.0" if macos_major >= 26 else "metal3.1" if macos_major >= 14 else "metal3.0" '
            'if macos_major >= 13 else "macos-metal2.0"') in ops_metal.read_text()
    assert "-std={metal_version}" in ops_metal.read_text()
    try:
        for version, has_bfloat in (("13.6.1", False), ("14.2", True), ("26.0", True), ("", False)):
            monkeypatch.setattr(platform, "mac_ver", lambda version=version: (version, ("", "", ""), "arm64"))
            kernels.metal_bfloat.cache_clear()
            assert kernels.metal_bfloat() is has_bfloat, version
    finally:
        kernels.metal_bfloat.cache_clear()


def test_a_device_without_kernels_has_the_empty_target():
    assert kernels.target("CPU") == kernels.Target(None)
    assert kernels.target(("CPU", "CPU:1")) == kernels.Target(None)
    with kernels.compositions_only():
        assert kernels.target("METAL") == kernels.Target(None)
