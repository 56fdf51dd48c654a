"""The gated delta rule of Gated DeltaNet (Qwen3-Next / Qwen3.5 linear-attention layers).

Per batch item, value head `h` (key head `h // (Hv / Hk)`) and step `t`, with the state `S`
(`[Dv, Dk]`):

    S = g[t] * S
    S = S + k[t] (beta[t] * (v[t] - S k[t]))ᵀ      (row r: S[r] += k * beta * (v[r] - S[r]·k))
    y[t] = S q[t]

The arithmetic is float32 (float64 stays float64); outputs take q's dtype and states their own
(or the `storage` dtype of `gated_delta_steps`). These are the compositions: the definition the
kernels are tested against.

`gated_delta_chunked` is the same rule for prefills where no kernel runs: the composition above
builds a few kernels per step, each step's its own program (its rows sit at their own offsets),
so a prompt of `T` tokens compiles `O(T)` programs; the chunked form (FLA's and transformers'
`chunk_gated_delta_rule`) builds a fixed number per chunk of `chunk_size` steps.
"""
from __future__ import annotations

import math

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .. import kernels
from ..kernels import gated_delta as kernel
from ..kernels.gated_delta import DeltaNetHeads
from ..tensor import check, check_floating, check_integer, check_tensor, is_floating, take_rows, put_rows
from .conv import causal_conv1d_slots, depthwise_conv1d
from .norms import rms_norm


