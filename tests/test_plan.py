"""plan_attention: routes, memory bounds, purity and validation."""
import subprocess
import sys
import threading

import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast

bf16, f16, f32 = dtypes.bfloat16, dtypes.float16, dtypes.float32
METAL = {c: fast.PlanTarget("metal", c) for c in "pgsd"}
CUDA = fast.PlanTarget("cuda", multiprocessors=132)
CPU = fast.PlanTarget(None)


def tiled(kernel) -> bool:
    """Whether a plan's kernel is the tiled prefill kernel (its launch is the kernel's own business)."""
    return isinstance(kernel, fast.Tiled)


def plan(b, hq, hkv, lq, lk, d, dv=None, dtype=bf16, target=METAL["g"], **options):
    return fast.plan_attention((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv or d), dtype, device=target, **options)


def test_every_route_kind_is_reachable():
    assert plan(1, 32, 8, 1, 8192, 128).kernel == fast.Vector(passes=2, blocks=64, dispatches=2)
    assert plan(1, 32, 32, 1, 512, 128).kernel == fast.Vector(passes=1, blocks=1, dispatches=1)
    assert tiled(plan(1, 8, 8, 512, 512, 128, mask="causal").kernel)
    assert plan(1, 8, 8, 512, 512, 256, mask="causal").kernel == fast.Composed()
    assert plan(1, 8, 1, 2048, 2048, 512, mask="causal").kernel == fast.BlockedD512(rows=256)
    capped = plan(1, 8, 8, 512, 512, 256, max_score_bytes=8 * 512 * 4 * 100)
    assert capped.kernel == fast.ComposedBlocks(rows=100) and capped.capped
    for target in (CPU, METAL["g"], CUDA):
        assert plan(1, 8, 8, 300, 300, 40, target=target).kernel == fast.Composed()


def test_cpu_and_other_devices_compose():
    assert plan(1, 32, 8, 1, 8192, 128, target=CPU).kernel == fast.Composed()
    assert fast.plan_attention((1, 4, 1, 64), (1, 4, 64, 64), (1, 4, 64, 64), f32, device="CPU").kernel == fast.Composed()


def test_vector_rules_follow_mlx():
    # Head sizes and shapes the vector kernels take.
    for d, dv in ((64, 64), (96, 96), (128, 128), (256, 256), (192, 128), (96, 64)):
        assert isinstance(plan(1, 8, 8, 1, 100, d, dv).kernel, fast.Vector)
    for d, dv in ((80, 80), (192, 192), (128, 64)):
        assert plan(1, 8, 8, 1, 100, d, dv).kernel == fast.Composed()
    assert plan(1, 8, 8, 9, 100, 128).kernel != fast.Vector  # Lq > 8 is not a vector call
    assert plan(1, 8, 8, 8, 7, 128).kernel == fast.Composed()     # Lq > Lk
    assert isinstance(plan(1, 32, 8, 8, 100, 128).kernel, fast.Vector)   # 8 x 4 = 32 rows
    assert plan(1, 64, 8, 5, 100, 128).kernel == fast.Composed()         # 5 x 8 > 32
    # Head size 512: one query, 8 grouped heads, no array mask, at least 1024 keys.
    assert isinstance(plan(1, 8, 1, 1, 1024, 512).kernel, fast.Vector)
    assert plan(1, 8, 1, 1, 1023, 512).kernel == fast.Composed()
    assert plan(1, 4, 1, 1, 2048, 512).kernel == fast.Composed()
    assert plan(1, 8, 1, 2, 2048, 512).kernel == fast.Composed()
    mask = Tensor.ones(1, 1, 1, 2048, dtype=dtypes.bool)
    assert plan(1, 8, 1, 1, 2048, 512, mask=mask).kernel == fast.Composed()


