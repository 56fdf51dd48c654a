"""Write the tiny random model checkpoints of tests/data/models/ with transformers' references.

Each fixture is a directory in Hugging Face's layout, as `save_pretrained` writes it:
`config.json`, `model.safetensors` (float32; `qwen3` sharded in two with its index),
`generation_config.json` (the stop tokens), `tokenizer.json` and `tokenizer_config.json` (a
byte-level BPE over printable ASCII with the family's special tokens and chat template), and
`reference.npz`:

- `prompt_i` int32 [T_i] (T = 5 and 11) and `prompt_text_i`, the text they encode;
- `logits_i` float32 [T_i, vocab]: `model(prompt_i).logits` (eager attention);
- `greedy_i` int32 [8]: `generate(do_sample=False, max_new_tokens=8)` with no stop token, checked
  against argmax of full forwards; `greedy_margin_i` float32 [8] the top-1 minus top-2 logit there;
- `sequence_i` int32 [T_i + 8] (prompt then greedy) and `sequence_logits_i` [T_i + 8, vocab], the
  full forward of it (what prefill-then-decode must reproduce);
- `stop_tokens` int32: generation_config.json's eos ids; `stop_prompt`, `stop_output` (the tokens
  `generate` returned with those stop tokens, ending on one of them, fewer than 8);
- the rope-scaling fixtures (`qwen3_rope_linear`, `qwen3_rope_yarn`) have the logits only.

Then `<name>_mlx4/` for qwen3 and qwen3_moe: mlx-lm's 4-bit affine conversion (group size 32) with
mlx-lm's own logits for the same prompts (`logits_i`, in the converted dtype and as float32).

Run from the repository root, with torch + transformers in one environment and mlx-lm in another:

    /work/fixenv/bin/python scripts/make_model_fixtures.py torch
    /work/mlxenv/bin/python scripts/make_model_fixtures.py mlx

(`torch` writes every family, or those named after it: `... torch qwen3 gemma3`.) CI never runs
this; the fixtures are committed.
"""
import json
import math
import pathlib
import shutil
import sys
import tempfile

import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "models"
VOCAB_SIZE = 128       # 96 printable-ASCII byte symbols and their merges, then 8 special tokens
N_SPECIAL = 8
PROMPT_LENGTHS = (5, 11)
NEW_TOKENS = 8
MIN_MARGIN = 2e-3      # the least top-1 minus top-2 logit along a recorded greedy run
PROMPT_SOURCE = ("The quick brown fox jumps over the lazy dog, and then the cat sat on the mat "
                 "while we wrote a test for each model.")
CORPUS = [
    "the cat sat on the mat. the dog ran to the park and the bird sang in the tree.",
    "a model reads the text, then it writes the next word; we test that it is right.",
    "The quick brown fox jumps over the lazy dog. Hello, world! What is 2 + 2? It is 4.",
    "user: write a short poem about the sea.\nassistant: the sea is blue and wide.",
]


# ----------------------------------------------------------------------------------------------
# The tokenizer: byte-level BPE over printable ASCII and newline, special tokens per family.

QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")
GPT_OSS_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant<|channel|>final<|message|>' }}{%- endif %}")

# name -> (special tokens in id order, whether they come first (Gemma) or last, roles, template)
TOKENIZER_STYLES = {
    "qwen": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                           "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>"],
                 first=False, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                 stops=["<|im_end|>", "<|endoftext|>"], template=QWEN_TEMPLATE),
    "gemma": dict(specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                            "<mask>", "<reserved_0>"],
                  first=True, bos="<bos>", eos="<eos>", pad="<pad>",
                  stops=["<eos>", "<end_of_turn>"], template=GEMMA_TEMPLATE),
    "gpt_oss": dict(specials=["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>",
                              "<|return|>", "<|call|>", "<|reserved_0|>"],
                    first=False, bos=None, eos="<|return|>", pad="<|endoftext|>",
                    stops=["<|return|>", "<|endoftext|>", "<|call|>"], template=GPT_OSS_TEMPLATE),
}


