# The README's two commands. Each sets up what it needs first (scripts/setup.sh is idempotent).
PYTHON := .venv/bin/python
# tinygrad compiles its CPU device's kernels with $CC: the clang the set-up found.
export CC := $(CURDIR)/.venv/bin/tinygrad-cc

.PHONY: demo test setup

setup:
	@bash scripts/setup.sh

demo: setup
	$(PYTHON) examples/qwen3_layer.py

# Tests run in parallel, one worker per core (pytest-xdist).
test: setup
	$(PYTHON) -m pytest -q -n auto