def test_passes_and_blocks_follow_mlx():
    # Two passes: class d or s from 1024 keys, or grouped heads from 4096.
    assert plan(1, 8, 8, 1, 1023, 128, target=METAL["s"]).kernel.passes == 1
    assert plan(1, 8, 8, 1, 1024, 128, target=METAL["s"]).kernel == fast.Vector(2, 64, 2)
    assert plan(1, 8, 8, 1, 100000, 128).kernel.passes == 1
    assert plan(1, 16, 8, 1, 4095, 128).kernel.passes == 1
    assert plan(1, 16, 8, 1, 4096, 128).kernel == fast.Vector(2, 32, 2)          # n = 2: 32 blocks
    assert plan(1, 32, 8, 1, 4096, 128).kernel == fast.Vector(2, 64, 2)          # n = 4: 64
    s, d = METAL["s"], METAL["d"]
    assert plan(1, 32, 8, 2, 8192, 128, target=s).kernel.blocks == 128           # n = 8
    assert plan(1, 32, 8, 2, 8193, 128, target=s).kernel.blocks == 256
    assert plan(1, 32, 8, 2, 65536, 128, target=s).kernel.blocks == 512
    assert plan(1, 32, 8, 2, 65537, 128, target=s).kernel.blocks == 1024
    assert plan(1, 16, 8, 2, 65537, 128, target=s).kernel.blocks == 64           # n = 4
    assert plan(1, 16, 8, 1, 8193, 128, target=d).kernel.blocks == 256          # n = 2
    assert plan(1, 48, 8, 1, 65536, 128, target=d).kernel.blocks == 1024        # n = 6
    assert plan(1, 48, 8, 1, 16384, 128, target=d).kernel.blocks == 512
    assert plan(1, 48, 8, 1, 16383, 128, target=d).kernel.blocks == 128
    # CUDA, the vector kernel (float32 here: 16-bit types with grouped heads take the matrix units):
    # one wave of 16 resident SIMD groups per multiprocessor (8 per threadgroup) for one batch
    # item, blocks of at least 64 keys, a power of two; 1 is a single pass. The batch size never
    # changes the plan (an item's bits must not depend on its batch).
    assert plan(1, 32, 8, 1, 1024, 128, dtype=f32, target=CUDA).kernel == fast.Vector(2, 16, 2)      # 1024 // 64
    assert plan(1, 32, 8, 1, 65536, 128, dtype=f32, target=CUDA).kernel == fast.Vector(2, 32, 2)     # 132 * 16 // (8 * 8) = 33
    assert plan(1, 64, 8, 1, 65536, 128, dtype=f32, target=CUDA).kernel == fast.Vector(2, 32, 2)
    # CUDA, 4 or more query rows per key head in 16-bit types: the matrix-unit pass, about
    # sqrt(keys / 64) blocks, a power of two, at most 8 resident SIMD groups per multiprocessor for
    # one item (4 per threadgroup).
    assert plan(1, 32, 8, 1, 1024, 128, target=CUDA).kernel == fast.Vector(2, 4, 2, matrix=True, l2_ahead=2)  # sqrt(16)
    assert plan(1, 32, 8, 1, 4096, 128, target=CUDA).kernel == fast.Vector(2, 8, 2, matrix=True, l2_ahead=2)  # sqrt(64)
    assert plan(1, 32, 4, 1, 16384, 128, target=CUDA).kernel == fast.Vector(2, 16, 2, matrix=True, l2_ahead=2)  # sqrt(256)
    assert plan(1, 64, 8, 1, 65536, 128, target=CUDA).kernel == fast.Vector(2, 32, 2, matrix=True)  # sqrt(1024)
    assert plan(1, 32, 4, 1, 1 << 20, 128, target=CUDA).kernel == fast.Vector(2, 64, 2, matrix=True)  # 1056 // 16
    assert plan(1, 32, 8, 1, 1 << 20, 128, target=CUDA).kernel == fast.Vector(2, 32, 2, matrix=True)  # 1056 // 32
    assert plan(1, 32, 4, 1, 1023, 128, target=CUDA).kernel == fast.Vector(2, 2, 2, matrix=True, l2_ahead=2)  # a power of two
    assert plan(1, 32, 4, 1, 200, 128, target=CUDA).kernel == fast.Vector(2, 1, 2, matrix=True, l2_ahead=2)
    assert plan(1, 16, 8, 2, 4096, 128, target=CUDA, mask="causal").kernel.matrix                     # 2 heads x 2 positions
    assert plan(1, 256, 8, 1, 1 << 20, 128, target=CUDA).kernel == fast.Vector(2, 16, 2, matrix=True)  # two row groups
    # A window's keys count, not the cache's.
    windowed = plan(1, 32, 8, 1, 65536, 128, target=CUDA, mask="causal", window=1024).kernel
    assert windowed == fast.Vector(2, 4, 2, matrix=True, l2_ahead=2)
    # A batch keeps the blocks (so the bits) of one item, run by about one wave of threadgroups
    # (2 per multiprocessor), each taking its share of the blocks in turn.
    for b in (2, 8, 32):
        alone, batched = plan(1, 16, 2, 1, 16384, 128, target=CUDA).kernel, plan(b, 16, 2, 1, 16384, 128, target=CUDA).kernel
        assert (batched.blocks, batched.matrix) == (alone.blocks, alone.matrix) == (16, True)
    assert plan(1, 32, 8, 1, 16384, 128, target=CUDA).kernel.block_groups == 0                          # one per block
    assert plan(8, 32, 8, 1, 16384, 128, target=CUDA).kernel == fast.Vector(2, 16, 2, True, 4)         # 264 // 64
    assert plan(32, 32, 4, 1, 16384, 128, target=CUDA).kernel == fast.Vector(2, 16, 2, True, 2)        # 264 // 128
    assert plan(64, 32, 4, 1, 16384, 128, target=CUDA).kernel == fast.Vector(2, 16, 2, True, 1)
    # The L2 prefetch 2 rounds ahead where the pass launches at most one threadgroup per
    # multiprocessor (132), none where it launches more (a hint: the batch may change it).
    assert plan(1, 32, 8, 1, 16384, 128, target=CUDA).kernel.l2_ahead == 2                            # 8 x 16
    assert plan(1, 32, 8, 1, 65536, 128, target=CUDA).kernel.l2_ahead == 0                            # 8 x 32
    assert plan(8, 16, 2, 1, 4096, 128, target=CUDA).kernel.l2_ahead == 2                             # 2 x 8 x 8
    assert plan(8, 32, 8, 1, 4096, 128, target=CUDA).kernel.l2_ahead == 0                             # 8 x 8 x 8
    assert not plan(1, 32, 4, 1, 4096, 128, dtype=f32, target=CUDA).kernel.matrix
    assert not plan(1, 32, 4, 1, 4096, 256, target=CUDA).kernel.matrix                                 # registers
    assert not plan(1, 32, 4, 1, 4096, 192, 128, target=CUDA).kernel.matrix
    assert plan(1, 32, 4, 1, 4096, 64, target=CUDA).kernel.matrix
    assert not plan(1, 16, 8, 1, 4096, 128, target=CUDA).kernel.matrix                                 # 2 rows a head
    assert not plan(1, 32, 4, 1, 4096, 128, target=METAL["g"]).kernel.matrix
    scratch = plan(2, 32, 4, 1, 16384, 128, target=CUDA)
    assert scratch.scratch_bytes == 2 * 32 * 1 * 16 * (128 + 2) * 4
    for b in (2, 8, 32):
        assert plan(b, 32, 8, 1, 16384, 128, dtype=f32, target=CUDA).kernel == plan(1, 32, 8, 1, 16384, 128, dtype=f32, target=CUDA).kernel
    assert plan(1, 32, 8, 1, 127, 128, dtype=f32, target=CUDA).kernel == fast.Vector(1, 1, 1)
    assert plan(1, 32, 8, 1, 65536, 128, dtype=f32, target=fast.PlanTarget("cuda", multiprocessors=66)).kernel == fast.Vector(2, 16, 2)
    # A window plans from the window's keys, not the cache's.
    assert plan(1, 32, 8, 1, 65536, 128, mask="causal", window=1000).kernel == fast.Vector(1, 1, 1)
    assert plan(1, 32, 8, 1, 65536, 128, mask="causal", window=5000).kernel == fast.Vector(2, 64, 2)
    partials = plan(2, 32, 8, 1, 8192, 128)
    assert partials.scratch_bytes == 2 * 32 * 1 * 64 * (128 + 2) * 4 and partials.max_intermediate_bytes == 0


