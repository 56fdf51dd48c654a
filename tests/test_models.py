"""nuvec_tg.models on the CPU in float32 against the tiny checkpoints of tests/data/models/
(scripts/make_model_fixtures.py): transformers' logits for the full forward, the same logits from
a cached prefill of several lengths then jitted single steps, transformers' greedy tokens (one
prompt and a left-padded batch), the stop tokens, mlx-lm's logits for its 4-bit conversions and
MLX's own quantized tensors for quantize= at load, the rope scalings, and the loader's errors.

tinygrad compiles every new shape on the CPU, so models are loaded once per module and the tests
reuse a few shapes (prompt lengths 5 and 11 and one cache length).
"""
from __future__ import annotations

import contextlib
import io
import json
import pathlib
import re
import shutil

import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from tinygrad.nn.state import safe_load, safe_save

from nuvec_tg import models, quant
from nuvec_tg.models import layers
from nuvec_tg.models.model import StepInput
from nuvec_tg.models.sampling import Sampler
from nuvec_tg.quant import QuantizedWeight
from reference import assert_rows_close

MODELS = pathlib.Path(__file__).resolve().parent / "data" / "models"
TOL = 1e-4          # float32 against transformers' float32, relative to each row's largest logit
CACHE_LENGTH = 256  # what generate allocates for these prompts: its kernels are shared


def fixture(name: str) -> pathlib.Path:
    directory = MODELS / name
    if not directory.is_dir(): pytest.skip(f"fixture tests/data/models/{name} is absent (scripts/make_model_fixtures.py)")
    return directory


def reference(name: str):
    return np.load(fixture(name) / "reference.npz")


_loaded: dict[tuple, models.Model] = {}


def model(name: str, **options) -> models.Model:
    """A loaded fixture, shared across the module's tests (each new model compiles its shapes)."""
    key = (name, tuple(sorted((k, str(v)) for k, v in options.items())))
    if key not in _loaded: _loaded[key] = models.load(fixture(name), progress=False, **options)
    return _loaded[key]


def logits_of(t: Tensor) -> np.ndarray:
    return t.cast(dtypes.float32).numpy()


# ---- transformers' logits ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "qwen3_tied", "gemma3", "gpt_oss", "qwen3_next", "qwen3_5"])
def test_the_full_forward_matches_transformers(name):
    ref = reference(name)
    got = logits_of(model(name)(ref["prompt_1"][None]))[0]
    assert_rows_close(f"{name} logits", got, ref["logits_1"], TOL)


@pytest.mark.parametrize("name", ["qwen3_rope_linear", "qwen3_rope_yarn"])
def test_rope_scalings_match_transformers(name):
    ref = reference(name)
    got = logits_of(model(name)(ref["prompt_1"][None]))[0]
    assert_rows_close(f"{name} logits", got, ref["logits_1"], TOL)


def test_the_full_forward_matches_transformers_with_tinygrads_optimizations(optimized):
    """The suite compiles tinygrad's kernels without its hand-coded optimizations (conftest);
    a user's programs have them: the same logits with them on."""
    ref = reference("qwen3")
    got = logits_of(model("qwen3")(ref["prompt_1"][None]))[0]
    assert_rows_close("qwen3 logits (optimized)", got, ref["logits_1"], TOL)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "gemma3", "gpt_oss", "qwen3_next", "qwen3_5"])   # gemma3, gpt_oss: 19 tokens over a window of 4
def test_a_prefill_then_single_steps_match_the_full_forward(name):
    ref, m = reference(name), model(name)
    sequence, want = ref["sequence_1"], ref["sequence_logits_1"]
    cache = m.make_cache(1, CACHE_LENGTH)
    assert_rows_close("prefill", logits_of(m(sequence[None, :11], cache=cache))[0], want[:11], TOL)
    for i in range(11, len(sequence)):
        assert_rows_close(f"step {i}", logits_of(m(sequence[None, i:i + 1], cache=cache))[0], want[i:i + 1], TOL)
    assert cache.position == len(sequence)
    step = cache.steps["logits"]
    assert step.captured is not None and step.cnt == len(sequence) - 11, "the decode steps did not replay one jitted step"


