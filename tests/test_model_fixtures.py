"""Sanity of the model fixtures in tests/data/models/ (written by scripts/make_model_fixtures.py),
checked without the models package: configs parse and say what each fixture is meant to
exercise, the safetensors files hold exactly the tensors the config implies with those shapes
(read with tinygrad's `safe_load`), every parameter is random, the references agree with each
other (the greedy tokens are the argmax of the recorded logits, the prompt's logits are the
prefix of the sequence's), and the tokenizer encodes the recorded prompts.
"""
import json
import pathlib

import numpy as np
import pytest
from tinygrad.nn.state import safe_load

MODELS = pathlib.Path(__file__).resolve().parent / "data" / "models"
VOCAB_SIZE = 128
NEW_TOKENS = 8
PROMPT_LENGTHS = (5, 11)

# fixture -> (model_type, architecture, full references: greedy runs and a stop run)
FIXTURES = {
    "qwen3": ("qwen3", "Qwen3ForCausalLM", True),
    "qwen3_tied": ("qwen3", "Qwen3ForCausalLM", True),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", True),
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM", True),
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", True),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", True),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", True),
    "qwen3_rope_linear": ("qwen3", "Qwen3ForCausalLM", False),
    "qwen3_rope_yarn": ("qwen3", "Qwen3ForCausalLM", False),
}
MLX_FIXTURES = {"qwen3_mlx4": "qwen3", "qwen3_moe_mlx4": "qwen3_moe"}


def config_of(name):
    return json.loads((MODELS / name / "config.json").read_text())


