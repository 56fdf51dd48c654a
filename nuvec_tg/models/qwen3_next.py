"""Qwen3-Next (`model_type` "qwen3_next"): a hybrid of gated DeltaNet linear-attention layers and
gated full-attention layers, by `layer_types` (else every `full_attention_interval`-th layer is
full attention), with sparse MoE MLPs that add a shared expert.

- linear layers: `linear_attention.GatedDeltaNet` from the fused `in_proj_qkvz` / `in_proj_ba`
  (grouped per key head), `conv1d`, `A_log`, `dt_bias`, the gated norm `norm` (a plain weight);
- full-attention layers: Qwen3's attention with q_proj giving each head's query and output gate
  (`sigmoid(gate)` multiplies the heads' output), `(1 + w)` q/k norms, and rotation of the first
  `partial_rotary_factor` of each head (0.25 when the config does not say, as transformers);
- MLPs: Qwen3-MoE's router and experts plus `shared_expert`, scaled by
  `sigmoid(shared_expert_gate(x))`; dense where `mlp_only_layers` or `decoder_sparse_step` say;
- `(1 + w)` input, post-attention and final norms.

`build_hybrid` is shared with Qwen3.5 (`qwen3_5`, the separate projections and dense MLPs), whose
multimodal checkpoints keep the text model under `model.language_model.`. MLX conversions store
the filter as `[C, K, 1]` and the `(1 + w)` norms with the 1 added (mlx-lm's sanitize): the
filter's layout says which.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes

from .config import Config
from .layers import MLP, Linear, MoE, PreNormBlock
from .linear_attention import GatedDeltaNet
from .loader import Loader, QuantSpec
from .qwen3 import attention, dense_mlp, head_dim
from .qwen3_moe import moe
from .rope import rotary_embedding

MODEL_TYPES = ("qwen3_next",)

# where checkpoints keep the decoder (the Hub's text models, transformers' multimodal Qwen3.5,
# mlx-lm's multimodal Qwen3.5) and their head
PREFIXES = (("model.", "lm_head"), ("model.language_model.", "lm_head"), ("language_model.model.", "language_model.lm_head"))


class SharedExpertMoE:
    """Sparse experts plus a shared expert: `moe(x) + sigmoid(gate(x)) * shared(x)`."""

    def __init__(self, moe: MoE, shared: MLP, gate: Linear):
        self.moe, self.shared, self.gate = moe, shared, gate

    def __call__(self, x: Tensor) -> Tensor:
        return self.moe(x) + self.gate(x).sigmoid() * self.shared(x)


def layer_types(config: Config, layers: int) -> list[str]:
    """`"linear_attention"` or `"full_attention"` per layer: `layer_types`, else every
    `full_attention_interval`-th layer (default 4) full."""
    if config.get("layer_types", None) is not None: return config.layer_types(layers)
    interval = config.integer("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def _prefix(config: Config, loader: Loader) -> tuple[str, str]:
    for prefix, head in PREFIXES:
        if f"{prefix}embed_tokens.weight" in loader.checkpoint: return prefix, head
    return PREFIXES[0]


def linear_attention(config: Config, loader: Loader, prefix: str, grouped: bool) -> GatedDeltaNet:
    """Layer `prefix`'s gated DeltaNet (`<prefix>.linear_attn.*`)."""
    hidden, eps = config.integer("hidden_size"), float(config.get("rms_norm_eps", 1e-6))
    hk, hv = config.integer("linear_num_key_heads"), config.integer("linear_num_value_heads")
    dk, dv = config.integer("linear_key_head_dim"), config.integer("linear_value_head_dim")
    kernel = config.integer("linear_conv_kernel_dim", 4)
    if hv % hk:
        raise ValueError(f"load: {config.path}: linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({hk})")
    attn = f"{prefix}.linear_attn"
    channels = 2 * hk * dk + hv * dv
    if grouped:
        projection = loader.linear([f"{attn}.in_proj_qkvz", f"{attn}.in_proj_ba"], [2 * hk * dk + 2 * hv * dv, 2 * hv], hidden)
    else:
        projection = loader.linear([f"{attn}.in_proj_qkv", f"{attn}.in_proj_z", f"{attn}.in_proj_b", f"{attn}.in_proj_a"],
                                   [channels, hv * dv, hv, hv], hidden)
    return GatedDeltaNet(projection, loader.linear(f"{attn}.out_proj", hidden, hv * dv),
                         loader.tensor(f"{attn}.conv1d.weight", [(channels, 1, kernel), (channels, kernel, 1)]),
                         loader.tensor(f"{attn}.A_log", (hv,), dtypes.float32),
                         loader.tensor(f"{attn}.dt_bias", (hv,), dtypes.float32),
                         loader.norm(f"{attn}.norm.weight", dv, eps), hk, hv, dk, dv, kernel, grouped)


