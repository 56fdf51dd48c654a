"""Run a kernel's CUDA rendering on the CPU (`prelude_emulated.h`): compiled with a C++20 compiler
into a shared library whose `run` launches a grid, one threadgroup at a time, each of its threads
an OS thread (the same ones for every threadgroup). For checking a kernel's indexing, decoding and arithmetic order where no GPU is present;
its arithmetic is the rendering's, written out (no contraction), so where a kernel writes every
multiply-add as fma the results have the CUDA build's bits.

A launch fails its assertion when the kernel reads outside the launch's buffers or writes outside
its outputs (its own stack, threadgroup arrays and thread state aside). With clang
(`CHECKS_EVERY_ACCESS`) every load and store of the kernel is checked, through the compiler's
load and store callbacks (`-fsanitize-coverage=trace-loads,trace-stores` over the kernel's
function, its helpers inlined); with another compiler only the reads the emulator sees by address
(asynchronous copies, L2 prefetch hints) are."""
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
_PADDING = 1 << 16  # bytes on either side of a buffer in a launch (a multiple of 16: its alignment stays)

_LAUNCHER = """
#include <thread>
#include <vector>
extern "C" void run(void** buffers, long* sizes, const int* writable, int count, int groups, int groups_y, int groups_z,
                    int threads, int* outside) {
  launch_buffer_count = count;
  for (int i = 0; i < count; i++) {
    launch_buffers[i] = {(const char*)buffers[i], (const char*)buffers[i] + sizes[i]};
    launch_writable[i] = writable[i] != 0;
  }
  if (library_segment_count == 0) dl_iterate_phdr(find_library_segments, nullptr);
  out_of_bounds_reads = out_of_bounds_writes = 0;
  // One OS thread per thread of a threadgroup, taking the grid's threadgroups one at a time (all of
  // them finish one before any starts the next): threadgroup arrays are statics.
  const int total = groups * groups_y * groups_z;
  std::barrier<> all(threads);
  Block sync{&all, {}, {}};
  for (int w = 0; w < (threads + 31) / 32; w++) sync.warps[w] = new std::barrier<>(32);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++)
    pool.emplace_back([&, t] {
      emulated.sync = &sync;
      emulated.thread = uint3{(uint)t, 0, 0};
      emulated.stack_top = (const char*)__builtin_frame_address(0);
      for (int g = 0; g < total; g++) {
        emulated.block = uint3{(uint)(g % groups), (uint)(g / groups % groups_y), (uint)(g / (groups * groups_y))};
        KERNEL(ARGUMENTS);
        all.arrive_and_wait();
      }
    });
  for (auto& thread : pool) thread.join();
  for (int w = 0; w < (threads + 31) / 32; w++) delete sync.warps[w];
  outside[0] = out_of_bounds_reads;
  outside[1] = out_of_bounds_writes;
}
"""


_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread", "-Wno-unknown-pragmas"]
# clang: every load and store of the kernel function (program names start with nuvec_) traced.
CHECKS_EVERY_ACCESS = COMPILER is not None and "clang" in COMPILER
_STD_HEADERS = "#include <barrier>\n#include <cstring>\n#include <link.h>\n#include <thread>\n#include <vector>\n"


def _write_once(path: pathlib.Path, make) -> bool:
    """Make `path` once: `make(private)` builds it under a private name, then it is renamed into
    place (parallel test workers share the cache); False when `make` failed."""
    if path.exists(): return True
    private = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
    if not make(private): return False
    os.replace(private, path)
    return True


def _trace_flags() -> list[str]:
    """clang's flags tracing every load and store of the kernel's function (program names start
    with nuvec_; its helpers are inlined into it), or none for another compiler."""
    if not CHECKS_EVERY_ACCESS: return []
    traced = _CACHE / "traced_functions.txt"
    _write_once(traced, lambda private: private.write_text("src:*\nfun:*nuvec_*\n") > 0)
    return ["-fsanitize-coverage=edge,trace-loads,trace-stores", f"-fsanitize-coverage-allowlist={traced}"]