def test_tiled_rules_follow_mlx():
    for d, dv in ((64, 64), (72, 72), (80, 80), (96, 96), (128, 128), (96, 64)):
        assert tiled(plan(1, 8, 8, 100, 100, d, dv, mask="causal").kernel)
    assert plan(1, 8, 8, 100, 99, 128, mask="causal").kernel == fast.Composed()   # causal needs Lq <= Lk
    assert tiled(plan(1, 8, 8, 100, 99, 128).kernel)
    # 192 and 256 are slow unless huge (> 8 GiB of scores), or 256 causal with Lq >= 1024, Lk <= 8192.
    assert plan(1, 8, 8, 100, 100, 192).kernel == fast.Composed()
    assert tiled(plan(64, 32, 8, 2048, 2048, 192).kernel)
    assert tiled(plan(1, 8, 8, 1024, 8192, 256, mask="causal").kernel)
    assert plan(1, 8, 8, 1023, 8192, 256, mask="causal").kernel == fast.Composed()
    assert plan(1, 8, 8, 1024, 8193, 256, mask="causal").kernel == fast.Composed()
    assert plan(1, 8, 8, 1024, 1024, 256).kernel == fast.Composed()
    # Tiled holds any cap: no scores.
    capped = plan(1, 8, 8, 512, 512, 128, mask="causal", max_score_bytes=0)
    assert isinstance(capped.kernel, fast.Tiled) and capped.max_intermediate_bytes == 0 and not capped.capped


