"""Hand-written Metal / CUDA programs and the mechanism that injects them into tinygrad's graph.

This package is the one home of what decides whether a kernel can run at all:
- `kernel_backend(device)`: `"metal"` or `"cuda"` when the device has nuvec_tg's kernels;
  `active_backend(device)` the same while kernels are on.
- `NUVEC_KERNELS=0` in the environment, or `with compositions_only():`, turns every kernel off:
  the operations then build their compositions (the tests compare the two on one device).
- `with per_device():` lets kernels run on tensors on several devices, one buffer a device each
  with its own values (a tensor-parallel model's per-device tensors, `models.parallel`): the
  kernel runs on each device over that device's buffers. Outside it such tensors take the
  compositions, as do tensors split by an axis (`Tensor.shard`) everywhere.
- `multiprocessors(device)` (CUDA) and `gpu_class(device)` (Metal): what the launch plans read;
  `metal_bfloat()` (the Metal language tinygrad compiles has bfloat) and
  `metal_matrix_units(device)` (simdgroup matrices): what Metal's routes read. `target(device)`
  gathers them in a `Target`, what every route and plan takes.
- `choose(op, description, device, kernel, unsupported)`: the backend that runs an operation's
  kernel, or None for the composition; with `NUVEC_DEBUG=1` it prints which, and why not.
- `record_launches()` collects `(program, label)` for every launch built, for tests.

The kernels themselves know nothing of the operations: `program.py` is the mechanism, and each
family's module (`attention.py`, `gated_delta.py`, `quant.py`) its sources, checks and plan.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
from dataclasses import dataclass
from typing import Callable, Iterator

from tinygrad import Device, Tensor

from . import program

_disabled_depth = 0
_per_device_depth = 0


def kernel_backend(device: str | tuple[str, ...] | Tensor) -> str | None:
    """`"metal"` or `"cuda"` when nuvec_tg has hand-written kernels for the device, else None.

    `device` is a tinygrad device name (`"METAL"`, `"CUDA:1"`, `"CPU"`), a tuple of them, or a
    tensor on it. Several devices have the backend they share, inside `per_device()` only.
    """
    name = device.device if isinstance(device, Tensor) else device
    if isinstance(name, tuple):
        backends = {kernel_backend(d) for d in name}
        return backends.pop() if _per_device_depth and len(backends) == 1 else None
    return {"METAL": "metal", "CUDA": "cuda"}.get(name.split(":")[0].upper())


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


@contextlib.contextmanager
def per_device() -> Iterator[None]:
    """Inside this block a tensor on several devices is taken as one buffer a device, each with
    its own values (a tensor-parallel model's per-device tensors): an operation's kernel runs on
    every device over that device's buffers, planned from their shape. tinygrad's own operations
    see such a tensor as copies of one value, which is right for everything that works device by
    device; `models.parallel` sums the partial products across devices itself. A tensor split by
    an axis (`Tensor.shard`) must not reach a kernel here: `program.launch` refuses it."""
    global _per_device_depth
    _per_device_depth += 1
    try:
        yield
    finally:
        _per_device_depth -= 1


def active_backend(device: str | tuple[str, ...] | Tensor) -> str | None:
    """The backend whose kernels run on `device` now: its `kernel_backend` while kernels are on."""
    return kernel_backend(device) if kernels_enabled() else None


def unavailable(device: str | tuple[str, ...] | Tensor) -> str:
    """Why no kernel runs on `device` (where `active_backend` is None)."""
    name = device.device if isinstance(device, Tensor) else device
    if isinstance(name, tuple) and not _per_device_depth and kernel_backend(name[0]) is not None:
        return f"a tensor on {len(name)} devices (kernels run on each device's buffers inside kernels.per_device())"
    if kernel_backend(device) is None: return f"{name} has no kernels"
    return "kernels are off (NUVEC_KERNELS=0 or compositions_only())"


@functools.cache
def multiprocessors(device: str) -> int | None:
    """A CUDA device's multiprocessor count (None where it cannot be read)."""
    try:
        import ctypes
        from tinygrad.runtime.autogen import cuda
        count = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(count), cuda.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, Device[device].cu_device)
        return count.value or None
    except Exception:  # noqa: BLE001 - unknown: the plans take their default
        return None


@functools.cache
def warpgroup_products(device: str) -> bool:
    """Whether a CUDA device runs Hopper's warpgroup matrix products (wgmma: compute capability 9.0
    exactly, code built for sm_90a runs nowhere else); False where it cannot be read."""
    try:
        return Device[device].arch == "sm_90"
    except Exception:  # noqa: BLE001 - unknown: the wgmma kernels stay off
        return False


def gpu_class_from_name(name: str) -> str:
    """MLX's GPU class from a Metal device's name: `d` Ultra, `s` Max, `g` other Macs (M-series), `p` phones and tablets."""
    if "Ultra" in name: return "d"
    if "Max" in name: return "s"
    if name.startswith("Apple M") or "Pro" in name: return "g"
    return "p"


@functools.cache
def gpu_class(device: str) -> str:
    """A Metal device's MLX GPU class (`gpu_class_from_name`; `g` where the name cannot be read)."""
    try:
        from tinygrad.runtime.ops_metal import from_ns_str
        return gpu_class_from_name(from_ns_str(Device[device].sysdevice.name()))
    except Exception:  # noqa: BLE001 - an unreadable name plans as the base class
        return "g"


# The Metal languages tinygrad's compiler asks for (`metal_language`) that have bfloat (3.1 on).
METAL_BFLOAT_LANGUAGES = ("metal3.1", "metal4.0")


