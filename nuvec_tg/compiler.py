"""The C compiler of tinygrad's CPU device: a clang that knows `__bf16`, found without the user's help.

tinygrad compiles the CPU device's kernels (and, when it opens the device, its own helpers) with
`$CC`, else with whatever `clang` is on PATH, and nuvec_tg's bfloat16 compositions need a clang
whose C has `__bf16` arithmetic (clang >= 16, Apple's from Xcode 15). Many systems install such a
clang only as `clang-19` or the like. When nuvec_tg is imported with `CC` unset,
`use_suitable_clang()` sets `CC` to the first such clang on PATH; without one, it leaves importing
(and METAL or CUDA) alone and makes a CPU compile that fails say what to install. A `CC` the user
sets is used as it is.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

from tinygrad.helpers import DEV
from tinygrad.runtime.support.compiler_cpu import ClangCompiler

# Searched in this order on PATH (the names scripts/setup.sh searches), the newest versions first.
CANDIDATES = ("clang", "clang-22", "clang-21", "clang-20", "clang-19", "clang-18", "clang-17", "clang-16",
              "/opt/homebrew/opt/llvm/bin/clang", "/usr/local/opt/llvm/bin/clang")
PROBE = "__bf16 f(__bf16 a, __bf16 b) { return a * b + (__bf16)1.0f; }\n"


def supports_bf16(compiler: str) -> bool:
    """Whether `compiler` compiles C with `__bf16` arithmetic (about 30 ms for a present clang)."""
    try:
        done = subprocess.run([compiler, "-x", "c", "-c", "-O2", "-o", os.devnull, "-"], input=PROBE, text=True,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def find_clang() -> str | None:
    """The path of the first of `CANDIDATES` on PATH that supports `__bf16`, else None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path is not None and supports_bf16(path):
            return path
    return None


def missing_clang_message() -> str:
    """What to install (or set) when no clang with `__bf16` is found, for this system."""
    if sys.platform == "darwin":
        install = ("install Xcode 15 or later's command line tools (`xcode-select --install`) "
                   "or Homebrew's llvm (`brew install llvm`)")
    elif shutil.which("apt-get"):
        install = "install one (`sudo apt-get install clang-19`)"
    else:
        install = "install clang 16 or later with your package manager"
    return (f"nuvec_tg: tinygrad's CPU device needs a clang that knows __bf16 (clang >= 16) and no `clang`, "
            f"`clang-22` ... `clang-16` on PATH is one: {install}, or set CC to such a clang's path")


def use_suitable_clang() -> None:
    """With `CC` unset, point it at the first clang on PATH that knows `__bf16`, before tinygrad
    (and the compile workers it spawns, which inherit the environment) reads it; without one, wrap
    tinygrad's CPU compile so that its failure says what to install."""
    if "CC" in os.environ:
        return
    if (found := find_clang()) is not None:
        os.environ["CC"] = found
        return
    compile_c = ClangCompiler.compile

    @functools.wraps(compile_c)
    def compile(self, src: str) -> bytes:
        try:
            return compile_c(self, src)
        except (OSError, subprocess.CalledProcessError) as error:
            if "CC" in os.environ:
                raise  # a compiler set since: its own error says what went wrong
            if not DEV.device:  # tinygrad is choosing the default device and hides the errors of those it tries
                print(missing_clang_message(), file=sys.stderr, flush=True)
            raise RuntimeError(missing_clang_message()) from error

    ClangCompiler.compile = compile
