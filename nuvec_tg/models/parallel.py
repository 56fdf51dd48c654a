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
  heads with their key head); norms, embeddings, the head and the rotary tables are copied.
- A MoE's experts split by their columns (each device a slice of every expert, as a dense MLP's;
  the router on every device), the weighted sum of the experts summed over devices (`MoE.reduce`).

Quantized weights split the same way: codes, scales and biases by output row, or by input column
where a device's slice of K is a whole number of groups. Not yet: the model is read onto the
first device whole before it is spread, so it must fit there; the linear-attention families
(Qwen3-Next, Qwen3.5) raise before any weight is read.
"""
from __future__ import annotations

import dataclasses

from tinygrad import Tensor
from tinygrad.uop.ops import Ops

from ..quant import QuantizedWeight
from .layers import Attention, Embedding, Experts, Linear, MoE, Norm, PreNormBlock
from .rope import RotaryEmbedding


def check_devices(op: str, devices) -> tuple[str, ...]:
    """`devices` as a tuple of at least two distinct device names (a `ValueError` naming `op` otherwise)."""
    if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
        raise TypeError(f"{op}: devices must be a tuple of device names, got {devices!r}")
    devices = tuple(devices)
    if len(devices) < 2 or len(set(devices)) != len(devices):
        raise ValueError(f"{op}: devices must name at least two distinct devices, got {devices}")
    return devices


def unsupported(parts: dict, devices: tuple[str, ...]) -> str | None:
    """Why `parts` (a family's `build` result) cannot be sharded over `devices`, or None. Before the
    loader has read the weights (`Linear.weights` empty) only the layers and their sizes are checked."""
    n = len(devices)
    for index, block in enumerate(parts["layers"]):
        if not isinstance(block, PreNormBlock) or not isinstance(block.attention, Attention):
            kind = type(block.attention if isinstance(block, PreNormBlock) else block).__name__
            return f"layer {index} ({kind}) is not sharded yet: only softmax attention is"
        attention, mlp = block.attention, block.mlp
        if attention.kv_heads % n:
            return f"layer {index}: {attention.kv_heads} key-value heads do not split over {n} devices"
        for name, linear in (("qkv", attention.qkv), ("o", attention.o), ("gate_up", mlp.gate_up), ("down", mlp.down)):
            if len(linear.weights) > 1:
                return f"layer {index}: {name}'s modules are stored unalike (not one fused weight)"
        if mlp.gate_up.outs[0] % n:
            return f"layer {index}: an MLP of {mlp.gate_up.outs[0]} does not split over {n} devices"
        for name, linear in (("o", attention.o), ("down", mlp.down)):
            w = linear.weights[0] if linear.weights else None
            if isinstance(w, QuantizedWeight) and (w.scales.shape[-1] % n):
                return f"layer {index}: {name}'s {w.scales.shape[-1]} groups of K do not split over {n} devices"
    return None


def refuse(parts: dict, devices: tuple[str, ...], op: str) -> None:
    """A `ValueError` naming `op` where `unsupported` gives a reason."""
    reason = unsupported(parts, devices)
    if reason is not None: raise ValueError(f"{op}: cannot shard over {len(devices)} devices: {reason}")


def _interleaved(t: Tensor, outs: list[int], n: int, axis: int = 0) -> Tensor:
    """`t`'s `axis` (of `sum(outs)`, the modules side by side) reordered so that the i-th of n
    equal slices holds the i-th slice of every module in turn."""
    modules = [module.chunk(n, dim=axis) for module in t.split(outs, dim=axis)]
    pieces = [module[i] for i in range(n) for module in modules]
    return pieces[0].cat(*pieces[1:], dim=axis)


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


def _column_parallel(linear: Linear | Experts, devices: tuple[str, ...]) -> None:
    """Output rows by device (a bank's: each expert's), each device's slice of every module
    together (`_interleaved`); the bias likewise along its last axis; `outs` a device's."""
    n = len(devices)
    def rows(t, axis=-2 if isinstance(linear, Experts) else 0):
        return None if t is None else _spread(_interleaved(t, linear.outs, n, axis).contiguous(), devices, axis)
    linear.weights = [_each_tensor(linear.weights[0], rows)]
    linear.bias = rows(linear.bias, -1)
    linear.outs = [out // n for out in linear.outs]


def _row_parallel(linear: Linear | Experts, devices: tuple[str, ...]) -> None:
    """Input columns by device (packed codes, scales and biases along K alike); the bias on the
    first device alone. A `Linear` sums its partial products over the devices (`reduce`)."""
    linear.weights = [_each_tensor(linear.weights[0], lambda t: _spread(t, devices, -1))]
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


def shard(parts: dict, devices: tuple[str, ...], op: str) -> None:
    """Spread a family's `build` result over `devices` in place (see the module's docstring);
    a `ValueError` naming `op` when the model cannot be, before any tensor moves."""
    refuse(parts, devices, op)   # again, now that the weights are read: their groups of K
    _replicated(parts["embed"], devices)
    _replicated(parts["norm"], devices)
    _replicated(parts["head"], devices)
    ropes, n = [], len(devices)
    for block in parts["layers"]:
        attention, mlp = block.attention, block.mlp
        _column_parallel(attention.qkv, devices)
        _row_parallel(attention.o, devices)
        attention.heads, attention.kv_heads = attention.heads // n, attention.kv_heads // n
        for norm in (attention.q_norm, attention.k_norm): _replicated(norm, devices)
        if attention.sinks is not None: attention.sinks.value = _spread(attention.sinks.value, devices, 0)   # per head
        if all(attention.rope is not r for r in ropes): ropes.append(attention.rope)
        if isinstance(mlp, MoE):
            _replicated(mlp.router, devices)   # every device routes every token
            mlp.reduce = True
        _column_parallel(mlp.gate_up, devices)
        _row_parallel(mlp.down, devices)
        for value in vars(block).values():   # the block's norms (Gemma's four, Qwen's two)
            if isinstance(value, Norm): _replicated(value, devices)
    for rope in ropes: _replicated(rope, devices)
