"""Qwen3 (`model_type` "qwen3"): pre-norm blocks of grouped-query attention with per-head RMS
norms of q and k before the rotation, and a SwiGLU MLP; tied or separate embeddings.

The decoder's skeleton (`build_decoder`) is shared with the other Qwen-style families, which
differ in their MLP (`qwen3_moe`) or blocks.
"""
from __future__ import annotations

from typing import Callable

from .config import Config
from .layers import MLP, Attention, Linear, PreNormBlock
from .loader import Loader
from .rope import RotaryEmbedding, rotary_embedding

MODEL_TYPES = ("qwen3",)


def head_dim(config: Config) -> int:
    return config.integer("head_dim", config.integer("hidden_size") // config.integer("num_attention_heads"))


def attention(config: Config, loader: Loader, prefix: str, layer_type: str, rope: RotaryEmbedding,
              qk_norms: bool = True, gated: bool = False, norm_offset: float = 0.0,
              scale: float | None = None) -> Attention:
    """Layer `prefix`'s self-attention (`<prefix>.self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`);
    `gated`: q_proj also gives the output gate (Qwen3-Next); `norm_offset` 1 for `(1 + w)` q/k
    norms; `scale` the scores' scale, default `head_dim ** -0.5`."""
    hidden, heads = config.integer("hidden_size"), config.integer("num_attention_heads")
    kv_heads = config.integer("num_key_value_heads", heads)
    size = head_dim(config)
    eps = float(config.get("rms_norm_eps", 1e-6))
    bias = bool(config.get("attention_bias", False))
    attn = f"{prefix}.self_attn"
    qkv = loader.linear([f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"],
                        [heads * size * (2 if gated else 1), kv_heads * size, kv_heads * size], hidden, bias=bias)
    o = loader.linear(f"{attn}.o_proj", hidden, heads * size, bias=bias)
    q_norm = loader.norm(f"{attn}.q_norm.weight", size, eps, norm_offset) if qk_norms else None
    k_norm = loader.norm(f"{attn}.k_norm.weight", size, eps, norm_offset) if qk_norms else None
    window = config.integer("sliding_window") if layer_type == "sliding_attention" else None
    return Attention(qkv, o, heads, kv_heads, size, rope, q_norm, k_norm, window, scale, gated=gated)


def dense_mlp(config: Config, loader: Loader, prefix: str, intermediate: int | None = None,
              activation: str = "silu") -> MLP:
    """`<prefix>.mlp.{gate,up,down}_proj` of `intermediate_size` (or `intermediate`), gated by
    `activation` (one of `layers.ACTIVATIONS`)."""
    hidden = config.integer("hidden_size")
    size = intermediate or config.integer("intermediate_size")
    gate_up = loader.linear([f"{prefix}.mlp.gate_proj", f"{prefix}.mlp.up_proj"], [size, size], hidden)
    return MLP(gate_up, loader.linear(f"{prefix}.mlp.down_proj", hidden, size), activation)


def build_decoder(config: Config, loader: Loader, mlp: Callable[[Config, Loader, str, int], object],
                  self_attention: Callable[..., Attention] | None = None) -> dict:
    """Embeddings, `num_hidden_layers` pre-norm blocks (attention, then `mlp(config, loader,
    prefix, index)`), the final norm and the head (None when tied) of a Qwen-style checkpoint.
    `self_attention(config, loader, prefix, layer_type, rope)` builds each block's attention
    (default: `attention`, Qwen3's)."""
    hidden, vocab = config.integer("hidden_size"), config.integer("vocab_size")
    layers = config.integer("num_hidden_layers")
    eps = float(config.get("rms_norm_eps", 1e-6))
    embed = loader.embedding("model.embed_tokens", vocab, hidden)
    types = config.layer_types(layers)
    rope = rotary_embedding(config.rope_parameters(), head_dim(config), str(config.path), loader.device)
    blocks = []
    for i in range(layers):
        prefix = f"model.layers.{i}"
        attending = (self_attention or attention)(config, loader, prefix, types[i], rope)
        blocks.append(PreNormBlock(attending, mlp(config, loader, prefix, i),
                                   loader.norm(f"{prefix}.input_layernorm.weight", hidden, eps),
                                   loader.norm(f"{prefix}.post_attention_layernorm.weight", hidden, eps)))
    norm = loader.norm("model.norm.weight", hidden, eps)
    tied = bool(config.get("tie_word_embeddings", False))
    head: Linear | None = None if tied else loader.linear("lm_head", vocab, hidden)
    return {"embed": embed, "layers": blocks, "norm": norm, "head": head}


def build(config: Config, loader: Loader) -> dict:
    """A Qwen3 model's parts from its checkpoint."""
    return build_decoder(config, loader, lambda config, loader, prefix, index: dense_mlp(config, loader, prefix))
