"""The layers the families share, built from nuvec_tg's operations.

Every layer holds its parameters (dense tensors or `QuantizedWeight`s, set by the `Loader`) and
is called on activations `[B, T, ...]` in the model's dtype:

- `Linear` (one product, or several fused ones split back; dense weights through `fast.linear`),
  `Embedding` (also the tied head),
  `Norm` (RMS norm), `Parameter` (a tensor a layer uses as stored: a filter, sinks, a gate's constants);
- `MLP` (SwiGLU, or GeLU-gated), `MoE` (softmax router, `moe_route`, experts through `gather_mm` or
  `gather_qmm`, `weighted_sum`; or gpt-oss's: a biased router, top-k then softmax, biased
  experts, the clamped GLU `clamped_swiglu`);
- `Attention` (q/k norms and rotation through `norm_rope`, grouped-query
  `scaled_dot_product_attention`, optional sinks, the KV cache written in place, optionally an
  output gate);
- `PreNormBlock` (the residual block of Llama-style decoders: norm, attention, add-and-norm, MLP);
- `SandwichBlock` (Gemma's: each branch normalised before and after, `residual_rms_norm`).
"""
from __future__ import annotations

from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import Ops

from .. import fast, quant
from ..quant import QuantizedWeight
from .cache import Pages, Positions, kv_buffers
from .rope import RotaryEmbedding

Weight = Tensor | QuantizedWeight


def _product(x: Tensor, w: Weight, bias: Tensor | None = None) -> Tensor:
    """`x · wᵀ (+ bias)` in x's dtype for a dense `[N, K]` weight (`fast.linear`, the bias added
    before the one rounding) or a quantized one (the bias added after it)."""
    if isinstance(w, QuantizedWeight):
        y = quant.quantized_matmul(x, w)
        return y if bias is None else y + bias.cast(y.dtype)
    return fast.linear(x, w.cast(x.dtype), None if bias is None else bias.cast(x.dtype))


def _fuse(weights: list[Weight]) -> Weight | None:
    """Weights stacked along their output rows, when they are stored alike (else None)."""
    if all(isinstance(w, Tensor) for w in weights):
        return weights[0].cat(*weights[1:], dim=-2) if len(weights) > 1 else weights[0]
    if all(isinstance(w, QuantizedWeight) for w in weights):
        first = weights[0]
        if all((w.mode, w.group_size, w.bits) == (first.mode, first.group_size, first.bits) for w in weights):
            def cat(parts):
                return None if parts[0] is None else parts[0].cat(*parts[1:], dim=-2)
            return QuantizedWeight(cat([w.weight for w in weights]), cat([w.scales for w in weights]),
                                   cat([w.biases for w in weights]), first.mode, first.group_size, first.bits)
    return None


def _tensors(weights: list[Weight | None]) -> list[Tensor]:
    """The tensors of dense and quantized weights (to realize them)."""
    out: list[Tensor] = []
    for w in weights:
        if isinstance(w, QuantizedWeight): out += [t for t in (w.weight, w.scales, w.biases) if t is not None]
        elif w is not None: out.append(w)
    return out


def all_reduce(y: Tensor) -> Tensor:
    """The sum over devices of a tensor-parallel model's per-device partial results `y` (tinygrad's
    all-reduce; `models.parallel`): the same total on every device. y on one device: itself."""
    return y if isinstance(y.device, str) else Tensor(y.uop.allreduce(Ops.ADD, y.device))


def all_gather(y: Tensor, owned: Tensor) -> Tensor:
    """Each device's slice `y [..., n]` of a tensor-parallel model's outputs gathered into the
    whole `[..., N]` on every device: `owned` (per device, `[N]` bool) marks the device's slice.
    Each device places its slice among zeros and the all-reduce sums them (x + 0 is x exactly)."""
    copies = owned.shape[-1] // y.shape[-1]
    return all_reduce(owned.where(y.repeat(*[1] * (y.ndim - 1), copies), 0))