def sparse_mlp(config: Config, loader: Loader, prefix: str) -> SharedExpertMoE:
    """Qwen3-MoE's router and experts (`<prefix>.mlp`) with `shared_expert` and `shared_expert_gate`."""
    hidden, size = config.integer("hidden_size"), config.integer("shared_expert_intermediate_size")
    shared = f"{prefix}.mlp.shared_expert"
    mlp = MLP(loader.linear([f"{shared}.gate_proj", f"{shared}.up_proj"], [size, size], hidden),
              loader.linear(f"{shared}.down_proj", hidden, size))
    return SharedExpertMoE(moe(config, loader, prefix), mlp, loader.linear(f"{prefix}.mlp.shared_expert_gate", 1, hidden))


def _mlp(config: Config, loader: Loader, prefix: str, index: int):
    experts = config.get("num_experts", 0, aliases=("num_local_experts",))
    step = config.integer("decoder_sparse_step", 1)
    if experts and index not in set(config.get("mlp_only_layers", []) or []) and (index + 1) % step == 0:
        return sparse_mlp(config, loader, prefix)
    return dense_mlp(config, loader, prefix)


def build_hybrid(config: Config, loader: Loader, grouped: bool) -> dict:
    """A hybrid model's parts: embeddings, pre-norm blocks of gated DeltaNet or gated attention
    and an MLP (`_mlp`), the final norm and the head; `grouped`: Qwen3-Next's fused projections."""
    hidden, vocab = config.integer("hidden_size"), config.integer("vocab_size")
    layers = config.integer("num_hidden_layers")
    eps = float(config.get("rms_norm_eps", 1e-6))
    types = layer_types(config, layers)
    prefix, head_name = _prefix(config, loader)
    first_linear = next((i for i, kind in enumerate(types) if kind == "linear_attention"), None)
    # MLX conversions store the filter as [C, K, 1] and the (1 + w) norms with the 1 added
    filter_name = f"{prefix}layers.{first_linear}.linear_attn.conv1d.weight"
    mlx_layout = first_linear is not None and filter_name in loader.checkpoint and loader.checkpoint.shape(filter_name)[-1] == 1
    offset = 0.0 if mlx_layout else 1.0
    params = config.rope_parameters()
    params.setdefault("partial_rotary_factor", 0.25)
    rope = rotary_embedding(params, head_dim(config), str(config.path), loader.device)
    embed = loader.embedding(f"{prefix}embed_tokens", vocab, hidden)
    blocks = []
    for i, kind in enumerate(types):
        layer = f"{prefix}layers.{i}"
        if kind == "linear_attention":
            mixer = linear_attention(config, loader, layer, grouped)
        elif kind == "full_attention":
            mixer = attention(config, loader, layer, kind, rope, gated=True, norm_offset=offset)
        else:
            raise ValueError(f"load: {config.path}: layer {i} has type {kind!r} (expected linear_attention or full_attention)")
        blocks.append(PreNormBlock(mixer, _mlp(config, loader, layer, i),
                                   loader.norm(f"{layer}.input_layernorm.weight", hidden, eps, offset),
                                   loader.norm(f"{layer}.post_attention_layernorm.weight", hidden, eps, offset)))
    norm = loader.norm(f"{prefix}norm.weight", hidden, eps, offset)
    tied = bool(config.get("tie_word_embeddings", False))
    head: Linear | None = None if tied else loader.linear(head_name, vocab, hidden)
    return {"embed": embed, "layers": blocks, "norm": norm, "head": head}


def build(config: Config, loader: Loader) -> dict:
    """A Qwen3-Next model's parts from its checkpoint."""
    return build_hybrid(config, loader, grouped=True)


def quant_predicate(path: str, spec: QuantSpec) -> QuantSpec | None:
    """mlx-lm's choice: the router and the shared expert's gate at 8-bit affine in groups of 64,
    the rest as asked (the filter, `A_log` and `dt_bias` are never quantized)."""
    return QuantSpec("affine", 64, 8) if path.endswith(("mlp.gate", "shared_expert_gate")) else spec