@pytest.mark.parametrize("name, length", [("qwen3", 4), ("qwen3_next", 11), ("qwen3_5", 11)])
def test_prefills_of_several_lengths_continue_the_cache(name, length):
    """One token (the jitted step), then `length` at row 1, then single steps. A hybrid's prefill
    continues its linear-attention state from the step's; its 11 tokens are the other tests'
    prefill length, whose programs are compiled already."""
    ref, m = reference(name), model(name)
    sequence, want = ref["sequence_0"], ref["sequence_logits_0"]
    cache = m.make_cache(1, CACHE_LENGTH)
    assert_rows_close("first token", logits_of(m(sequence[None, :1], cache=cache))[0], want[:1], TOL)
    rows = slice(1, 1 + length)
    assert_rows_close(f"{length} more", logits_of(m(Tensor(sequence[None, rows]), cache=cache))[0], want[rows], TOL)
    for i in range(1 + length, len(sequence)):
        assert_rows_close(f"step {i}", logits_of(m(sequence[None, i:i + 1], cache=cache))[0], want[i:i + 1], TOL)
    with pytest.raises(ValueError, match="do not fit a cache of 256"):
        m(np.zeros((1, CACHE_LENGTH), dtype=np.int32), cache=cache)


# ---- generation -------------------------------------------------------------------------------

# qwen3_5 for the hybrids: their padding is the DeltaNet's (the same for both), and a batch of two
# compiles every program anew (qwen3_next's experts too)
@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "qwen3_5"])
def test_greedy_generation_of_a_padded_batch_matches_transformers(name):
    ref = reference(name)
    prompts = [ref["prompt_0"].tolist(), ref["prompt_1"].tolist()]   # 5 and 11 tokens: the first left-padded
    steps = list(model(name).generate_tokens(prompts, max_tokens=8, stop_tokens=()))
    got = np.array(steps).T
    np.testing.assert_array_equal(got[0], ref["greedy_0"])
    np.testing.assert_array_equal(got[1], ref["greedy_1"])


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])   # qwen3_5: a linear-attention state to empty too
def test_a_second_generation_reuses_the_cache_and_its_jitted_step(name):
    """Generations of one shape share a cache, emptied between them: the same tokens as the
    first (transformers' greedy ones), the decode step replayed without a new capture; the same
    for a padded batch (its padding written into the same buffer). A generation started while
    another is under way gets a cache of its own, and neither disturbs the other."""
    ref, m = reference(name), model(name)
    prompts = [[ref["prompt_1"].tolist()], [ref["prompt_0"].tolist(), ref["prompt_1"].tolist()]]
    wants = [[ref["greedy_1"]], [ref["greedy_0"], ref["greedy_1"]]]
    for prompt, want in zip(prompts, wants):
        caches, steps = [], []
        for _ in range(2):
            got = np.array(list(m.generate_tokens(prompt, max_tokens=8, stop_tokens=()))).T
            for row, expected in zip(got, want): np.testing.assert_array_equal(row, expected)
            caches.append(m._generation_cache)
            steps.append((caches[-1].steps["chained"], caches[-1].steps["chained"].cnt))
        assert caches[0] is caches[1] and steps[0][0] is steps[1][0] and steps[1][1] == steps[0][1] + 7
    unfinished = m.generate_tokens(prompts[1], max_tokens=8, stop_tokens=())
    first = next(unfinished)
    got = np.array(list(m.generate_tokens(prompts[1], max_tokens=8, stop_tokens=()))).T
    assert m._generation_cache is caches[0] and got.tolist() == [w.tolist() for w in wants[1]]
    rest = np.array([first, *unfinished]).T
    assert rest.tolist() == [w.tolist() for w in wants[1]]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_prompts_of_one_bucket_share_a_prefill(name):
    """An attention-only model prefills a generation's last prompt chunk as a multiple of
    PREFILL_BUCKET rows (junk after the prompt), so prompts of different lengths replay one jitted
    prefill, with the tokens of each prompt prefilled alone at its own length (`model(tokens,
    cache)`, every row exact); a hybrid (qwen3_5: a recurrent state the junk would enter) keeps
    one prefill a length."""
    from nuvec_tg.models.model import PREFILL_BUCKET
    m = model(name)
    rng = np.random.default_rng(0x5B)
    lengths = (3, 17, 40) if name == "qwen3" else (3, 17)   # a hybrid compiles each length: two say it
    for length in lengths:
        prompt = rng.integers(0, 200, length).tolist()
        got = [step[0] for step in m.generate_tokens([prompt], max_tokens=4, stop_tokens=())]
        cache = m.make_cache(1, 64)
        want = [int(m(np.array([prompt]), cache)[0, -1].argmax().item())]
        for _ in range(3): want.append(int(m(np.array([[want[-1]]]), cache)[0, -1].argmax().item()))
        assert got == want, length
    keys = sorted(m._generation_cache.prefills)
    assert keys == ([(0, PREFILL_BUCKET, "last")] if name == "qwen3" else [(0, n, "last") for n in lengths]), keys


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "gpt_oss", "qwen3_5"])   # qwen3_5: one hybrid, its 25-token prompt compiles anew
def test_a_stop_token_stops_generation(name):
    ref = reference(name)
    steps = list(model(name).generate_tokens([ref["stop_prompt"].tolist()], max_tokens=8))
    got = [s[0] for s in steps]
    assert got == ref["stop_output"].tolist()
    assert got[-1] in ref["stop_tokens"].tolist() and len(got) < 8
    assert set(model(name).eos_token_ids) == set(ref["stop_tokens"].tolist())


