#!/usr/bin/env bash
# Sets up everything `make demo` and `make test` need, idempotently, on a fresh Debian/Ubuntu
# machine (as root, or with sudo) or on macOS:
#   1. a C compiler for tinygrad's CPU device that knows `__bf16` (clang >= 16; on Linux clang 19
#      from the distribution's packages when none is present), wrapped as .venv/bin/tinygrad-cc;
#   2. a virtual environment in .venv with Python >= 3.11;
#   3. the package, editable, with its test and models extras (the models' tests read tokenizers).
set -euo pipefail
cd "$(dirname "$0")/.."

# tinygrad's CPU device needs a clang whose C knows `__bf16` arithmetic (clang >= 16; Apple's
# clang from Xcode 15 or later): ask each candidate to compile it.
supports_bf16() {
  printf '__bf16 f(__bf16 a, __bf16 b) { return a * b + (__bf16)1.0f; }\n' |
    "$1" -x c -c -O2 -o /dev/null - >/dev/null 2>&1
}

find_clang() {
  local candidate
  for candidate in clang clang-22 clang-21 clang-20 clang-19 clang-18 clang-17 clang-16 \
                   /opt/homebrew/opt/llvm/bin/clang /usr/local/opt/llvm/bin/clang; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if supports_bf16 "$candidate"; then command -v "$candidate"; return 0; fi
  done
  return 1
}

install_clang() {
  if [ "$(uname -s)" = Darwin ]; then
    echo "setup: no clang with __bf16 found; install Xcode 15+ command line tools (xcode-select --install) or Homebrew's llvm" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no clang >= 16 found and no apt-get to install one; install clang >= 16 and rerun" >&2
    exit 1
  fi
  echo "setup: installing clang-19 for tinygrad's CPU device" >&2
  apt_get update
  apt_get install -y clang-19
}

# apt-get as root, quiet. While another apt or dpkg holds a lock it needs (on a fresh machine, often
# the daily unattended upgrade) it waits, saying so, up to 10 minutes, instead of failing at once:
# apt-get's own DPkg::Lock::Timeout does not cover `apt-get update`. LC_ALL=C keeps its message
# in English for the match.
apt_get() {
  local sudo="" errors held waited=0
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  until errors=$($sudo env LC_ALL=C DEBIAN_FRONTEND=noninteractive apt-get -qq "$@" 2>&1 >/dev/null); do
    held=$(printf '%s\n' "$errors" | grep -m1 'Could not get lock' | sed 's/^E: //') || true
    if [ -z "$held" ]; then
      printf '%s\n' "$errors" >&2
      return 1
    fi
    if [ "$waited" -ge 600 ]; then
      echo "setup: $held; still held after 10 minutes: let that process finish (or stop it), then rerun" >&2
      return 1
    fi
    [ "$waited" -gt 0 ] || echo "setup: $held; waiting for it to finish (up to 10 minutes)" >&2
    sleep 5
    waited=$((waited + 5))
  done
  [ -z "$errors" ] || printf '%s\n' "$errors" >&2
}

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  echo "setup: Python >= 3.11 is required" >&2
  return 1
}

clang_path=$(find_clang) || { install_clang; clang_path=$(find_clang); }

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi

# tinygrad runs `$CC` for its CPU device. The wrapper pins the compiler found above and silences
# a harmless warning some clang versions print for `-march=native` on recent x86 CPUs.
wrapper=.venv/bin/tinygrad-cc
wanted="exec $clang_path -Wno-unknown-warning-option -Wno-invalid-feature-combination \"\$@\""
if [ ! -x "$wrapper" ] || ! grep -qxF "$wanted" "$wrapper"; then
  printf '#!/bin/sh\n%s\n' "$wanted" > "$wrapper"
  chmod +x "$wrapper"
fi

# Reinstall only when the package metadata changed since the last install.
stamp=.venv/.nuvec-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,models]'
  touch "$stamp"
fi