class Linear:
    """`y = x · Wᵀ + b` over the last axis. Built for one or several modules (`outs`: their output
    sizes); several return a tuple of their outputs, computed by one fused product where their
    weights are stored alike. `reduce` (a row-parallel layer of a tensor-parallel model,
    `models.parallel`): each device's product is a partial sum, summed over the devices.
    `owned` (per device, `[N]` bool; a head split by vocabulary): each device's product is its
    slice of the outputs, `owned` marks where that slice lies among all of them, and the slices
    are gathered into the whole on every device (`all_gather`)."""

    def __init__(self, outs: list[int]):
        self.outs = outs
        self.weights: list[Weight] = []
        self.bias: Tensor | None = None
        self.reduce = False
        self.owned: Tensor | None = None

    def set(self, weights: list[Weight], biases: list[Tensor] | None) -> None:
        fused = _fuse(weights) if len(weights) > 1 else weights[0]
        self.weights = [fused] if fused is not None else weights
        if biases is not None: self.bias = biases[0].cat(*biases[1:]) if len(biases) > 1 else biases[0]

    def parameters(self) -> list[Tensor]:
        return _tensors([*self.weights, self.bias])

    def __call__(self, x: Tensor) -> Tensor | tuple[Tensor, ...]:
        """x: `[..., K]`. Returns `[..., N]` (or one tensor per module)."""
        y = self.joined(x)
        if len(self.outs) > 1: return tuple(y.split(self.outs, dim=-1))
        if self.owned is not None: return all_gather(y, self.owned)
        return all_reduce(y) if self.reduce else y

    def joined(self, x: Tensor) -> Tensor:
        """x: `[..., K]`. Returns every module's outputs side by side, `[..., sum(outs)]`."""
        if len(self.weights) == 1: return _product(x, self.weights[0], self.bias)
        parts = [_product(x, w) for w in self.weights]  # weights stored unalike: one product each
        y = parts[0].cat(*parts[1:], dim=-1)
        return y if self.bias is None else y + self.bias.cast(y.dtype)


class Embedding:
    """Token embeddings `[vocab, hidden]`, dense or quantized; `as_linear` is the tied head."""

    def __init__(self):
        self.weight: Weight | None = None

    def set(self, weight: Weight) -> None:
        self.weight = weight

    def parameters(self) -> list[Tensor]:
        return _tensors([self.weight])

    def __call__(self, tokens: Tensor, dtype) -> Tensor:
        """tokens: `[B, T]` integers. Returns `[B, T, hidden]` in `dtype` (quantized rows are
        dequantized after the gather)."""
        # fast.take reads the rows named (a kernel on METAL and CUDA); indexing would read the whole table
        w = self.weight
        if isinstance(w, Tensor): return fast.take(w, tokens).cast(dtype)
        rows = QuantizedWeight(fast.take(w.weight, tokens), fast.take(w.scales, tokens),
                               None if w.biases is None else fast.take(w.biases, tokens), w.mode, w.group_size, w.bits)
        return quant.dequantize(rows, dtype)

    def as_linear(self, x: Tensor) -> Tensor:
        """`x · Wᵀ`: hidden states `[..., hidden]` to logits `[..., vocab]`."""
        return _product(x, self.weight)


class Norm:
    """RMS norm over the last axis with weight `[D]` and `eps`."""

    def __init__(self, eps: float):
        self.eps = eps
        self.weight: Tensor | None = None

    def set(self, weight: Tensor) -> None:
        self.weight = weight

    def parameters(self) -> list[Tensor]:
        return [self.weight]

    def __call__(self, x: Tensor) -> Tensor:
        return fast.rms_norm(x, self.weight, self.eps)


class Parameter:
    """A tensor a layer uses as the checkpoint stores it (`value`), set by the `Loader`."""

    def __init__(self):
        self.value: Tensor | None = None

    def set(self, value: Tensor) -> None:
        self.value = value

    def parameters(self) -> list[Tensor]:
        return [self.value]


def _gelu_tanh(x: Tensor) -> Tensor:
    """GeLU's tanh approximation computed in float32 and rounded once (torch's `gelu(approximate="tanh")`)."""
    return x.cast(dtypes.float32).gelu().cast(x.dtype) if x.dtype != dtypes.float64 else x.gelu()