def regular_vocabulary():
    """The shared BPE: the byte-level symbols of newline and printable ASCII, then merges learnt on
    CORPUS up to VOCAB_SIZE - N_SPECIAL tokens. Returns (tokens in id order, merges)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    byte_symbols = _byte_symbols()
    symbols = [byte_symbols[b] for b in [0x0A] + list(range(0x20, 0x7F))]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - N_SPECIAL, initial_alphabet=symbols,
                                  show_progress=False, limit_alphabet=len(symbols))
    tokenizer.train_from_iterator(CORPUS, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if len(tokens) != VOCAB_SIZE - N_SPECIAL:
        raise RuntimeError(f"BPE trainer made {len(tokens)} tokens, wanted {VOCAB_SIZE - N_SPECIAL}")
    return tokens, merges


def _byte_symbols():
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build_tokenizer(style_name):
    """A transformers fast tokenizer of VOCAB_SIZE tokens in the given family style, with its
    chat template and special tokens (Gemma's prepends <bos> like the real one)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    style = TOKENIZER_STYLES[style_name]
    regular, merges = regular_vocabulary()
    ordered = style["specials"] + regular if style["first"] else regular + style["specials"]
    vocab = {token: i for i, token in enumerate(ordered)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in style["specials"]])
    if style["bos"] is not None:
        bos = style["bos"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=style["bos"], eos_token=style["eos"],
        pad_token=style["pad"], chat_template=style["template"],
        add_bos_token=style["bos"] is not None)
    ids = {name: vocab[style[name]] for name in ("bos", "eos", "pad") if style[name] is not None}
    ids["stops"] = [vocab[t] for t in style["stops"]]
    return fast, ids


def save_tokenizer(fast, directory):
    """tokenizer.json + tokenizer_config.json, with the chat template inside tokenizer_config.json
    (as most released checkpoints have it) rather than in a separate chat_template.jinja."""
    fast.save_pretrained(directory)
    jinja = directory / "chat_template.jinja"
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if jinja.exists():
        config["chat_template"] = jinja.read_text()
        jinja.unlink()
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    for extra in ("special_tokens_map.json",):  # everything it says is in the two files above
        (directory / extra).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# One function per family: its config (small dims, multiples of 32/64 for MLX's group size 32).

def _common(ids, **extra):
    """Keys every family shares: vocabulary, special ids, float32."""
    base = dict(vocab_size=VOCAB_SIZE, pad_token_id=ids["pad"], eos_token_id=ids["stops"],
                bos_token_id=ids.get("bos"), max_position_embeddings=256)
    base.update(extra)
    return base


def config_qwen3(ids, tied=False, layers=2, rope_parameters=None):
    """Dense Qwen3: q/k RMSNorm on heads, GQA 4:2, head_dim 16; separate or tied embeddings."""
    from transformers import Qwen3Config
    return Qwen3Config(**_common(ids), hidden_size=64, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       tie_word_embeddings=tied,
                       rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 1e6})


def config_qwen3_moe(ids):
    """Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 sparse with 4 experts, top-2,
    norm_topk_prob."""
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(**_common(ids), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                          rms_norm_eps=1e-6, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def config_qwen3_next(ids):
    """Qwen3-Next: a gated-delta linear-attention layer (with MoE + shared expert), then a gated
    full-attention layer with partial rotary (dense MLP via mlp_only_layers, to stay small)."""
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(**_common(ids), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           layer_types=["linear_attention", "full_attention"],
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           partial_rotary_factor=0.25,
                           linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                           linear_num_key_heads=2, linear_num_value_heads=4,
                           moe_intermediate_size=32, shared_expert_intermediate_size=32,
                           num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                           decoder_sparse_step=1, mlp_only_layers=[1], rms_norm_eps=1e-6,
                           tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                            "partial_rotary_factor": 0.25})


def config_qwen3_5(ids):
    """Qwen3.5 text (Qwen3_5ForCausalLM): a linear-attention and a gated full-attention layer, dense
    MLP, (1 + w) norms, partial rotary; mrope sections that text positions make plain rope."""
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig(**_common(ids), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"],
                             num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                             linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6,
                             tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                              "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                              "mrope_interleaved": True})


def config_gemma3(ids):
    """Gemma 3 text: sliding (window 4) and full layers, query_pre_attn_scalar 24 (not head_dim),
    local base 10000 and global base 1e6 with the released linear x8 scaling on full layers,
    final logit softcapping, tied embeddings."""
    from transformers import Gemma3TextConfig
    return Gemma3TextConfig(**_common(ids), hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                            sliding_window=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            query_pre_attn_scalar=24, rms_norm_eps=1e-6,
                            final_logit_softcapping=0.5, attn_logit_softcapping=None,
                            tie_word_embeddings=True,
                            rope_parameters={
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                   "rope_theta": 1e6}})


