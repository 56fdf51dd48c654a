"""Qwen3.5, text (`model_type` "qwen3_5_text", `Qwen3_5ForCausalLM`; and the Hub's multimodal
"qwen3_5" checkpoints, whose `text_config` is read and whose vision tower is left unread): Qwen3-Next's
hybrid (`qwen3_next.build_hybrid`) with the DeltaNet's projections separate (`in_proj_qkv`,
`in_proj_z`, `in_proj_b`, `in_proj_a`) and dense MLPs. Its rotary `mrope_section`s rotate text
positions as plain rope (the three position streams are equal for text)."""
from __future__ import annotations

from .config import Config
from .loader import Loader
from .qwen3_next import build_hybrid

MODEL_TYPES = ("qwen3_5", "qwen3_5_text")


def build(config: Config, loader: Loader) -> dict:
    """A Qwen3.5 text model's parts from its checkpoint."""
    return build_hybrid(config, loader, grouped=False)
