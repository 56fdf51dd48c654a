"""Tensor-parallel models on two GPUs of one kind (`models.parallel`, issue 27; the device tool's
`nvidia-h200-x2`): a kernel over per-device tensors gives each device the bits one device gives
for that slice; the fixtures split over two GPUs give transformers' logits (mlx-lm's for its 4-bit
checkpoint) with the kernels running; a random Qwen3 with 128-wide heads decodes through the jitted
step over two GPUs as on one. Skipped where fewer than two GPUs of a kind open."""
from __future__ import annotations

import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes

from conftest import GPU_DEVICES
from nuvec_tg import fast, kernels, models, quant
from nuvec_tg.kernels import record_launches
from nuvec_tg.models import parallel
from reference import assert_rows_close
from test_gpu_models import TOL, fixture, logits_of, random_qwen3


def _second_gpu() -> tuple[str, ...]:
    """The first GPU kind's first two devices, where both open; else ()."""
    if not GPU_DEVICES: return ()
    try:
        Device[f"{GPU_DEVICES[0]}:1"]
    except Exception:  # noqa: BLE001 - no second device of the kind
        return ()
    return (f"{GPU_DEVICES[0]}:0", f"{GPU_DEVICES[0]}:1")


GPUS = _second_gpu()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="fewer than two GPUs")]


def each_device(t: Tensor) -> np.ndarray:
    """A per-device tensor's buffers (`parallel.per_device`), `[devices, ...]`."""
    return Tensor(t.reshape(1, *t.shape).uop.unshard(0)).numpy()


def split_rows(array: np.ndarray, dtype) -> Tensor:
    """`array`'s rows split over the two GPUs, per device (each its half)."""
    whole = Tensor(array, device=GPUS[0]).cast(dtype)
    return parallel.per_device(whole.shard(GPUS, axis=0).realize())


def test_a_kernel_over_per_device_tensors_gives_each_device_one_devices_bits():
    """rms_norm and a 4-bit product of 8 rows (qmv_mma) over per-device tensors: each device's
    result has the bits of the same call on that device's slice alone."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4096)).astype(np.float32)
    w = (rng.standard_normal((2 * 1024, 4096)) * 0.02).astype(np.float32)
    norm_weight = Tensor(rng.standard_normal(4096).astype(np.float32), device=GPUS[0]).cast(dtypes.bfloat16)
    xs = split_rows(x, dtypes.bfloat16)                              # 8 rows a device
    ws = quant.quantize(split_rows(w, dtypes.bfloat16), 64, 4)       # 1024 output rows a device
    with kernels.per_device(), record_launches() as launches:
        normed = fast.rms_norm(xs, norm_weight.to(GPUS).realize(), 1e-6).realize()
        product = quant.quantized_matmul(xs, ws).realize()
    names = [name for name, _ in launches]
    assert any(n.startswith("nuvec_rms_norm") for n in names) and any(n.startswith("nuvec_qmv_mma") for n in names)
    for i, device in enumerate(GPUS):
        x_i = Tensor(x[8 * i:8 * i + 8], device=device).cast(dtypes.bfloat16)
        w_i = quant.quantize(Tensor(w[1024 * i:1024 * i + 1024], device=device).cast(dtypes.bfloat16), 64, 4)
        want_norm = fast.rms_norm(x_i, norm_weight.to(device), 1e-6).bitcast(dtypes.uint16).numpy()
        want_product = quant.quantized_matmul(x_i, w_i).bitcast(dtypes.uint16).numpy()
        assert np.array_equal(each_device(normed.bitcast(dtypes.uint16))[i], want_norm)
        assert np.array_equal(each_device(product.bitcast(dtypes.uint16))[i], want_product)


@pytest.mark.parametrize("name, reference_key", [("qwen3", "logits_1"), ("gpt_oss", "logits_1"), ("qwen3_5", "logits_1"),
                                                 ("qwen3_moe_mlx4", "logits_f32_1")])
def test_fixtures_split_over_two_gpus_match_their_references(name, reference_key):
    ref = np.load(fixture(name) / "reference.npz")
    m = models.load(fixture(name), dtype="float32", devices=GPUS, progress=False)
    with record_launches() as launches:
        got = logits_of(m(ref["prompt_1"][None]))[0]
    assert launches, "no kernel ran on the split model"
    assert_rows_close(f"{name} over 2 GPUs", got, ref[reference_key], TOL[dtypes.float32])


@pytest.mark.parametrize("quantize", [None, 4])
def test_jitted_decode_steps_over_two_gpus_equal_one_gpus(tmp_path, quantize):
    """A random Qwen3 (heads of 128, 8 query and 2 key-value heads: 4 and 1 a device) generating
    greedily in bfloat16 over two GPUs: the decode kernels run, and the logits of each step are
    one GPU's within bfloat16's tolerance (the all-reduce sums the halves in another order)."""
    checkpoint = random_qwen3(tmp_path / "qwen3")
    one = models.load(checkpoint, dtype="bfloat16", quantize=quantize, device=GPUS[0], progress=False)
    two = models.load(checkpoint, dtype="bfloat16", quantize=quantize, devices=GPUS, progress=False)
    prompt = np.arange(1, 17, dtype=np.int32)[None]
    caches = [m.make_cache(1, 64) for m in (one, two)]
    for m, cache in zip((one, two), caches): m(prompt, cache=cache)
    token, launched = np.array([[5]], dtype=np.int32), []
    for _ in range(4):
        want = logits_of(one(token, cache=caches[0]))[0]
        with record_launches() as launches:   # the split model's own (its jitted step's capture)
            got = logits_of(two(token, cache=caches[1]))[0]
        launched += [name for name, _ in launches]
        assert_rows_close("a decode step over 2 GPUs", got, want, TOL[dtypes.bfloat16])
        token = want.argmax(-1).reshape(1, 1).astype(np.int32)
    assert any(name.startswith("nuvec_sdpa_decode") for name in launched)