def config_gpt_oss(ids):
    """gpt-oss: attention sinks, sliding (window 4) / full alternation, biased projections,
    4 experts top-2 with the clamped GLU, router with bias, YaRN as released (factor 32 over 4096)."""
    from transformers import GptOssConfig
    return GptOssConfig(**_common(ids, max_position_embeddings=131072), hidden_size=64,
                        intermediate_size=32, num_hidden_layers=2,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                        attention_bias=True, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": False,
                                         "original_max_position_embeddings": 4096,
                                         "rope_theta": 150000.0})


# name -> (config builder, tokenizer style, full references (False: logits only), save kwargs)
FAMILIES = {
    "qwen3": (lambda ids: config_qwen3(ids), "qwen", True, {"max_shard_size": "150KB"}),
    "qwen3_moe": (config_qwen3_moe, "qwen", True, {}),
    "qwen3_tied": (lambda ids: config_qwen3(ids, tied=True, layers=1), "qwen", True, {}),
    "qwen3_next": (config_qwen3_next, "qwen", True, {}),
    "qwen3_5": (config_qwen3_5, "qwen", True, {}),
    "gemma3": (config_gemma3, "gemma", True, {}),
    "gpt_oss": (config_gpt_oss, "gpt_oss", True, {}),
    "qwen3_rope_linear": (lambda ids: config_qwen3(ids, layers=1, rope_parameters={
        "rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}), "qwen", False, {}),
    "qwen3_rope_yarn": (lambda ids: config_qwen3(ids, layers=1, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "rope_theta": 1e6}), "qwen", False, {}),
}


# ----------------------------------------------------------------------------------------------
# The shared writer.

def randomise(model, seed):
    """Give every parameter random values of sane magnitude: (1 + w) norm weights (initialised to
    0) around 0, plain norm weights (initialised to 1) around 1, each +- 0.1; projections
    N(0, 0.125) (1/sqrt(64)); embeddings N(0, 0.5); routers N(0, 0.3) so top-k picks are clear;
    biases N(0, 0.05); sinks N(0, 0.5); A_log log U(0.5, 4); dt_bias N(0, 0.5); conv N(0, 0.3)."""
    import torch
    generator = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=generator, dtype=torch.float32) * std + mean

    kinds, tied = {}, model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and p.ndim == 1:
                if torch.all(p == 0):
                    value, kind = normal(p.shape, 0.1), "norm (1 + w)"
                elif torch.all(p == 1):
                    value, kind = normal(p.shape, 0.1, 1.0), "norm w"
                else:
                    raise RuntimeError(f"{name}: a norm weight initialised to neither 0 nor 1")
            elif leaf == "A_log":
                value, kind = torch.log(torch.rand(p.shape, generator=generator) * 3.5 + 0.5), "A_log"
            elif leaf == "dt_bias":
                value, kind = normal(p.shape, 0.5), "dt_bias"
            elif "conv1d" in name:
                value, kind = normal(p.shape, 0.3), "conv"
            elif leaf == "sinks":
                value, kind = normal(p.shape, 0.5), "sinks"
            elif leaf == "bias" or leaf.endswith("_bias"):
                value, kind = normal(p.shape, 0.05), "bias"
            elif "embed_tokens" in name:  # small when tied: a big one makes the head echo the input
                value, kind = normal(p.shape, 0.04 if tied else 0.5), "embedding"
            elif name.endswith("mlp.gate.weight") or ".router." in name or "shared_expert_gate" in name:
                value, kind = normal(p.shape, 0.3), "router"
            elif p.ndim >= 2:
                value, kind = normal(p.shape, 0.125), "projection"
            else:
                raise RuntimeError(f"{name}: no rule to randomise a {tuple(p.shape)} parameter")
            p.copy_(value)
            kinds.setdefault(kind, []).append(name)
    return kinds


def prompt_ids(tokenizer, length):
    """A prefix of PROMPT_SOURCE that encodes (with the tokenizer's own special tokens) to exactly
    `length` ids and round-trips through decode. Returns (text, ids)."""
    for end in range(1, len(PROMPT_SOURCE) + 1):
        text = PROMPT_SOURCE[:end]
        ids = tokenizer(text)["input_ids"]
        if len(ids) == length and tokenizer.decode(ids, skip_special_tokens=True) == text:
            return text, ids
    raise RuntimeError(f"no prefix of the prompt source encodes to {length} tokens")


def greedy_by_forward(model, ids, steps):
    """Greedy continuation by full forwards (no cache): (tokens, top-1 minus top-2 logit each step)."""
    import torch
    tokens, margins = list(ids), []
    for _ in range(steps):
        logits = model(torch.tensor([tokens])).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        tokens.append(int(torch.argmax(logits)))
    return tokens[len(ids):], margins


def find_stop_run(model, tokenizer, ids, stops, seed):
    """A prompt whose greedy continuation (generation config's stop tokens on) hits a stop token
    within NEW_TOKENS: tries random word sequences, plain and in the chat template (whose special
    tokens make a stop token likelier). Returns (prompt ids, generated ids) or None."""
    import torch
    words = sorted(set(" ".join(CORPUS).replace("\n", " ").split(" ")))
    rng = np.random.default_rng(seed)
    for attempt in range(400):
        text = " ".join(rng.choice(words, size=int(rng.integers(2, 7))))
        if attempt % 2:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=attempt % 2 == 0)["input_ids"]
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                             eos_token_id=stops, pad_token_id=ids["pad"])[0, len(prompt):].tolist()
        if out and out[-1] in stops and len(out) <= NEW_TOKENS:
            return prompt, out
    return None


