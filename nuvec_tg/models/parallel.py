"""Tensor parallelism over tinygrad's multi-device tensors (`Tensor.shard`): a model loaded on one
device, then its weights spread over several, Megatron-style, so that each device holds a slice of
every layer and tinygrad's lazy graph does the rest (each op runs per device; a product summed
over a sharded axis becomes an all-reduce).

- Column-parallel (q/k/v, gate/up): output rows split by device. A fused `Linear`'s rows are
  reordered first so that device i holds the i-th slice of every module (`[q_i; k_i; v_i]`), and
  `Linear.shards` tells it to split its output per device (`Linear.__call__`): every device then
  holds whole heads and their matching gate and up columns.
- Row-parallel (o, down): input columns split by device; the product's sum over them is tinygrad's
  all-reduce; a bias is added once, after it.
- Attention heads and the KV cache (`cache.kv_buffers`) split by key-value head (whole groups of
  query heads with their key head); norms, embeddings, the head and the rotary tables are
  replicated.

Quantized weights split the same way: codes, scales and biases by output row, or by input column
where a device's slice of K is a whole number of groups. Not yet: on a device with kernels the
sharded calls run the compositions (the launch mechanism takes one device); the model is read
onto the first device whole before it is spread, so it must fit there; the families sharded are
those of softmax attention with dense or MoE MLPs (Qwen3, Qwen3-MoE, Gemma 3, gpt-oss; a MoE's
experts split by their columns, each device a slice of every expert, the router on every
device), and the linear-attention families (Qwen3-Next, Qwen3.5) raise before any weight is read.
"""
from __future__ import annotations

import dataclasses

from tinygrad import Tensor

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


def _spread(t: Tensor | None, devices: tuple[str, ...], axis: int | None) -> Tensor | None:
    """`t` split along `axis` over `devices` (None: a copy on each), realized."""
    if t is None: return None
    return (t.to(devices) if axis is None else t.shard(devices, axis=axis)).realize()


def _each_tensor(w, spread):
    """A dense weight through `spread`, or a quantized one's codes, scales and biases alike."""
    if not isinstance(w, QuantizedWeight): return spread(w)
    return QuantizedWeight(spread(w.weight), spread(w.scales), spread(w.biases), w.mode, w.group_size, w.bits)


def _column_parallel(linear: Linear | Experts, devices: tuple[str, ...]) -> None:
    """Output rows by device (a bank's: each expert's), each device's slice of every module
    together (`_interleaved`); the bias likewise along its last axis."""
    n = len(devices)
    def rows(t, axis=-2 if isinstance(linear, Experts) else 0):
        return None if t is None else _spread(_interleaved(t, linear.outs, n, axis).contiguous(), devices, axis)
    linear.weights = [_each_tensor(linear.weights[0], rows)]
    linear.bias = rows(linear.bias, -1)
    linear.shards = n


def _row_parallel(linear: Linear | Experts, devices: tuple[str, ...]) -> None:
    """Input columns by device (packed codes, scales and biases along K alike); the bias copied,
    added once after the all-reduce."""
    linear.weights = [_each_tensor(linear.weights[0], lambda t: _spread(t, devices, -1))]
    linear.bias = _spread(linear.bias, devices, None)


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
    ropes = []
    for block in parts["layers"]:
        attention, mlp = block.attention, block.mlp
        _column_parallel(attention.qkv, devices)
        _row_parallel(attention.o, devices)
        for norm in (attention.q_norm, attention.k_norm): _replicated(norm, devices)
        if attention.sinks is not None: attention.sinks.value = _spread(attention.sinks.value, devices, 0)   # per head
        if all(attention.rope is not r for r in ropes): ropes.append(attention.rope)
        if isinstance(mlp, MoE): _replicated(mlp.router, devices)   # every device routes every token
        _column_parallel(mlp.gate_up, devices)
        _row_parallel(mlp.down, devices)
        for value in vars(block).values():   # the block's norms (Gemma's four, Qwen's two)
            if isinstance(value, Norm): _replicated(value, devices)
    for rope in ropes: _replicated(rope, devices)
