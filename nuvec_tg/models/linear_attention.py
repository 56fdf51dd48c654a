"""The gated DeltaNet layer of the hybrid families (Qwen3-Next, Qwen3.5): linear attention whose
cache is a fixed-size state per sequence rather than keys and values.

Per token: one projection gives the convolution's input (q, k and v features), the output gate
`z` and the per-value-head `b` and `a`; a causal depthwise convolution (kernel `K`) with SiLU
mixes each feature with its `K - 1` predecessors; q and k are L2-normalised (q also scaled by
`1 / sqrt(Dk)`); the decay is `exp(-exp(A_log) * softplus(a + dt_bias))` and the rate `sigmoid(b)`
(all of this `fast.gated_delta_inputs`, one kernel on METAL and CUDA); the gated delta rule
(`fast.gated_delta_slots` for one token, `fast.gated_delta_chunked` for more) runs with them, value
heads grouped over key heads; the result is RMS-normalised per head (a plain weight), multiplied by `silu(z)` and
projected out. transformers' torch fallbacks (`torch_chunk_gated_delta_rule`,
`torch_recurrent_gated_delta_rule`, `causal_conv1d_update`) compute the same.

The cache state of a layer is its last `K - 1` convolution inputs `[B, K - 1, C]` (the model's
dtype, `C = 2 Hk Dk + Hv Dv`) and the recurrent state `[B, Hv, Dv, Dk]` (float32, as transformers
keeps it), both updated in place (a contiguous cache's as a pool whose row `b` is sequence `b`'s,
`identity_slots`). Left padding: the rows before `pads[b]` enter as zeros
(transformers zeroes them too) with rate 0 and decay 1, so they leave the state as it was.
"""
from __future__ import annotations

import functools

from tinygrad import Tensor, dtypes

from .. import fast, kernels
from .cache import Positions, store
from .layers import Linear, Norm, Parameter

L2_EPS = 1e-6    # the l2norm of q and k (transformers' and FLA's), added to the sum of squares


def kept_rows(positions: Positions, batch: int, rows: int) -> Tensor | None:
    """`[B, T]` bool: the call's rows that are not left padding (None when no sequence is padded)."""
    if positions.pads is None: return None
    start = positions.query_start if positions.query_start is not None else Tensor(positions.start, dtype=dtypes.int32)
    index = Tensor.arange(rows, dtype=dtypes.int32).reshape(1, rows) + start.to(positions.pads.device).reshape(())
    return index >= positions.pads.reshape(batch, 1)