def build_model(config, ids, seed):
    """The transformers model of `config` (eager attention, float32), randomised with `seed`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    kinds = randomise(model, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=ids.get("bos"), eos_token_id=ids["stops"], pad_token_id=ids["pad"],
        do_sample=False)
    return model, kinds


def choose_model(name, config, tokenizer, ids, seed, full):
    """The randomised model to save. For full fixtures: the first of a few seeds whose greedy
    runs on the two prompts keep every top-1 over top-2 margin above MIN_MARGIN (near ties
    would make greedy tests flaky), with a prompt whose greedy run hits a stop token; where no
    such prompt exists, the stop tokens' rows of the output embedding (the input embedding too
    where tied) are scaled up by 1.5, 2 or 3 (tied embeddings tend to echo and never stop).
    Returns (model, kinds, stop run or None)."""
    import torch
    if not full:
        return (*build_model(config, ids, seed), None)
    for attempt in range(6):
        for boost in (1.0, 1.5, 2.0, 3.0):
            model, kinds = build_model(config, ids, seed + 100 * attempt)
            with torch.no_grad():
                model.get_output_embeddings().weight[ids["stops"]] *= boost
                margin = min(min(greedy_by_forward(model, prompt_ids(tokenizer, length)[1], NEW_TOKENS)[1])
                             for length in PROMPT_LENGTHS)
                if margin < MIN_MARGIN:
                    print(f"  {name}: seed {seed + 100 * attempt} x{boost}: greedy margin {margin:.1e}")
                    break
                stop_run = find_stop_run(model, tokenizer, ids, ids["stops"], seed)
            if stop_run is not None:
                return model, kinds, stop_run
            print(f"  {name}: seed {seed + 100 * attempt} x{boost}: no greedy run hits a stop token")
    raise RuntimeError(f"{name}: no seed gave clear greedy margins and a stop run")


def write_family(name, seed):
    """Build, randomise (choose_model), save and reference one family under OUT/name."""
    import torch
    build_config, style, full, save_kwargs = FAMILIES[name]
    tokenizer, ids = build_tokenizer(style)
    model, kinds, stop_run = choose_model(name, build_config(ids), tokenizer, ids, seed, full)
    directory = OUT / name
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    model.save_pretrained(directory, safe_serialization=True, **save_kwargs)
    save_tokenizer(tokenizer, directory)

    reference = {}
    with torch.no_grad():
        for i, length in enumerate(PROMPT_LENGTHS):
            text, prompt = prompt_ids(tokenizer, length)
            reference[f"prompt_{i}"] = np.array(prompt, np.int32)
            reference[f"prompt_text_{i}"] = np.array(text)
            reference[f"logits_{i}"] = model(torch.tensor([prompt])).logits[0].float().numpy()
            if not full:
                continue
            generated = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                       eos_token_id=None, pad_token_id=ids["pad"])[0, length:].tolist()
            by_forward, margins = greedy_by_forward(model, prompt, NEW_TOKENS)
            if generated != by_forward:
                raise RuntimeError(f"{name}: generate {generated} != full-forward greedy {by_forward}")
            sequence = prompt + generated
            reference[f"greedy_{i}"] = np.array(generated, np.int32)
            reference[f"greedy_margin_{i}"] = np.array(margins, np.float32)
            reference[f"sequence_{i}"] = np.array(sequence, np.int32)
            reference[f"sequence_logits_{i}"] = model(torch.tensor([sequence])).logits[0].float().numpy()
    if full:
        reference["stop_tokens"] = np.array(ids["stops"], np.int32)
        reference["stop_prompt"] = np.array(stop_run[0], np.int32)
        reference["stop_output"] = np.array(stop_run[1], np.int32)
    np.savez_compressed(directory / "reference.npz", **reference)
    size = sum(f.stat().st_size for f in directory.iterdir())
    print(f"{name}: {size / 1024:.0f} KB, {sum(p.numel() for p in model.parameters())} parameters; "
          + ", ".join(f"{k} x{len(v)}" for k, v in kinds.items()))


def torch_main(names):
    import torch
    torch.set_num_threads(1)
    for index, name in enumerate(FAMILIES):
        if not names or name in names:
            write_family(name, seed=1000 + index)


# ----------------------------------------------------------------------------------------------
# The MLX-quantized fixtures: mlx-lm's conversion of two of the checkpoints above.

MLX_FIXTURES = {"qwen3_mlx4": ("qwen3", None), "qwen3_moe_mlx4": ("qwen3_moe", "bfloat16")}


def hub_style_copy(source, destination, dtype):
    """A copy of checkpoint `source` whose config.json has the keys transformers 4 wrote (and the
    Hub's Qwen3-MoE configs have): rope_theta and rope_scaling for rope_parameters, num_experts
    for num_local_experts, torch_dtype for dtype (`dtype`, that of the converted weights, if not
    None). mlx-lm 0.32's qwen3_moe reads only these."""
    shutil.copytree(source, destination)
    config = json.loads((destination / "config.json").read_text())
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    if rope.pop("rope_type", "default") != "default":
        raise ValueError("hub_style_copy: only the default rope is converted")
    config["rope_scaling"] = None
    if "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
    config["torch_dtype"] = dtype or config["dtype"]
    del config["dtype"]
    (destination / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def mlx_main(names):
    """Convert with mlx_lm.convert (4-bit affine, group size 32; qwen3 kept float32, qwen3_moe cast
    to bfloat16 as mlx-community checkpoints are; both from a copy with transformers 4's config
    keys, so their config.json has those) and store mlx-lm's logits: `logits_i` in the model's
    dtype (as float32) and `logits_f32_i` with every parameter upcast to float32 (the same
    quantized values, computed in float32)."""
    import mlx.core as mx
    from mlx_lm import convert, load
    for name, (source, dtype) in MLX_FIXTURES.items():
        if names and name not in names:
            continue
        directory = OUT / name
        if directory.exists():
            shutil.rmtree(directory)
        with tempfile.TemporaryDirectory() as scratch:
            hub_source = pathlib.Path(scratch) / source
            hub_style_copy(OUT / source, hub_source, dtype)
            convert(str(hub_source), mlx_path=str(directory), quantize=True, q_group_size=32, q_bits=4,
                    dtype=dtype)
        source_reference = np.load(OUT / source / "reference.npz")
        model, _ = load(str(directory))
        reference = {}
        for i in range(len(PROMPT_LENGTHS)):
            prompt = source_reference[f"prompt_{i}"]
            reference[f"prompt_{i}"] = prompt
            reference[f"prompt_text_{i}"] = source_reference[f"prompt_text_{i}"]
            logits = model(mx.array(prompt)[None])[0]
            reference[f"logits_{i}"] = np.array(logits.astype(mx.float32))
        model.set_dtype(mx.float32)
        for i in range(len(PROMPT_LENGTHS)):
            logits = model(mx.array(reference[f"prompt_{i}"])[None])[0]
            reference[f"logits_f32_{i}"] = np.array(logits.astype(mx.float32))
        np.savez_compressed(directory / "reference.npz", **reference)
        size = sum(f.stat().st_size for f in directory.iterdir())
        print(f"{name}: {size / 1024:.0f} KB (mlx {mx.__version__})")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("torch", "mlx"):
        raise SystemExit("usage: make_model_fixtures.py torch|mlx [names...]")
    (torch_main if sys.argv[1] == "torch" else mlx_main)(set(sys.argv[2:]))