def metal_language(macos_version: str) -> str:
    """The Metal language tinygrad 0.14's Metal compiler asks for (its one option, `-std=`) on a
    macOS version such as "14.5": metal4.0 from macOS 26, metal3.1 from 14, metal3.0 on 13,
    macos-metal2.0 before (`tinygrad/runtime/ops_metal.py`, `MetalCompiler.compile`)."""
    major = int(macos_version.split(".")[0])
    return "metal4.0" if major >= 26 else "metal3.1" if major >= 14 else "metal3.0" if major >= 13 else "macos-metal2.0"


@functools.cache
def metal_bfloat() -> bool:
    """Whether the Metal language tinygrad compiles kernels in on this machine has bfloat (Metal
    3.1, macOS 14, and later): tinygrad chooses it from the macOS version alone, so that version
    decides, without compiling anything. False where the version cannot be read."""
    try:
        return metal_language(platform.mac_ver()[0]) in METAL_BFLOAT_LANGUAGES
    except ValueError:  # not macOS: mac_ver() gives ""
        return False


@functools.cache
def metal_matrix_units(device: str) -> bool:
    """Whether a Metal device has simdgroup matrices (the Apple7 family, A14 and M1, and later:
    `supportsFamily`); False where the device cannot be asked."""
    try:
        from tinygrad.runtime.autogen import metal
        return bool(Device[device].sysdevice.supportsFamily(metal.MTLGPUFamilyApple7))
    except Exception:  # noqa: BLE001 - unknown: the matrix kernels stay off
        return False


@dataclass(frozen=True)
class Target:
    """What the routes and plans read of a device: its kernel `backend` ("metal", "cuda", or None
    for compositions only); `gpu_class` (Metal: MLX's `p`, `g`, `s`, `d`; None plans as `g`);
    `multiprocessors` (CUDA); `bfloat`, whether the kernel language has bfloat (CUDA; Metal 3.1
    and later); `matrix_units`, whether the GPU has the matrix units of the matrix kernels (CUDA's
    mma; Metal's simdgroup matrices, Apple7 and later); `warpgroups`, whether it has Hopper's
    warpgroup matrix products (CUDA sm_90: wgmma)."""
    backend: str | None
    gpu_class: str | None = None
    multiprocessors: int | None = None
    bfloat: bool = True
    matrix_units: bool = True
    warpgroups: bool = False

    def lacks(self, *, bfloat: bool = False, matrix_units: bool = False) -> str | None:
        """Why a kernel that needs bfloat (`bfloat`) or matrix units (`matrix_units`) cannot run on
        this target, or None."""
        if bfloat and not self.bfloat: return "bfloat16 kernels need Metal 3.1 (macOS 14) or later"
        if matrix_units and not self.matrix_units: return "simdgroup matrices need an Apple7 GPU (A14, M1) or later"
        return None


def target(device: str | tuple[str, ...]) -> Target:
    """The `Target` of a tinygrad device name: its kernel backend while kernels are on (None
    otherwise), and the facts its routes read. Several devices (inside `per_device()`): their
    common target where every one has the same and compiles the same programs, else None."""
    if isinstance(device, tuple):
        targets = {target(d) for d in device}
        if not _per_device_depth or len(targets) != 1 or len({_architecture(d) for d in device}) != 1: return Target(None)
        return targets.pop()
    device = Device.canonicalize(device)
    backend = active_backend(device)
    if backend == "metal":
        return Target("metal", gpu_class(device), bfloat=metal_bfloat(), matrix_units=metal_matrix_units(device))
    if backend == "cuda": return Target("cuda", multiprocessors=multiprocessors(device), warpgroups=warpgroup_products(device))
    return Target(None)


def _architecture(device: str) -> str | None:
    """What a device compiles programs for (a CUDA device's `sm_90`), where tinygrad says."""
    try:
        return getattr(Device[device], "arch", None)
    except Exception:  # noqa: BLE001 - a device that cannot open has no kernels either
        return None


def debugging() -> bool:
    """Whether `NUVEC_DEBUG` is set (to anything but 0)."""
    return os.environ.get("NUVEC_DEBUG", "0") != "0"


def debug(message: str) -> None:
    """Print `message` when `NUVEC_DEBUG` is set."""
    if debugging(): print(f"nuvec_tg: {message}")


def choose(op: str, description: str, device: str | Tensor, kernel: str,
           unsupported: Callable[[str], str | None] = lambda backend: None) -> str | None:
    """The backend whose `kernel` runs `op` on `device`, or None for the composition: None where
    the device has no active backend or `unsupported(backend)` gives a reason. Under NUVEC_DEBUG
    prints `op description: the <kernel> kernel` or `...: composition (<reason>)`."""
    backend = active_backend(device)
    reason = unavailable(device) if backend is None else unsupported(backend)
    if debugging(): debug(f"{op} {description}: " + (f"the {kernel} kernel" if reason is None else f"composition ({reason})"))
    return backend if reason is None else None


def composition(op: str, description: str) -> None:
    """Say under NUVEC_DEBUG that `op` runs its composition because it has no kernel."""
    if debugging(): debug(f"{op} {description}: composition ({op} has no kernel)")


@contextlib.contextmanager
def record_launches() -> Iterator[list[tuple[str, str]]]:
    """Collect `(program name, label)` for every kernel launch built inside the block."""
    launches: list[tuple[str, str]] = []
    program.launch_listeners.append(launches)
    try:
        yield launches
    finally:
        program.launch_listeners.remove(launches)