def test_blocked_d512_rules():
    assert plan(1, 8, 1, 1024, 1024, 512, dtype=f16, mask="causal").kernel == fast.BlockedD512(256)
    assert plan(1, 8, 1, 1024, 1024, 512, dtype=f16, mask="causal", window=100).kernel == fast.BlockedD512(256)
    for options in (dict(mask="causal", dtype=f32), dict(mask=None), dict(mask="causal", sinks=Tensor.zeros(8, dtype=f16))):
        options = {"dtype": f16, **options}
        assert not isinstance(plan(1, 8, 1, 1024, 1024, 512, **options).kernel, fast.BlockedD512)
    assert plan(1, 8, 1, 1023, 1024, 512, mask="causal").kernel == fast.Composed()
    # Under a cap the rows halve; below 32 rows' worth the capped composition decides.
    row = 8 * 1024 * 4
    halved = plan(1, 8, 1, 1024, 1024, 512, mask="causal", max_score_bytes=100 * row)
    assert halved.kernel == fast.BlockedD512(64) and halved.capped and halved.max_intermediate_bytes <= 100 * row
    small = plan(1, 8, 1, 1024, 1024, 512, mask="causal", max_score_bytes=20 * row)
    assert small.kernel == fast.ComposedBlocks(20) and small.capped


def test_caps_and_memory_bounds():
    # Uncapped composition: the whole score matrix in float32.
    whole = plan(2, 4, 2, 100, 300, 40, target=CPU)
    assert whole == fast.AttentionPlan(whole.kernel, whole.scratch_bytes, 2 * 4 * 100 * 300 * 4, False)
    assert whole.scratch_bytes >= 2 * whole.max_intermediate_bytes
    # A cap picks the most rows that fit; causal blocks see only their prefix, windows their band.
    row = 2 * 4 * 300 * 4
    capped = plan(2, 4, 2, 100, 300, 40, target=CPU, max_score_bytes=10 * row)
    assert capped.kernel == fast.ComposedBlocks(10) and capped.capped
    assert plan(2, 4, 2, 100, 300, 40, target=CPU, max_score_bytes=10 * row - 1).kernel == fast.ComposedBlocks(9)
    window = plan(1, 1, 1, 100, 100, 8, target=CPU, mask="causal", window=10, max_score_bytes=20 * 29 * 4)
    assert window.kernel == fast.ComposedBlocks(20) and window.max_intermediate_bytes == 20 * 29 * 4
    # A cap that holds everything changes nothing.
    assert not plan(2, 4, 2, 100, 300, 40, target=CPU, max_score_bytes=10**9).capped
    # Below one row: an error naming the smallest cap.
    with pytest.raises(ValueError, match=f"^plan_attention: .*smallest cap is {row}$"):
        plan(2, 4, 2, 100, 300, 40, target=CPU, max_score_bytes=row - 1)
    q, k = Tensor.zeros(2, 4, 100, 40), Tensor.zeros(2, 2, 300, 40)
    with pytest.raises(ValueError, match=f"^scaled_dot_product_attention: .*smallest cap is {row}$"):
        fast.scaled_dot_product_attention(q, k, k, 1.0, max_score_bytes=row - 1)
    # Empty calls allocate nothing.
    assert plan(1, 2, 2, 0, 10, 8).scratch_bytes == 0 and plan(1, 2, 2, 3, 0, 8).kernel == fast.Composed()


def _plans():
    shapes = [(b, hq, hkv, lq, lk, d) for b in (1, 3) for hq, hkv in ((8, 8), (32, 8)) for lq in (1, 4, 300, 2048)
              for lk in (300, 5000, 70000) for d in (64, 128, 256, 512)]
    return [repr(plan(*s, target=t, mask="causal", max_score_bytes=1 << 26)) for s in shapes
            for t in (METAL["s"], METAL["d"], CUDA) if s[3] <= s[4]]


