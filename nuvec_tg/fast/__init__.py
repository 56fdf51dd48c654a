"""Fused operations for LLMs on tinygrad Tensors (see DESIGN.md for the contract of each)."""
from .norms import add_rms_norm, layer_norm, residual_rms_norm, rms_norm
from .rope import rope
from .softmax import cross_entropy, logsumexp, softmax

__all__ = ["rms_norm", "layer_norm", "add_rms_norm", "residual_rms_norm", "rope", "softmax", "logsumexp",
           "cross_entropy"]