def test_gemma3_greedy_generation_matches_transformers():
    """One prompt (11 tokens, past the window of 4): its prefill and greedy step are the kernels the
    cache and stop-token tests compile."""
    ref = reference("gemma3")
    steps = list(model("gemma3").generate_tokens([ref["prompt_1"].tolist()], max_tokens=8, stop_tokens=()))
    np.testing.assert_array_equal([s[0] for s in steps], ref["greedy_1"])


def test_gemma3_tokenizer_prepends_bos_and_its_chat_template():
    ref, m = reference("gemma3"), model("gemma3")
    assert m.tokenizer.encode(str(ref["prompt_text_1"])) == ref["prompt_1"].tolist()
    assert ref["prompt_1"][0] == m.config.get("bos_token_id")
    text = m.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_gpt_oss_greedy_generation_matches_transformers():
    """One sequence: the prefill test's shapes, compiled already (the padded batch's path, the
    same for every family, is the Qwen families' test)."""
    ref = reference("gpt_oss")
    steps = list(model("gpt_oss").generate_tokens([ref["prompt_1"].tolist()], max_tokens=8, stop_tokens=()))
    np.testing.assert_array_equal(np.array(steps)[:, 0], ref["greedy_1"])


def test_a_random_gpt_oss_from_its_config_runs():
    """`random_model` from the fixture's config: the sinks, the router's bias and the fused, biased
    expert banks are made with the shapes asked for (a random checkpoint has only those), and the
    forward (the full-forward test's kernels) gives finite logits."""
    config = json.loads((fixture("gpt_oss") / "config.json").read_text())
    m = models.random_model(config, dtype="float32", device="CPU")
    assert m.layers[0].attention.sinks.value.shape == (4,) and m.layers[0].mlp.gate_up.bias.shape == (4, 64)
    logits = logits_of(m(reference("gpt_oss")["prompt_1"][None]))
    assert logits.shape == (1, 11, 128) and np.isfinite(logits).all() and logits.std() > 0


def test_text_generation_streams_the_greedy_text():
    ref, m = reference("qwen3"), model("qwen3")
    text = str(ref["prompt_text_0"])
    assert m.tokenizer.encode(text) == ref["prompt_0"].tolist()
    pieces = list(m.generate(text, max_tokens=8, stop_tokens=()))
    assert "".join(pieces) == m.tokenizer.decode(ref["greedy_0"].tolist())
    stats = m.last_generation
    assert (stats.prompt_tokens, stats.generated_tokens) == (5, 8) and stats.generation_tps > 0


def test_the_command_prints_the_text_and_the_speeds():
    from nuvec_tg import generate
    ref = reference("qwen3")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        generate.main(["--model", str(fixture("qwen3")), "--prompt", str(ref["prompt_text_0"]), "--max-tokens", "8"])
    text = model("qwen3").tokenizer.decode(ref["greedy_0"].tolist())   # greedy_0 holds no stop token
    assert out.getvalue().startswith(text + "\n")
    lines = out.getvalue()[len(text) + 1:].splitlines()
    assert lines[0].startswith("prompt: 5 tokens, ") and lines[0].endswith(" tokens/s")
    assert lines[1].startswith("generation: 8 tokens, ") and lines[2].startswith("device: CPU")
    assert len(lines) == 3


def test_sampling_repeats_with_its_seed_and_top_k_1_is_greedy():
    ref, m = reference("qwen3"), model("qwen3")
    prompt = [ref["prompt_0"].tolist()]
    def run(**options): return [s[0] for s in m.generate_tokens(prompt, max_tokens=4, stop_tokens=(), **options)]
    first = run(temperature=1.5, seed=7)
    assert run(temperature=1.5, seed=7) == first
    assert run(temperature=1.5, top_k=1, seed=3) == ref["greedy_0"][:4].tolist()