def tensors_of(name):
    """{tensor name: tinygrad Tensor on the DISK device} over every safetensors file of the
    fixture; for a sharded one, also checks that the index names the file each tensor is in."""
    directory = MODELS / name
    index_path = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").exists():
        return safe_load(directory / "model.safetensors")
    weight_map = json.loads(index_path.read_text())["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        loaded = safe_load(directory / shard)
        assert all(weight_map[key] == shard for key in loaded), f"{name}: index disagrees with {shard}"
        tensors.update(loaded)
    assert set(tensors) == set(weight_map)
    return tensors


def _attention(prefix, c, gated=False, bias=False):
    """q/k/v/o shapes ([out, in], as nn.Linear stores them) of one attention layer."""
    heads, kv_heads, head_dim, hidden = (c["num_attention_heads"], c["num_key_value_heads"],
                                         c["head_dim"], c["hidden_size"])
    shapes = {f"{prefix}.q_proj.weight": (heads * head_dim * (2 if gated else 1), hidden),
              f"{prefix}.k_proj.weight": (kv_heads * head_dim, hidden),
              f"{prefix}.v_proj.weight": (kv_heads * head_dim, hidden),
              f"{prefix}.o_proj.weight": (hidden, heads * head_dim)}
    if bias:
        shapes.update({f"{prefix}.q_proj.bias": (heads * head_dim,), f"{prefix}.k_proj.bias": (kv_heads * head_dim,),
                       f"{prefix}.v_proj.bias": (kv_heads * head_dim,), f"{prefix}.o_proj.bias": (hidden,)})
    return shapes


def _mlp(prefix, hidden, intermediate):
    return {f"{prefix}.gate_proj.weight": (intermediate, hidden), f"{prefix}.up_proj.weight": (intermediate, hidden),
            f"{prefix}.down_proj.weight": (hidden, intermediate)}


def _sparse(c, i):
    """Whether layer i of a Qwen MoE config has the sparse block (transformers' rule)."""
    experts = c.get("num_experts", c.get("num_local_experts"))
    return i not in c["mlp_only_layers"] and experts > 0 and (i + 1) % c["decoder_sparse_step"] == 0


def _linear_attention(prefix, c, fused):
    """Gated delta layer shapes: Qwen3-Next's fused qkvz/ba projections or Qwen3.5's separate ones."""
    hidden, k_heads, v_heads = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    key_dim, value_dim = k_heads * c["linear_key_head_dim"], v_heads * c["linear_value_head_dim"]
    shapes = {f"{prefix}.conv1d.weight": (2 * key_dim + value_dim, 1, c["linear_conv_kernel_dim"]),
              f"{prefix}.A_log": (v_heads,), f"{prefix}.dt_bias": (v_heads,),
              f"{prefix}.norm.weight": (c["linear_value_head_dim"],),
              f"{prefix}.out_proj.weight": (hidden, value_dim)}
    if fused:
        shapes[f"{prefix}.in_proj_qkvz.weight"] = (2 * key_dim + 2 * value_dim, hidden)
        shapes[f"{prefix}.in_proj_ba.weight"] = (2 * v_heads, hidden)
    else:
        shapes[f"{prefix}.in_proj_qkv.weight"] = (2 * key_dim + value_dim, hidden)
        shapes[f"{prefix}.in_proj_z.weight"] = (value_dim, hidden)
        shapes[f"{prefix}.in_proj_b.weight"] = (v_heads, hidden)
        shapes[f"{prefix}.in_proj_a.weight"] = (v_heads, hidden)
    return shapes


def expected_shapes(c):
    """Every tensor a checkpoint of config `c` holds, by transformers' module layout."""
    hidden, vocab, kind = c["hidden_size"], c["vocab_size"], c["model_type"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
        layer_type = c.get("layer_types", ["full_attention"] * c["num_hidden_layers"])[i]
        if layer_type == "linear_attention":
            shapes.update(_linear_attention(f"{layer}.linear_attn", c, fused=kind == "qwen3_next"))
        else:
            gated = kind in ("qwen3_next", "qwen3_5_text")
            shapes.update(_attention(f"{layer}.self_attn", c, gated=gated, bias=kind == "gpt_oss"))
            if kind != "gpt_oss":
                shapes[f"{layer}.self_attn.q_norm.weight"] = (c["head_dim"],)
                shapes[f"{layer}.self_attn.k_norm.weight"] = (c["head_dim"],)
        if kind == "gemma3_text":
            shapes[f"{layer}.pre_feedforward_layernorm.weight"] = (hidden,)
            shapes[f"{layer}.post_feedforward_layernorm.weight"] = (hidden,)
        if kind == "gpt_oss":
            experts, inter = c["num_local_experts"], c["intermediate_size"]
            shapes.update({f"{layer}.self_attn.sinks": (c["num_attention_heads"],),
                           f"{layer}.mlp.router.weight": (experts, hidden), f"{layer}.mlp.router.bias": (experts,),
                           f"{layer}.mlp.experts.gate_up_proj": (experts, hidden, 2 * inter),
                           f"{layer}.mlp.experts.gate_up_proj_bias": (experts, 2 * inter),
                           f"{layer}.mlp.experts.down_proj": (experts, inter, hidden),
                           f"{layer}.mlp.experts.down_proj_bias": (experts, hidden)})
        elif kind in ("qwen3_moe", "qwen3_next") and _sparse(c, i):
            experts = c.get("num_experts", c.get("num_local_experts"))
            shapes[f"{layer}.mlp.gate.weight"] = (experts, hidden)
            for e in range(experts):
                shapes.update(_mlp(f"{layer}.mlp.experts.{e}", hidden, c["moe_intermediate_size"]))
            if kind == "qwen3_next":
                shapes.update(_mlp(f"{layer}.mlp.shared_expert", hidden, c["shared_expert_intermediate_size"]))
                shapes[f"{layer}.mlp.shared_expert_gate.weight"] = (1, hidden)
        else:
            shapes.update(_mlp(f"{layer}.mlp", hidden, c["intermediate_size"]))
    return shapes


@pytest.mark.parametrize("name", FIXTURES)
def test_config_says_what_the_fixture_exercises(name):
    model_type, architecture, _ = FIXTURES[name]
    c = config_of(name)
    assert (c["model_type"], c["architectures"], c["vocab_size"]) == (model_type, [architecture], VOCAB_SIZE)
    assert c["hidden_size"] % 64 == 0
    generation = json.loads((MODELS / name / "generation_config.json").read_text())
    stops = generation["eos_token_id"]
    assert isinstance(stops, list) and len(stops) >= 2 and all(0 <= t < VOCAB_SIZE for t in stops)
    if name == "qwen3":
        assert not (MODELS / name / "model.safetensors").exists()
        assert sorted(p.name for p in (MODELS / name).glob("*.safetensors")) == [
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    if name in ("qwen3_tied", "gemma3"):
        assert c["tie_word_embeddings"] is True
    if name == "qwen3_moe":
        assert c["num_local_experts"] == 4 and c["num_experts_per_tok"] == 2 and c["norm_topk_prob"]
        assert [_sparse(c, i) for i in range(c["num_hidden_layers"])] == [False, True]
    if name in ("qwen3_next", "qwen3_5"):
        assert c["layer_types"] == ["linear_attention", "full_attention"]
        assert c["rope_parameters"]["partial_rotary_factor"] == 0.25
    if name == "qwen3_next":
        assert [_sparse(c, i) for i in range(c["num_hidden_layers"])] == [True, False]
    if name == "gemma3":
        window = c["sliding_window"]
        assert set(c["layer_types"]) == {"sliding_attention", "full_attention"} and window < min(PROMPT_LENGTHS)
        assert c["query_pre_attn_scalar"] != c["head_dim"] and c["final_logit_softcapping"] is not None
        rope = c["rope_parameters"]
        assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]
    if name == "gpt_oss":
        assert c["layer_types"] == ["sliding_attention", "full_attention"] and c["sliding_window"] < 5
        assert c["rope_parameters"]["rope_type"] == "yarn" and c["attention_bias"]
    if name.startswith("qwen3_rope_"):
        assert c["rope_parameters"]["rope_type"] == name.removeprefix("qwen3_rope_")


@pytest.mark.parametrize("name", FIXTURES)
def test_tensors_have_the_config_shapes_and_are_random(name):
    c = config_of(name)
    tensors = tensors_of(name)
    assert {key: tuple(t.shape) for key, t in tensors.items()} == expected_shapes(c)
    values = {key: t.to("CPU").numpy() for key, t in tensors.items()}
    one_plus_w = c["model_type"] in ("gemma3_text", "qwen3_next", "qwen3_5_text")
    for key, value in values.items():
        assert value.dtype == np.float32 and np.isfinite(value).all(), key
        assert np.unique(value).size > value.size // 2, f"{key} is not random"
        if key.endswith("norm.weight") and ".linear_attn." not in key:
            # (1 + w) norms store w around 0; the others (and the gated norm) w around 1
            assert abs(value.mean() - (0.0 if one_plus_w else 1.0)) < 0.1, key
            assert 0.03 < value.std() < 0.3, key
    assert 0.02 < values["model.layers.0.input_layernorm.weight"].std()  # norms randomised too


@pytest.mark.parametrize("name", FIXTURES)
def test_references_agree_with_each_other(name):
    reference = np.load(MODELS / name / "reference.npz")
    for i, length in enumerate(PROMPT_LENGTHS):
        prompt, logits = reference[f"prompt_{i}"], reference[f"logits_{i}"]
        assert prompt.dtype == np.int32 and prompt.shape == (length,) and (prompt < VOCAB_SIZE).all()
        assert logits.dtype == np.float32 and logits.shape == (length, VOCAB_SIZE)
        assert np.isfinite(logits).all() and logits.std() > 0.05
        if not FIXTURES[name][2]:
            continue
        greedy, sequence = reference[f"greedy_{i}"], reference[f"sequence_{i}"]
        sequence_logits = reference[f"sequence_logits_{i}"]
        assert greedy.shape == (NEW_TOKENS,) and sequence.tolist() == prompt.tolist() + greedy.tolist()
        assert sequence_logits.shape == (length + NEW_TOKENS, VOCAB_SIZE)
        # causal: the prompt's logits are the prefix of the longer forward's
        np.testing.assert_allclose(sequence_logits[:length], logits, rtol=1e-4, atol=1e-5)
        # greedy: each new token is the argmax of the logits before it, by the recorded margin
        before = sequence_logits[length - 1:-1]
        assert before.argmax(-1).tolist() == greedy.tolist()
        top_two = np.sort(before, axis=-1)[:, -2:]
        np.testing.assert_allclose(top_two[:, 1] - top_two[:, 0], reference[f"greedy_margin_{i}"], rtol=1e-3, atol=1e-5)
        assert reference[f"greedy_margin_{i}"].min() >= 2e-3
    if FIXTURES[name][2]:
        stops = reference["stop_tokens"].tolist()
        generation = json.loads((MODELS / name / "generation_config.json").read_text())
        assert stops == generation["eos_token_id"]
        output = reference["stop_output"].tolist()
        assert 1 <= len(output) <= NEW_TOKENS and output[-1] in stops and not set(output[:-1]) & set(stops)


@pytest.mark.parametrize("name", FIXTURES)
def test_tokenizer_encodes_the_prompts(name):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(MODELS / name / "tokenizer.json"))
    reference = np.load(MODELS / name / "reference.npz")
    assert tokenizer.get_vocab_size() == config_of(name)["vocab_size"]
    for i in range(len(PROMPT_LENGTHS)):
        text = str(reference[f"prompt_text_{i}"])
        assert tokenizer.encode(text).ids == reference[f"prompt_{i}"].tolist()
        assert tokenizer.decode(reference[f"prompt_{i}"].tolist()) == text
    ascii_text = "Hello, world!\nThe 3 cats sat."
    assert tokenizer.decode(tokenizer.encode(ascii_text, add_special_tokens=False).ids) == ascii_text
    tokenizer_config = json.loads((MODELS / name / "tokenizer_config.json").read_text())
    eos_id = tokenizer.token_to_id(tokenizer_config["eos_token"])
    generation = json.loads((MODELS / name / "generation_config.json").read_text())
    assert eos_id in generation["eos_token_id"]
    template = tokenizer_config["chat_template"]
    for stop in generation["eos_token_id"]:  # stop tokens are special: one id each, kept whole
        token = tokenizer.id_to_token(stop)
        assert tokenizer.encode(token, add_special_tokens=False).ids == [stop]
    assert "messages" in template and "add_generation_prompt" in template


def test_chat_template_renders():
    jinja2 = pytest.importorskip("jinja2")
    tokenizer_config = json.loads((MODELS / "qwen3" / "tokenizer_config.json").read_text())
    text = jinja2.Template(tokenizer_config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", MLX_FIXTURES)
def test_mlx_fixture_is_quantized_as_mlx_writes_it(name):
    c = config_of(name)
    quantization = c["quantization"]
    assert (quantization["group_size"], quantization["bits"], quantization["mode"]) == (32, 4, "affine")
    tensors = tensors_of(name)
    source = config_of(MLX_FIXTURES[name])
    assert c["hidden_size"] == source["hidden_size"] and "rope_theta" in c  # transformers 4's keys
    packed = [key.removesuffix(".weight") for key, t in tensors.items() if str(t.dtype) == "dtypes.uint"]
    assert "model.embed_tokens" in packed and "lm_head" in packed
    for module in packed:
        weight, scales = tensors[f"{module}.weight"], tensors[f"{module}.scales"]
        override = quantization.get(module, {})
        bits, group_size = override.get("bits", 4), override.get("group_size", 32)
        assert tensors[f"{module}.biases"].shape == scales.shape
        in_features = weight.shape[-1] * 32 // bits
        assert scales.shape == weight.shape[:-1] + (in_features // group_size,), module
    reference = np.load(MODELS / name / "reference.npz")
    float_reference = np.load(MODELS / MLX_FIXTURES[name] / "reference.npz")
    for i, length in enumerate(PROMPT_LENGTHS):
        assert reference[f"prompt_{i}"].tolist() == float_reference[f"prompt_{i}"].tolist()
        for key in (f"logits_{i}", f"logits_f32_{i}"):
            assert reference[key].shape == (length, VOCAB_SIZE) and np.isfinite(reference[key]).all()
        # 4-bit weights move the logits, but they stay those of the same model
        correlation = np.corrcoef(reference[f"logits_f32_{i}"].ravel(), float_reference[f"logits_{i}"].ravel())[0, 1]
        assert correlation > 0.9


def test_fixtures_stay_small():
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total < 3 * 1024 * 1024
    listed = (MODELS / "README.md").read_text()
    for name in [*FIXTURES, *MLX_FIXTURES]:
        assert f"`{name}`" in listed, f"{name} is not described in tests/data/models/README.md"
