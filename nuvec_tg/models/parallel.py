"""Tensor parallelism over tinygrad's multi-device tensors: a model's weights spread over several
devices as the loader reads them (`Plan`: each layer object, once read, goes straight to its
devices), Megatron-style, so that each device holds a slice of every layer.

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
where a device's slice of K is a whole number of groups. A layer is read onto the first device
before it spreads (a MoE's first bank waits there for its second), so the largest layer must fit
there beside the first device's shards, not the whole model.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.uop.ops import Ops

from ..quant import QuantizedWeight
from .layers import MLP, Attention, Embedding, Experts, Linear, MoE, Norm, Parameter, PreNormBlock
from .linear_attention import GatedDeltaNet
from .qwen3_next import SharedExpertMoE
from .rope import RotaryEmbedding


def default_devices(count: int) -> tuple[str, ...] | None:
    """The default device's first `count` instances (`CUDA:0`, `CUDA:1`, ...), or None for one:
    what `--devices N` of the commands splits a model over."""
    return tuple(f"{Device.DEFAULT}:{i}" for i in range(count)) if count > 1 else None


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


def mlps(mlp) -> list[MLP | MoE]:
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
    for mlp in mlps(block.mlp):
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


def _row_parallel(linear: Linear | Experts, devices: tuple[str, ...], op: str, name: str) -> None:
    """Input columns by device (packed codes, scales and biases along K alike); the bias on the
    first device alone. A `Linear` sums its partial products over the devices (`reduce`). A
    `ValueError` naming `op` and the weight (`name`) where quantized groups of K do not split
    (known only once the weight is read)."""
    reason = _row_parallel_groups(name, linear, len(devices))
    if reason is not None: raise ValueError(f"{op}: cannot shard over {len(devices)} devices: {reason}")
    linear.weights = [_each_tensor(w, lambda t: _spread(t, devices, -1)) for w in linear.weights]
    linear.bias = _first_device_only(linear.bias, devices)
    if isinstance(linear, Linear): linear.reduce = True


def _replicated(part, devices: tuple[str, ...]) -> None:
    """Every tensor a norm, embedding, replicated `Linear`, `Parameter` or rotary embedding holds,
    copied to each device."""
    if part is None: return
    def copied(t): return _spread(t, devices, None)
    if isinstance(part, Norm): part.weight = copied(part.weight)
    elif isinstance(part, Embedding): part.weight = _each_tensor(part.weight, copied)
    elif isinstance(part, Parameter): part.value = copied(part.value)
    elif isinstance(part, Linear):
        part.weights = [_each_tensor(w, copied) for w in part.weights]
        part.bias = copied(part.bias)
    elif isinstance(part, RotaryEmbedding):
        if part.rotation.freqs is not None:
            part.rotation = dataclasses.replace(part.rotation, freqs=copied(part.rotation.freqs))
    else: raise TypeError(f"parallel: cannot replicate a {type(part).__name__}")


class Plan:
    """How a model spreads over `devices`, decided from its layers before its weights are read:
    for each layer object the loader fills, what spreads its tensors once they are read
    (`place`, called by `Loader.finish` as each is read: the model never lies whole on the first
    device), and what changes the layers' sizes once all are (`finish`)."""

    def __init__(self, parts: dict, devices: tuple[str, ...], op: str):
        self.devices, self.parts, self.op = devices, parts, op
        self._placements: dict[int, Callable[[], None]] = {}
        self._resizes: list[Callable[[], None]] = []
        self._plan()

    def place(self, part) -> None:
        """Spread a layer object the loader has just filled."""
        placement = self._placements.pop(id(part), None)
        if placement is None: raise TypeError(f"parallel: no placement planned for a {type(part).__name__}")
        placement()

    def finish(self) -> None:
        """The layers' sizes as a device's, once every tensor has spread."""
        if self._placements: raise RuntimeError(f"parallel: {len(self._placements)} layer objects were never read")
        for resize in self._resizes: resize()

    def _on(self, part, placement: Callable[[], None]) -> None:
        if part is not None: self._placements[id(part)] = placement

    def _copied(self, part) -> None:
        self._on(part, lambda: _replicated(part, self.devices))

    def _plan(self) -> None:
        parts, devices, n = self.parts, self.devices, len(self.devices)
        self._copied(parts["embed"])
        self._copied(parts["norm"])
        head = parts["head"]
        if head is not None and head.outs[0] % n == 0: self._on(head, lambda: _split_head(head, devices))
        else: self._copied(head)
        ropes = []
        for index, block in enumerate(parts["layers"]):
            mixer, where = block.attention, f"layer {index}"
            if isinstance(mixer, Attention):
                self._attention(mixer, where)
                if all(mixer.rope is not r for r in ropes): ropes.append(mixer.rope)
            else: self._delta_net(mixer, where)
            self._mlp(block.mlp, where)
            for value in vars(block).values():   # the block's norms (Gemma's four, Qwen's two)
                if isinstance(value, Norm): self._copied(value)
        # the rotary tables are made at build, not read: copied once the rest has spread
        self._resizes += [lambda rope=rope: _replicated(rope, devices) for rope in ropes]

    def _attention(self, attention: Attention, where: str) -> None:
        """Query heads by device with their key-value heads (or copies of them, where fewer than
        the devices); o row-parallel; sinks by query head; the q/k norms copied."""
        devices, n = self.devices, len(self.devices)
        kv_slices = n if attention.kv_heads % n == 0 else attention.kv_heads   # fewer heads than devices: copies
        self._on(attention.qkv, lambda: _column_parallel(attention.qkv, devices, slices=[n, kv_slices, kv_slices]))
        self._on(attention.o, lambda: _row_parallel(attention.o, devices, self.op, f"{where}: o"))
        for norm in (attention.q_norm, attention.k_norm): self._copied(norm)
        sinks = attention.sinks
        if sinks is not None: self._on(sinks, lambda: setattr(sinks, "value", _spread(sinks.value, devices, 0)))
        heads, kv_heads = attention.heads // n, attention.kv_heads // kv_slices
        self._resizes.append(lambda: (setattr(attention, "heads", heads), setattr(attention, "kv_heads", kv_heads)))

    def _delta_net(self, net: GatedDeltaNet, where: str) -> None:
        """Key heads by device, each with its value heads: the projection's rows (grouped by key
        head in Qwen3-Next's layout; q, k, v, z, b and a each split in Qwen3.5's), the filter's
        channels (q, k, v), the decays `A_log` and `dt_bias`; out_proj row-parallel; the norm copied."""
        devices, n = self.devices, len(self.devices)
        dk, dv, hk, hv = net.key_dim, net.value_dim, net.key_heads, net.value_heads
        channels = [hk * dk, hk * dk, hv * dv]
        pieces = None if net.grouped else channels + [hv * dv, hv, hv]
        self._on(net.projection, lambda: _column_parallel(net.projection, devices, pieces=pieces))
        self._on(net.out, lambda: _row_parallel(net.out, devices, self.op, f"{where}: out_proj"))
        conv = net.conv
        self._on(conv, lambda: setattr(conv, "value", _spread(_interleaved(conv.value, channels, n).contiguous(), devices, 0)))
        for parameter in (net.a_log, net.dt_bias):
            self._on(parameter, lambda p=parameter: setattr(p, "value", _spread(p.value, devices, 0)))
        self._copied(net.norm)
        def resize() -> None:
            net.key_heads, net.value_heads = hk // n, hv // n
            net.heads = dataclasses.replace(net.heads, key_heads=hk // n, value_heads=hv // n)
            net.channels = net.heads.channels
        self._resizes.append(resize)

    def _mlp(self, mlp, where: str) -> None:
        """gate/up column-parallel, down row-parallel, for a dense MLP; a MoE's banks once both
        are read (`_split_banks`), its router copied; a shared expert's gate copied."""
        devices, op, down = self.devices, self.op, f"{where}: down"
        if isinstance(mlp, SharedExpertMoE): self._copied(mlp.gate)
        for part in mlps(mlp):
            if isinstance(part, MoE):
                self._copied(part.router)   # every device routes every token
                self._on(part.gate_up, lambda moe=part: _split_banks(moe, devices, op, down))
                self._on(part.down, lambda moe=part: _split_banks(moe, devices, op, down))
            else:
                self._on(part.gate_up, lambda mlp=part: _column_parallel(mlp.gate_up, devices))
                self._on(part.down, lambda mlp=part: _row_parallel(mlp.down, devices, op, down))


def _split_head(head: Linear, devices: tuple[str, ...]) -> None:
    """The head by vocabulary, each device its slice of the logits, and `owned` (where each
    device's slice lies, for `layers.all_gather`)."""
    n, vocab = len(devices), head.outs[0]
    _column_parallel(head, devices)
    owned = np.arange(vocab)[None, :] // (vocab // n) == np.arange(n)[:, None]   # device i's row: its columns
    head.owned = _spread(Tensor(owned, device=devices[0]), devices, 0).reshape(vocab)


def _split_banks(moe: MoE, devices: tuple[str, ...], op: str, name: str) -> None:
    """A MoE's expert banks, once both are read (the first read waits, realized, on the first
    device): whole experts to each device where `_whole_experts` says (the choice reads the
    quantized banks' groups), else each expert's columns; the weighted sum summed over devices."""
    if not (moe.gate_up.weights and moe.down.weights):
        Tensor.realize(*moe.gate_up.parameters(), *moe.down.parameters())
        return
    moe.reduce = True
    if _whole_experts(moe, len(devices)): _split_experts(moe, devices)
    else:
        _column_parallel(moe.gate_up, devices)
        _row_parallel(moe.down, devices, op, name)


def _split_experts(moe: MoE, devices: tuple[str, ...]) -> None:
    """Whole experts to each device (expert parallelism): the banks and their biases split by
    expert, and each device told the first expert it holds."""
    experts, n = moe.router.outs[0], len(devices)
    for bank in (moe.gate_up, moe.down):
        bank.weights = [_each_tensor(w, lambda t: _spread(t, devices, 0)) for w in bank.weights]
        bank.bias = _spread(bank.bias, devices, 0)
    moe.local_experts = experts // n
    moe.first_expert = _spread(Tensor(np.arange(0, experts, experts // n, dtype=np.int32), device=devices[0]), devices, 0)
