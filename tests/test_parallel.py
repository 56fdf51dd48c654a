"""Tensor-parallel models (`models.load(..., devices=...)`, `models.parallel`) on tinygrad's virtual
multi-device CPU (two CPU devices): the fixtures split over two devices give transformers' logits
(Qwen3, Qwen3 with tied embeddings and YaRN, Gemma 3, Qwen3-MoE with its experts entry by entry
and sorted, gpt-oss) and mlx-lm's (its 4-bit Qwen3), transformers' logits from a cached prefill
then single steps, and transformers' greedy tokens for a left-padded batch and from the serving
engine; the fused weights are
laid out as the split promises (each device its slice of every module); the linear-attention
families, sizes that do not split and bad device arguments raise before any weight moves;
`generate --devices 2`; a kernel launched over several devices running on each device's buffer."""
from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pytest
from tinygrad import Device, Tensor

from nuvec_tg import models
from nuvec_tg.models import layers, parallel
from nuvec_tg.quant import QuantizedWeight
from reference import assert_rows_close
from test_models import CACHE_LENGTH, TOL, fixture, logits_of, model, reference

DEVICES = ("CPU:0", "CPU:1")
CANONICAL = tuple(Device.canonicalize(d) for d in DEVICES)   # ("CPU", "CPU:1")
DEVICES4 = ("CPU:0", "CPU:1", "CPU:2", "CPU:3")


def sharded(name: str, **options) -> models.Model:
    """A fixture split over DEVICES, loaded once (`test_models.model`'s store)."""
    return model(name, devices=DEVICES, **options)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_tied", "qwen3_rope_yarn", "gemma3", "qwen3_moe", "gpt_oss",
                                  "qwen3_next", "qwen3_5"])
def test_a_sharded_fixture_gives_transformers_logits(name):
    """Every family; Qwen3-Next and Qwen3.5 with their one key-value head copied to both devices
    (a query head each) and their DeltaNet's two key heads split."""
    ref = reference(name)
    got = logits_of(sharded(name)(ref["prompt_1"][None]))[0]
    assert_rows_close(f"{name} over 2 devices", got, ref["logits_1"], TOL)


