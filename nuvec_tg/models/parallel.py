"""Tensor parallelism over tinygrad's multi-device tensors: a model loaded on one device, then
its weights spread over several, Megatron-style, so that each device holds a slice of every layer.

The model then runs on per-device tensors: each weight is kept as its shards, one buffer a device
(`per_device`: on the tuple of devices, each buffer that device's slice), and every layer runs
the single-device code on its own device's slice, with its own sizes (a device's heads, its MLP
columns), kernels included (`kernels.per_device()`, which `Model` enters). Between the layers
the activations are the same on every device; two sums a block cross devices:

- Column-parallel (q/k/v, gate/up): output rows split by device. A fused `Linear`'s rows are
  reordered first so that device i holds the i-th slice of every module (`[q_i; k_i; v_i]`), so
  its product splits into its modules as on one device, with the device's sizes (`outs`).
- Row-parallel (o, down): input columns split by device; each device's product is a partial sum
  and `Linear.reduce` sums them (`layers.all_reduce`, tinygrad's all-reduce); a bias is held by
  the first device alone (zeros on the others), so that it is added once.
- Attention heads, their sinks and the KV cache split by key-value head (whole groups of query
  heads with their key head); with fewer key-value heads than devices, the query heads split and
  each device holds a copy of its heads' key-value head (as vLLM does). Norms, embeddings and
  the rotary tables are copied.
- The head (untied) splits by vocabulary: each device computes its slice of the logits, then
  the slices are gathered on every device (`Linear.owned`). A tied head (the embeddings) is copied.
- A gated DeltaNet (Qwen3-Next, Qwen3.5) splits by key head, each with its value heads: their
  projection rows, filter channels, decays and states; its output projection is row-parallel.
- A MoE's experts: many (`WHOLE_EXPERTS` or more a device), or whose columns do not split, go
  whole to the devices (expert parallelism: each device runs its experts' entries, the others'
  give zeros); few split by their columns (each device a slice of every expert, as a dense MLP's:
  every device busy with every expert a token picks). The router is on every device, and the
  weighted sum of the experts is summed over the devices (`MoE.reduce`). A shared expert
  (Qwen3-Next) is an MLP split by columns, its gate copied.

Quantized weights split the same way: codes, scales and biases by output row, or by input column
where a device's slice of K is a whole number of groups. Not yet: the model is read onto the
first device whole before it is spread, so it must fit there.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from tinygrad import Tensor
from tinygrad.uop.ops import Ops

from ..quant import QuantizedWeight
from .layers import MLP, Attention, Embedding, Experts, Linear, MoE, Norm, PreNormBlock
from .linear_attention import GatedDeltaNet
from .qwen3_next import SharedExpertMoE
from .rope import RotaryEmbedding


def check_devices(op: str, devices) -> tuple[str, ...]:
    """`devices` as a tuple of at least two distinct device names (a `ValueError` naming `op` otherwise)."""
    if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
        raise TypeError(f"{op}: devices must be a tuple of device names, got {devices!r}")
    devices = tuple(devices)
    if len(devices) < 2 or len(set(devices)) != len(devices):
        raise ValueError(f"{op}: devices must name at least two distinct devices, got {devices}")
    return devices


# Experts a device from which a MoE's experts go whole to the devices (expert parallelism).
WHOLE_EXPERTS = 8


def _mlps(mlp) -> list[MLP | MoE]:
    """The dense MLPs and expert banks of a block's MLP (a shared-expert MoE has one of each)."""
    return [mlp.moe, mlp.shared] if isinstance(mlp, SharedExpertMoE) else [mlp]


def _row_parallel_groups(name: str, linear: Linear | Experts, n: int) -> str | None:
    """Why a quantized row-parallel weight's groups of K do not split over n devices, or None."""
    for w in linear.weights:
        if isinstance(w, QuantizedWeight) and w.scales.shape[-1] % n:
            return f"{name}'s {w.scales.shape[-1]} groups of K do not split over {n} devices"
    return None