def _precompiled_headers() -> list[str]:
    """Flags that bring in the standard headers precompiled (clang; about half a compile's time),
    or none where that cannot be built."""
    if "clang" not in COMPILER: return []
    flags = _FLAGS + _trace_flags()
    key = hashlib.sha256((COMPILER + " ".join(flags) + _STD_HEADERS).encode()).hexdigest()[:16]
    header, pch = _CACHE / f"std-{key}.h", _CACHE / f"std-{key}.pch"
    _write_once(header, lambda private: private.write_text(_STD_HEADERS) > 0)
    built = _write_once(pch, lambda private: subprocess.run([COMPILER, *flags, "-x", "c++-header", str(header), "-o", str(private)],
                                                            capture_output=True).returncode == 0)
    return ["-include-pch", str(pch)] if built else []


def build(program: Program):
    """A shared library running `program` (a CUDA specialisation); returns its
    `run(buffers, groups, threads, groups_y=1, groups_z=1)` (a grid of groups x groups_y x groups_z
    threadgroups)."""
    name, kernel_text, params = program.name, program.text, program.params
    arguments = ", ".join(f"({'const ' if p.kind == 'in' else ''}{p.ctype}*)buffers[{i}]" for i, p in enumerate(params))
    source = ((HERE / "prelude_emulated.h").read_text() + (SOURCE_DIR / "common.h").read_text() +
              kernel_text.replace('extern "C" ', "") + _LAUNCHER.replace("KERNEL", name).replace("ARGUMENTS", arguments))
    _CACHE.mkdir(exist_ok=True)
    library = _CACHE / f"{hashlib.sha256(source.encode()).hexdigest()[:16]}.so"

    def compile_library(private: pathlib.Path) -> bool:
        src = private.with_suffix(".cpp")
        src.write_text(source)
        result = subprocess.run([COMPILER, *_FLAGS, *_trace_flags(), *_precompiled_headers(), "-shared", "-o", str(private), str(src)],
                                capture_output=True, text=True)
        if result.returncode: raise RuntimeError(result.stderr[:4000])
        src.unlink()
        return True
    _write_once(library, compile_library)
    run = ctypes.CDLL(str(library)).run
    run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    run.restype = None
    writable = [p.kind == "out" for p in params]

    def launch(buffers: Sequence[np.ndarray], groups: int, threads: int, groups_y: int = 1, groups_z: int = 1) -> None:
        for given in buffers: assert given is np.ascontiguousarray(given), "buffers must be contiguous numpy arrays"
        assert len(buffers) == len(writable) <= 32, f"{name}: {len(writable)} buffers, got {len(buffers)}"
        # The kernel runs on padded copies (NaN bytes around each buffer), so that a stray access
        # the launch reports lands in memory of its own rather than in the interpreter's.
        padded = [np.full(_PADDING + b.nbytes + _PADDING, 0xFF, np.uint8) for b in buffers]
        for copy, given in zip(padded, buffers): copy[_PADDING:_PADDING + given.nbytes] = given.reshape(-1).view(np.uint8)
        pointers = (ctypes.c_void_p * len(padded))(*[copy.ctypes.data + _PADDING for copy in padded])
        sizes = (ctypes.c_long * len(padded))(*[b.nbytes for b in buffers])
        outside = (ctypes.c_int * 2)()
        run(pointers, sizes, (ctypes.c_int * len(padded))(*writable), len(padded), groups, groups_y, groups_z, threads, outside)
        for copy, given, out in zip(padded, buffers, writable):
            if out: given.reshape(-1).view(np.uint8)[:] = copy[_PADDING:_PADDING + given.nbytes]
        assert outside[0] == 0 and outside[1] == 0, \
            f"{name}: {outside[0]} reads outside the launch's buffers, {outside[1]} writes outside its outputs"
    return launch
