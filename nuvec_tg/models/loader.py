"""Turning a checkpoint's tensors into layers' parameters: checks first, reading later.

A family builds its layers by asking the `Loader` for parameters (`linear`, `embedding`, `norm`,
`experts`). Each request is checked at once against the checkpoint's headers (the tensor exists,
its shape fits the config) and returns the layer with its parameters still empty; `finish()` then
reads every tensor, casts it to the model's dtype and quantizes what is to be quantized, with a
progress bar when `tqdm` is installed. So a wrong checkpoint fails before any weight is read.

Quantized weights come from either side:
- an MLX checkpoint: `<module>.scales` (and `.biases` for affine) beside a packed uint32
  `<module>.weight`; the format is `config.json`'s `quantization` entry for the module, else the
  top-level one, checked against the shapes (or read off them, as mlx-lm does);
- `quantize=` at load: the 16-bit weights of every linear layer, embedding and expert bank are
  quantized (`nuvec_tg.quant.quantize`, bit for bit MLX's), except where the family's predicate
  says otherwise (mlx-lm's `quant_predicate`) or the row length is not a multiple of the group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .. import quant
from ..quant import QuantizedWeight
from .checkpoint import Checkpoint
from .config import Config
from .layers import Embedding, Experts, Linear, Norm, Parameter

_FLOAT_DTYPES = {"F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64}


@dataclass(frozen=True)
class QuantSpec:
    """A quantization format: MLX's mode, group size and bits."""
    mode: str
    group_size: int
    bits: int

    @classmethod
    def parse(cls, value, where: str) -> "QuantSpec":
        """`4`, `8` (affine, group 64), a mode name (`"mxfp4"`, its own group and bits) or a dict
        with `bits`, `group_size` and `mode` (missing fields take the mode's defaults)."""
        if isinstance(value, bool): raise TypeError(f"{where}: quantize must be 4, 8, a mode name or a dict, got {value!r}")
        if isinstance(value, int): value = {"bits": value}
        elif isinstance(value, str): value = {"mode": value}
        if not isinstance(value, dict): raise TypeError(f"{where}: quantize must be 4, 8, a mode name or a dict, got {value!r}")
        mode = value.get("mode", "affine")
        if mode not in quant.MODES: raise ValueError(f"{where}: unknown quantization mode {mode!r} (one of {', '.join(quant.MODES)})")
        group_size, bits = quant.DEFAULTS[mode]
        spec = cls(mode, int(value.get("group_size") or group_size), int(value.get("bits") or bits))
        if mode == "affine" and (spec.bits not in (2, 3, 4, 5, 6, 8) or spec.group_size not in (32, 64, 128)):
            raise ValueError(f"{where}: affine quantization takes 2-6 or 8 bits and groups of 32, 64 or 128, got {value!r}")
        if mode != "affine" and (spec.group_size, spec.bits) != (group_size, bits):
            raise ValueError(f"{where}: {mode} quantization is {bits} bits in groups of {group_size}, got {value!r}")
        return spec


# A family's choice per module when quantizing at load: the spec to use, or None to leave it dense.
Predicate = Callable[[str, QuantSpec], "QuantSpec | None"]


