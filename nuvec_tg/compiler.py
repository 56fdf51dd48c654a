"""The C compiler of tinygrad's CPU device: a clang that knows `__bf16`, found without the user's help.

tinygrad compiles the CPU device's kernels (and, when it opens the device, its own helpers) with
`$CC`, else with whatever `clang` is on PATH, and nuvec_tg's bfloat16 compositions need a clang
whose C has `__bf16` arithmetic (clang >= 16, Apple's from Xcode 15). Many systems install such a
clang only as `clang-19` or the like. When nuvec_tg is imported with `CC` unset,
`use_suitable_clang()` sets `CC` to the first such clang on PATH; without one, it leaves importing
(and METAL or CUDA) alone and makes a CPU compile that fails say what to install. A `CC` the user
sets is used as it is.

On a CPU without native bfloat16 conversions (x86 without AVX512-BF16, such as AMD's Zen 3),
clang lowers a float-to-`__bf16` conversion to a call of the runtime library's `__truncsfbf2`,
which tinygrad's CPU loader looks up in libgcc_s and libm only, and libgcc before GCC 13 lacks it.
`provide_bf16_truncation()` then defines it there, where tinygrad's loader finds it.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
import shutil
import subprocess
import sys

from tinygrad.helpers import DEV
from tinygrad.runtime.ops_cpu import CPUProgram
from tinygrad.runtime.support.elf import jit_loader
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


# float -> bfloat16, to nearest even (a NaN stays a NaN of its sign). The empty asm keeps clang
# from folding the rounding back into a call of this very function.
BF16_TRUNCATION = r"""
__bf16 __truncsfbf2(float x) {
  unsigned int bits;
  __builtin_memcpy(&bits, &x, 4);
  bits = (bits & 0x7FFFFFFFu) > 0x7F800000u ? bits | 0x00400000u : bits + 0x7FFFu + ((bits >> 16) & 1u);
  unsigned short top = (unsigned short)(bits >> 16);
  __asm__("" : "+r"(top));
  __bf16 out;
  __builtin_memcpy(&out, &top, 2);
  return out;
}
"""
_truncation_code: list[mmap.mmap] = []  # the loaded definition, kept mapped for the process's life


def runtime_has_bf16_truncation() -> bool:
    """Whether the libraries tinygrad links its CPU programs against (libm and libgcc_s; on macOS
    libSystem) define `__truncsfbf2`."""
    return any(hasattr(lib, "__truncsfbf2") for lib in (CPUProgram.libm, CPUProgram.rt_lib))


def define_bf16_truncation(device) -> int:
    """Compile `BF16_TRUNCATION` with the CPU device's compiler, load it as tinygrad loads a
    program, and give it to the runtime library tinygrad resolves symbols in (once). Returns its
    address."""
    if not _truncation_code:
        image = jit_loader(device.renderer.compiler.compile(BF16_TRUNCATION))
        code = mmap.mmap(-1, len(image), mmap.MAP_ANON | mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(image)
        _truncation_code.append(code)
        setattr(CPUProgram.rt_lib, "__truncsfbf2", ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(code))))
    return CPUProgram.rt_lib.__dict__["__truncsfbf2"].value


def provide_bf16_truncation() -> None:
    """Where the runtime libraries lack `__truncsfbf2` (Linux with libgcc before GCC 13), define it
    before tinygrad loads its first CPU program. Programs are loaded (and their symbols resolved)
    in this process; tinygrad's compile workers only compile, so they need nothing."""
    if sys.platform != "linux" or runtime_has_bf16_truncation(): return
    load = CPUProgram.__init__

    @functools.wraps(load)
    def load_with_truncation(self, device, obj):
        define_bf16_truncation(device)
        load(self, device, obj)

    CPUProgram.__init__ = load_with_truncation
