"""The KV cache and the positions of a call's rows.

A cache holds, per attention layer, preallocated `[B, Hkv, max_length, D]` key and value buffers;
a call writes its `T` new rows in place at rows `start..start+T-1` (a slice assignment, so only
those rows are written) and attends over the rows before them. `position` is how many rows every
sequence holds. Prompts of different lengths are left-padded: sequence `b`'s first `pads[b]`
rows are padding, which no query attends and which the rotary positions skip.

`Positions` tells every layer of one call where its rows sit: the cache row they start at (an
int, or in the jitted decode step a bound symbolic variable), their rotary positions, and how
attention reads the cache:
- `key_count` keys (`start + T`) with `"causal"` masking, lower-right aligned — the eager calls,
  and the jitted step where the decode kernels take a symbolic key count (METAL, CUDA);
- or every row of the cache under a boolean mask built from the positions — the jitted step
  elsewhere (tinygrad's compositions need fixed sizes) and left-padded batches.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinygrad import Tensor, UOp, dtypes


@dataclass
class Pages:
    """Where a paged call's sequences keep their keys, values and states (`models.paged`).

    starts: `[B]` int32, each sequence's position of the call's first row (its rotary position too).
    writes: `[B, T]` int32, the pool slot each row's key and value go to (-1: nowhere, an idle row).
    tables: `[B, M]` int32 block tables; lengths: `[B]` int32, the positions each sequence holds
        once the call's rows are written (`starts + T`; 1 for an idle row).
    sequences: `[B]` int32, each sequence's row of the state pools (-1: an idle row, which reads a
        zero state and writes none).
    """
    starts: Tensor
    writes: Tensor
    tables: Tensor
    lengths: Tensor
    sequences: Tensor


@dataclass
class Positions:
    """Where a call's `rows` new tokens sit.

    start: the cache row of the first (an int, or a symbolic expression in the jitted step).
    rope_offset: the rotary position of the first: an int, or an int32 tensor of one or `B`
        elements (left padding shifts each sequence's positions).
    cached: whether the call reads and writes a cache.
    key_count: keys to read from the cache (`start + rows`), or None to read every row under `mask`.
    query_start: `start` as an int32 tensor (None unless a mask is needed).
    pads: `[B]` int32 left padding, or None.
    capacity: the cache's `max_length`.
    pages: for a paged cache (`models.paged.PagedCache`), where each sequence's rows go and what
        they read; then `rope_offset` is `pages.starts`.
    """
    start: int | UOp
    rows: int
    rope_offset: int | Tensor
    cached: bool = False
    key_count: int | UOp | None = None
    query_start: Tensor | None = None
    pads: Tensor | None = None
    capacity: int = 0
    pages: Pages | None = None

    @property
    def masked(self) -> bool:
        """Whether attention needs an array mask (rather than `"causal"`)."""
        return self.cached and (self.key_count is None or self.pads is not None)

    def mask(self, window: int | None) -> Tensor:
        """`[B or 1, 1, rows, keys]` boolean: query row `t` (cache row `start + t`) sees cache row
        `j` when `j <= start + t`, `j >= pads[b]`, and, with a window, `j > start + t - window`."""
        keys = self.capacity if self.key_count is None else self.key_count
        key_rows = Tensor.arange(keys, dtype=dtypes.int32).reshape(1, 1, 1, keys)
        start = self.query_start if self.query_start is not None else Tensor(self.start, dtype=dtypes.int32)
        query_rows = (Tensor.arange(self.rows, dtype=dtypes.int32) + start.reshape(())).reshape(1, 1, self.rows, 1)
        visible = key_rows <= query_rows
        if window is not None: visible = visible & (key_rows > query_rows - window)
        if self.pads is not None: visible = visible & (key_rows >= self.pads.reshape(-1, 1, 1, 1))
        return visible


class KVCache:
    """Per-layer cache state (`[B, Hkv, max_length, D]` keys and values for attention layers), the
    rows every sequence holds (`position`) and the left padding of each sequence (`pads`)."""

    def __init__(self, layers: list, batch: int, max_length: int, device: str):
        self.layers, self.batch, self.max_length, self.device = layers, batch, max_length, device
        self.position = 0
        self.pads: Tensor | None = None
        self.steps: dict[str, object] = {}       # the jitted decode steps bound to these buffers
        self.prefills: dict[tuple, object] = {}  # the jitted prefills (`Model._prefill_jit`)
        # each sequence's tokens by cache row, for greedy steps chained on the device (row r's token
        # at column r, the token it predicts at r + 1)
        self.history = Tensor.zeros(batch, max_length + 1, dtype=dtypes.int32, device=device).contiguous().realize()
        self.query_start = Tensor.zeros(1, dtype=dtypes.int32, device=device).contiguous().realize()   # the step's row
        self.in_use = False                     # a generation runs on it (`Model.generate_tokens`)

    def buffers(self) -> list[Tensor]:
        """Every tensor the cache holds (to realize after in-place writes)."""
        out: list[Tensor] = []
        for layer in self.layers:
            if layer is not None: out.extend(layer)
        return out

    def set_padding(self, pads: list[int]) -> None:
        """Mark sequence `b`'s first `pads[b]` rows as padding (before the first call)."""
        if len(pads) != self.batch: raise ValueError(f"KVCache: pads must have {self.batch} entries, got {len(pads)}")
        self.pads = Tensor(list(pads), dtype=dtypes.int32, device=self.device).realize() if any(pads) else None
        self.steps.clear()
        self.prefills.clear()

    def reset(self, pads: list[int]) -> None:
        """Empty the cache for new sequences padded by `pads`: every buffer zeroed in place, position
        0. The jitted steps stay bound to the same buffers, so they replay without a new capture,
        unless the padding changes kind (none against some: the steps differ)."""
        if len(pads) != self.batch: raise ValueError(f"KVCache: pads must have {self.batch} entries, got {len(pads)}")
        buffers = self.buffers()
        for buffer in buffers: buffer.assign(buffer.zeros_like())
        self.position = 0
        if any(pads) and self.pads is not None:
            self.pads.assign(Tensor(list(pads), dtype=dtypes.int32, device=self.device))
            buffers.append(self.pads)
        elif any(pads) or self.pads is not None:
            self.set_padding(pads)
        Tensor.realize(*buffers)


def written_in_place(result: Tensor, buffer: Tensor) -> bool:
    """Whether `result` is `buffer` itself, updated in place (a kernel's write), rather than a new
    tensor (a composition's, which the caller then assigns to the buffer)."""
    return result.uop.is_realized and result.uop.base.buffer is buffer.uop.base.buffer


def store(buffer: Tensor, updated: Tensor) -> Tensor:
    """`buffer` holding `updated`: a kernel's in-place result as it is, a composition's assigned to it."""
    return updated if written_in_place(updated, buffer) else buffer.assign(updated)


def kv_buffers(batch: int, kv_heads: int, max_length: int, head_dim: int, dtype,
               device: str | tuple[str, ...]) -> tuple[Tensor, Tensor]:
    """Zeroed key and value buffers `[batch, kv_heads, max_length, head_dim]`, realized; over
    several devices, one buffer a device of its own heads (a tensor-parallel model's, `models.parallel`)."""
    def buffer() -> Tensor:
        return Tensor.zeros(batch, kv_heads, max_length, head_dim, dtype=dtype, device=device).contiguous().realize()
    return buffer(), buffer()