class GatedDeltaNet:
    """A gated DeltaNet linear-attention layer.

    `projection` gives, in the `grouped` layout (Qwen3-Next's `in_proj_qkvz`, `in_proj_ba`), per
    key head its q, k, then its value heads' v and z, and per key head its value heads' b then a;
    in the separate layout (Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) all
    q, then all k, all v, and z, b, a (`fast.DeltaNetHeads`). `conv` is the depthwise filter
    (`[C, 1, K]` or `[C, K, 1]`), `norm` the gated RMS norm over each value head."""

    def __init__(self, projection: Linear, out: Linear, conv: Parameter, a_log: Parameter, dt_bias: Parameter,
                 norm: Norm, key_heads: int, value_heads: int, key_dim: int, value_dim: int, kernel: int,
                 grouped: bool):
        self.projection, self.out, self.conv, self.a_log, self.dt_bias, self.norm = projection, out, conv, a_log, dt_bias, norm
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = key_heads, value_heads, key_dim, value_dim
        self.kernel, self.grouped = kernel, grouped
        self.heads = fast.DeltaNetHeads(key_heads, value_heads, key_dim, value_dim, grouped)
        self.channels = self.heads.channels

    def make_cache(self, batch: int, max_length: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        """Zeroed convolution inputs `[B, K - 1, C]` (dtype) and recurrent state `[B, Hv, Dv, Dk]` (float32)."""
        conv = Tensor.zeros(batch, self.kernel - 1, self.channels, dtype=dtype, device=device).contiguous().realize()
        state = Tensor.zeros(batch, self.value_heads, self.value_dim, self.key_dim, dtype=dtypes.float32,
                             device=device).contiguous().realize()
        return conv, state

    def make_pool(self, sequences: int, blocks: int, block_size: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        """A paged cache's state pools (`models.paged`), a row a sequence: zeroed convolution inputs
        `[sequences, K - 1, C]` (dtype) and recurrent states `[sequences, Hv, Dv, Dk]` (float32)."""
        return self.make_cache(sequences, 0, dtype, device)

    def clear_slot(self, pools: tuple[Tensor, Tensor], slot: int) -> list[Tensor]:
        """Zero a new sequence's row of both pools (in place, unrealized: the caller realizes them)."""
        return [pool[slot:slot + 1].assign(Tensor.zeros(1, *pool.shape[1:], dtype=pool.dtype, device=pool.device))
                for pool in pools]

    def _output(self, y: Tensor, z: Tensor, dtype) -> Tensor:
        """The rule's output `[B, T, Hv, Dv]` normalised per head, gated by `silu(z)` and projected out."""
        b, t = y.shape[:2]
        normed = fast.rms_norm(y.cast(dtype), self.norm.weight, self.norm.eps)
        gated = (normed.cast(dtypes.float32) * z.cast(dtypes.float32).silu()).cast(dtype)
        return self.out(gated.reshape(b, t, self.value_heads * self.value_dim))

    def __call__(self, x: Tensor, positions: Positions, cache: tuple[Tensor, Tensor] | None) -> Tensor:
        """x: `[B, T, hidden]` (normalised). Returns the output projection `[B, T, hidden]`; with a
        cache, continues each sequence from its state and leaves the new state there (a paged
        cache's pools: sequence `b` from row `pages.sequences[b]`; an idle row, -1, reads zeros and
        writes nothing)."""
        b, t, _ = x.shape
        cached = cache is not None and (positions.cached or positions.pages is not None)
        kept = kept_rows(positions, b, t) if cached and positions.pages is None else None
        if kept is not None: x = kept.unsqueeze(-1).where(x, 0.0)
        projected = self.projection.joined(x)                                       # [B, T, heads.width]
        z = self.heads.split(projected)[1]
        filters = self.conv.value.reshape(self.channels, self.kernel)
        if not cached:   # zero states, the compositions: differentiable (the kernels update states in place)
            conv = Tensor.zeros(b, self.kernel - 1, self.channels, dtype=x.dtype, device=x.device)
            state = Tensor.zeros(b, self.value_heads, self.value_dim, self.key_dim, dtype=dtypes.float32, device=x.device)
            with kernels.compositions_only():
                q, k, v, g, beta, _ = fast.gated_delta_inputs(projected, conv, filters, self.a_log.value,
                                                              self.dt_bias.value, self.heads, eps=L2_EPS, log_decay=t > 1)
            y = fast.gated_delta(q, k, v, g, beta, state)[0] if t == 1 else fast.gated_delta_chunked(q, k, v, g, beta, state)[0]
            return self._output(y, z, x.dtype)
        conv_pool, state_pool = cache
        slots = positions.pages.sequences if positions.pages is not None else identity_slots(b, x.device)
        q, k, v, g, beta, convolved = fast.gated_delta_inputs(projected, conv_pool, filters, self.a_log.value,
                                                              self.dt_bias.value, self.heads, slots=slots, eps=L2_EPS,
                                                              log_decay=t > 1)
        store(conv_pool, convolved)
        if kept is not None:   # left padding: rate 0 and decay 1 leave the state as it was
            rows = kept.unsqueeze(-1)
            beta, g = rows.where(beta, 0.0), rows.where(g, 0.0 if t > 1 else 1.0)
        if t == 1: y, states = fast.gated_delta_slots(q, k, v, g, beta, state_pool, slots)
        else: y, states = fast.gated_delta_chunked(q, k, v, g, beta, state_pool, slots=slots)
        store(state_pool, states)
        return self._output(y, z, x.dtype)


@functools.lru_cache(maxsize=64)
def identity_slots(batch: int, device: str) -> Tensor:
    """`[0, 1, ..., B - 1]` int32, realized once: a contiguous cache's states as a pool whose row
    `b` is sequence `b`'s, so that the kernels update them in place."""
    return Tensor(list(range(batch)), dtype=dtypes.int32, device=device).realize()
