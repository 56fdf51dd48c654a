"""Hand-written Metal / CUDA programs and the mechanism that injects them into tinygrad's graph.

No program has landed yet: every device runs the compositions, and `attention_backend` answers
None everywhere. The planner (`fast.plan`) asks it which backend's kernels a device can run.
"""
from __future__ import annotations

from ..tensor import kernel_backend

# The backends whose attention programs are built and tested (none yet).
ATTENTION_BACKENDS: frozenset[str] = frozenset()


def attention_backend(device: str) -> str | None:
    """The backend (`"metal"`, `"cuda"`) whose attention kernels run on `device`, or None."""
    backend = kernel_backend(device)
    return backend if backend in ATTENTION_BACKENDS else None