def test_the_sampler_keeps_top_k_and_top_p():
    logits = np.log(np.array([[0.05, 0.4, 0.3, 0.2, 0.05]]))
    draws = lambda sampler: {sampler(logits)[0] for _ in range(300)}  # noqa: E731
    assert draws(Sampler(temperature=1.0, top_k=2, seed=1)) == {1, 2}
    assert draws(Sampler(temperature=1.0, top_p=0.75, seed=1)) == {1, 2, 3}   # 0.4 + 0.3 < 0.75
    assert draws(Sampler(temperature=1.0, top_p=0.7, seed=1)) == {1, 2}
    assert Sampler()(logits) == [1]
    with pytest.raises(ValueError, match="top_p"): Sampler(top_p=0.0)


def test_the_chat_template():
    tokenizer = model("qwen3").tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ---- quantized checkpoints --------------------------------------------------------------------

@pytest.mark.parametrize("name, reference_key", [("qwen3_mlx4", "logits_1"), ("qwen3_moe_mlx4", "logits_f32_1")])
def test_mlx_quantized_checkpoints_match_mlx_lm(name, reference_key):
    """mlx-lm's 4-bit conversions (qwen3_moe's in bfloat16, read here in float32 as mlx-lm's
    float32 logits were computed)."""
    ref = reference(name)
    got = logits_of(model(name, dtype="float32")(ref["prompt_1"][None]))[0]
    assert_rows_close(f"{name} logits", got, ref[reference_key], TOL)


def test_quantized_experts_sorted_by_expert_give_the_same_logits(monkeypatch):
    """Many tokens' quantized experts run sorted by expert (the gathered qmm's order): the
    threshold lowered so that the 11-token prompt takes that path."""
    ref = reference("qwen3_moe_mlx4")
    monkeypatch.setattr(layers, "SORT_ENTRIES", 1)
    got = logits_of(model("qwen3_moe_mlx4", dtype="float32")(ref["prompt_1"][None]))[0]
    assert_rows_close("sorted experts", got, ref["logits_f32_1"], TOL)


def _weights(layer_weights) -> dict[str, np.ndarray]:
    return {k: v.bitcast(dtypes.uint16).numpy() if v.dtype == dtypes.bfloat16 else v.numpy()
            for k, v in layer_weights.items() if v is not None}


@pytest.mark.parametrize("name, dtype", [("qwen3_moe", "bfloat16")])
def test_quantizing_at_load_gives_mlx_lms_tensors(name, dtype):
    """`quantize=` on the 16/32-bit checkpoint stores exactly what mlx-lm's conversion stored
    (MLX's codes, scales and biases; the router at 8 bits; norms dense)."""
    m = models.load(fixture(name), dtype=dtype, quantize={"bits": 4, "group_size": 32}, progress=False)
    stored = safe_load(fixture(f"{name}_mlx4") / "model.safetensors")
    def stored_module(path): return {p: stored.get(f"{path}.{p}") for p in ("weight", "scales", "biases")}
    def ours(qw: QuantizedWeight): return {"weight": qw.weight, "scales": qw.scales, "biases": qw.biases}
    checks = [(ours(m.embed.weight), stored_module("model.embed_tokens")),
              (ours(m.head.weights[0]), stored_module("lm_head"))]
    attention = m.layers[1].attention
    fused = attention.qkv.weights[0]
    rows = [0, *np.cumsum(attention.qkv.outs).tolist()]
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        part = {k: v[rows[i]:rows[i + 1]] for k, v in ours(fused).items()}
        checks.append((part, stored_module(f"model.layers.1.self_attn.{proj}")))
    if name == "qwen3_moe":
        moe = m.layers[1].mlp
        assert moe.router.weights[0].bits == 8 and moe.router.weights[0].group_size == 64
        checks.append((ours(moe.router.weights[0]), stored_module("model.layers.1.mlp.gate")))
        size = moe.gate_up.outs[0]
        bank = ours(moe.gate_up.weights[0])
        checks.append(({k: v[:, :size] for k, v in bank.items()}, stored_module("model.layers.1.mlp.switch_mlp.gate_proj")))
        checks.append((ours(moe.down.weights[0]), stored_module("model.layers.1.mlp.switch_mlp.down_proj")))
    for got, want in checks:
        got, want = _weights(got), _weights(want)
        assert got.keys() == want.keys()
        for key in got: np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert isinstance(m.layers[0].input_norm.weight, Tensor) and isinstance(m.norm.weight, Tensor)


