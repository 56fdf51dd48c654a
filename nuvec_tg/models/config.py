"""Reading a checkpoint's `config.json` as transformers 4 and transformers 5 write it.

The two spellings differ in a few keys: transformers 4 writes `rope_theta` and `rope_scaling`
beside the other fields, transformers 5 one `rope_parameters` dict (per layer type for some
families); experts are `num_experts` or `num_local_experts`. `Config` reads either and says which
file and key is wrong when something is missing.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

_REQUIRED = object()


class Config:
    """A model's configuration: the parsed `config.json` (a multimodal checkpoint's `text_config`
    merged over it) and the file it came from, for error messages."""

    def __init__(self, values: dict[str, Any], path: pathlib.Path):
        self.path = path
        text = values.get("text_config")
        self.values = {**values, **text} if isinstance(text, dict) else dict(values)

    @classmethod
    def read(cls, path: pathlib.Path) -> "Config":
        """Parse `path` (a config.json); a `ValueError` naming the file when it is not a JSON object."""
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"load: cannot read {path}: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"load: {path} must hold a JSON object, got {type(values).__name__}")
        return cls(values, path)

    @property
    def model_type(self) -> str | None:
        return self.values.get("model_type")

    def get(self, key: str, default: Any = _REQUIRED, *, aliases: tuple[str, ...] = ()) -> Any:
        """The value of `key` (or of the first alias present); `default` when none is present and
        a default is given, else a `ValueError` naming the file and the key."""
        for name in (key, *aliases):
            if name in self.values and self.values[name] is not None:
                return self.values[name]
        if default is _REQUIRED:
            spelled = " or ".join(repr(n) for n in (key, *aliases))
            raise ValueError(f"load: {self.path}: {self.model_type} needs {spelled}")
        return default

    def integer(self, key: str, default: Any = _REQUIRED, *, aliases: tuple[str, ...] = ()) -> int:
        """`get` for a positive integer field."""
        value = self.get(key, default, aliases=aliases)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"load: {self.path}: {key} must be a positive integer, got {value!r}")
        return value

    def rope_parameters(self, layer_type: str | None = None) -> dict[str, Any]:
        """The rotary embedding's parameters in transformers 5's spelling: `rope_type`,
        `rope_theta` and the scaling's fields (`factor`, `original_max_position_embeddings`, ...).

        transformers 4: `rope_theta` beside `rope_scaling` (`type` or `rope_type`, or null);
        transformers 5: `rope_parameters`, possibly one dict per layer type (`layer_type` picks)."""
        params = self.values.get("rope_parameters") or self.values.get("rope_scaling") or {}
        if not isinstance(params, dict):
            raise ValueError(f"load: {self.path}: rope_parameters must be an object, got {params!r}")
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        params = dict(params)
        params["rope_type"] = params.get("rope_type", params.get("type", "default"))
        params.pop("type", None)
        if "rope_theta" not in params:
            params["rope_theta"] = self.get("rope_theta", 10000.0)
        params.setdefault("max_position_embeddings", self.get("max_position_embeddings", None))
        if "partial_rotary_factor" not in params and "partial_rotary_factor" in self.values:
            params["partial_rotary_factor"] = self.values["partial_rotary_factor"]
        return params

    def layer_types(self, layers: int, sliding_from: int | None = None) -> list[str]:
        """Each layer's attention, `"full_attention"` or `"sliding_attention"`: `layer_types` when
        given (transformers 5), else from `use_sliding_window`, `sliding_window` and
        `max_window_layers` (Qwen's rule: layers from `max_window_layers` on slide)."""
        given = self.values.get("layer_types")
        if given is not None:
            if not isinstance(given, list) or len(given) != layers:
                raise ValueError(f"load: {self.path}: layer_types must list {layers} layers, got {given!r}")
            return list(given)
        sliding = self.values.get("use_sliding_window", False) and self.values.get("sliding_window") is not None
        first = self.values.get("max_window_layers", sliding_from or 0)
        return ["sliding_attention" if sliding and i >= first else "full_attention" for i in range(layers)]
