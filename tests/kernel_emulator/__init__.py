"""Run a kernel's CUDA rendering on the CPU (`prelude_emulated.h`): compiled with a C++20 compiler
into a shared library whose `run` launches a grid, one threadgroup at a time, each thread an OS
thread. For checking a kernel's indexing, decoding and arithmetic order where no GPU is present;
its arithmetic is the rendering's, written out (no contraction), so where a kernel writes every
multiply-add as fma the results have the CUDA build's bits. The reads it sees by address (the
asynchronous copies a kernel asks for, and its L2 prefetch hints, which read nothing here) must lie
inside the launch's buffers: a launch fails its assertion otherwise."""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Sequence

import numpy as np

from nuvec_tg.kernels.program import SOURCE_DIR, Program

HERE = pathlib.Path(__file__).parent
COMPILER = next((c for c in ("clang++-19", "clang++", "clang++-20", "clang++-18", "g++") if shutil.which(c)), None)
_CACHE = pathlib.Path(tempfile.gettempdir()) / "nuvec_kernel_emulator"

_LAUNCHER = """
#include <thread>
#include <vector>
extern "C" int run(void** buffers, long* sizes, int count, int groups, int groups_y, int groups_z, int threads) {
  launch_buffer_count = count;
  for (int i = 0; i < count; i++) launch_buffers[i] = {(const char*)buffers[i], (const char*)buffers[i] + sizes[i]};
  out_of_bounds_reads = 0;
  for (int g = 0; g < groups * groups_y * groups_z; g++) {
    std::barrier<> all(threads);
    std::vector<std::barrier<>*> warps;
    Block sync{&all, {}, {}};
    for (int w = 0; w < (threads + 31) / 32; w++) sync.warps[w] = new std::barrier<>(32);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
      pool.emplace_back([&, t] {
        block_sync = &sync;
        blockIdx = uint3{(uint)(g % groups), (uint)(g / groups % groups_y), (uint)(g / (groups * groups_y))};
        threadIdx = uint3{(uint)t, 0, 0};
        KERNEL(ARGUMENTS);
      });
    for (auto& thread : pool) thread.join();
    for (int w = 0; w < (threads + 31) / 32; w++) delete sync.warps[w];
  }
  return out_of_bounds_reads;
}
"""


_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread", "-Wno-unknown-pragmas"]
_STD_HEADERS = "#include <barrier>\n#include <cstring>\n#include <thread>\n#include <vector>\n"


def _write_once(path: pathlib.Path, make) -> bool:
    """Make `path` once: `make(private)` builds it under a private name, then it is renamed into
    place (parallel test workers share the cache); False when `make` failed."""
    if path.exists(): return True
    private = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
    if not make(private): return False
    os.replace(private, path)
    return True


def _precompiled_headers() -> list[str]:
    """Flags that bring in the standard headers precompiled (clang; about half a compile's time),
    or none where that cannot be built."""
    if "clang" not in COMPILER: return []
    key = hashlib.sha256((COMPILER + " ".join(_FLAGS) + _STD_HEADERS).encode()).hexdigest()[:16]
    header, pch = _CACHE / f"std-{key}.h", _CACHE / f"std-{key}.pch"
    _write_once(header, lambda private: private.write_text(_STD_HEADERS) > 0)
    built = _write_once(pch, lambda private: subprocess.run([COMPILER, *_FLAGS, "-x", "c++-header", str(header), "-o", str(private)],
                                                            capture_output=True).returncode == 0)
    return ["-include-pch", str(pch)] if built else []


def build(program: Program, metal_tiles: bool = False):
    """A shared library running `program` (a CUDA specialisation); returns its
    `run(buffers, groups, threads, groups_y=1, groups_z=1)` (a grid of groups x groups_y x groups_z
    threadgroups). `metal_tiles`: qmm's matrix tiles as Metal has them (`prelude_emulated.h`)."""
    name, kernel_text, params = program.name, program.text, program.params
    arguments = ", ".join(f"({'const ' if p.kind == 'in' else ''}{p.ctype}*)buffers[{i}]" for i, p in enumerate(params))
    source = (("#define METAL_TILES 1\n" if metal_tiles else "") + program.header + (HERE / "prelude_emulated.h").read_text() +
              (SOURCE_DIR / "common.h").read_text() +
              kernel_text.replace('extern "C" ', "") + _LAUNCHER.replace("KERNEL", name).replace("ARGUMENTS", arguments))
    _CACHE.mkdir(exist_ok=True)
    library = _CACHE / f"{hashlib.sha256(source.encode()).hexdigest()[:16]}.so"

    def compile_library(private: pathlib.Path) -> bool:
        src = private.with_suffix(".cpp")
        src.write_text(source)
        result = subprocess.run([COMPILER, *_FLAGS, *_precompiled_headers(), "-shared", "-o", str(private), str(src)],
                                capture_output=True, text=True)
        if result.returncode: raise RuntimeError(result.stderr[:4000])
        src.unlink()
        return True
    _write_once(library, compile_library)
    run = ctypes.CDLL(str(library)).run
    run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                    ctypes.c_int, ctypes.c_int]
    run.restype = ctypes.c_int

    def launch(buffers: Sequence[np.ndarray], groups: int, threads: int, groups_y: int = 1, groups_z: int = 1) -> None:
        arrays = [np.ascontiguousarray(b) for b in buffers]
        for given, array in zip(buffers, arrays): assert given is array, "buffers must be contiguous numpy arrays"
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        sizes = (ctypes.c_long * len(arrays))(*[a.nbytes for a in arrays])
        outside = run(pointers, sizes, len(arrays), groups, groups_y, groups_z, threads)
        assert outside == 0, f"{name}: {outside} asynchronous copies or L2 prefetches read outside the launch's buffers"
    return launch