def _mlx_multimodal_gemma3(quantized: models.Model, directory: pathlib.Path) -> None:
    """The gemma3 fixture as an MLX conversion of a multimodal Gemma 3 stores it, with the codes,
    scales and biases of `quantized` (the fixture quantized at load) split back into modules:
    weights under `language_model.model.`, a `gemma3` config whose text_config leaves Gemma's
    defaults out and spells rope and layer types as transformers 4 did."""
    source = fixture("gemma3")
    shutil.copytree(source, directory)
    (directory / "model.safetensors").unlink()
    tensors = {f"language_model.{k}": Tensor(v.numpy()) for k, v in safe_load(source / "model.safetensors").items()
               if v.ndim == 1}
    def store(module: str, linear, names: list[str]):
        rows = [0, *np.cumsum(linear.outs).tolist()] if isinstance(linear, layers.Linear) else [0, None]
        qw = linear.weights[0] if isinstance(linear, layers.Linear) else linear.weight
        for name, lo, hi in zip(names, rows, rows[1:]):
            for part in ("weight", "scales", "biases"):
                tensors[f"language_model.model.{module}{name}.{part}"] = Tensor(getattr(qw, part).numpy()[lo:hi])
    store("", quantized.embed, ["embed_tokens"])
    for i, block in enumerate(quantized.layers):
        store(f"layers.{i}.self_attn.", block.attention.qkv, ["q_proj", "k_proj", "v_proj"])
        store(f"layers.{i}.self_attn.", block.attention.o, ["o_proj"])
        store(f"layers.{i}.mlp.", block.mlp.gate_up, ["gate_proj", "up_proj"])
        store(f"layers.{i}.mlp.", block.mlp.down, ["down_proj"])
    safe_save({k: v.realize() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    c = json.loads((source / "config.json").read_text())
    text = {k: c[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window",
                              "final_logit_softcapping", "vocab_size", "max_position_embeddings")}
    text.update(model_type="gemma3_text", sliding_window_pattern=3, rope_scaling={"rope_type": "linear", "factor": 8.0})
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
              "vision_config": {"model_type": "siglip_vision_model"}, "eos_token_id": c["eos_token_id"],
              "quantization": {"group_size": 64, "bits": 4}, "quantization_config": {"group_size": 64, "bits": 4}}
    (directory / "config.json").write_text(json.dumps(config))


def _parameters(where: str, layer) -> dict[str, np.ndarray]:
    """Every parameter below a layer (a model, a block, ...) by where it sits: dense ones as
    arrays, quantized ones as their codes, scales and biases."""
    if isinstance(layer, QuantizedWeight):
        return {f"{where}.{k}": v for k, v in _weights({"weight": layer.weight, "scales": layer.scales,
                                                          "biases": layer.biases}).items()}
    if isinstance(layer, Tensor): return {where: layer.numpy()}
    if isinstance(layer, list): items = enumerate(layer)
    elif isinstance(layer, (models.Model, layers.Linear, layers.Embedding, layers.Norm, layers.Attention, layers.MLP,
                            layers.PreNormBlock)): items = vars(layer).items()
    else: return {}
    out = {}
    for key, value in items:
        if key != "config": out.update(_parameters(f"{where}.{key}", value))
    return out


def test_gemma3_quantized_at_load_and_in_the_mlx_multimodal_layout(tmp_path):
    """`quantize=4` on the float32 gemma3 fixture quantizes every linear layer and the tied
    embedding (mlx-lm has no predicate for Gemma 3) and leaves the norms dense; the same codes
    stored as an MLX conversion of a multimodal Gemma 3 load to the same parameters and layers.
    No forward pass (the quantized products are the qwen3_mlx4 tests'; a quantized forward
    compiles its own kernels, some 10 s on the CPU)."""
    at_load = models.load(fixture("gemma3"), quantize=4, progress=False)
    block = at_load.layers[2]
    quantized = [at_load.embed.weight, *block.attention.qkv.weights, *block.attention.o.weights,
                 *block.mlp.gate_up.weights, *block.mlp.down.weights]
    assert at_load.head is None and all(isinstance(w, QuantizedWeight) and w.bits == 4 for w in quantized)
    assert isinstance(block.pre_mlp_norm.weight, Tensor) and isinstance(block.attention.q_norm.weight, Tensor)
    directory = tmp_path / "gemma3_mlx4"
    _mlx_multimodal_gemma3(at_load, directory)
    converted = models.load(directory, progress=False)
    want, got = _parameters("model", at_load), _parameters("model", converted)
    assert got.keys() == want.keys() and sum(key.endswith(".scales") for key in got) == 1 + 3 * 4   # qkv, gate_up fused
    for key in want: np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    for ours, theirs in zip(converted.layers, at_load.layers):
        assert ours.attention.window == theirs.attention.window and ours.attention.scale == theirs.attention.scale
        rotation = lambda layer: vars(layer.attention.rope.rotation)  # noqa: E731
        assert rotation(ours) == rotation(theirs)
    assert (converted.embed_scale, converted.logit_softcap, converted.eos_token_ids) == (8.0, 0.5, (1, 5))


def _dequantized(weights: list) -> list:
    return [quant.dequantize(w, dtypes.float32).realize() if isinstance(w, QuantizedWeight) else w for w in weights]


def test_gpt_oss_released_mxfp4_experts_load_as_stored_and_quantize_4_takes_the_rest(tmp_path):
    """The released checkpoints' layout, made from the fixture: its expert banks quantized to mxfp4
    (`quant.quantize`) and stored as `<bank>_blocks` `[E, out, in / 32, 16]` uint8 and
    `<bank>_scales` `[E, out, in / 32]` (out-major, gate and up rows interleaved). With
    `quantize=4` the experts stay the stored codes and scales (gate rows, then up rows), the
    router is 8-bit affine in groups of 64 (mlx-lm's predicate), the other projections and the
    embeddings 4-bit; sinks, biases and norms dense. The logits are those of the float model given
    the same weights dequantized (one test for both: each new format compiles its own kernels)."""
    directory = _copy("gpt_oss", tmp_path)
    tensors = {k: v.to("CPU").realize() for k, v in safe_load(directory / "model.safetensors").items()}
    banks = {}
    for name in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        banks[name] = quant.quantize(tensors.pop(name).transpose(-1, -2).contiguous(), mode="mxfp4")   # [E, out, in]
        scales = banks[name].scales.numpy()
        tensors[f"{name}_blocks"] = Tensor(banks[name].weight.numpy().view(np.uint8).reshape(*scales.shape, 16))
        tensors[f"{name}_scales"] = Tensor(scales)
    safe_save(tensors, str(directory / "model.safetensors"))
    m = models.load(directory, quantize=4, progress=False)

    def spec(w): return (w.mode, w.group_size, w.bits) if isinstance(w, QuantizedWeight) else None
    assert spec(m.embed.weight) == spec(m.head.weights[0]) == ("affine", 64, 4)
    for i, layer in enumerate(m.layers):
        moe, attention = layer.mlp, layer.attention
        assert spec(moe.router.weights[0]) == ("affine", 64, 8)
        assert spec(attention.qkv.weights[0]) == spec(attention.o.weights[0]) == ("affine", 64, 4)
        assert all(isinstance(t, Tensor) for t in (attention.sinks.value, attention.qkv.bias, moe.router.bias, moe.down.bias))
        for bank, name in ((moe.gate_up, "gate_up_proj"), (moe.down, "down_proj")):
            qw, stored = bank.weights[0], banks[f"model.layers.{i}.mlp.experts.{name}"]
            rows = stored.weight.shape[1]
            order = np.r_[0:rows:2, 1:rows:2] if name == "gate_up_proj" else np.arange(rows)
            assert spec(qw) == ("mxfp4", 32, 4)
            np.testing.assert_array_equal(qw.weight.numpy(), stored.weight.numpy()[:, order])
            np.testing.assert_array_equal(qw.scales.numpy(), stored.scales.numpy()[:, order])
            np.testing.assert_array_equal(quant.dequantize(qw, dtypes.float32).numpy(),
                                          quant.dequantize(stored, dtypes.float32).numpy()[:, order])
            bias = tensors[f"model.layers.{i}.mlp.experts.{name}_bias"].numpy()
            np.testing.assert_array_equal(bank.bias.numpy(), bias[:, order])

    dense = models.load(fixture("gpt_oss"), progress=False)   # the float model's shapes: compiled already
    dense.embed.weight, dense.head.weights = _dequantized([m.embed.weight])[0], _dequantized(m.head.weights)
    for ours, theirs in zip(m.layers, dense.layers):
        for part in ("qkv", "o"): getattr(theirs.attention, part).weights = _dequantized(getattr(ours.attention, part).weights)
        for part in ("router", "gate_up", "down"): getattr(theirs.mlp, part).weights = _dequantized(getattr(ours.mlp, part).weights)
    prompt = reference("gpt_oss")["prompt_1"][None]
    assert_rows_close("quantized logits", logits_of(m(prompt))[0], logits_of(dense(prompt))[0], TOL)
def _dequantize_all(node, seen=None) -> None:
    """Replace every quantized weight reachable from `node` (a model or its parts) by its dense
    values, in place: the model then computes the same products densely."""
    from nuvec_tg.quant import dequantize
    seen = set() if seen is None else seen
    if id(node) in seen: return
    seen.add(id(node))
    if isinstance(node, (layers.Linear, layers.Experts)):
        node.weights = [dequantize(w, dtypes.float32) if isinstance(w, QuantizedWeight) else w for w in node.weights]
    elif isinstance(node, layers.Embedding) and isinstance(node.weight, QuantizedWeight):
        node.weight = dequantize(node.weight, dtypes.float32)
    if isinstance(node, (layers.Linear, layers.Experts, layers.Embedding)):   # stored: the dense programs are the fixture's
        Tensor.realize(*node.parameters())
    children = node if isinstance(node, (list, tuple)) else getattr(node, "__dict__", {}).values()
    for child in children:
        if isinstance(child, (list, tuple)) or type(child).__module__.startswith("nuvec_tg.models"): _dequantize_all(child, seen)


def test_quantizing_a_hybrid_at_load():
    """quantize=4 on Qwen3.5: its projections, embeddings and head at 4 bits, the filter, A_log,
    dt_bias and norms dense; its logits those of the same model with the weights dequantized.
    Qwen3-Next's predicate keeps its router and shared expert's gate at 8 bits (mlx-lm's)."""
    from nuvec_tg.models import qwen3_next
    ref = reference("qwen3_5")
    m = model("qwen3_5", quantize=4)
    deltanet, attention, mlp = m.layers[0].attention, m.layers[1].attention, m.layers[0].mlp
    def spec(w): return (w.bits, w.group_size) if isinstance(w, QuantizedWeight) else None
    weights = deltanet.projection.weights + deltanet.out.weights + attention.qkv.weights + mlp.gate_up.weights
    assert [spec(w) for w in weights + [m.embed.weight] + m.head.weights] == [(4, 64)] * 6
    for dense in (deltanet.conv.value, deltanet.a_log.value, deltanet.dt_bias.value, deltanet.norm.weight, m.norm.weight):
        assert isinstance(dense, Tensor)
    got = logits_of(m(ref["prompt_1"][None]))[0]
    dense = models.load(fixture("qwen3_5"), quantize=4, progress=False)
    _dequantize_all(dense)
    assert_rows_close("quantized logits", got, logits_of(dense(ref["prompt_1"][None]))[0], TOL)
    spec4 = models.loader.QuantSpec("affine", 64, 4)
    for path in ("model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate"):
        assert qwen3_next.quant_predicate(path, spec4) == models.loader.QuantSpec("affine", 64, 8)
    assert qwen3_next.quant_predicate("model.layers.0.mlp.shared_expert.gate_proj", spec4) == spec4


# ---- errors -----------------------------------------------------------------------------------

def _copy(name: str, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / name
    shutil.copytree(fixture(name), target)
    return target


def _edit_config(directory: pathlib.Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_a_bad_directory_says_so(tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        models.load(tmp_path / "nothing")
    with pytest.raises(ValueError, match="has no config.json"):
        models.load(tmp_path)


def test_an_unknown_family_lists_the_supported_ones(tmp_path):
    directory = _copy("qwen3_tied", tmp_path)
    _edit_config(directory, model_type="llama9")
    supported = re.escape(", ".join(models.supported()))
    with pytest.raises(ValueError, match=rf"config.json: unknown model_type 'llama9' \(supported: {supported}\)"):
        models.load(directory)
    assert {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "gpt_oss"} <= set(models.supported())


def test_a_missing_tensor_is_named(tmp_path):
    directory = _copy("qwen3_tied", tmp_path)
    tensors = {k: v.to("CPU").realize() for k, v in safe_load(directory / "model.safetensors").items()}
    del tensors["model.layers.0.self_attn.k_norm.weight"]
    safe_save(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match="tensor model.layers.0.self_attn.k_norm.weight is missing from"):
        models.load(directory)
    untied = _copy("qwen3_tied", tmp_path / "untied")
    _edit_config(untied, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="tensor lm_head.weight is missing"):
        models.load(untied)


def test_a_shape_that_does_not_fit_the_config_is_named_with_its_file(tmp_path):
    directory = _copy("qwen3", tmp_path)
    _edit_config(directory, intermediate_size=96)
    with pytest.raises(ValueError, match=r"model-0000[12]-of-00002.safetensors: tensor model.layers.0.mlp.gate_proj.weight "
                                         r"has shape \(64, 64\), expected \(96, 64\)"):
        models.load(directory)


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention .* is not supported"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer type 'chunked_attention'"),
])
def test_what_gemma3_cannot_run_is_refused_at_load(tmp_path, change, message):
    directory = _copy("gemma3", tmp_path)
    _edit_config(directory, **change)
    with pytest.raises(ValueError, match=f"config.json: {message}"):
        models.load(directory)
@pytest.mark.parametrize("layout", ["multimodal", "mlx"])
def test_a_hybrid_reads_the_hubs_and_mlx_lms_layouts(tmp_path, layout):
    """Qwen3.5 as its multimodal checkpoints keep it (`text_config`, `model.language_model.*`, a
    vision tower left unread) and as mlx-lm writes them (`language_model.model.*`, the filter
    `[C, K, 1]`, the `(1 + w)` norms with the 1 added): the fixture's logits either way."""
    ref = reference("qwen3_5")
    directory = _copy("qwen3_5", tmp_path)
    text = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text, "vision_config": {}}))
    tensors = {k: v.to("CPU").realize() for k, v in safe_load(directory / "model.safetensors").items()}
    if layout == "multimodal":
        renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
        renamed["model.visual.patch_embed.proj.weight"] = Tensor.zeros(4, 4).contiguous().realize()
    else:
        one_plus = ("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")
        renamed = {}
        for k, v in tensors.items():
            if "conv1d" in k: v = v.reshape(v.shape[0], v.shape[2], 1)
            elif k.endswith(one_plus): v = v + 1.0
            renamed["language_model." + k] = v.contiguous().realize()
    safe_save(renamed, str(directory / "model.safetensors"))
    got = logits_of(models.load(directory, progress=False)(ref["prompt_1"][None]))[0]
    assert_rows_close(f"{layout} logits", got, ref["logits_1"], TOL)


