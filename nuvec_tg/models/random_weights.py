"""A checkpoint of random weights, to build any family's model at any size from its config alone
(benchmarks at real sizes, tests), with nothing on disk: `nuvec_tg.models.random_model`.

The `Loader` checks every tensor a family asks for (`Checkpoint.require(name, shape)`) before
reading it, so the family's requests say which tensors exist and their shapes: a name exists
once it has been required with a shape, and reading it computes its values on the model's device
from the seed and the name alone (an integer hash of each element's index: the same tensor
whatever the order of requests, cheap to compile and to run, nothing made on the host). Names
never required with a shape are absent,
so tensors a family only probes for (`name in checkpoint`) are left out, and where a family
picks among layouts by probing, it takes the one it then requires shape by shape (for expert
banks: one tensor per expert).

Magnitudes: norm weights (1-D tensors of a module whose name ends in `norm`) are ones, every
other tensor close to normal with standard deviation 0.02 (transformers' `initializer_range`; the
sum of four uniforms, so within 3.5 standard deviations): at Qwen3-8B's size (36 layers, hidden
4096) the logits stay finite in bfloat16.
"""
from __future__ import annotations

import math
import pathlib
import zlib

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .checkpoint import Checkpoint
from .loader import _FLOAT_DTYPES

STD = 0.02
DIRECTORY = pathlib.Path("<random weights>")


def is_norm_weight(name: str, shape: tuple[int, ...]) -> bool:
    """Whether `name` is an RMS/layer norm's weight (`model.norm.weight`, `...q_norm.weight`,
    `...input_layernorm.weight`): 1-D, its module's name ends in `norm`."""
    parts = name.split(".")
    return len(shape) == 1 and len(parts) >= 2 and parts[-2].endswith("norm")


def _mix(x: Tensor) -> Tensor:
    """A uint32 integer hash (lowbias32: two multiply-xorshift rounds) of each element."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


def random_normal(shape: tuple[int, ...], key: int, dtype: DType, device: str) -> Tensor:
    """Close to standard normal values of `shape` from `key` (uint32): element i sums the four
    16-bit halves of `mix(mix(2i) + key)` and `mix(mix(2i + 1) + key)` as uniforms (mean 2,
    variance 1/3), centred and scaled. Lazy; computed on `device`."""
    count = math.prod(shape)
    if 2 * count > 2 ** 32: raise ValueError(f"random_model: {shape} has too many elements for its hash")
    # arange has no device: the key puts the computation on `device`. A copied buffer, not a
    # constant, so that every tensor of a shape shares one kernel and one schedule.
    key_on_device = Tensor([key], dtype=dtypes.uint32, device=device)
    index = Tensor.arange(count, dtype=dtypes.uint32) * 2
    total = None
    for h in (_mix(_mix(index) + key_on_device), _mix(_mix(index + 1) + key_on_device)):
        pair = (h & 0xFFFF).cast(dtypes.float32) + (h >> 16).cast(dtypes.float32)
        total = pair if total is None else total + pair
    uniform_sum = (total + 2.0) * (1.0 / 65536)        # four uniforms on (0, 1)
    return ((uniform_sum - 2.0) * math.sqrt(3.0)).cast(dtype).reshape(shape)


class RandomCheckpoint(Checkpoint):
    """Answers the `Loader` as a 16-bit checkpoint in `dtype` whose tensors are the ones the family
    requires, with the shapes it requires; `tensor(name)` is random (from `seed` and the name),
    computed lazily on `device`."""

    def __init__(self, dtype: DType, device: str, seed: int = 0, std: float = STD):
        codes = {value: code for code, value in _FLOAT_DTYPES.items()}
        if dtype not in codes: raise TypeError(f"random_model: dtype must be a float dtype, got {dtype}")
        self.directory, self.files, self._loaded = DIRECTORY, [], {}
        self.headers: dict[str, dict] = {}
        self.dtype, self.device, self.seed, self.std, self.code = dtype, device, seed, std, codes[dtype]

    def require(self, name: str, shape: tuple[int, ...] | None = None, why: str = "") -> None:
        """Records `name` with `shape` the first time it is asked for; then checks as a checkpoint
        does (a name asked for without a shape, never given one, is missing)."""
        if name not in self.headers and shape is not None:
            self.headers[name] = {"dtype": self.code, "shape": tuple(int(s) for s in shape), "file": self.directory}
        super().require(name, shape, why)

    def tensor(self, name: str) -> Tensor:
        """Ones for a norm's weight, else normal * `std`, in the checkpoint's dtype on its device."""
        shape = self.shape(name)
        if is_norm_weight(name, shape): return Tensor.ones(*shape, dtype=self.dtype, device=self.device)
        key = zlib.crc32(f"{self.seed}:{name}".encode())
        # contiguous: a tensor built on an arange and then concatenated with others (a fused
        # projection's parts) is no longer folded into an index by tinygrad's scheduler but summed
        # as a reduction over every element (41 s for one Qwen3.5-9B in_proj on the H200)
        return random_normal(shape, key, dtypes.float32, self.device).mul(self.std).cast(self.dtype).contiguous()
