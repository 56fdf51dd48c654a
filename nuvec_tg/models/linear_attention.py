"""The gated DeltaNet layer of the hybrid families (Qwen3-Next, Qwen3.5): linear attention whose
cache is a fixed-size state per sequence rather than keys and values.

Per token: one projection gives the convolution's input (q, k and v features), the output gate
`z` and the per-value-head `b` and `a`; a causal depthwise convolution (kernel `K`) with SiLU
mixes each feature with its `K - 1` predecessors; q and k are L2-normalised (q also scaled by
`1 / sqrt(Dk)`); the gated delta rule (`fast.gated_delta` for one token, `fast.gated_delta_chunked`
for more) runs with decay
`exp(-exp(A_log) * softplus(a + dt_bias))` and rate `sigmoid(b)`, value heads grouped over key
heads; the result is RMS-normalised per head (a plain weight), multiplied by `silu(z)` and
projected out. transformers' torch fallbacks (`torch_chunk_gated_delta_rule`,
`torch_recurrent_gated_delta_rule`, `causal_conv1d_update`) compute the same.

The cache state of a layer is its last `K - 1` convolution inputs `[B, K - 1, C]` (the model's
dtype, `C = 2 Hk Dk + Hv Dv`) and the recurrent state `[B, Hv, Dv, Dk]` (float32, as transformers
keeps it), both updated in place. Left padding: the rows before `pads[b]` enter as zeros
(transformers zeroes them too) with rate 0 and decay 1, so they leave the state as it was.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes

from .. import fast
from .cache import Pages, Positions, store
from .layers import Linear, Norm, Parameter

L2_EPS = 1e-6    # the l2norm of q and k (transformers' and FLA's), added to the sum of squares


def l2_normalized(x: Tensor, eps: float = L2_EPS) -> Tensor:
    """`x / sqrt(sum(x²) + eps)` over the last axis, as an RMS norm with `eps / D` (MLX's form)."""
    size = x.shape[-1]
    return fast.rms_norm(x, None, eps / size) * (size ** -0.5)


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
    q, then all k, all v, and z, b, a. `conv` is the depthwise filter (`[C, 1, K]` or `[C, K, 1]`),
    `norm` the gated RMS norm over each value head."""

    def __init__(self, projection: Linear, out: Linear, conv: Parameter, a_log: Parameter, dt_bias: Parameter,
                 norm: Norm, key_heads: int, value_heads: int, key_dim: int, value_dim: int, kernel: int,
                 grouped: bool):
        self.projection, self.out, self.conv, self.a_log, self.dt_bias, self.norm = projection, out, conv, a_log, dt_bias, norm
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = key_heads, value_heads, key_dim, value_dim
        self.kernel, self.grouped = kernel, grouped
        self.channels = 2 * key_heads * key_dim + value_heads * value_dim

    def make_cache(self, batch: int, max_length: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        """Zeroed convolution inputs `[B, K - 1, C]` (dtype) and recurrent state `[B, Hv, Dv, Dk]` (float32)."""
        conv = Tensor.zeros(batch, self.kernel - 1, self.channels, dtype=dtype, device=device).contiguous().realize()
        state = Tensor.zeros(batch, self.value_heads, self.value_dim, self.key_dim, dtype=dtypes.float32,
                             device=device).contiguous().realize()
        return conv, state

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The convolution's input `[B, T, C]` (all q, all k, all v), z `[B, T, Hv, Dv]`, b and a `[B, T, Hv]`."""
        b, t, _ = x.shape
        hk, hv, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        if not self.grouped:
            mixed, z, beta, a = self.projection(x)
            return mixed, z.reshape(b, t, hv, dv), beta, a
        group = hv // hk
        qkvz, ba = self.projection(x)
        q, k, v, z = qkvz.reshape(b, t, hk, 2 * dk + 2 * group * dv).split([dk, dk, group * dv, group * dv], dim=-1)
        beta, a = ba.reshape(b, t, hk, 2 * group).split([group, group], dim=-1)
        mixed = q.reshape(b, t, hk * dk).cat(k.reshape(b, t, hk * dk), v.reshape(b, t, hv * dv), dim=-1)
        return mixed, z.reshape(b, t, hv, dv), beta.reshape(b, t, hv), a.reshape(b, t, hv)

    def make_pool(self, sequences: int, blocks: int, block_size: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        """A paged cache's state pools (`models.paged`), a row a sequence: zeroed convolution inputs
        `[sequences, K - 1, C]` (dtype) and recurrent states `[sequences, Hv, Dv, Dk]` (float32)."""
        return self.make_cache(sequences, 0, dtype, device)

    def clear_slot(self, pools: tuple[Tensor, Tensor], slot: int) -> list[Tensor]:
        """Zero a new sequence's row of both pools (in place, unrealized: the caller realizes them)."""
        return [pool[slot:slot + 1].assign(Tensor.zeros(1, *pool.shape[1:], dtype=pool.dtype, device=pool.device))
                for pool in pools]

    def _rule_inputs(self, features: Tensor, beta: Tensor, a: Tensor) -> tuple[Tensor, ...]:
        """The convolution's features `[B, T, C]` and the projections' b and a to the rule's
        float32 q, k (l2-normalised, q scaled), v, rate and log decay."""
        b, t, _ = features.shape
        hk, hv, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        q, k, v = features.split([hk * dk, hk * dk, hv * dv], dim=-1)
        q = l2_normalized(q.reshape(b, t, hk, dk).cast(dtypes.float32)) * (dk ** -0.5)
        k = l2_normalized(k.reshape(b, t, hk, dk).cast(dtypes.float32))
        v = v.reshape(b, t, hv, dv).cast(dtypes.float32)
        rate = beta.cast(dtypes.float32).sigmoid()
        log_decay = -self.a_log.value.cast(dtypes.float32).exp() * (a.cast(dtypes.float32) + self.dt_bias.value.cast(dtypes.float32)).softplus()
        return q, k, v, rate, log_decay

    def _output(self, y: Tensor, z: Tensor, dtype) -> Tensor:
        """The rule's output `[B, T, Hv, Dv]` normalised per head, gated by `silu(z)` and projected out."""
        b, t = y.shape[:2]
        normed = fast.rms_norm(y.cast(dtype), self.norm.weight, self.norm.eps)
        gated = (normed.cast(dtypes.float32) * z.cast(dtypes.float32).silu()).cast(dtype)
        return self.out(gated.reshape(b, t, self.value_heads * self.value_dim))

    def __call__(self, x: Tensor, positions: Positions, cache: tuple[Tensor, Tensor] | None) -> Tensor:
        """x: `[B, T, hidden]` (normalised). Returns the output projection `[B, T, hidden]`; with a
        cache, continues each sequence from its state and leaves the new state there."""
        if positions.pages is not None: return self._paged(x, positions.pages, cache)
        b, t, _ = x.shape
        hv, dk, dv = self.value_heads, self.key_dim, self.value_dim
        cached = cache is not None and positions.cached
        kept = kept_rows(positions, b, t) if cached else None
        if kept is not None: x = kept.unsqueeze(-1).where(x, 0.0)
        mixed, z, beta, a = self._project(x)

        if cached:
            conv_state, state = cache
            history = conv_state.cast(mixed.dtype)
        else:   # zero states stored, not folded: the programs are then the cached call's
            history = Tensor.zeros(b, self.kernel - 1, self.channels, dtype=mixed.dtype, device=x.device).contiguous()
            state = Tensor.zeros(b, hv, dv, dk, dtype=dtypes.float32, device=x.device).contiguous()
        # stored, as the convolution's output: what reads them then compiles as small programs
        # (fused, each of q, k and v recomputed the concatenation and the convolution)
        sequence = history.cat(mixed, dim=1).contiguous()                            # [B, K - 1 + T, C]
        filters = self.conv.value.reshape(self.channels, self.kernel, 1)
        features = fast.depthwise_conv1d(sequence, filters).silu().contiguous()      # [B, T, C]
        q, k, v, rate, log_decay = self._rule_inputs(features, beta, a)
        if kept is not None:
            rows = kept.unsqueeze(-1)
            rate, log_decay = rows.where(rate, 0.0), rows.where(log_decay, 0.0)
        # one step: the rule itself (the decode kernels where there are some); more: its chunked form
        if t == 1: y, new_state = fast.gated_delta(q, k, v, log_decay.exp(), rate, state)
        else: y, new_state = fast.gated_delta_chunked(q, k, v, log_decay, rate, state)   # y [B, T, Hv, Dv] float32
        if cached:
            conv_state.assign(sequence[:, t:].cast(conv_state.dtype))
            state.assign(new_state)
        return self._output(y, z, x.dtype)

    def _paged(self, x: Tensor, pages: Pages, pools: tuple[Tensor, Tensor]) -> Tensor:
        """The layer over a paged cache's state pools: sequence `b` continues from row
        `pages.sequences[b]` of both and leaves its states there (an idle row, -1, reads zeros and
        writes nothing); the recurrent pool is updated in place where the kernels run."""
        conv_pool, state_pool = pools
        mixed, z, beta, a = self._project(x)
        filters = self.conv.value.reshape(self.channels, self.kernel, 1)
        features, convolved = fast.causal_conv1d_slots(mixed, filters, conv_pool, pages.sequences, silu=True)
        store(conv_pool, convolved)
        q, k, v, rate, log_decay = self._rule_inputs(features.contiguous(), beta, a)
        if x.shape[1] == 1: y, states = fast.gated_delta_slots(q, k, v, log_decay.exp(), rate, state_pool, pages.sequences)
        else: y, states = fast.gated_delta_chunked(q, k, v, log_decay, rate, state_pool, slots=pages.sequences)
        store(state_pool, states)
        return self._output(y, z, x.dtype)
