"""Fused operations for LLMs on tinygrad Tensors (`docs/design.md` gives the contract of each)."""
from .attention import scaled_dot_product_attention
from .conv import causal_conv1d_slots, depthwise_conv1d
from .gated_delta import DeltaNetHeads, gated_delta, gated_delta_chunked, gated_delta_inputs, gated_delta_slots, gated_delta_steps
from .linear import linear
from .moe import moe_route, weighted_sum
from .norms import add_rms_norm, layer_norm, residual_rms_norm, rms_norm
from .plan import (AttentionPlan, BlockedD512, Composed, ComposedBlocks, PlanTarget, Tiled, Vector,
                   plan_attention)
from .paged import paged_attention, paged_write, take
from .rope import Rotation, norm_rope, norm_rope_at, norm_rope_kv, rope
from .softmax import cross_entropy, logsumexp, softmax

__all__ = ["rms_norm", "layer_norm", "add_rms_norm", "residual_rms_norm", "rope", "softmax", "logsumexp",
           "cross_entropy", "scaled_dot_product_attention", "plan_attention", "AttentionPlan", "PlanTarget", "Vector",
           "Tiled", "Composed", "ComposedBlocks", "BlockedD512", "paged_attention", "paged_write", "take", "Rotation", "norm_rope", "norm_rope_at",
           "norm_rope_kv", "gated_delta", "gated_delta_chunked", "gated_delta_steps", "gated_delta_slots", "gated_delta_inputs",
           "DeltaNetHeads", "depthwise_conv1d",
           "causal_conv1d_slots", "moe_route", "weighted_sum", "linear"]