def _block_unsupported(block, n: int) -> str | None:
    """Why a block cannot be split over n devices, or None (`unsupported`)."""
    if not isinstance(block, PreNormBlock):
        return f"a {type(block).__name__} is not sharded"
    mixer, reasons = block.attention, []
    if isinstance(mixer, Attention):
        if mixer.heads % n: return f"{mixer.heads} query heads do not split over {n} devices"
        if mixer.kv_heads % n and n % mixer.kv_heads:
            return f"{mixer.kv_heads} key-value heads neither split over {n} devices nor copy to them evenly"
        reasons.append(_row_parallel_groups("o", mixer.o, n))
    elif isinstance(mixer, GatedDeltaNet):
        if mixer.key_heads % n: return f"{mixer.key_heads} key heads of a gated DeltaNet do not split over {n} devices"
        reasons.append(_row_parallel_groups("out_proj", mixer.out, n))
    else:
        return f"its {type(mixer).__name__} is not sharded"
    for mlp in _mlps(block.mlp):
        if not isinstance(mlp, (MLP, MoE)): return f"its {type(mlp).__name__} is not sharded"
        if isinstance(mlp, MoE) and _whole_experts(mlp, n): continue
        reason = _columns_unsupported(mlp, n)
        if reason is not None and isinstance(mlp, MoE): reason += f", and {mlp.router.outs[0]} experts do not split over them"
        reasons.append(reason)
    return next((r for r in reasons if r is not None), None)


def _columns_unsupported(mlp: MLP | MoE, n: int) -> str | None:
    """Why an MLP's (or every expert's) columns do not split over n devices, or None."""
    if mlp.gate_up.outs[0] % n: return f"an MLP of {mlp.gate_up.outs[0]} does not split over {n} devices"
    return _row_parallel_groups("down", mlp.down, n)


