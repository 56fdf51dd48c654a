"""Hand-written Metal / CUDA programs and the mechanism that injects them into tinygrad's graph.

- `attention_backend(device)`: the backend whose attention kernels run on a device, or None
  (CPU and other devices; any device while kernels are turned off).
- `NUVEC_KERNELS=0` in the environment, or `with compositions_only():`, turns every kernel off:
  the operations then build their compositions (the tests compare the two on one device).
- `NUVEC_DEBUG=1` prints, for every fused call, its plan and the kernels it launched;
  `record_launches()` collects the same as `(kernel, specialisation)` pairs for tests.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from ..tensor import kernel_backend
from . import program

# The backends whose decode attention programs are built and tested. (The tiled prefill kernel
# has not landed: a `Tiled` plan runs the composition, and says so under NUVEC_DEBUG.)
ATTENTION_BACKENDS: frozenset[str] = frozenset({"cuda", "metal"})

_disabled_depth = 0


def kernels_enabled() -> bool:
    """False under `NUVEC_KERNELS=0` or inside `compositions_only()`."""
    return _disabled_depth == 0 and os.environ.get("NUVEC_KERNELS", "1") != "0"


@contextlib.contextmanager
def compositions_only() -> Iterator[None]:
    """Inside this block every operation builds its composition, on every device."""
    global _disabled_depth
    _disabled_depth += 1
    try:
        yield
    finally:
        _disabled_depth -= 1


def attention_backend(device: str) -> str | None:
    """The backend (`"metal"`, `"cuda"`) whose attention kernels run on `device`, or None."""
    backend = kernel_backend(device)
    return backend if backend in ATTENTION_BACKENDS and kernels_enabled() else None


@contextlib.contextmanager
def record_launches() -> Iterator[list[tuple[str, str]]]:
    """Collect `(kernel name, specialisation)` for every kernel launch built inside the block."""
    launches: list[tuple[str, str]] = []
    program._listeners.append(launches)
    try:
        yield launches
    finally:
        program._listeners.remove(launches)


def debug(message: str) -> None:
    """Print `message` when `NUVEC_DEBUG` is set (to anything but 0)."""
    if os.environ.get("NUVEC_DEBUG", "0") != "0":
        print(f"nuvec_tg: {message}")
