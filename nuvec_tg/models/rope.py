"""Rotary embeddings from a config's rope parameters: the default, linear and YaRN scalings.

transformers computes `inv_freq` per rope type and multiplies cos and sin by an
`attention_factor` (YaRN's; 1 otherwise). Here the type becomes a `fast.Rotation` (a base with a
position scale, or YaRN's periods as `freqs`) and the factor multiplies the rotated features.
"""
from __future__ import annotations

import math

import numpy as np
from tinygrad import Tensor, dtypes

from .. import fast
from .cache import store, written_in_place

ROPE_TYPES = ("default", "linear", "yarn")


class RotaryEmbedding:
    """`norm_rope` with a config's rotation: RMS-normalise (when a weight is given) and rotate the
    first `dims` features of `[B, H, T, D]` rows, then apply the attention factor."""

    def __init__(self, rotation: fast.Rotation, attention_factor: float = 1.0):
        self.rotation, self.attention_factor = rotation, attention_factor

    def into_cache(self, x: Tensor, weight: Tensor | None, eps: float, offset: int | Tensor, cache: Tensor,
                   values: Tensor, values_cache: Tensor,
                   queries: tuple[Tensor, Tensor | None] | None = None) -> tuple[Tensor, ...] | None:
        """`__call__`'s rows written into `cache` `[B, H, S, D]` at rows `offset..`, and `values`
        (x's shape) into `values_cache` beside them, in place by `norm_rope`'s kernel (METAL,
        CUDA); with `queries` (`(q, q_weight)`, normalised with the same eps) q's `__call__` rows
        in the same launch, first. Returns the updated caches (after q's rows), or None where no
        kernel wrote them in place (the composition's results are new tensors; an attention factor
        needs a step of its own): then the caller writes the rows itself (and turns q)."""
        if self.attention_factor != 1.0: return None
        *rotated, keys, written = fast.norm_rope(x, weight, eps, self.rotation, offset, cache=cache, values=values,
                                                 values_cache=values_cache, queries=queries)
        return (*rotated, keys, written) if written_in_place(keys, cache) and written_in_place(written, values_cache) else None

    def into_pool(self, x: Tensor, weight: Tensor | None, eps: float, starts: Tensor, pool: Tensor, slots: Tensor,
                  values: Tensor, values_pool: Tensor, queries: tuple[Tensor, Tensor | None] | None = None) -> tuple[Tensor, ...]:
        """`__call__`'s rows of `[B, H, T, D]` x at positions `starts[b] + t`, written into a paged
        `pool` at `slots [B, T]`, and `values` (x's shape) into `values_pool` at the same slots
        (`norm_rope_at`: one kernel on METAL and CUDA, in place); returns the pools holding them,
        after q's `__call__` rows where `queries` (`(q, q_weight)`, the same eps) are given (in
        the same launch where the kernel takes them)."""
        rotated: tuple[Tensor, ...] = ()
        if self.attention_factor == 1.0:
            *rotated, keys, written = fast.norm_rope_at(x, weight, eps, self.rotation, starts, pool, slots, values, values_pool,
                                                        queries=queries)
        else:
            keys = fast.paged_write(pool, self(x, weight, eps, starts).transpose(1, 2), slots)
            written = fast.paged_write(values_pool, values.transpose(1, 2), slots)
            if queries is not None: rotated = (self(queries[0], queries[1], eps, starts),)
        return (*rotated, store(pool, keys), store(values_pool, written))

    def __call__(self, x: Tensor, weight: Tensor | None, eps: float, offset: int | Tensor) -> Tensor:
        y = fast.norm_rope(x, weight, eps, self.rotation, offset)
        if self.attention_factor == 1.0: return y
        dims = self.rotation.dims
        scaled = (y[..., :dims].cast(dtypes.float32) * self.attention_factor).cast(y.dtype)
        return scaled if dims == y.shape[-1] else scaled.cat(y[..., dims:], dim=-1)


def rotary_embedding(params: dict, head_dim: int, where: str, device: str) -> RotaryEmbedding:
    """The `RotaryEmbedding` of `params` (`Config.rope_parameters`) for heads of `head_dim`."""
    rope_type = params["rope_type"]
    base = float(params["rope_theta"])
    dims = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))
    dims -= dims % 2
    if rope_type == "default":
        return RotaryEmbedding(fast.Rotation(dims, base=base))
    if rope_type == "linear":
        return RotaryEmbedding(fast.Rotation(dims, base=base, scale=1.0 / float(params["factor"])))
    if rope_type == "yarn":
        inv_freq, attention_factor = yarn_frequencies(params, dims, base)
        periods = Tensor((1.0 / inv_freq).astype(np.float32), device=device).realize()
        return RotaryEmbedding(fast.Rotation(dims, base=None, freqs=periods), attention_factor)
    raise ValueError(f"load: {where}: rope type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")


def yarn_frequencies(params: dict, dims: int, base: float) -> tuple[np.ndarray, float]:
    """YaRN's inverse frequencies `[dims/2]` and attention factor (transformers' rule: the
    interpolated and extrapolated frequencies blended by a linear ramp over the correction range
    of `beta_fast`..`beta_slow` rotations, truncated to whole dimensions unless `truncate` is false)."""
    factor = float(params["factor"])
    original = params.get("original_max_position_embeddings") or params.get("max_position_embeddings")
    if original is None: raise ValueError("load: yarn rope needs original_max_position_embeddings")
    original = float(original)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True): low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high: high += 0.001
    # float32 as transformers computes them
    pos_freqs = np.float32(base) ** (np.arange(0, dims, 2, dtype=np.float32) / np.float32(dims))
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dims // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    keep = (1 - ramp).astype(np.float32)
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.astype(np.float64), float(attention_factor)
