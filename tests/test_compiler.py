"""The CPU device's compiler without `CC` (`nuvec_tg.compiler`), with stand-in clangs: shell
scripts that accept any C (a clang with `__bf16`) or reject it (an older clang)."""
import os
import pathlib
import subprocess
import sys

from nuvec_tg.compiler import find_clang

ROOT = pathlib.Path(__file__).resolve().parents[1]
ACCEPTS = "#!/bin/sh\n/bin/cat >/dev/null\nprintf object\n"  # prints its "object file" as tinygrad asks (-o -)
REJECTS = "#!/bin/sh\n/bin/cat >/dev/null\nexit 1\n"


def stand_in(folder: pathlib.Path, name: str, script: str) -> pathlib.Path:
    folder.mkdir(exist_ok=True)
    (path := folder / name).write_text(script)
    path.chmod(0o755)
    return path


def cpu_compile(path: pathlib.Path, cc: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """A fresh process that imports nuvec_tg and compiles through tinygrad's CPU compiler, with
    only `path` on PATH and `CC` unset (or `cc`); it prints the object and the `CC` used."""
    env = {k: v for k, v in os.environ.items() if k != "CC"} | {"PATH": str(path), "PYTHONPATH": str(ROOT)}
    if cc is not None: env["CC"] = str(cc)
    code = ("import os, nuvec_tg; from tinygrad.runtime.support.compiler_cpu import ClangCompiler\n"
            "print(ClangCompiler(['x86_64', 'native']).compile('int x;'), os.environ['CC'])")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_first_clang_with_bf16_on_path_is_found(tmp_path, monkeypatch):
    stand_in(tmp_path, "clang", REJECTS)
    newer = stand_in(tmp_path, "clang-19", ACCEPTS)
    stand_in(tmp_path, "clang-18", ACCEPTS)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_clang() == str(newer)
    (tmp_path / "clang-19").unlink()
    (tmp_path / "clang-18").unlink()
    assert find_clang() is None


def test_the_cpu_device_compiles_with_the_clang_found(tmp_path):
    stand_in(tmp_path, "clang", REJECTS)
    newer = stand_in(tmp_path, "clang-19", ACCEPTS)
    done = cpu_compile(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["b'object'", str(newer)]


def test_without_a_clang_the_cpu_device_says_what_to_install(tmp_path):
    stand_in(tmp_path, "clang", REJECTS)
    done = cpu_compile(tmp_path)
    assert "RuntimeError: nuvec_tg: tinygrad's CPU device needs a clang that knows __bf16 (clang >= 16)" in done.stderr
    assert "or set CC to such a clang's path" in done.stderr


def test_a_user_cc_is_used_as_it_is(tmp_path):
    stand_in(tmp_path / "bin", "clang-19", ACCEPTS)
    mine = stand_in(tmp_path, "my-cc", ACCEPTS)
    assert cpu_compile(tmp_path / "bin", cc=mine).stdout.split() == ["b'object'", str(mine)]
    mine.write_text(REJECTS)
    done = cpu_compile(tmp_path / "bin", cc=mine)
    assert "CalledProcessError" in done.stderr and "nuvec_tg:" not in done.stderr  # its own error, no advice


def test_the_bf16_truncation_rounds_to_nearest_even():
    """The `__truncsfbf2` nuvec_tg defines where the runtime libraries lack it (CPUs without
    native bfloat16 conversions), called directly: numpy's round-to-nearest-even bits, ties both
    ways, subnormals, overflow to infinity, NaNs quiet with their sign."""
    import ctypes

    import numpy as np
    from tinygrad import Device

    from nuvec_tg.compiler import define_bf16_truncation
    truncate = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float)(define_bf16_truncation(Device["CPU"]))
    special = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00008000, 0x00018000, 0x7F7FFFFF, 0xFF7F8000,
                        0x7F800000, 0x7F800001, 0xFFC12345, 0x80000000], dtype=np.uint32)
    bits = np.concatenate([special, np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint32)])
    got = np.array([np.float32(truncate(float(x))).view(np.uint32) & 0xFFFF for x in bits.view(np.float32)], dtype=np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    want = np.where(nan, (bits | 0x00400000) >> 16, (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    assert np.array_equal(got, want.astype(np.uint32)), np.flatnonzero(got != want)[:8]
