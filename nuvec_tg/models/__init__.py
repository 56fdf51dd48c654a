"""Language models from Hugging Face checkpoints, built from nuvec_tg's operations.

```python
from nuvec_tg import models
m = models.load("path/to/checkpoint", dtype=None, quantize=None)
logits = m(tokens)                          # int32 [B, T] -> logits [B, T, vocab], no cache
cache = m.make_cache(batch, max_length)
logits = m(tokens, cache=cache)             # continues each sequence from the cache's position
for text in m.generate("Hello", max_tokens=32): print(text, end="")
```

A family is one module with `MODEL_TYPES` (the `model_type`s it reads), `build(config, loader)`
returning the model's parts, and optionally `quant_predicate(path, spec)`; `FAMILIES` maps each
`model_type` to its module. The tokenizer and chat template need the optional `tokenizers` and
`jinja2` packages (`pip install 'nuvec-tg[models]'`); nothing else here does.
"""
from __future__ import annotations

import importlib
import json
import pathlib

from tinygrad import Device, dtypes
from tinygrad.dtype import DType

from .cache import KVCache
from .checkpoint import Checkpoint
from .config import Config
from .loader import Loader, QuantSpec, default_dtype
from .model import GenerationStats, Model, device_description
from . import parallel
from .paged import Engine, PagedCache
from .random_weights import DIRECTORY, RandomCheckpoint

# model_type -> the module that builds it (imported when a checkpoint needs it)
FAMILIES = {"qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "gemma3_text": "gemma3", "gemma3": "gemma3",
            "gpt_oss": "gpt_oss", "qwen3_next": "qwen3_next", "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5"}

_DTYPES = {"float16": dtypes.float16, "bfloat16": dtypes.bfloat16, "float32": dtypes.float32}


def _dtype(value) -> DType | None:
    if value is None or isinstance(value, DType): return value
    if isinstance(value, str) and value in _DTYPES: return _DTYPES[value]
    raise TypeError(f"load: dtype must be a tinygrad float dtype or one of {', '.join(_DTYPES)}, got {value!r}")


def _eos_ids(directory: pathlib.Path, config: Config) -> tuple[int, ...]:
    """The stop tokens: generation_config.json's `eos_token_id` (an int or a list), else config.json's."""
    value = None
    generation = directory / "generation_config.json"
    if generation.exists():
        try:
            value = json.loads(generation.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"load: cannot read {generation}: {error}") from None
    if value is None: value = config.get("eos_token_id", None)
    if value is None: return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def load(path, dtype=None, quantize=None, device: str | None = None, progress: bool = True,
         devices: tuple[str, ...] | None = None) -> Model:
    """A model from checkpoint directory `path` (Hugging Face's layout, or an MLX-quantized one).

    dtype: the activations' and weights' dtype (a tinygrad dtype or its name); None keeps the
    checkpoint's. quantize: quantize a 16-bit checkpoint on load: 4 or 8 (affine, groups of 64),
    a mode (`"mxfp4"`, `"mxfp8"`, `"nvfp4"`) or `{"bits", "group_size", "mode"}`; modules that
    mlx-lm leaves dense stay dense. device: tinygrad's default unless given. devices: instead of
    `device`, two or more devices the model is split over, tensor-parallel (`models.parallel`:
    each layer read onto the first, then spread; heads, MLP columns and experts by device). Raises `ValueError`
    naming the file and tensor for a bad directory, config, missing tensor or shape, before any
    weight is read.
    """
    directory = pathlib.Path(path)
    if not directory.is_dir(): raise ValueError(f"load: {directory} is not a directory")
    config_path = directory / "config.json"
    if not config_path.exists(): raise ValueError(f"load: {directory} has no config.json")
    config = Config.read(config_path)
    family = _family(config)
    checkpoint = Checkpoint(directory)
    return _build(family, config, checkpoint, _dtype(dtype) or default_dtype(checkpoint), quantize, device, progress,
                  _devices("load", device, devices), "load")


def random_model(config, dtype="bfloat16", quantize=None, device: str | None = None, seed: int = 0,
                 progress: bool = False, devices: tuple[str, ...] | None = None) -> Model:
    """A model of `config`'s family and size with random weights made on the device, without a
    checkpoint: for benchmarks at real sizes and tests.

    config: a config.json's values (a dict, as `load` reads them: a `text_config` is merged over
    the rest) or a `Config`. dtype, quantize, device, devices: as for `load` (quantize=4 quantizes the
    random 16-bit weights on the device, as `load` does a checkpoint's). seed: with a tensor's
    name, picks its values (the same seed gives the same model). Every tensor the family asks for
    exists with the shape it asks for; norm weights are ones and the rest about normal * 0.02,
    computed on the device (`random_weights`). The model has no tokenizer: generate from token ids
    (`generate_tokens`).
    """
    if not isinstance(config, Config): config = Config(dict(config), DIRECTORY / "config.json")
    family = _family(config)
    model_dtype = _dtype(dtype)
    if model_dtype is None: raise TypeError("random_model: dtype is required")
    shards = _devices("random_model", device, devices)
    device = shards[0] if shards else Device.canonicalize(device) if device is not None else Device.DEFAULT
    return _build(family, config, RandomCheckpoint(model_dtype, device, seed), model_dtype, quantize, device, progress,
                  shards, "random_model")


def _devices(op: str, device: str | None, devices) -> tuple[str, ...] | None:
    """`devices` canonicalized (None when not given); `device` and `devices` are exclusive."""
    if devices is None: return None
    if device is not None: raise ValueError(f"{op}: give device or devices, not both")
    return tuple(Device.canonicalize(d) for d in parallel.check_devices(op, devices))


def _family(config: Config):
    """The module that builds `config`'s model_type (a `ValueError` naming the file when none does)."""
    model_type = config.model_type
    if model_type not in FAMILIES:
        raise ValueError(f"load: {config.path}: unknown model_type {model_type!r} "
                         f"(supported: {', '.join(sorted(FAMILIES))})")
    return importlib.import_module(f".{FAMILIES[model_type]}", __name__)


def _build(family, config: Config, checkpoint: Checkpoint, model_dtype: DType, quantize, device: str | None,
           progress: bool, devices: tuple[str, ...] | None = None, op: str = "load") -> Model:
    """The family's model from `checkpoint`'s tensors (what `load` and `random_model` share),
    read on `device`, or over `devices` (each layer onto the first as it is read, then spread:
    `parallel.Plan`)."""
    device = devices[0] if devices else Device.canonicalize(device) if device is not None else Device.DEFAULT
    spec = None if quantize is None else QuantSpec.parse(quantize, "load")
    loader = Loader(checkpoint, config, model_dtype, device, spec, getattr(family, "quant_predicate", None))
    parts = family.build(config, loader)
    plan = None
    if devices:
        parallel.refuse(parts, devices, op)   # before any weight is read: the layers and their sizes
        plan = parallel.Plan(parts, devices, op)
    loader.finish(progress, None if plan is None else plan.place)   # each layer spread as it is read
    if plan is not None: plan.finish()
    return Model(config=config, dtype=model_dtype, device=devices or device, directory=checkpoint.directory,
                 eos_token_ids=_eos_ids(checkpoint.directory, config), **parts)


def supported() -> list[str]:
    """The `model_type`s `load` reads."""
    return sorted(FAMILIES)


__all__ = ["load", "random_model", "supported", "Model", "KVCache", "GenerationStats", "Engine", "PagedCache", "FAMILIES",
           "device_description"]