class Loader:
    """Parameters for a family's layers from a `Checkpoint`, in `dtype`, on `device`."""

    def __init__(self, checkpoint: Checkpoint, config: Config, dtype: DType, device: str,
                 quantize: QuantSpec | None = None, predicate: Predicate | None = None):
        self.checkpoint, self.config, self.dtype, self.device = checkpoint, config, dtype, device
        self.quantize, self.predicate = quantize, predicate or (lambda path, spec: spec)
        # MLX's format entries (the top level's and per-module overrides), or None for a 16-bit checkpoint
        has_scales = any(name.endswith(".scales") for name in checkpoint.names())
        self.stored = (config.values.get("quantization") or config.values.get("quantization_config") or {}) if has_scales else None
        if self.stored is not None and quantize is not None:
            raise ValueError(f"load: {checkpoint.directory} is already quantized; load it without quantize=")
        self._tasks: list[Callable[[], None]] = []
        self.used: set[str] = set()

    # ---- reading ------------------------------------------------------------------------------

    def _read(self, name: str, dtype: DType | None = None) -> Tensor:
        """The tensor `name` on the device; float tensors cast to `dtype` (default the model's)."""
        self.used.add(name)
        t = self.checkpoint.tensor(name).to(self.device)
        if self.checkpoint.dtype_code(name) in _FLOAT_DTYPES: t = t.cast(dtype or self.dtype)
        return t

    def _stored_spec(self, path: str, rows_shape: tuple[int, ...], columns: int) -> QuantSpec:
        """The format of MLX-quantized module `path` whose dense weight would be `rows_shape + (columns,)`,
        checked against the packed weight and scales in the checkpoint."""
        weight, scales = f"{path}.weight", f"{path}.scales"
        self.checkpoint.require(weight)
        packed, scale_shape = self.checkpoint.shape(weight), self.checkpoint.shape(scales)
        where = self.checkpoint.where(weight)
        if packed[:-1] != rows_shape or scale_shape[:-1] != rows_shape or not packed[-1] or not scale_shape[-1]:
            raise ValueError(f"load: {where}: quantized tensor {weight} {packed} and {scales} {scale_shape} do not fit "
                             f"{rows_shape + (columns,)} from the config")
        override = self.stored.get(path) if isinstance(self.stored, dict) else None
        given = override if isinstance(override, dict) else self.stored if isinstance(self.stored, dict) else {}
        bits, group_size = packed[-1] * 32 // columns, columns // scale_shape[-1]
        float_scales = self.checkpoint.dtype_code(scales) in _FLOAT_DTYPES
        mode = given.get("mode") or ("affine" if float_scales else {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}.get(
            (bits, group_size), "unknown"))
        spec = QuantSpec.parse({"mode": mode, "bits": bits, "group_size": group_size}, f"load: {where}: {path}")
        if packed[-1] * 32 != columns * bits or scale_shape[-1] * group_size != columns:
            raise ValueError(f"load: {where}: quantized tensor {weight} {packed} does not pack {columns} columns "
                             f"in whole {bits}-bit groups of {group_size}")
        if spec.mode == "affine":
            self.checkpoint.require(f"{path}.biases", scale_shape, f"the biases of affine {path}")
        return spec

    def _load_quantized(self, path: str, spec: QuantSpec) -> QuantizedWeight:
        """A stored quantized weight: packed codes as they are, affine scales and biases in the model's dtype."""
        affine = spec.mode == "affine"
        scales = self._read(f"{path}.scales")
        biases = self._read(f"{path}.biases") if affine else None
        return QuantizedWeight(self._read(f"{path}.weight"), scales, biases, spec.mode, spec.group_size, spec.bits)

    def _plan(self, path: str, rows_shape: tuple[int, ...], columns: int, quantizable: bool = True) -> QuantSpec | None:
        """How module `path` is stored or to be stored: its quantization spec, or None for dense.
        Checks the stored tensors' shapes."""
        if self.stored is not None and f"{path}.scales" in self.checkpoint:
            return self._stored_spec(path, rows_shape, columns)
        self.checkpoint.require(f"{path}.weight", rows_shape + (columns,), f"from {self.config.path.name}")
        if self.quantize is None or not quantizable: return None
        spec = self.predicate(path, self.quantize)
        return spec if spec is not None and columns % spec.group_size == 0 else None

    def _materialize(self, path: str, spec: QuantSpec | None, stored: bool) -> Tensor | QuantizedWeight:
        if spec is None: return self._read(f"{path}.weight")
        if stored: return self._load_quantized(path, spec)
        return quant.quantize(self._read(f"{path}.weight"), spec.group_size, spec.bits, spec.mode)

    def _is_stored(self, path: str) -> bool:
        return self.stored is not None and f"{path}.scales" in self.checkpoint

    # ---- what families ask for ----------------------------------------------------------------

    def linear(self, paths: str | list[str], outs: int | list[int], columns: int, bias: bool = False,
               quantizable: bool = True) -> Linear:
        """`y = x · Wᵀ (+ b)` for module `paths` (`<path>.weight` `[out, columns]`, `<path>.bias`).

        Several paths give one layer whose outputs are the modules' outputs in order (`Linear`
        returns them split); they are fused into one product when stored alike."""
        paths = [paths] if isinstance(paths, str) else list(paths)
        outs = [outs] * len(paths) if isinstance(outs, int) else list(outs)
        specs = [self._plan(p, (o,), columns, quantizable) for p, o in zip(paths, outs)]
        for p, o in zip(paths, outs):
            if bias: self.checkpoint.require(f"{p}.bias", (o,), f"{p} has a bias")
        layer = Linear(outs)
        stored = [self._is_stored(p) for p in paths]

        def read() -> Linear:
            if len(paths) > 1 and not any(stored) and len(set(specs)) == 1:
                # quantized (or kept dense) alike: fused first, so one quantize call makes the whole layer
                weights = [self._quantized_or_dense(_cat([self._read(f"{p}.weight") for p in paths]), specs[0])]
            else:
                weights = [self._materialize(p, s, st) for p, s, st in zip(paths, specs, stored)]
            layer.set(weights, [self._read(f"{p}.bias") for p in paths] if bias else None)
            return layer
        self._tasks.append(read)
        return layer

    def embedding(self, path: str, vocab: int, hidden: int) -> Embedding:
        """Token embeddings `<path>.weight` `[vocab, hidden]` (or MLX-quantized)."""
        spec = self._plan(path, (vocab,), hidden)
        layer, stored = Embedding(), self._is_stored(path)
        self._tasks.append(lambda: _set(layer, self._materialize(path, spec, stored)))
        return layer

    def norm(self, name: str, size: int, eps: float, offset: float = 0.0) -> Norm:
        """An RMS norm's weight `name` `[size]` (`offset` is added to it: 1 for `(1 + w)` norms)."""
        self.checkpoint.require(name, (size,), f"from {self.config.path.name}")
        layer = Norm(eps)
        self._tasks.append(lambda: _set(layer, self._read(name) + offset if offset else self._read(name)))
        return layer

    def tensor(self, name: str, shapes: tuple[int, ...] | list[tuple[int, ...]], dtype: DType | None = None) -> Parameter:
        """Tensor `name` as stored, of one of `shapes` (one shape or a list of the layouts
        accepted), floats cast to `dtype` (default the model's); never quantized."""
        options = [tuple(shapes)] if isinstance(shapes, tuple) else [tuple(s) for s in shapes]
        # asked for with a shape (the first), unless stored with another of them: a random checkpoint
        # (`random_model`) makes the tensors asked for with a shape
        if name not in self.checkpoint or self.checkpoint.shape(name) not in options:
            self.checkpoint.require(name, options[0], f"from {self.config.path.name}")
        layer = Parameter()
        self._tasks.append(lambda: _set(layer, self._read(name, dtype)))
        return layer

    def experts(self, path: str, experts: int, names: list[str], outs: list[int], columns: int, *,
                bias: bool = False, input_major: bool = False, interleaved: bool = False) -> Experts:
        """A bank of `experts` experts' projections `names` (gate, up: `[E, out, columns]`), fused in
        order, from any of the layouts checkpoints use:

        - `<path>.switch_mlp.<name>.weight` `[E, out, columns]` (mlx-lm; quantized or not),
        - `<path>.experts.<e>.<name>.weight` `[out, columns]` per expert (the Hub's checkpoints),
        - `<path>.experts.gate_up_proj` `[E, 2 * out, columns]` and `<path>.experts.down_proj`
          (transformers 5's fused banks, asked for as names `gate_up_proj` / `down_proj`); see
          `_fused_experts` for gpt-oss's (`bias`, `input_major`, `interleaved`: these banks only).
        """
        stacked = [f"{path}.switch_mlp.{name}" for name in names]
        bank = Experts(outs)
        if f"{stacked[0]}.weight" in self.checkpoint:
            specs = [self._plan(p, (experts, o), columns) for p, o in zip(stacked, outs)]
            stored = [self._is_stored(p) for p in stacked]
            self._tasks.append(lambda: _set(bank, [self._materialize(p, s, st) for p, s, st in zip(stacked, specs, stored)]))
            return bank
        fused_name = {("gate_proj", "up_proj"): "gate_up_proj", ("down_proj",): "down_proj"}.get(tuple(names))
        name = f"{path}.experts.{fused_name}"
        if fused_name is not None and (bias or input_major or interleaved or name in self.checkpoint):
            spec = None if self.quantize is None else self.predicate(f"{path}.switch_mlp.{names[0]}", self.quantize)
            spec = spec if spec is not None and columns % spec.group_size == 0 else None
            return self._fused_experts(bank, name, experts, sum(outs), columns, spec, bias, input_major, interleaved)
        for name, out in zip(names, outs):
            for e in range(experts):
                self.checkpoint.require(f"{path}.experts.{e}.{name}.weight", (out, columns), f"expert {e} of {experts}")
        specs = [None if self.quantize is None else self.predicate(f"{path}.switch_mlp.{name}", self.quantize) for name in names]
        specs = [s if s is not None and columns % s.group_size == 0 else None for s in specs]

        def read() -> Experts:
            banks = [Tensor.stack(*[self._read(f"{path}.experts.{e}.{name}.weight") for e in range(experts)])
                     for name in names]
            if len(set(specs)) == 1: return _set(bank, [self._quantized_or_dense(_cat(banks), specs[0])])
            return _set(bank, [self._quantized_or_dense(b, s) for b, s in zip(banks, specs)])
        self._tasks.append(read)
        return bank

    def _fused_experts(self, bank: Experts, name: str, experts: int, rows: int, columns: int, spec: QuantSpec | None,
                       bias: bool, input_major: bool, interleaved: bool) -> Experts:
        """transformers' fused bank `name`: `[E, rows, columns]`, or `[E, columns, rows]` when
        `input_major` (gpt-oss's float layout, read transposed); with `interleaved` its rows
        alternate between the projections (gpt-oss's gate, up, gate, ...: `gate_up[..., ::2]`),
        and are reordered into one block per projection; with `bias`, `<name>_bias` `[E, rows]`.
        gpt-oss's released checkpoints store the bank as MXFP4: `<name>_blocks` uint8
        `[E, rows, columns / 32, 16]` (two e2m1 codes a byte, the low nibble first) and
        `<name>_scales` uint8 `[E, rows, columns / 32]` (e8m0), which is MLX's mxfp4 layout: the
        bytes become the packed uint32 words of an `mxfp4` weight as they are, not dequantized."""
        where = f"{experts} experts from {self.config.path.name}"
        blocks, scales = f"{name}_blocks", f"{name}_scales"
        mxfp4 = blocks in self.checkpoint
        if mxfp4:
            group = quant.DEFAULTS["mxfp4"][0]
            if columns % group:
                raise ValueError(f"load: {self.checkpoint.where(blocks)}: MXFP4 bank {blocks} needs rows of a multiple of "
                                 f"{group} values, got {columns}")
            self.checkpoint.require(blocks, (experts, rows, columns // group, group // 2), f"MXFP4 codes of {where}")
            self.checkpoint.require(scales, (experts, rows, columns // group), f"MXFP4 scales of {where}")
            for tensor in (blocks, scales):
                if self.checkpoint.dtype_code(tensor) != "U8":
                    raise ValueError(f"load: {self.checkpoint.where(tensor)}: MXFP4 tensor {tensor} must be U8, "
                                     f"got {self.checkpoint.dtype_code(tensor)}")
        else:
            self.checkpoint.require(name, (experts, columns, rows) if input_major else (experts, rows, columns), where)
        if bias: self.checkpoint.require(f"{name}_bias", (experts, rows), f"the biases of {where}")

        def order(t: Tensor, axis: int) -> Tensor:
            return (_deinterleave(t, axis) if interleaved else t).contiguous()

        def read() -> Experts:
            if mxfp4:
                packed = self._read(blocks).reshape(experts, rows, columns // 2).contiguous().bitcast(dtypes.uint32)
                weight = QuantizedWeight(order(packed, -2), order(self._read(scales), -2), None, "mxfp4",
                                         *quant.DEFAULTS["mxfp4"])
            else:
                dense = self._read(name)
                weight = self._quantized_or_dense(order(dense.transpose(-1, -2) if input_major else dense, -2), spec)
            bank.set([weight], order(self._read(f"{name}_bias"), -1) if bias else None)
            return bank
        self._tasks.append(read)
        return bank

    def _quantized_or_dense(self, w: Tensor, spec: QuantSpec | None) -> Tensor | QuantizedWeight:
        return w if spec is None else quant.quantize(w, spec.group_size, spec.bits, spec.mode)

    def finish(self, progress: bool = True, place: Callable | None = None) -> None:
        """Read every requested tensor, one layer's parameters at a time (with a progress bar
        when tqdm is installed). One schedule per layer: tinygrad reuses the schedules of layers
        alike, which one schedule over many layers would not. `place(layer)`, where given, reads
        each layer object instead, as it likes (a tensor-parallel model's `parallel.Plan`
        spreads it over the devices)."""
        tasks, self._tasks = self._tasks, []
        bar = None
        if progress:
            try:
                from tqdm import tqdm
                bar = tqdm(total=len(tasks), desc="loading", unit="layer", leave=False)
            except ImportError:
                bar = None
        for task in tasks:
            layer = task()
            if place is None: Tensor.realize(*layer.parameters())
            else: place(layer)
            if bar is not None: bar.update(1)
        if bar is not None: bar.close()


def _cat(weights: list[Tensor]) -> Tensor:
    """Weights `[..., out_i, K]` stacked along their output rows (quantization is per row, so
    quantizing the stack equals stacking the quantized parts)."""
    return weights[0].cat(*weights[1:], dim=-2) if len(weights) > 1 else weights[0]


def _deinterleave(t: Tensor, axis: int) -> Tensor:
    """`t` with its entries along `axis` reordered from alternating pairs (a0, b0, a1, b1, ...) to
    (a0, a1, ..., b0, b1, ...)."""
    axis %= t.ndim
    shape = list(t.shape)
    pairs = t.reshape(*shape[:axis], shape[axis] // 2, 2, *shape[axis + 1:])
    return pairs.transpose(axis, axis + 1).reshape(shape)


def _set(layer, value):
    """`layer.set(value)`, then the layer (a loading task's result)."""
    layer.set(value)
    return layer


def default_dtype(checkpoint: Checkpoint) -> DType:
    """The model dtype of a checkpoint: its float weights' (float32 when it has none)."""
    return _FLOAT_DTYPES.get(checkpoint.float_dtype() or "F32", dtypes.float32)
