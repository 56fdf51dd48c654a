"""Gemma 3 text (`model_type` "gemma3_text", and the language model of the multimodal "gemma3"
checkpoints, whose `text_config` the `Config` merges over the rest).

What differs from the Qwen-style decoder (transformers' `Gemma3ForCausalLM`):
- sandwich blocks: every branch normalised before and after (`SandwichBlock`), with `(1 + w)`
  RMS norms (the q and k head norms too);
- layers sliding or full by `layer_types`, else every `sliding_window_pattern`-th layer full;
  a local rotary base on sliding layers and the global one (with its scaling) on full ones;
- scores scaled by `query_pre_attn_scalar ** -0.5`; a GeLU-tanh gated MLP;
- embeddings times `hidden_size ** 0.5` rounded to the model's dtype; final logit soft-capping;
  tied embeddings.

Weights are `model.*` (text-only checkpoints and mlx-lm's conversions), `language_model.model.*`
(the multimodal checkpoints as first released, and mlx-lm's conversions of them) or
`model.language_model.*` (transformers 5's layout); the vision tower's tensors are not read.
mlx-lm quantizes every Gemma 3 linear layer and the embedding (no predicate of its own).
"""
from __future__ import annotations

from .config import Config
from .layers import ACTIVATIONS, Linear, SandwichBlock
from .loader import Loader
from .qwen3 import attention, dense_mlp, head_dim
from .rope import rotary_embedding

MODEL_TYPES = ("gemma3_text", "gemma3")

# Gemma3TextConfig's defaults (transformers) for what a config leaves out: the multimodal
# checkpoints' text_config lists only the fields that differ from them.
DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 256, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True}
ROPE_THETA = {"sliding_attention": ("rope_local_base_freq", 10000.0), "full_attention": ("rope_theta", 1000000.0)}
# where the decoder's weights are -> where an untied head is
PREFIXES = {"model": "lm_head", "language_model.model": "language_model.lm_head", "model.language_model": "lm_head"}


def _check(config: Config) -> None:
    """What this family cannot run, refused before any weight is read."""
    if config.get("attn_logit_softcapping", None) is not None:
        raise ValueError(f"load: {config.path}: attn_logit_softcapping is not supported "
                         "(the attention operations do not soft-cap scores)")
    if config.get("use_bidirectional_attention", False):
        raise ValueError(f"load: {config.path}: use_bidirectional_attention (an embedding model) is not supported")
    activation = config.get("hidden_activation")
    if activation not in ACTIVATIONS:
        raise ValueError(f"load: {config.path}: hidden_activation {activation!r} is not supported "
                         f"(supported: {', '.join(ACTIVATIONS)})")


def layer_types(config: Config, layers: int) -> list[str]:
    """`layer_types`, else transformers' older rule: layer `i` is full when `(i + 1)` is a
    multiple of `sliding_window_pattern` (6), sliding otherwise."""
    if config.get("layer_types", None) is not None:
        types = config.layer_types(layers)
    else:
        pattern = config.integer("sliding_window_pattern", 6, aliases=("_sliding_window_pattern",))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    for kind in types:
        if kind not in ROPE_THETA:
            raise ValueError(f"load: {config.path}: layer type {kind!r} is not one of {', '.join(ROPE_THETA)}")
    return types


def rope_parameters(config: Config, layer_type: str) -> dict:
    """A layer type's rotary parameters: transformers 5's `rope_parameters[layer_type]`; in
    transformers 4's spelling, sliding layers rotate with `rope_local_base_freq` unscaled and full
    layers with `rope_theta` and `rope_scaling`. Gemma's bases where none is given."""
    key, base = ROPE_THETA[layer_type]
    given = config.get("rope_parameters", None)
    if isinstance(given, dict) and isinstance(given.get(layer_type), dict):
        params = config.rope_parameters(layer_type)
        if "rope_theta" not in given[layer_type]: params["rope_theta"] = config.get(key, base)
        return params
    if layer_type == "sliding_attention":
        return {"rope_type": "default", "rope_theta": config.get(key, base)}
    params = config.rope_parameters()
    params["rope_theta"] = config.get(key, base)
    return params


def build(config: Config, loader: Loader) -> dict:
    """A Gemma 3 text model's parts from its checkpoint."""
    for key, value in DEFAULTS.items():
        if config.values.get(key) is None: config.values[key] = value
    _check(config)
    hidden, vocab = config.integer("hidden_size"), config.integer("vocab_size")
    layers = config.integer("num_hidden_layers")
    eps = float(config.get("rms_norm_eps"))
    activation = config.get("hidden_activation")
    scale = float(config.get("query_pre_attn_scalar")) ** -0.5
    prefix = next((p for p in PREFIXES if f"{p}.embed_tokens.weight" in loader.checkpoint), "model")
    types = layer_types(config, layers)
    ropes = {kind: rotary_embedding(rope_parameters(config, kind), head_dim(config), str(config.path), loader.device)
             for kind in sorted(set(types))}
    embed = loader.embedding(f"{prefix}.embed_tokens", vocab, hidden)
    blocks = []
    for i, kind in enumerate(types):
        at = f"{prefix}.layers.{i}"
        def norm(name: str): return loader.norm(f"{at}.{name}.weight", hidden, eps, offset=1.0)
        blocks.append(SandwichBlock(attention(config, loader, at, kind, ropes[kind], norm_offset=1.0, scale=scale),
                                    dense_mlp(config, loader, at, activation=activation),
                                    norm("input_layernorm"), norm("post_attention_layernorm"),
                                    norm("pre_feedforward_layernorm"), norm("post_feedforward_layernorm")))
    final_norm = loader.norm(f"{prefix}.norm.weight", hidden, eps, offset=1.0)
    head: Linear | None = None if config.get("tie_word_embeddings") else loader.linear(PREFIXES[prefix], vocab, hidden)
    softcap = config.get("final_logit_softcapping", None)
    return {"embed": embed, "layers": blocks, "norm": final_norm, "head": head,
            "embed_scale": hidden ** 0.5, "logit_softcap": None if softcap is None else float(softcap)}