def test_plans_are_pure_across_threads_and_processes():
    first = _plans()
    results = []
    threads = [threading.Thread(target=lambda: results.append(_plans())) for _ in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert results == [first, first]
    code = "import sys; sys.path.insert(0, 'tests'); from test_plan import _plans; print('\\n'.join(_plans()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0]).stdout
    assert out.splitlines() == first


def test_a_plan_says_why_no_kernel_runs():
    assert plan(1, 8, 2, 1, 512, 128, target=CUDA).reason == ""
    assert plan(1, 8, 2, 1, 512, 128, target=CPU).reason == "the target has no kernels"
    assert plan(1, 8, 2, 1, 512, 80, target=CUDA).reason == "head sizes D 80 / DV 80 have no decode kernel"
    assert plan(1, 8, 2, 1, 512, 128, dtype=dtypes.float64, target=CUDA).reason == "float64 has no kernel"
    assert plan(1, 32, 1, 2, 512, 128, target=CUDA).reason == "64 query rows per key head (the decode kernels take at most 32)"
    assert plan(1, 8, 2, 4, 3, 128, target=CUDA).reason == "more queries (4) than keys (3)"
    assert plan(1, 8, 2, 512, 512, 128, target=CUDA).reason == ""
    assert plan(1, 8, 2, 512, 512, 128, dtype=f32, target=CUDA).reason == \
        "float32 has no tiled kernel (float16 and bfloat16 do; float32 composes)"
    assert plan(1, 8, 2, 512, 512, 112, target=CUDA).reason == "512 queries of head sizes D 112 / DV 112 have no tiled route"
    no_matrix = fast.PlanTarget("metal", "g", matrix_units=False)
    assert plan(1, 8, 2, 512, 512, 128, target=no_matrix).reason == "simdgroup matrices need an Apple7 GPU (A14, M1) or later"
    assert plan(1, 8, 1, 1024, 1024, 512, dtype=f16, mask="causal", target=CUDA).reason.startswith("head size 512 has no tiled kernel")
    assert plan(1, 8, 2, 0, 512, 128, target=CUDA).reason.startswith("nothing to attend")
    assert plan(0, 8, 2, 1, 512, 128, target=CUDA).kernel == fast.Composed()   # an empty batch launches nothing
    assert "MLX's rule" in plan(1, 8, 1, 2, 2048, 512, target=METAL["g"]).reason


q, k, v = (1, 4, 5, 8), (1, 2, 9, 8), (1, 2, 9, 8)
INVALID = [
    (ValueError, dict(q_shape=(1, 4, 5), k_shape=k, v_shape=v)),
    (ValueError, dict(q_shape=q, k_shape=(1, 3, 9, 8), v_shape=(1, 3, 9, 8))),
    (ValueError, dict(q_shape=q, k_shape=k, v_shape=(1, 2, 8, 8))),
    (ValueError, dict(q_shape=q, k_shape=(2, 2, 9, 8), v_shape=(2, 2, 9, 8))),
    (ValueError, dict(q_shape=q, k_shape=(1, 2, 9, 4), v_shape=v)),
    (ValueError, dict(mask="causal", window=0)),
    (ValueError, dict(window=3)),
    (ValueError, dict(mask=Tensor.ones(5, 9, dtype=dtypes.bool), window=3)),
    (TypeError, dict(mask="causal", window=2.5)),
    (ValueError, dict(mask="lower")),
    (ValueError, dict(mask=Tensor.ones(5, 8, dtype=dtypes.bool))),
    (ValueError, dict(mask=Tensor.ones(1, 1, 1, 5, 9, dtype=dtypes.bool))),
    (TypeError, dict(mask=Tensor.ones(5, 9, dtype=dtypes.float64))),
    (TypeError, dict(mask=Tensor.ones(5, 9, dtype=dtypes.int32))),
    (ValueError, dict(sinks=Tensor.zeros(3))),
    (TypeError, dict(sinks=Tensor.zeros(4, dtype=dtypes.float64))),
    (ValueError, dict(max_score_bytes=-1)),
    (TypeError, dict(max_score_bytes=1.5)),
]


@pytest.mark.parametrize("error, options", INVALID, ids=str)
def test_invalid_options_are_rejected_by_plan_and_op(error, options):
    options = dict(options)
    shapes = [options.pop(name, default) for name, default in (("q_shape", q), ("k_shape", k), ("v_shape", v))]
    with pytest.raises(error, match="^plan_attention: "):
        fast.plan_attention(*shapes, f32, device=CPU, **options)
    tensors = [Tensor.zeros(*s, device="CPU") for s in shapes]
    with pytest.raises(error, match="^scaled_dot_product_attention: "):
        fast.scaled_dot_product_attention(*tensors, 0.5, **options)
    with pytest.raises(TypeError, match="^scaled_dot_product_attention: "):
        fast.scaled_dot_product_attention(tensors[0].cast(dtypes.int32), *tensors[1:], 0.5)


def test_float64_composes_on_every_target():
    for target in (METAL["s"], CUDA):
        assert plan(1, 32, 8, 1, 8192, 128, dtype=dtypes.float64, target=target).kernel == fast.Composed()