def test_a_quantized_checkpoint_is_not_quantized_again():
    with pytest.raises(ValueError, match="already quantized"):
        models.load(fixture("qwen3_mlx4"), quantize=4)
    with pytest.raises(ValueError, match="unknown quantization mode"):
        models.load(fixture("qwen3"), quantize="int3")


def test_gpt_oss_mxfp4_blocks_of_the_wrong_shape_are_named(tmp_path):
    directory = _copy("gpt_oss", tmp_path)
    tensors = {k: v.to("CPU").realize() for k, v in safe_load(directory / "model.safetensors").items()}
    name = "model.layers.0.mlp.experts.gate_up_proj"
    del tensors[name]
    tensors[f"{name}_blocks"] = Tensor.zeros(4, 64, 4, 8, dtype=dtypes.uint8).contiguous().realize()   # 16 codes a block, not 32
    tensors[f"{name}_scales"] = Tensor.zeros(4, 64, 4, dtype=dtypes.uint8).contiguous().realize()
    safe_save(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"tensor {name}_blocks has shape \(4, 64, 4, 8\), expected \(4, 64, 2, 16\)"):
        models.load(directory)


def test_step_inputs_refresh_a_jitted_steps_buffer_in_place():
    """StepInput: each write lands in the one realized buffer a TinyJit replays over, so the step
    sees every step's values without a new tensor (and its schedule) a step."""
    host = StepInput((2, 3), "CPU")
    step = TinyJit(lambda t: (t * 2).realize())
    seen = []
    for i in range(4):
        t = host.write(np.arange(6).reshape(2, 3) + i)
        assert t is host.tensor
        seen.append(step(t).numpy().copy())
    np.testing.assert_array_equal(np.stack(seen), 2 * (np.arange(6).reshape(1, 2, 3) + np.arange(4).reshape(4, 1, 1)))