# a config's `hidden_act` / `hidden_activation` -> the gate's activation
ACTIVATIONS = {"silu": Tensor.silu, "gelu_pytorch_tanh": _gelu_tanh}


class MLP:
    """A gated MLP: `down(act(gate(x)) * up(x))`, gate and up one fused `Linear`; `act` is SiLU
    (SwiGLU) unless `activation` names another of `ACTIVATIONS`."""

    def __init__(self, gate_up: Linear, down: Linear, activation: str = "silu"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: activation {activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        self.gate_up, self.down, self.activation = gate_up, down, ACTIVATIONS[activation]

    def __call__(self, x: Tensor) -> Tensor:
        # the activation as its own kernel, then the product: `quant.swiglu_matmul`'s activation in
        # the product's loads is computed again by every column set of the product, slower at
        # every shape measured (`tools/glu_probe.py`, benchmarks/models_h200.md)
        gate, up = self.gate_up(x)
        return self.down(self.activation(gate) * up)


class Experts:
    """A bank of experts' weights `[E, out, K]` (dense or quantized), one per projection, possibly
    a fused gate-and-up bank (`outs` says how to split it), and optionally their biases
    `[E, sum(outs)]` (gpt-oss)."""

    def __init__(self, outs: list[int]):
        self.outs = outs
        self.weights: list[Weight] = []
        self.bias: Tensor | None = None

    def set(self, weights: list[Weight], bias: Tensor | None = None) -> None:
        fused = _fuse(weights) if len(weights) > 1 else weights[0]
        self.weights = [fused] if fused is not None else weights
        self.bias = bias

    def parameters(self) -> list[Tensor]:
        return _tensors([*self.weights, self.bias])

    def __call__(self, x: Tensor, lhs: Tensor | None, rhs: Tensor, sorted_indices: bool) -> Tensor | tuple[Tensor, ...]:
        """Entries' rows through their experts: x `[P, 1, K]` rows, `lhs` picks x's row of each
        entry, `rhs` its expert (flat indices that broadcast). Returns `[..., 1, out]` per
        projection (a tuple for a fused bank)."""
        parts = []
        for w in self.weights:
            if isinstance(w, QuantizedWeight):
                parts.append(quant.gather_qmm(x, w, lhs, rhs, sorted_indices=sorted_indices))
            else:
                parts.append(quant.gather_mm(x, w.cast(x.dtype).transpose(-1, -2), lhs, rhs, sorted_indices=sorted_indices))
        y = parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=-1)
        if self.bias is not None: y = y + self.bias[rhs].unsqueeze(-2).cast(y.dtype)
        return y if len(self.outs) == 1 else tuple(y.split(self.outs, dim=-1))


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """`silu(gate) * up`: the experts' GLU of the Qwen families."""
    return gate.silu() * up


def clamped_swiglu(alpha: float, limit: float) -> Callable[[Tensor, Tensor], Tensor]:
    """gpt-oss's experts' GLU: `gate` clamped above at `limit`, `up` to `[-limit, limit]`, then
    `(up + 1) * gate * sigmoid(alpha * gate)` (transformers' `GptOssExperts._apply_gate`)."""
    def glu(gate: Tensor, up: Tensor) -> Tensor:
        gate, up = gate.minimum(limit), up.clip(-limit, limit)
        return (up + 1) * (gate * (gate * alpha).sigmoid())
    return glu


# Entries (tokens x experts per token) from which experts are run sorted by expert, so that the
# gathered products take an expert's rows together (mlx-lm's SwitchGLU threshold).
SORT_ENTRIES = 64


class MoE:
    """A sparse mixture of gated experts: router logits, float32 softmax, the `top_k` most probable
    experts (`moe_route`; their probabilities renormalised with `normalize`), the experts' outputs
    weighted by them (transformers' Qwen3-MoE block). With `softmax_first` false the `top_k`
    largest logits are taken first and the softmax is over them alone (gpt-oss). `glu(gate, up)`
    joins the gate and up projections (`swiglu` unless given). `reduce`: as `Linear.reduce`, the
    weighted sum of a tensor-parallel model's experts (each device a slice of every expert, or
    whole experts: `first_expert`, per device the first of the `local_experts` its banks hold,
    where the others' entries give zeros)."""

    def __init__(self, router: Linear, gate_up: Experts, down: Experts, top_k: int, normalize: bool,
                 softmax_first: bool = True, glu: Callable[[Tensor, Tensor], Tensor] = swiglu):
        self.router, self.gate_up, self.down = router, gate_up, down
        self.top_k, self.normalize = top_k, normalize
        self.softmax_first, self.glu = softmax_first, glu
        self.reduce = False
        self.first_expert: Tensor | None = None
        self.local_experts = 0

    def __call__(self, x: Tensor) -> Tensor:
        *lead, hidden = x.shape
        rows = x.reshape(-1, 1, hidden)                                            # [N, 1, H]
        tokens, k = rows.shape[0], self.top_k
        logits = self.router(x).reshape(tokens, -1).cast(dtypes.float32)
        if self.softmax_first:
            experts, scores = fast.moe_route(fast.softmax(logits), k, normalize=self.normalize)   # [N, k]
        else:
            experts, top = fast.moe_route(logits, k)                               # the k largest logits
            scores = fast.softmax(top)
        experts = experts.cast(dtypes.int32)
        if self.first_expert is not None: experts = self._held(experts)
        if tokens * k >= SORT_ENTRIES:
            out = self._sorted(rows, experts)
        else:
            token_rows = Tensor.arange(tokens, dtype=dtypes.int32).reshape(tokens, 1)
            gate, up = self.gate_up(rows, token_rows, experts, False)              # [N, k, 1, I]
            entries = Tensor.arange(tokens * k, dtype=dtypes.int32).reshape(tokens, k)
            out = self.down(self.glu(gate, up).reshape(tokens * k, 1, -1), entries, experts, False)
        out = fast.weighted_sum(out.reshape(tokens, k, hidden), scores.cast(x.dtype)).reshape(*lead, hidden)
        return all_reduce(out) if self.reduce else out

    def _held(self, experts: Tensor) -> Tensor:
        """Expert numbers as this device's banks number them; past their end (an entry of zeros)
        for an expert another device holds."""
        local = experts - self.first_expert
        return ((local >= 0) & (local < self.local_experts)).where(local, self.local_experts)

    def _sorted(self, rows: Tensor, experts: Tensor) -> Tensor:
        """The experts' outputs `[N * k, 1, H]` in entry order, computed with the entries sorted by expert."""
        tokens, k = experts.shape
        flat = experts.reshape(-1)
        order = flat.argsort()
        unsort = order.argsort()
        picked = flat[order]
        gate, up = self.gate_up(rows, order // k, picked, True)                    # [N * k, 1, I]
        out = self.down(self.glu(gate, up), None, picked, True)                    # [N * k, 1, H]
        return out[unsort]


def _norm_parameters(norm: Norm | None) -> tuple[Tensor | None, float]:
    """`(weight, eps)` of an optional per-head norm, as `norm_rope` takes them (None: no norm)."""
    return (None, 0.0) if norm is None else (norm.weight, norm.eps)


class Attention:
    """Grouped-query self-attention with optional per-head q/k RMS norms (Qwen3), rotary
    embeddings, a sliding window, and the KV cache.

    `qkv` is one `Linear` over the three projections; heads are `[B, H, T, head_dim]`; the scale
    is `head_dim ** -0.5` unless given. `sinks` (gpt-oss): a `Parameter` of `[heads]` logits that
    join each head's softmax (`scaled_dot_product_attention`'s `sinks=`). With `gated`
    (Qwen3-Next), q's projection gives each head's query then its gate (`2 * head_dim` per head)
    and the heads' output is multiplied by `sigmoid(gate)` before `o`."""

    def __init__(self, qkv: Linear, o: Linear, heads: int, kv_heads: int, head_dim: int, rope: RotaryEmbedding,
                 q_norm: Norm | None = None, k_norm: Norm | None = None, window: int | None = None,
                 scale: float | None = None, gated: bool = False):
        self.qkv, self.o, self.rope = qkv, o, rope
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_norm, self.k_norm, self.window = q_norm, k_norm, window
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.sinks: Parameter | None = None
        self.gated = gated

    def make_cache(self, batch: int, max_length: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        return kv_buffers(batch, self.kv_heads, max_length, self.head_dim, dtype, device)

    def make_pool(self, sequences: int, blocks: int, block_size: int, dtype, device: str) -> tuple[Tensor, Tensor]:
        """Zeroed key and value pools `[blocks, Hkv, block_size, D]` (a paged cache's; `models.paged`)."""
        return kv_buffers(blocks, self.kv_heads, block_size, self.head_dim, dtype, device)

    def clear_slot(self, pools: tuple[Tensor, Tensor], slot: int) -> list[Tensor]:
        """Nothing to clear for a new sequence: no query reads past a sequence's own positions."""
        return []

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.reshape(b, t, heads, self.head_dim).transpose(1, 2)

    def __call__(self, x: Tensor, positions: Positions, cache: tuple[Tensor, Tensor] | None) -> Tensor:
        """x: `[B, T, hidden]` (normalised). Returns the output projection `[B, T, hidden]`."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x)
        # the projection realized whole: its k and v become views of its buffer, not copies
        Tensor.realize(q, k, v)
        gate = None
        if self.gated:
            q, gate = q.reshape(b, t, self.heads, 2 * self.head_dim).split(self.head_dim, dim=-1)
            q, gate = q.reshape(b, t, -1), gate.reshape(b, t, -1)
        q, k, v = (self._heads(p, h) for p, h in zip((q, k, v), (self.heads, self.kv_heads, self.kv_heads)))
        q_weight, q_eps = _norm_parameters(self.q_norm)
        k_weight, k_eps = _norm_parameters(self.k_norm)
        # q turned in the keys' launch where it is normalised as they are (or neither is)
        queries = (q, q_weight) if q_eps == k_eps else None
        sinks = None if self.sinks is None else self.sinks.value
        if positions.pages is not None:
            out = self._paged(q, k, v, positions.pages, cache, sinks, queries)
        elif cache is None or not positions.cached:
            q, k = self.rope(q, q_weight, q_eps, positions.rope_offset), self.rope(k, k_weight, k_eps, positions.rope_offset)
            out = fast.scaled_dot_product_attention(q, k, v, self.scale, mask="causal", window=self.window, sinks=sinks)
        else:
            keys, values = cache
            start = positions.start
            # without padding a row's rotary position is its cache row: keys and values go straight into the cache
            written = None if positions.pads is not None else \
                self.rope.into_cache(k, k_weight, k_eps, positions.rope_offset, keys, v, values, queries)
            if written is None:
                keys[:, :, start:start + t].assign(self.rope(k, k_weight, k_eps, positions.rope_offset).cast(keys.dtype))
                values[:, :, start:start + t].assign(v.cast(values.dtype))
                q = self.rope(q, q_weight, q_eps, positions.rope_offset)
            elif queries is None:
                keys, values = written
                q = self.rope(q, q_weight, q_eps, positions.rope_offset)
            else: q, keys, values = written
            if positions.key_count is not None:
                keys, values = keys[:, :, :positions.key_count], values[:, :, :positions.key_count]
            if positions.masked:
                out = fast.scaled_dot_product_attention(q, keys, values, self.scale, mask=positions.mask(self.window), sinks=sinks)
            else:
                out = fast.scaled_dot_product_attention(q, keys, values, self.scale, mask="causal", window=self.window, sinks=sinks)
        # [B, H, T, D] to [B, T, H * D]: at T = 1 the same memory, a reshape (a transpose would be copied)
        out = out.reshape(b, t, -1) if t == 1 else out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o(out if gate is None else out * gate.sigmoid())

    def _paged(self, q: Tensor, k: Tensor, v: Tensor, pages: Pages, pools: tuple[Tensor, Tensor],
               sinks: Tensor | None, queries: tuple[Tensor, Tensor | None] | None) -> Tensor:
        """Attention of `[B, H, T, D]` heads over a paged cache: the keys rotated and written into
        the pools at `pages.writes` with the values (one kernel, in place, where kernels run; with
        `queries`, q turned in the same launch), then each sequence's rows over its blocks."""
        key_pool, value_pool = pools
        written = self.rope.into_pool(k, *_norm_parameters(self.k_norm), pages.starts, key_pool, pages.writes, v, value_pool,
                                      queries)
        if queries is not None: q, keys, values = written
        else:
            keys, values = written
            q = self.rope(q, *_norm_parameters(self.q_norm), pages.starts)
        return fast.paged_attention(q, keys, values, pages.tables, pages.lengths, self.scale, sinks=sinks, window=self.window)


class PreNormBlock:
    """`h = x + attention(norm(x))`, `out = h + mlp(norm(h))` (the second norm fused with the add).

    `residual_call` runs the block on a residual stream given as `h + delta` and returns its own
    output the same way, so that each add is fused with the norm after it (the next block's input
    norm, or the model's final norm): one kernel fewer a block in a decode step."""

    fuses_residual = True

    def __init__(self, attention: Attention, mlp: MLP | MoE, input_norm: Norm, post_attention_norm: Norm):
        self.attention, self.mlp = attention, mlp
        self.input_norm, self.post_attention_norm = input_norm, post_attention_norm

    def make_cache(self, batch: int, max_length: int, dtype, device: str):
        return self.attention.make_cache(batch, max_length, dtype, device)

    def make_pool(self, sequences: int, blocks: int, block_size: int, dtype, device: str):
        return self.attention.make_pool(sequences, blocks, block_size, dtype, device)

    def clear_slot(self, pools, slot: int) -> list[Tensor]:
        return self.attention.clear_slot(pools, slot)

    def __call__(self, x: Tensor, positions: Positions, cache) -> Tensor:
        h, out = self.residual_call(x, None, positions, cache)
        return out + h

    def residual_call(self, h: Tensor, delta: Tensor | None, positions: Positions, cache) -> tuple[Tensor, Tensor]:
        """The block on the stream `delta + h` (h alone when delta is None); returns `(h', out)`,
        the stream after attention and the MLP's output, whose sum is the block's output."""
        norm, post = self.input_norm, self.post_attention_norm
        if delta is None: x, normed = h, norm(h)
        else: x, normed = fast.add_rms_norm(delta, h, norm.weight, norm.eps)
        # the stream realized here: a kernel that updates the cache in place realizes its inputs at
        # once, and tinygrad would compute anything unrealized upstream again for the later uses
        Tensor.realize(x, normed)
        attended = self.attention(normed, positions, cache)
        h, y = fast.add_rms_norm(attended, x, post.weight, post.eps)
        return h, self.mlp(y)


class SandwichBlock(PreNormBlock):
    """Gemma's residual block, each branch normalised before and after:
    `h = x + post_attention_norm(attention(input_norm(x)))`,
    `out = h + post_mlp_norm(mlp(pre_mlp_norm(h)))` (the adds fused with the norms around them)."""

    fuses_residual = False   # its adds are fused with its own norms already

    def __init__(self, attention: Attention, mlp: MLP | MoE, input_norm: Norm, post_attention_norm: Norm,
                 pre_mlp_norm: Norm, post_mlp_norm: Norm):
        super().__init__(attention, mlp, input_norm, post_attention_norm)
        self.pre_mlp_norm, self.post_mlp_norm = pre_mlp_norm, post_mlp_norm

    def __call__(self, x: Tensor, positions: Positions, cache) -> Tensor:
        attended = self.attention(self.input_norm(x), positions, cache)
        pre, post = self.pre_mlp_norm, self.post_attention_norm
        h, y = fast.residual_rms_norm(x, attended, post.weight, post.eps, next=(pre.weight, pre.eps))
        out, _ = fast.residual_rms_norm(h, self.mlp(y), self.post_mlp_norm.weight, self.post_mlp_norm.eps)
        return out
