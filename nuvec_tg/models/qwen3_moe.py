"""Qwen3-MoE (`model_type` "qwen3_moe"): Qwen3's attention with sparse mixture-of-experts MLPs
(a softmax router over `num_experts`, the `num_experts_per_tok` most probable, renormalised with
`norm_topk_prob`); layers listed in `mlp_only_layers` or off the `decoder_sparse_step` keep a
dense MLP."""
from __future__ import annotations

from .config import Config
from .layers import MoE
from .loader import Loader, QuantSpec
from .qwen3 import build_decoder, dense_mlp

MODEL_TYPES = ("qwen3_moe",)


def moe(config: Config, loader: Loader, prefix: str) -> MoE:
    """`<prefix>.mlp.gate` (the router) and the experts' bank."""
    hidden = config.integer("hidden_size")
    experts = config.integer("num_experts", aliases=("num_local_experts",))
    size = config.integer("moe_intermediate_size")
    router = loader.linear(f"{prefix}.mlp.gate", experts, hidden)
    gate_up = loader.experts(f"{prefix}.mlp", experts, ["gate_proj", "up_proj"], [size, size], hidden)
    down = loader.experts(f"{prefix}.mlp", experts, ["down_proj"], [hidden], size)
    return MoE(router, gate_up, down, config.integer("num_experts_per_tok"), bool(config.get("norm_topk_prob", False)))


def build(config: Config, loader: Loader) -> dict:
    """A Qwen3-MoE model's parts from its checkpoint."""
    experts = config.integer("num_experts", aliases=("num_local_experts",))
    step = config.integer("decoder_sparse_step", 1)
    dense_layers = set(config.get("mlp_only_layers", []) or [])

    def mlp(config: Config, loader: Loader, prefix: str, index: int):
        if index not in dense_layers and experts > 0 and (index + 1) % step == 0:
            return moe(config, loader, prefix)
        return dense_mlp(config, loader, prefix)
    return build_decoder(config, loader, mlp)


def quant_predicate(path: str, spec: QuantSpec) -> QuantSpec | None:
    """mlx-lm's choice: the router is quantized to 8-bit affine in groups of 64, the rest as asked."""
    return QuantSpec("affine", 64, 8) if path.endswith("mlp.gate") else spec
