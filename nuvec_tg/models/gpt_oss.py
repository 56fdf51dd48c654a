"""gpt-oss (`model_type` "gpt_oss"): pre-norm blocks of grouped-query attention with biased
projections, no q/k norms and a learnt sink logit per head, sliding-window and full layers as
`layer_types` says (YaRN rope, as released: factor 32 over 4096, `truncate` false), and a sparse
mixture of experts in every layer: a biased router `mlp.router` whose `num_experts_per_tok`
largest logits are softmaxed among themselves, experts with biases and the clamped GLU
(`swiglu_alpha`, `swiglu_limit`), their outputs weighted by those scores.

The experts come in transformers' float layout (`gate_up_proj` `[E, H, 2I]`, input-major, gate
and up columns interleaved; `down_proj` `[E, I, H]`) or as the released checkpoints' MXFP4 blocks
and scales, which load as `mxfp4` quantized weights without dequantizing (`Loader.experts`).
"""
from __future__ import annotations

from .config import Config
from .layers import Attention, MoE, clamped_swiglu
from .loader import Loader, QuantSpec
from .qwen3 import attention, build_decoder
from .rope import RotaryEmbedding

MODEL_TYPES = ("gpt_oss",)


def sink_attention(config: Config, loader: Loader, prefix: str, layer_type: str, rope: RotaryEmbedding) -> Attention:
    """Layer `prefix`'s attention: Qwen3's without the q/k norms, with `<prefix>.self_attn.sinks` `[heads]`."""
    layer = attention(config, loader, prefix, layer_type, rope, qk_norms=False)
    layer.sinks = loader.tensor(f"{prefix}.self_attn.sinks", (layer.heads,))
    return layer


def moe(config: Config, loader: Loader, prefix: str, index: int) -> MoE:
    """`<prefix>.mlp.router` (weight and bias) and `<prefix>.mlp.experts`' biased banks."""
    hidden = config.integer("hidden_size")
    experts = config.integer("num_local_experts", aliases=("num_experts",))
    size = config.integer("intermediate_size")
    router = loader.linear(f"{prefix}.mlp.router", experts, hidden, bias=True)
    gate_up = loader.experts(f"{prefix}.mlp", experts, ["gate_proj", "up_proj"], [size, size], hidden,
                             bias=True, input_major=True, interleaved=True)
    down = loader.experts(f"{prefix}.mlp", experts, ["down_proj"], [hidden], size, bias=True, input_major=True)
    glu = clamped_swiglu(float(config.get("swiglu_alpha", 1.702)), float(config.get("swiglu_limit", 7.0)))
    top_k = config.integer("num_experts_per_tok", aliases=("experts_per_token",))
    return MoE(router, gate_up, down, top_k, normalize=False, softmax_first=False, glu=glu)


def build(config: Config, loader: Loader) -> dict:
    """A gpt-oss model's parts from its checkpoint (transformers' defaults where its config.json
    leaves out `layer_types`, sliding then full, and `attention_bias`, true)."""
    if config.values.get("layer_types") is None:
        config.values["layer_types"] = ["full_attention" if i % 2 else "sliding_attention"
                                        for i in range(config.integer("num_hidden_layers"))]
    if config.values.get("attention_bias") is None: config.values["attention_bias"] = True
    return build_decoder(config, loader, moe, self_attention=sink_attention)


def quant_predicate(path: str, spec: QuantSpec) -> QuantSpec | None:
    """mlx-lm's choice: the router is quantized to 8-bit affine in groups of 64, the rest as asked
    (the sinks and biases are never quantized)."""
    return QuantSpec("affine", 64, 8) if path.endswith("mlp.router") else spec
