"""The tensors of a checkpoint directory in Hugging Face's layout, read lazily.

`model.safetensors`, or shards named by `model.safetensors.index.json` (its `weight_map`), or
else every `*.safetensors` file of the directory. Only the files' headers are read up front (names,
dtypes, shapes), so that a missing tensor or a wrong shape is reported before any weight is read;
the data come through tinygrad's `safe_load` as lazy DISK tensors.
"""
from __future__ import annotations

import json
import pathlib
import struct

from tinygrad import Tensor
from tinygrad.nn.state import safe_dtypes, safe_load

_FLOAT_CODES = ("F16", "BF16", "F32", "F64")


class Checkpoint:
    """A checkpoint directory's tensors: which file holds each, its dtype and shape, and the lazy
    tensor itself on demand (`tensor(name)`)."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self.files = self._weight_files(directory)
        self.headers: dict[str, dict] = {}         # name -> {"dtype", "shape", "file"}
        for file in self.files:
            for name, entry in self._read_header(file).items():
                self.headers[name] = {"dtype": entry["dtype"], "shape": tuple(entry["shape"]), "file": file}
        self._loaded: dict[pathlib.Path, dict[str, Tensor]] = {}

    @staticmethod
    def _weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
        index = directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(f"load: cannot read the weight map of {index}: {error}") from None
            files = [directory / name for name in dict.fromkeys(weight_map.values())]
            for file in files:
                if not file.exists(): raise ValueError(f"load: {index} names {file.name}, which is missing")
            return files
        single = directory / "model.safetensors"
        if single.exists(): return [single]
        files = sorted(directory.glob("*.safetensors"))
        if not files: raise ValueError(f"load: {directory} has no model.safetensors, index or *.safetensors file")
        return files

    @staticmethod
    def _read_header(file: pathlib.Path) -> dict[str, dict]:
        try:
            with open(file, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"load: {file} is not a safetensors file: {error}") from None
        header.pop("__metadata__", None)
        for name, entry in header.items():
            if entry.get("dtype") not in safe_dtypes:
                raise ValueError(f"load: {file}: tensor {name} has dtype {entry.get('dtype')}, which tinygrad cannot read")
        return header

    def __contains__(self, name: str) -> bool:
        return name in self.headers

    def names(self) -> list[str]:
        return list(self.headers)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.headers[name]["shape"]

    def dtype_code(self, name: str) -> str:
        """The safetensors dtype code of `name` (`BF16`, `U32`, ...)."""
        return self.headers[name]["dtype"]

    def where(self, name: str) -> str:
        """The file that holds `name` (or the directory, for a missing tensor), for messages."""
        return str(self.headers[name]["file"]) if name in self.headers else str(self.directory)

    def require(self, name: str, shape: tuple[int, ...] | None = None, why: str = "") -> None:
        """A `ValueError` naming the file and the tensor unless `name` exists with `shape`."""
        if name not in self.headers:
            raise ValueError(f"load: tensor {name} is missing from {self.directory}{f' ({why})' if why else ''}")
        if shape is not None and self.shape(name) != tuple(shape):
            raise ValueError(f"load: {self.where(name)}: tensor {name} has shape {self.shape(name)}, "
                             f"expected {tuple(shape)}{f' ({why})' if why else ''}")

    def float_dtype(self) -> str | None:
        """The dtype code of the checkpoint's float weights (the most common), None when it has none."""
        counts: dict[str, int] = {}
        for entry in self.headers.values():
            if entry["dtype"] in _FLOAT_CODES: counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + 1
        return max(counts, key=counts.get) if counts else None

    def tensor(self, name: str) -> Tensor:
        """The lazy DISK tensor of `name` (nothing is read until it is moved to a device)."""
        file = self.headers[name]["file"]
        if file not in self._loaded: self._loaded[file] = safe_load(file)
        return self._loaded[file][name]