def test_more_devices_than_key_value_heads_copy_each_to_its_query_heads_devices():
    """Qwen3's 2 key-value heads over 4 devices: a query head a device, with a copy of its
    key-value head (the cache holds one head a device)."""
    ref = reference("qwen3")
    m = model("qwen3", devices=DEVICES4)
    assert (m.layers[0].attention.heads, m.layers[0].attention.kv_heads) == (1, 1)
    got = logits_of(m(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3 over 4 devices", got, ref["logits_1"], TOL)


def test_a_sharded_mlx_quantized_checkpoint_gives_mlx_lms_logits():
    """mlx-lm's 4-bit conversion split as stored (codes, scales and biases by row, or by K in
    whole groups)."""
    ref = reference("qwen3_mlx4")
    m = sharded("qwen3_mlx4", dtype="float32")
    down = m.layers[0].mlp.down.weights[0]
    assert isinstance(down, QuantizedWeight) and down.weight.device == down.scales.device == CANONICAL
    got = logits_of(m(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3_mlx4 over 2 devices", got, ref["logits_1"], TOL)


def moes(m: models.Model) -> list[layers.MoE]:
    return [block.mlp for block in m.layers if isinstance(block.mlp, layers.MoE)]


def test_experts_whose_columns_do_not_split_go_whole_to_the_devices(monkeypatch):
    """mlx-lm's 4-bit Qwen3-MoE: its experts' K (32) is one group of 64, so the 4 experts go two
    to each device (expert parallelism), entry by entry and sorted by expert."""
    ref = reference("qwen3_moe_mlx4")
    m = sharded("qwen3_moe_mlx4", dtype="float32")
    assert moes(m) and all(moe.local_experts == 2 for moe in moes(m))
    assert np.array_equal(each_device(moes(m)[0].first_expert).ravel(), [0, 2])
    assert moes(m)[0].gate_up.weights[0].weight.shape[0] == 2
    got = logits_of(m(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3_moe_mlx4 over 2 devices", got, ref["logits_f32_1"], TOL)
    monkeypatch.setattr(layers, "SORT_ENTRIES", 1)
    got = logits_of(m(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3_moe_mlx4 sorted over 2 devices", got, ref["logits_f32_1"], TOL)


def test_many_experts_go_whole_to_the_devices(monkeypatch):
    """gpt-oss's experts whole to the devices (the rule's count lowered to the fixture's 2 a
    device), their biases with them: transformers' logits."""
    ref = reference("gpt_oss")
    monkeypatch.setattr(parallel, "WHOLE_EXPERTS", 2)
    m = models.load(fixture("gpt_oss"), progress=False, devices=DEVICES)
    assert all(moe.local_experts == 2 and moe.down.bias.shape[0] == 2 for moe in moes(m))
    got = logits_of(m(ref["prompt_1"][None]))[0]
    assert_rows_close("gpt_oss, whole experts over 2 devices", got, ref["logits_1"], TOL)


def test_sharded_experts_sorted_by_expert_give_transformers_logits(monkeypatch):
    """The experts' sorted path (the threshold lowered so that the 11-token prompt takes it) over
    a bank split by its columns."""
    ref = reference("qwen3_moe")
    monkeypatch.setattr(layers, "SORT_ENTRIES", 1)
    got = logits_of(sharded("qwen3_moe")(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3_moe sorted over 2 devices", got, ref["logits_1"], TOL)


def each_device(t: Tensor) -> np.ndarray:
    """A per-device tensor's buffers (`parallel.per_device`), `[devices, ...]`."""
    return Tensor(t.reshape(1, *t.shape).uop.unshard(0)).numpy()


def test_the_split_gives_each_device_whole_heads_and_its_gate_and_up_columns():
    """A fused weight's rows are reordered so that device i's slice is its slice of every module
    (`[q_i; k_i; v_i]`, `[gate_i; up_i]`), which the split along rows then hands it: each device
    holds a buffer of its own rows (or columns of o and down, and the o bias on the first device
    alone; the head's vocabulary), the layers a device's sizes; the norms are copied to every device."""
    rows = Tensor(np.arange(12).reshape(12, 1), device="CPU")
    order = parallel._interleaved(rows, [4, 4, 4], 2).numpy().ravel()
    assert list(order) == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    order = parallel._interleaved(rows, [8, 2, 2], 2).numpy().ravel()
    assert list(order) == [0, 1, 2, 3, 8, 10, 4, 5, 6, 7, 9, 11]
    one, m = model("gpt_oss"), sharded("gpt_oss")
    whole, block = one.layers[0].attention, m.layers[0].attention
    assert (block.heads, block.kv_heads) == (whole.heads // 2, whole.kv_heads // 2)
    assert block.qkv.outs == [o // 2 for o in whole.qkv.outs] and block.o.reduce and not whole.o.reduce
    qkv = whole.qkv.weights[0].numpy()
    q, k, v = np.split(qkv, np.cumsum(whole.qkv.outs)[:-1])
    for i, device_rows in enumerate(each_device(block.qkv.weights[0])):
        mine = [np.split(module, 2)[i] for module in (q, k, v)]
        assert np.array_equal(device_rows, np.concatenate(mine))
    o_columns = np.split(whole.o.weights[0].numpy(), 2, axis=1)
    assert all(np.array_equal(got, want) for got, want in zip(each_device(block.o.weights[0]), o_columns))
    bias = each_device(block.o.bias)
    assert np.array_equal(bias[0], whole.o.bias.numpy()) and not bias[1].any()
    assert np.array_equal(each_device(block.sinks.value).ravel(), whole.sinks.value.numpy())
    head_rows = np.split(one.head.weights[0].numpy(), 2)   # the head by vocabulary, gathered by `owned`
    assert all(np.array_equal(got, want) for got, want in zip(each_device(m.head.weights[0]), head_rows))
    assert np.array_equal(each_device(m.head.owned), np.repeat(np.eye(2, dtype=bool), 64, axis=1))
    for t in (block.qkv.weights[0], block.o.weights[0], m.layers[0].input_norm.weight, m.norm.weight):
        assert t.device == CANONICAL
    assert all(np.array_equal(w, m.norm.weight.numpy()) for w in each_device(m.norm.weight))
    assert m.device == CANONICAL


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss", "qwen3_5"])   # gpt-oss: sinks, a window of 4, experts; Qwen3.5: states
def test_a_cached_prefill_then_steps_give_transformers_logits(name):
    ref = reference(name)
    tokens = ref["sequence_1"][None]
    want = ref["sequence_logits_1"]
    m = sharded(name)
    cache = m.make_cache(1, CACHE_LENGTH)
    assert cache.buffers()[0].device == CANONICAL
    got = [logits_of(m(tokens[:, :11], cache=cache))[0]]
    got += [logits_of(m(tokens[:, i:i + 1], cache=cache))[0] for i in range(11, tokens.shape[1])]
    assert_rows_close("prefill then steps over 2 devices", np.concatenate(got), want, TOL)


def test_greedy_generation_of_a_padded_batch_over_two_devices_gives_transformers_tokens():
    ref = reference("qwen3")
    prompts = [list(ref["prompt_0"]), list(ref["prompt_1"])]
    steps = list(sharded("qwen3").generate_tokens(prompts, max_tokens=8, stop_tokens=()))
    for b, key in enumerate(("greedy_0", "greedy_1")):
        assert [step[b] for step in steps] == list(ref[key])


def test_the_serving_engine_over_two_devices_gives_transformers_tokens():
    """`models.Engine` over a split model (its paged pools split by key-value head): a prompt
    prefilled, then decoded through the paged cache; and Qwen3.5's two requests at once, its
    DeltaNet state pools a device's heads, each new sequence's rows cleared on every device."""
    from test_paged_models import served
    ref = reference("qwen3")
    engine = models.Engine(sharded("qwen3"), max_sequences=1, max_length=32, prefill_chunk=16)
    request = engine.submit(ref["prompt_1"].tolist(), max_tokens=4, stop_tokens=())
    np.testing.assert_array_equal(served(engine)[request], ref["greedy_1"][:4])
    assert engine.cache.buffers()[0].device == CANONICAL
    ref = reference("qwen3_5")
    engine = models.Engine(sharded("qwen3_5"), max_sequences=2, max_length=32, prefill_chunk=16)
    requests = [engine.submit(ref[f"prompt_{i}"].tolist(), max_tokens=4, stop_tokens=()) for i in (1, 0)]
    tokens = served(engine)
    for request, key in zip(requests, ("greedy_1", "greedy_0")): np.testing.assert_array_equal(tokens[request], ref[key][:4])


def test_each_layer_spreads_as_it_is_read(monkeypatch):
    """The loader hands each layer object to the plan as it reads it, and the plan spreads it then:
    the model never lies whole on the first device."""
    placed = []
    original = parallel.Plan.place

    def place(plan, part):
        original(plan, part)
        placed.append({t.device for t in part.parameters()})
    monkeypatch.setattr(parallel.Plan, "place", place)
    models.load(fixture("qwen3"), progress=False, devices=DEVICES)
    assert len(placed) > 10 and all(devices == {CANONICAL} for devices in placed)


def test_what_cannot_be_split_raises_before_any_weight_moves():
    with pytest.raises(ValueError, match="layer 0: 2 key heads of a gated DeltaNet do not split over 4 devices"):
        models.load(fixture("qwen3_next"), progress=False, devices=DEVICES4)
    with pytest.raises(ValueError, match="layer 0: 4 query heads do not split over 3 devices"):
        models.load(fixture("qwen3"), progress=False, devices=DEVICES4[:3])
    parts = {"layers": [copy.copy(block) for block in model("qwen3_moe_mlx4").layers]}
    moe = parts["layers"][1].mlp = copy.copy(parts["layers"][1].mlp)
    moe.router = copy.copy(moe.router)
    moe.router.outs = [3]   # 3 experts, whose K (32) is one group of 64
    assert parallel.unsupported(parts, DEVICES) == \
        "layer 1: down's 1 groups of K do not split over 2 devices, and 3 experts do not split over them"
    with pytest.raises(ValueError, match="device or devices, not both"):
        models.load(fixture("qwen3"), progress=False, device="CPU", devices=DEVICES)
    with pytest.raises(ValueError, match="at least two distinct devices"):
        models.load(fixture("qwen3"), progress=False, devices=("CPU:0",))
    with pytest.raises(TypeError, match="tuple of device names"):
        models.random_model({"model_type": "qwen3"}, devices="CPU")
    assert parallel.check_devices("x", ["CPU:0", "CPU:1"]) == DEVICES


def test_the_command_generates_over_two_devices():
    from nuvec_tg import generate
    ref = reference("qwen3")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        generate.main(["--model", str(fixture("qwen3")), "--prompt", str(ref["prompt_text_0"]), "--max-tokens", "8",
                       "--devices", "2"])
    text = sharded("qwen3").tokenizer.decode(ref["greedy_0"].tolist())   # greedy_0 holds no stop token
    assert out.getvalue().startswith(text + "\n")
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("devices: CPU") and ", CPU:1" in last


def test_a_kernel_runs_on_each_devices_buffer_and_refuses_a_tensor_split_by_an_axis():
    """`launch` over several devices runs the program on each over that device's buffer (a
    per-device tensor's, of the shard's shape: here 4 of 8 elements each); a tensor split by an
    axis, whose shape is the whole tensor's, is refused. Kernels take several devices inside
    `kernels.per_device()` alone."""
    from nuvec_tg import kernels
    from nuvec_tg.kernels.program import Param, int_buffer, launch
    from reference import stand_in_program
    params = (Param("y", "out", "float"), Param("x", "in", "float"), Param("n", "in", "int"))
    program = stand_in_program("stand_in_per_device", params, "for (int i = 0; i < n[0]; i++) y[i] = 2.0f * x[i] + 1.0f;")
    split = Tensor(np.arange(8, dtype=np.float32), device="CPU").shard(DEVICES, axis=0).realize()
    x = parallel.per_device(split)
    assert x.shape == (4,) and x.device == CANONICAL
    out = launch(program, x.device, [Tensor.empty(4, device=x.device)], [x, int_buffer(x.device, (4,))], (1, 1, 1), 1)[0]
    assert np.array_equal(each_device(out).ravel(), 2 * np.arange(8, dtype=np.float32) + 1)
    with pytest.raises(ValueError, match="not split by an axis"):
        launch(program, split.device, [Tensor.empty(8, device=split.device)], [split, int_buffer(x.device, (8,))], (1, 1, 1), 1)
    assert kernels.kernel_backend(("CUDA:0", "CUDA:1")) is None
    with kernels.per_device():
        assert kernels.kernel_backend(("CUDA:0", "CUDA:1")) == "cuda" and kernels.kernel_backend(("CUDA", "METAL")) is None
        assert kernels.target(("CUDA:0", "CUDA:1")).backend == "cuda"
    assert kernels.target(("CUDA:0", "CUDA:1")).backend is None
