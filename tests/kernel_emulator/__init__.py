"""Run a kernel's CUDA rendering on the CPU (`prelude_emulated.h`): compiled with a C++20 compiler
into a shared library, which the runner library (`runner.cpp`, built once) launches over a grid,
one threadgroup (or cluster of them) at a time, each of its threads a fiber of the calling thread
(switched where a thread waits: a barrier or an exchange). For checking a kernel's indexing,
decoding and arithmetic order where no GPU is present; its arithmetic is the rendering's, written
out (no contraction), so where a kernel writes every multiply-add as fma the results have the
CUDA build's bits.

A launch fails its assertion when the kernel reads outside the launch's buffers or writes outside
its outputs (its own stack, threadgroup arrays and thread state aside). With clang
(`CHECKS_EVERY_ACCESS`) every load and store of the kernel is checked, through the compiler's
load and store callbacks (`-fsanitize-coverage=trace-loads,trace-stores` over the kernel's
function, its helpers inlined); with another compiler only the reads the emulator sees by address
(asynchronous copies, L2 prefetch hints) are."""
from __future__ import annotations

import ctypes
import functools
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

# A kernel library's entry: the runner's `run` calls it with the launch's buffers (not traced: its
# name must not match the kernels', `_trace_flags`); and where its threadgroup arrays lie (the
# section THREADGROUP puts them in: the runner swaps a cluster's threadgroups' arrays there; none: nulls).
_ENTRY = """
extern "C" void emulated_kernel_entry(void** buffers) { KERNEL(ARGUMENTS); }
extern "C" char __start_nuvec_threadgroup[] __attribute__((weak)), __stop_nuvec_threadgroup[] __attribute__((weak));
extern "C" void emulated_threadgroup_memory(char** range) { range[0] = __start_nuvec_threadgroup; range[1] = __stop_nuvec_threadgroup; }
"""


_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread", "-Wno-unknown-pragmas"]
# gold where installed: it links a kernel's library in about a third of the default linker's time
# (a library is compiled and linked per kernel, hundreds of them in a cold test run).
_LINK_FLAGS = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
# clang: every load and store of the kernel function (program names start with nuvec_) traced.
CHECKS_EVERY_ACCESS = COMPILER is not None and "clang" in COMPILER
_STD_HEADERS = "#include <cstring>\n"


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


@functools.cache
def _runner():
    """The runner library (`runner.cpp`: the launch, barriers, exchanges and access checks), built
    once and loaded where every kernel library finds its symbols; returns its `run`."""
    source = (HERE / "runner.cpp").read_text().replace('#include "prelude_emulated.h"', (HERE / "prelude_emulated.h").read_text())
    _CACHE.mkdir(exist_ok=True)
    library = _CACHE / f"runner-{hashlib.sha256((COMPILER + source).encode()).hexdigest()[:16]}.so"

    def compile_runner(private: pathlib.Path) -> bool:
        src = private.with_suffix(".cpp")
        src.write_text(source)
        result = subprocess.run([COMPILER, *_FLAGS, *_LINK_FLAGS, "-shared", "-o", str(private), str(src)], capture_output=True,
                                text=True)
        if result.returncode: raise RuntimeError(result.stderr[:4000])
        src.unlink()
        return True
    _write_once(library, compile_runner)
    run = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL).run
    run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long), ctypes.POINTER(ctypes.c_int),
                    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    run.restype = None
    return run


def build(program: Program, metal_tiles: bool = False):
    """A shared library running `program` (a CUDA specialisation); returns its
    `run(buffers, groups, threads, groups_y=1, groups_z=1)` (a grid of groups x groups_y x groups_z
    threadgroups, in clusters of `program.cluster` where it has them). `metal_tiles`: qmm's matrix tiles as Metal has them (`prelude_emulated.h`)."""
    name, kernel_text, params = program.name, program.text, program.params
    arguments = ", ".join(f"({'const ' if p.kind == 'in' else ''}{p.ctype}*)buffers[{i}]" for i, p in enumerate(params))
    source = (("#define METAL_TILES 1\n" if metal_tiles else "") + program.header + (HERE / "prelude_emulated.h").read_text() +
              (SOURCE_DIR / "common.h").read_text() +
              kernel_text.replace('extern "C" ', "") + _ENTRY.replace("KERNEL", name).replace("ARGUMENTS", arguments))
    _CACHE.mkdir(exist_ok=True)
    library = _CACHE / f"{hashlib.sha256((COMPILER + ' '.join(_FLAGS + _trace_flags()) + source).encode()).hexdigest()[:16]}.so"

    def compile_library(private: pathlib.Path) -> bool:
        src = private.with_suffix(".cpp")
        src.write_text(source)
        result = subprocess.run([COMPILER, *_FLAGS, *_trace_flags(), *_precompiled_headers(), *_LINK_FLAGS, "-shared", "-o",
                                 str(private), str(src)], capture_output=True, text=True)
        if result.returncode: raise RuntimeError(result.stderr[:4000])
        src.unlink()
        return True
    _write_once(library, compile_library)
    run = _runner()  # first: the kernel library's undefined symbols are the runner's
    kernel_library = ctypes.CDLL(str(library))
    entry = ctypes.cast(kernel_library.emulated_kernel_entry, ctypes.c_void_p)
    memory = (ctypes.c_void_p * 2)()
    kernel_library.emulated_threadgroup_memory(memory)
    writable = [p.kind == "out" for p in params]
    cluster = program.cluster or (1, 1, 1)

    def launch(buffers: Sequence[np.ndarray], groups: int, threads: int, groups_y: int = 1, groups_z: int = 1) -> None:
        for given in buffers: assert given is np.ascontiguousarray(given), "buffers must be contiguous numpy arrays"
        assert len(buffers) == len(writable) <= 32, f"{name}: {len(writable)} buffers, got {len(buffers)}"
        assert not (groups % cluster[0] or groups_y % cluster[1] or groups_z % cluster[2]), f"{name}: clusters of {cluster}"
        # The kernel runs on padded copies (NaN bytes around each buffer), so that a stray access
        # the launch reports lands in memory of its own rather than in the interpreter's.
        padded = [np.full(_PADDING + b.nbytes + _PADDING, 0xFF, np.uint8) for b in buffers]
        for copy, given in zip(padded, buffers): copy[_PADDING:_PADDING + given.nbytes] = given.reshape(-1).view(np.uint8)
        pointers = (ctypes.c_void_p * len(padded))(*[copy.ctypes.data + _PADDING for copy in padded])
        sizes = (ctypes.c_long * len(padded))(*[b.nbytes for b in buffers])
        outside = (ctypes.c_int * 2)()
        run(entry, pointers, sizes, (ctypes.c_int * len(padded))(*writable), len(padded), groups, groups_y, groups_z, threads,
            (ctypes.c_int * 3)(*cluster), memory[0], memory[1], outside)
        for copy, given, out in zip(padded, buffers, writable):
            if out: given.reshape(-1).view(np.uint8)[:] = copy[_PADDING:_PADDING + given.nbytes]
        assert outside[0] == 0 and outside[1] == 0, \
            f"{name}: {outside[0]} reads outside the launch's buffers, {outside[1]} writes outside its outputs"
    return launch