def _check(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None) -> tuple[int, ...]:
    """Check the step inputs (and a `[B, Hv, Dv, Dk]` state when given); return `(B, T, Hk, Hv, Dk, Dv)`."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_tensor(op, name, t)
        check_floating(op, name, t.dtype)
    check(q.ndim == 4 and tuple(q.shape) == tuple(k.shape) and v.ndim == 4, op,
          f"q and k must be [B, T, Hk, Dk] and v [B, T, Hv, Dv], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    check(tuple(v.shape[:2]) == (b, t) and hk > 0 and hv % hk == 0, op,
          f"v must be [{b}, {t}, Hv, Dv] with Hv a multiple of {hk}, got {tuple(v.shape)}")
    check(tuple(g.shape) == (b, t, hv) and tuple(beta.shape) == (b, t, hv), op,
          f"g and beta must be [{b}, {t}, {hv}], got {tuple(g.shape)} and {tuple(beta.shape)}")
    if state is not None:
        check_tensor(op, "state", state)
        check_floating(op, "state", state.dtype)
        check(tuple(state.shape) == (b, hv, dv, dk), op, f"state must be [{b}, {hv}, {dv}, {dk}], got {tuple(state.shape)}")
    return b, t, hk, hv, dk, dv


def _kernel_backend(op: str, q: Tensor, v: Tensor, tensors: tuple[Tensor, ...], storage: DType | None = None) -> str | None:
    """The backend whose kernel runs this call, or None (the composition)."""
    types = tuple(t.dtype for t in tensors) + ((storage,) if storage is not None else ())
    return kernels.choose(op, f"{tuple(q.shape)} on {q.device}", q.device, "gated_delta",
                          lambda backend: kernel.unsupported(types, q.shape[0], q.shape[1], v.shape[2], q.shape[3], v.shape[3],
                                                             kernels.target(q.device)))


def _arithmetic_dtype(*tensors: Tensor) -> DType:
    return dtypes.float64 if any(t.dtype == dtypes.float64 for t in tensors) else dtypes.float32


def _rounded(x: Tensor, dtype: DType, arithmetic: DType) -> Tensor:
    """`x` stored in `dtype` and read back. Stored for real (a buffer): tinygrad folds a lazy
    cast to float16 and back into nothing, and a step fused with the next could round otherwise
    than a step run alone; each step must continue from the stored state."""
    return x.cast(dtype).contiguous().cast(arithmetic)


def _recurrence(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                storage: DType | None) -> tuple[Tensor, Tensor]:
    """Run the rule over every step. Returns `y [B, T, Hv, Dv]` in q's dtype and the final state
    (`storage` None) or every step's state `[B, T, Hv, Dv, Dk]` rounded to `storage`."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    acc = _arithmetic_dtype(q, k, v, g, beta, state)

    def per_value_head(x: Tensor) -> Tensor:  # [B, T, Hk, Dk] -> [B, T, Hv, Dk], no copy per head
        x = x.cast(acc)
        return x if hv == hk else x.reshape(b, t, hk, 1, dk).expand(b, t, hk, hv // hk, dk).reshape(b, t, hv, dk)

    queries, keys = per_value_head(q), per_value_head(k)
    values, decay, rate = v.cast(acc), g.cast(acc), beta.cast(acc)
    s = state.cast(acc) if storage is None else _rounded(state.cast(acc), storage, acc)
    outputs, states = [], []
    for step in range(t):
        key = keys[:, step].unsqueeze(2)                                    # [B, Hv, 1, Dk]
        s = s * decay[:, step].reshape(b, hv, 1, 1)
        remembered = (s * key).sum(-1)                                      # [B, Hv, Dv]
        correction = (values[:, step] - remembered) * rate[:, step].unsqueeze(-1)
        s = s + key * correction.unsqueeze(-1)
        outputs.append((s * queries[:, step].unsqueeze(2)).sum(-1).cast(q.dtype))
        if storage is not None:
            s = _rounded(s, storage, acc)
            states.append(s.cast(storage))
    y = outputs[0].stack(*outputs[1:], dim=1) if outputs else Tensor.zeros(b, 0, hv, dv, dtype=q.dtype, device=q.device)
    if storage is None: return y, s.cast(state.dtype)
    stacked = states[0].stack(*states[1:], dim=1) if states else Tensor.zeros(b, 0, hv, dv, dk, dtype=storage, device=q.device)
    return y, stacked


def gated_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The gated delta rule over `T` steps from `state`.

    q, k: `[B, T, Hk, Dk]`; v: `[B, T, Hv, Dv]` (`Hv` a multiple of `Hk`); g, beta: `[B, T, Hv]`;
    state: `[B, Hv, Dv, Dk]`; all float dtypes. Returns `(y [B, T, Hv, Dv] in q's dtype,
    the final state in state's dtype)`.
    """
    _check("gated_delta", q, k, v, g, beta, state)
    backend = _kernel_backend("gated_delta", q, v, (q, k, v, g, beta, state))
    if backend is not None:
        return kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=backend,
                                         composition=lambda *x: _recurrence(*x, None))
    return _recurrence(q, k, v, g, beta, state, None)


def gated_delta_steps(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                      storage: DType | None = None) -> tuple[Tensor, Tensor]:
    """`gated_delta`, keeping every step's state: `(y, states [B, T, Hv, Dv, Dk])`.

    Each state is rounded to `storage` (default: state's dtype, a float dtype) and the next step
    continues from the rounded state, so `states[:, t]` equals `t + 1` serial `gated_delta` calls
    on a state kept in `storage`, bit for bit.
    """
    op = "gated_delta_steps"
    _check(op, q, k, v, g, beta, state)
    storage = state.dtype if storage is None else storage
    if not is_floating(storage):
        raise TypeError(f"{op}: storage must be a float dtype, got {storage}")
    backend = _kernel_backend(op, q, v, (q, k, v, g, beta, state), storage)
    if backend is not None:
        return kernel.gated_delta_kernel(q, k, v, g, beta, state, backend=backend, storage=storage,
                                         composition=lambda *x: _recurrence(*x, storage))
    return _recurrence(q, k, v, g, beta, state, storage)


def _chunked(q: Tensor, k: Tensor, v: Tensor, log_g: Tensor, beta: Tensor, state: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The rule over chunks of `size` steps (the input padded to whole chunks with steps that
    change nothing: k = v = 0, beta = 0, log_g = 0).

    Within a chunk, with the cumulative log decay `c` and `L[i, j] = exp(c_i - c_j)` for `j <= i`,
    the delta rule's updates are `u = X (beta v)` and `w = X (beta k exp(c))` with
    `X = (I + strictly_lower((beta k) kᵀ * L))⁻¹`; the inverse of the unit lower triangular
    matrix is the product `(I + N)(I + N²)(I + N⁴)...` of `N = -strictly_lower(...)`, nilpotent,
    so no solve is needed. Then per chunk (Sᵀ `[Dk, Dv]`): `v' = u - w Sᵀ`,
    `y = (q exp(c)) Sᵀ + ((q kᵀ) * L) v'`, `Sᵀ = exp(c_last) Sᵀ + (k exp(c_last - c))ᵀ v'`."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    acc = _arithmetic_dtype(q, k, v, log_g, beta, state)
    chunks = -(-t // size)
    pad = chunks * size - t

    def heads(x: Tensor, per_value_head: bool) -> Tensor:   # [B, T, H, D] -> [B, Hv, chunks, size, D]
        x = x.cast(acc)
        if per_value_head and hv != hk:
            x = x.reshape(b, t, hk, 1, x.shape[-1]).expand(b, t, hk, hv // hk, x.shape[-1]).reshape(b, t, hv, -1)
        x = x.pad((None, (0, pad), None, None)) if pad else x
        # stored: the chunks' programs then read buffers of one layout whatever T is (compiled once)
        return x.permute(0, 2, 1, 3).reshape(b, hv, chunks, size, x.shape[-1]).contiguous()

    def per_step(x: Tensor) -> Tensor:                     # [B, T, Hv] -> [B, Hv, chunks, size]
        x = x.cast(acc)
        x = x.pad((None, (0, pad), None)) if pad else x
        return x.permute(0, 2, 1).reshape(b, hv, chunks, size).contiguous()

    queries, keys, values = heads(q, True), heads(k, True), heads(v, False)
    rate, cum = per_step(beta), per_step(log_g).cumsum(-1)
    rows = Tensor.arange(size).reshape(size, 1)
    lower, strict = rows >= Tensor.arange(size).reshape(1, size), rows > Tensor.arange(size).reshape(1, size)
    # the exponentials stored once: inlined, each product using them would compile its own copy
    decay = lower.where(cum.unsqueeze(-1) - cum.unsqueeze(-2), -math.inf).exp().contiguous()  # L [.., size, size]
    grown, last = cum.exp().unsqueeze(-1).contiguous(), cum[..., -1:]
    keys_rate = keys * rate.unsqueeze(-1)
    n = strict.where(-(keys_rate @ keys.transpose(-1, -2)) * decay, 0.0).contiguous()
    inverse, power = (n + Tensor.eye(size, dtype=acc)).contiguous(), n
    for _ in range(max(math.ceil(math.log2(size)), 1) - 1):   # each level's two programs alike (stored operands)
        power = (power @ power).contiguous()
        inverse = (inverse + inverse @ power).contiguous()
    updates = inverse @ (values * rate.unsqueeze(-1))                                       # u [.., size, Dv]
    reads = inverse @ (keys_rate * grown)                                                   # w [.., size, Dk]
    within = (queries @ keys.transpose(-1, -2)) * decay
    queries = queries * grown
    keys = keys * (last - cum).exp().unsqueeze(-1)
    s = state.cast(acc).transpose(-1, -2)                                                   # Sᵀ [B, Hv, Dk, Dv]
    outputs = []
    for i in range(chunks):
        fresh = updates[:, :, i] - reads[:, :, i] @ s
        outputs.append(queries[:, :, i] @ s + within[:, :, i] @ fresh)
        s = s * last[:, :, i].exp().unsqueeze(-1) + keys[:, :, i].transpose(-1, -2) @ fresh
    y = outputs[0].stack(*outputs[1:], dim=2) if chunks > 1 else outputs[0].unsqueeze(2)  # [B, Hv, chunks, size, Dv]
    y = y.reshape(b, hv, chunks * size, dv)[:, :, :t].permute(0, 2, 1, 3)
    return y.cast(q.dtype), s.transpose(-1, -2).cast(state.dtype)


def _check_pool(op: str, pool: Tensor, slots: Tensor, batch: int, hv: int, dv: int, dk: int) -> None:
    """A `[P, Hv, Dv, Dk]` float pool and `[B]` integer slots."""
    check_tensor(op, "pool", pool)
    check_tensor(op, "slots", slots)
    check(pool.ndim == 4 and tuple(pool.shape[1:]) == (hv, dv, dk), op,
          f"pool must be [slots, {hv}, {dv}, {dk}], got {tuple(pool.shape)}")
    check(tuple(slots.shape) == (batch,), op, f"slots must be [{batch}], got shape {tuple(slots.shape)}")
    check_floating(op, "pool", pool.dtype)
    check_integer(op, "slots", slots.dtype)


def _on_slots(pool: Tensor, slots: Tensor, rule) -> tuple[Tensor, Tensor]:
    """`rule(states) -> (y, new states)` run from each sequence's state in the pool, the new states
    written back: a slot outside the pool reads a zero state, gives zero outputs and writes nothing."""
    b, places = slots.shape[0], pool.shape[0]
    valid = (slots >= 0) & (slots < places)
    states = take_rows(pool, slots.cast(dtypes.int64).clip(0, max(places - 1, 0)).cast(dtypes.int32)) if places else \
        Tensor.zeros(b, *pool.shape[1:], dtype=pool.dtype, device=pool.device)
    y, new_states = rule(valid.reshape(b, 1, 1, 1).where(states, 0.0))
    return valid.reshape(b, 1, 1, 1).where(y, 0.0), put_rows(pool, new_states, slots)


def gated_delta_chunked(q: Tensor, k: Tensor, v: Tensor, log_g: Tensor, beta: Tensor, state: Tensor,
                        chunk_size: int = 64, slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`gated_delta` with the decay given as its logarithm (`g = exp(log_g)`, `log_g` finite and
    <= 0), for prefills: where the gated delta kernel runs this call (METAL, CUDA) it runs it;
    elsewhere the chunked composition (`chunk_size` steps a chunk, a power of two), equal to
    `gated_delta`'s up to rounding and compiled once per chunk count rather than per step.

    Shapes and dtypes as `gated_delta`'s; returns `(y, the final state)`. With `slots` (`[B]`
    integers) `state` is a pool `[P, Hv, Dv, Dk]` as `gated_delta_slots` takes it: sequence `b`
    continues from `pool[slots[b]]` and leaves its state there (a slot outside the pool: zero
    outputs, no row changed); returns `(y, the updated pool)`, the kernel's written in place.
    """
    op = "gated_delta_chunked"
    if slots is None:
        _check(op, q, k, v, log_g, beta, state)
    else:
        b, _, _, hv, dk, dv = _check(op, q, k, v, log_g, beta)
        _check_pool(op, state, slots, b, hv, dv, dk)
    check(isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size >= 1
          and chunk_size & (chunk_size - 1) == 0, op, f"chunk_size must be a power of two, got {chunk_size!r}")
    backend = _kernel_backend(op, q, v, (q, k, v, log_g, beta, state))
    if backend is not None:
        shape = kernel.route(q, k, v, "final" if slots is None else "slots")
        composition = None if slots is not None else lambda *x: _recurrence(*x, None)
        if isinstance(shape, kernel.Chunked):  # the chunked kernel takes the logarithm itself
            if composition is not None:
                composition = lambda q, k, v, lg, b, s: _recurrence(q, k, v, lg.exp(), b, s, None)  # noqa: E731
            return kernel.gated_delta_kernel(q, k, v, log_g, beta, state, backend=backend, shape=shape, log_decay=True,
                                             slots=slots, composition=composition)
        return kernel.gated_delta_kernel(q, k, v, log_g.exp(), beta, state, backend=backend, shape=shape, slots=slots,
                                         composition=composition)

    def rule(states: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[1] == 0: return _recurrence(q, k, v, log_g, beta, states, None)
        return _chunked(q, k, v, log_g, beta, states, chunk_size)
    return rule(state) if slots is None else _on_slots(state, slots, rule)


def gated_delta_slots(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor,
                      slots: Tensor) -> tuple[Tensor, Tensor]:
    """`gated_delta` for sequences whose states live in a pool: sequence `b` reads and writes
    `pool[slots[b]]`.

    pool: `[P, Hv, Dv, Dk]`; slots: `[B]` integers. A negative or out-of-range slot is skipped: its
    outputs are zeros and no pool row changes (never clamped onto a live slot). Returns
    `(y, the updated pool)`. On METAL and CUDA the kernel updates `pool`'s buffer in place (when
    `pool` is a realized buffer; otherwise a copy of it) and runs at once, both outputs realized
    together so that the update is applied once; two sequences naming one live slot then race (the
    composition keeps the later sequence's state).
    """
    op = "gated_delta_slots"
    b, _, _, hv, dk, dv = _check(op, q, k, v, g, beta)
    _check_pool(op, pool, slots, b, hv, dv, dk)
    backend = _kernel_backend(op, q, v, (q, k, v, g, beta, pool))
    if backend is not None: return kernel.gated_delta_kernel(q, k, v, g, beta, pool, backend=backend, slots=slots)
    return _on_slots(pool, slots, lambda states: _recurrence(q, k, v, g, beta, states, None))


def gated_delta_inputs(projected: Tensor, conv: Tensor, filters: Tensor, a_log: Tensor, dt_bias: Tensor,
                       heads: DeltaNetHeads, slots: Tensor | None = None, eps: float = 1e-6,
                       log_decay: bool = False) -> tuple[Tensor, ...]:
    """A gated DeltaNet layer's inputs to the rule (Qwen3-Next, Qwen3.5) from its input projection:
    the causal depthwise convolution continuing each sequence from its state, then SiLU (both in
    the projection's dtype); q and k L2-normalised per head (`x / sqrt(sum(x²) + eps)`, q then
    scaled by `1 / sqrt(Dk)`); the rate `sigmoid(b)` and the decay
    `exp(-exp(a_log) * softplus(a + dt_bias))`, or its logarithm with `log_decay` (as
    `gated_delta_chunked` takes it). transformers' `causal_conv1d_update`, `l2norm` and its gate
    computations in `Qwen3NextGatedDeltaNet` compute the same.

    projected: `[B, T, heads.width]` (`DeltaNetHeads.split` says the layout); conv: the state
    `[B, K - 1, C]` (`C = heads.channels`), or with `slots` (`[B]` integers) a pool
    `[P, K - 1, C]` of which sequence `b` continues row `slots[b]` (a slot outside the pool reads
    zeros, gives zero q, k and v, and changes no row); filters: `[C, K]`; a_log, dt_bias: `[Hv]`.
    Returns `(q, k [B, T, Hk, Dk], v [B, T, Hv, Dv])` in the projection's dtype (the norms
    computed in float32, then rounded, as transformers keeps the rule's inputs), `(g, beta [B, T,
    Hv])` in float32, and the updated state (or pool): the last `K - 1` inputs of each sequence, in
    conv's dtype. Where the kernel runs (METAL, CUDA) it updates conv's buffer in place (a realized
    buffer; otherwise a copy of it) and runs at once.
    """
    op = "gated_delta_inputs"
    for name, t in (("projected", projected), ("conv", conv), ("filters", filters), ("a_log", a_log), ("dt_bias", dt_bias)):
        check_tensor(op, name, t)
        check_floating(op, name, t.dtype)
    check(isinstance(heads, DeltaNetHeads) and min(heads.key_heads, heads.value_heads, heads.key_dim, heads.value_dim) > 0
          and heads.value_heads % heads.key_heads == 0, op,
          f"heads must be DeltaNetHeads of positive sizes, value heads a multiple of key heads, got {heads!r}")
    channels, hv = heads.channels, heads.value_heads
    taps = filters.shape[1] if filters.ndim == 2 else 0
    check(projected.ndim == 3 and projected.shape[2] == heads.width and filters.ndim == 2 and filters.shape[0] == channels
          and taps >= 1 and conv.ndim == 3 and tuple(conv.shape[1:]) == (taps - 1, channels)
          and tuple(a_log.shape) == (hv,) and tuple(dt_bias.shape) == (hv,), op,
          f"projected must be [B, T, {heads.width}], filters [{channels}, K], conv [.., K - 1, {channels}], a_log and "
          f"dt_bias [{hv}], got {tuple(projected.shape)}, {tuple(filters.shape)}, {tuple(conv.shape)}, "
          f"{tuple(a_log.shape)} and {tuple(dt_bias.shape)}")
    batch, steps = projected.shape[0], projected.shape[1]
    if slots is None:
        check(conv.shape[0] == batch, op, f"conv must be [{batch}, {taps - 1}, {channels}], got {tuple(conv.shape)}")
    else:
        check_tensor(op, "slots", slots)
        check_integer(op, "slots", slots.dtype)
        check(tuple(slots.shape) == (batch,), op, f"slots must be [{batch}], got shape {tuple(slots.shape)}")
    check(isinstance(eps, (int, float)) and eps >= 0, op, f"eps must be a number >= 0, got {eps!r}")
    description = f"{tuple(projected.shape)} on {projected.device}"
    backend = None if 0 in (batch, steps) else kernels.choose(
        op, description, projected.device, "gated_delta_inputs",
        lambda backend: kernel.inputs_unsupported(tuple(t.dtype for t in (projected, conv, filters, a_log, dt_bias)), taps,
                                                  heads.key_dim, heads.value_dim, kernels.target(projected.device)))
    if backend is not None:
        return kernel.gated_delta_inputs_kernel(projected, conv, filters, a_log, dt_bias, heads, float(eps), backend=backend,
                                                slots=slots, log_decay=log_decay)
    return _inputs(projected, conv, filters, a_log, dt_bias, heads, slots, float(eps), log_decay)


def _inputs(projected: Tensor, conv: Tensor, filters: Tensor, a_log: Tensor, dt_bias: Tensor, heads: DeltaNetHeads,
            slots: Tensor | None, eps: float, log_decay: bool) -> tuple[Tensor, ...]:
    """`gated_delta_inputs`' composition."""
    b, t, _ = projected.shape
    hk, hv, dk, dv = heads.key_heads, heads.value_heads, heads.key_dim, heads.value_dim
    mixed, _, beta, a = heads.split(projected)
    w = filters.cast(mixed.dtype).reshape(heads.channels, filters.shape[1], 1)
    if slots is not None:
        features, new_conv = causal_conv1d_slots(mixed, w, conv, slots, silu=True)
    else:   # stored, as the convolution's output: what reads them then compiles as small programs
        sequence = conv.cast(mixed.dtype).cat(mixed, dim=1).contiguous()           # [B, K - 1 + T, C]
        features = depthwise_conv1d(sequence, w).silu()
        new_conv = sequence[:, t:].cast(conv.dtype)
    q, k, v = features.contiguous().split([hk * dk, hk * dk, hv * dv], dim=-1)

    def l2_normalized(x: Tensor) -> Tensor:   # an RMS norm with eps / D (MLX's form), then 1 / sqrt(D)
        return rms_norm(x, None, eps / dk) * (dk ** -0.5)
    q = (l2_normalized(q.reshape(b, t, hk, dk).cast(dtypes.float32)) * (dk ** -0.5)).cast(mixed.dtype)
    k = l2_normalized(k.reshape(b, t, hk, dk).cast(dtypes.float32)).cast(mixed.dtype)
    v = v.reshape(b, t, hv, dv)
    rate = beta.cast(dtypes.float32).sigmoid()
    decay = -a_log.cast(dtypes.float32).exp() * (a.cast(dtypes.float32) + dt_bias.cast(dtypes.float32)).softplus()
    return q, k, v, decay if log_decay else decay.exp(), rate, new_conv