def _whole_experts(moe: MoE, n: int) -> bool:
    """Whether a MoE's experts go whole to n devices: they divide evenly, and are many
    (`WHOLE_EXPERTS` a device) or their columns do not split."""
    experts = moe.router.outs[0]
    return experts % n == 0 and (experts // n >= WHOLE_EXPERTS or _columns_unsupported(moe, n) is not None)


def unsupported(parts: dict, devices: tuple[str, ...]) -> str | None:
    """Why `parts` (a family's `build` result) cannot be sharded over `devices`, or None. Before the
    loader has read the weights (`Linear.weights` empty) only the layers and their sizes are checked."""
    for index, block in enumerate(parts["layers"]):
        reason = _block_unsupported(block, len(devices))
        if reason is not None: return f"layer {index}: {reason}"
    return None


def refuse(parts: dict, devices: tuple[str, ...], op: str) -> None:
    """A `ValueError` naming `op` where `unsupported` gives a reason."""
    reason = unsupported(parts, devices)
    if reason is not None: raise ValueError(f"{op}: cannot shard over {len(devices)} devices: {reason}")


def _interleaved(t: Tensor, sizes: list[int], n: int, axis: int = 0, slices: list[int] | None = None) -> Tensor:
    """`t`'s `axis` (of `sum(sizes)`, pieces side by side) reordered so that the i-th of n equal
    parts holds the i-th slice of every piece in turn. `slices[j]` (default n): piece j's count of
    slices, device i taking slice `i * slices[j] // n` (fewer than n: a slice copied to several
    devices, a key-value head to the devices of its query heads)."""
    slices = slices or [n] * len(sizes)
    pieces = [piece.chunk(count, dim=axis) for piece, count in zip(t.split(sizes, dim=axis), slices)]
    parts = [piece[i * count // n] for i in range(n) for piece, count in zip(pieces, slices)]
    return parts[0].cat(*parts[1:], dim=axis)


def per_device(t: Tensor) -> Tensor:
    """A realized tensor split over devices (`Tensor.shard`) as its shards: one buffer a device,
    each that device's slice, as a tensor of the shard's shape on the tuple of devices; a copied or
    single-device tensor as it is."""
    return Tensor(t.uop.src[0]) if t.uop.op is Ops.UNSHARD else t


def _spread(t: Tensor | None, devices: tuple[str, ...], axis: int | None) -> Tensor | None:
    """`t` split along `axis` over `devices` (None: a copy on each), realized, per device."""
    if t is None: return None
    return per_device((t.to(devices) if axis is None else t.shard(devices, axis=axis)).realize())


def _first_device_only(t: Tensor | None, devices: tuple[str, ...]) -> Tensor | None:
    """`t` on the first of `devices` and zeros of its shape on the others, per device: a bias added
    to partial sums before they are summed over the devices counts once."""
    if t is None: return None
    stacked = t.unsqueeze(0).cat(t.zeros_like().unsqueeze(0).expand(len(devices) - 1, *t.shape), dim=0).contiguous()
    return _spread(stacked, devices, 0).reshape(t.shape)


def _each_tensor(w, spread):
    """A dense weight through `spread`, or a quantized one's codes, scales and biases alike."""
    if not isinstance(w, QuantizedWeight): return spread(w)
    return QuantizedWeight(spread(w.weight), spread(w.scales), spread(w.biases), w.mode, w.group_size, w.bits)


def _column_parallel(linear: Linear | Experts, devices: tuple[str, ...], pieces: list[int] | None = None,
                     slices: list[int] | None = None) -> None:
    """Output rows by device (a bank's: each expert's), each device's slice of every module
    together (`_interleaved`); the bias likewise along its last axis; `outs` a device's. `pieces`
    (default `outs`): finer pieces the modules are made of, each split alone (Qwen3.5's
    `in_proj_qkv`: q, k, v); `slices`: as `_interleaved`'s, a count per piece. Weights stored
    unalike (one a module) split each alone."""
    n, pieces = len(devices), pieces or linear.outs
    slices = slices or [n] * len(pieces)
    axis = -2 if isinstance(linear, Experts) else 0
    ends = list(itertools.accumulate(pieces))
    def span(start: int, stop: int) -> tuple[list[int], list[int]]:   # the pieces (and their slices) of rows [start, stop)
        chosen = [j for j, end in enumerate(ends) if start < end <= stop]
        return [pieces[j] for j in chosen], [slices[j] for j in chosen]
    def rows(t, start, stop, axis=axis):
        sizes, counts = span(start, stop)
        return _spread(_interleaved(t, sizes, n, axis, counts).contiguous(), devices, axis)
    module_ends = list(itertools.accumulate(linear.outs))
    if len(linear.weights) == 1: linear.weights = [_each_tensor(linear.weights[0], lambda t: rows(t, 0, ends[-1]))]
    else: linear.weights = [_each_tensor(w, lambda t, a=a, b=b: rows(t, a, b))
                            for w, a, b in zip(linear.weights, [0, *module_ends[:-1]], module_ends)]
    if linear.bias is not None: linear.bias = rows(linear.bias, 0, ends[-1], -1)
    linear.outs = [sum(p // c for p, c in zip(*span(a, b))) for a, b in zip([0, *module_ends[:-1]], module_ends)]


def _row_parallel(linear: Linear | Experts, devices: tuple[str, ...]) -> None:
    """Input columns by device (packed codes, scales and biases along K alike); the bias on the
    first device alone. A `Linear` sums its partial products over the devices (`reduce`)."""
    linear.weights = [_each_tensor(w, lambda t: _spread(t, devices, -1)) for w in linear.weights]
    linear.bias = _first_device_only(linear.bias, devices)
    if isinstance(linear, Linear): linear.reduce = True


def _replicated(part, devices: tuple[str, ...]) -> None:
    """Every tensor a norm, embedding, replicated `Linear` or rotary embedding holds, copied to each device."""
    if part is None: return
    def copied(t): return _spread(t, devices, None)
    if isinstance(part, Norm): part.weight = copied(part.weight)
    elif isinstance(part, Embedding): part.weight = _each_tensor(part.weight, copied)
    elif isinstance(part, Linear):
        part.weights = [_each_tensor(w, copied) for w in part.weights]
        part.bias = copied(part.bias)
    elif isinstance(part, RotaryEmbedding):
        if part.rotation.freqs is not None:
            part.rotation = dataclasses.replace(part.rotation, freqs=copied(part.rotation.freqs))
    else: raise TypeError(f"parallel: cannot replicate a {type(part).__name__}")


def _split_attention(attention: Attention, devices: tuple[str, ...]) -> None:
    """Query heads by device with their key-value heads (or copies of them, where fewer than the
    devices); o row-parallel; sinks by query head; the q/k norms copied."""
    n = len(devices)
    kv_slices = n if attention.kv_heads % n == 0 else attention.kv_heads   # fewer heads than devices: copies
    _column_parallel(attention.qkv, devices, slices=[n, kv_slices, kv_slices])
    _row_parallel(attention.o, devices)
    attention.heads, attention.kv_heads = attention.heads // n, attention.kv_heads // kv_slices
    for norm in (attention.q_norm, attention.k_norm): _replicated(norm, devices)
    if attention.sinks is not None: attention.sinks.value = _spread(attention.sinks.value, devices, 0)


def _split_delta_net(net: GatedDeltaNet, devices: tuple[str, ...]) -> None:
    """Key heads by device, each with its value heads: the projection's rows (grouped by key head
    in Qwen3-Next's layout; q, k, v, z, b and a each split in Qwen3.5's), the filter's channels
    (q, k, v), the decays `A_log` and `dt_bias`; out_proj row-parallel; the norm copied."""
    n = len(devices)
    hk, hv, dk, dv = net.key_heads // n, net.value_heads // n, net.key_dim, net.value_dim
    channels = [net.key_heads * dk, net.key_heads * dk, net.value_heads * dv]
    if net.grouped: _column_parallel(net.projection, devices)
    else: _column_parallel(net.projection, devices, pieces=channels + [net.value_heads * dv, net.value_heads, net.value_heads])
    _row_parallel(net.out, devices)
    net.conv.value = _spread(_interleaved(net.conv.value, channels, n).contiguous(), devices, 0)
    for parameter in (net.a_log, net.dt_bias): parameter.value = _spread(parameter.value, devices, 0)
    _replicated(net.norm, devices)
    net.key_heads, net.value_heads = hk, hv
    net.heads = dataclasses.replace(net.heads, key_heads=hk, value_heads=hv)
    net.channels = net.heads.channels


def _split_mlp(mlp, devices: tuple[str, ...]) -> None:
    """gate/up column-parallel, down row-parallel, for a dense MLP and each expert alike, or a
    MoE's experts whole to the devices (`_whole_experts`); a MoE's router copied, its weighted sum
    summed over the devices; a shared expert's gate copied."""
    if isinstance(mlp, SharedExpertMoE): _replicated(mlp.gate, devices)
    for part in _mlps(mlp):
        if isinstance(part, MoE):
            _replicated(part.router, devices)   # every device routes every token
            part.reduce = True
            if _whole_experts(part, len(devices)):
                _split_experts(part, devices)
                continue
        _column_parallel(part.gate_up, devices)
        _row_parallel(part.down, devices)


def _split_experts(moe: MoE, devices: tuple[str, ...]) -> None:
    """Whole experts to each device (expert parallelism): the banks and their biases split by
    expert, and each device told the first expert it holds."""
    experts, n = moe.router.outs[0], len(devices)
    for bank in (moe.gate_up, moe.down):
        bank.weights = [_each_tensor(w, lambda t: _spread(t, devices, 0)) for w in bank.weights]
        bank.bias = _spread(bank.bias, devices, 0)
    moe.local_experts = experts // n
    moe.first_expert = _spread(Tensor(np.arange(0, experts, experts // n, dtype=np.int32), device=devices[0]), devices, 0)


def shard(parts: dict, devices: tuple[str, ...], op: str) -> None:
    """Spread a family's `build` result over `devices` in place (see the module's docstring);
    a `ValueError` naming `op` when the model cannot be, before any tensor moves."""
    refuse(parts, devices, op)   # again, now that the weights are read: their groups of K
    _replicated(parts["embed"], devices)
    _replicated(parts["norm"], devices)
    head, n = parts["head"], len(devices)
    if head is not None and head.outs[0] % n == 0:
        vocab = head.outs[0]
        _column_parallel(head, devices)
        owned = np.arange(vocab)[None, :] // (vocab // n) == np.arange(n)[:, None]   # device i's row: its columns
        head.owned = _spread(Tensor(owned, device=devices[0]), devices, 0).reshape(vocab)
    else: _replicated(head, devices)
    ropes = []
    for block in parts["layers"]:
        mixer = block.attention
        if isinstance(mixer, Attention):
            _split_attention(mixer, devices)
            if all(mixer.rope is not r for r in ropes): ropes.append(mixer.rope)
        else: _split_delta_net(mixer, devices)
        _split_mlp(block.mlp, devices)
        for value in vars(block).values():   # the block's norms (Gemma's four, Qwen's two)
            if isinstance(value, Norm): _replicated(value, devices)
    for rope in ropes: _replicated(rope, devices)
