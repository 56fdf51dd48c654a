"""Serving many sequences at once: a paged cache, and an engine that decodes every running
sequence in one batched step and interleaves new prompts' prefills with those steps (continuous
batching, as vLLM and SGLang serve).

```python
engine = models.Engine(model, max_sequences=64, max_length=4096)
first = engine.submit(prompt_tokens, max_tokens=128)            # any number, any lengths
for request, token in engine.run(): ...                          # (request id, token) as produced
```

**The cache** (`PagedCache`). Each attention layer owns key and value pools `[blocks, Hkv,
block_size, D]`; each linear-attention layer a convolution-state pool `[sequences, K - 1, C]` and
a recurrent-state pool `[sequences, Hv, Dv, Dk]` (float32). A sequence owns a slot (its row of the
block table and of the state pools) and the blocks its table lists, in order: position `p` of the
sequence is row `p % block_size` of block `table[p // block_size]`. Blocks are reserved when a
request is admitted, enough for its prompt and its `max_tokens`, and freed when it finishes, so a
running sequence never waits for memory (no preemption); a request waits until a slot and its
blocks are free.

**The engine** (`Engine`). Each `step()`: admits waiting requests (first come, first served)
while slots and blocks last; runs one decode step for every sequence whose prompt is in (one
token each, batched, at each sequence's own position and length); then one chunk of at most
`prefill_chunk` prompt tokens of the oldest admitted request still prefilling (whose last chunk
gives its first token, after which it decodes with the others). A long prompt thus delays the
running sequences by one chunk a step, not by its whole prefill. A chunk is `prefill_chunk`
tokens; a prompt's remainder is one chunk padded to a multiple of `PREFILL_BUCKET` rows (junk
rows after the prompt, which write nowhere and whose outputs nothing reads) where every layer of
the model is attention (`Model._right_pads_prompts`), else chunks of powers of two (300 tokens:
256, 32, 8 and 4; a recurrent state would take the junk rows in). Either way the jitted
prefills are a fixed few whatever the prompts' lengths: one jit per chunk length would compile
again for every new length (about 2 s on an H100 for Qwen3-8B; requests of 8 different lengths
waited 13 s for their first tokens), and padding runs a remainder as one pass over the weights. The decode step is jitted once
per batch bucket (1, 2, 4, ... up to `max_sequences`): a bucket's idle rows write nowhere (slot
-1) and read a zero state, and no row's result depends on another's. Greedy requests take their
argmax on the device; if any running request samples, the step returns logits and each request
samples on the host with its own seeded generator (`sampling.Sampler`). `requests[id]` keeps
each request's tokens (and, asked for, its logits) after it finishes.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from tinygrad import Tensor, TinyJit, dtypes
from tinygrad.helpers import Context

from .cache import Pages, Positions
from .model import PREFILL_BUCKET, StepInput, bucket_rows, recent_jit, row_by_value
from .sampling import Sampler, greedy_tokens

DEFAULT_BLOCK_SIZE = 16   # positions a block (vLLM's default): a power of two, which the paged decode kernels read


class PagedCache:
    """The pools of a model's layers for up to `sequences` sequences of up to `max_length`
    positions, `blocks` blocks of `block_size` positions in all, with the host's block tables,
    free blocks and free slots."""

    def __init__(self, model, sequences: int, max_length: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 blocks: int | None = None):
        if sequences < 1 or max_length < 1: raise ValueError(f"PagedCache: sequences and max_length must be positive, "
                                                             f"got {sequences}, {max_length}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"PagedCache: block_size must be a power of two, got {block_size}")
        self.table_blocks = -(-max_length // block_size)          # a table row: the blocks of the longest sequence
        if blocks is None: blocks = sequences * self.table_blocks
        if blocks < 1: raise ValueError(f"PagedCache: blocks must be positive, got {blocks}")
        self.sequences, self.max_length, self.block_size, self.blocks = sequences, max_length, block_size, blocks
        self.device = model.device
        self.layers = [layer.make_pool(sequences, blocks, block_size, model.dtype, model.device) for layer in model.layers]
        self._layer_objects = model.layers
        self.tables = np.zeros((sequences, self.table_blocks), np.int32)
        self.free_blocks = list(range(blocks - 1, -1, -1))          # popped from the end: block 0 first
        self.free_slots = list(range(sequences - 1, -1, -1))

    def buffers(self) -> list[Tensor]:
        """Every pool (to realize after in-place writes)."""
        return [pool for pools in self.layers for pool in pools]

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def can_hold(self, positions: int) -> bool:
        """Whether a slot and the blocks for a sequence of `positions` are free now."""
        return bool(self.free_slots) and self.blocks_for(positions) <= len(self.free_blocks) and positions <= self.max_length

    def allocate(self, positions: int) -> int:
        """A slot with the blocks for `positions` positions (`can_hold` must be true); the slot's
        linear-attention states are zeroed."""
        slot = self.free_slots.pop()
        needed = self.blocks_for(positions)
        self.tables[slot] = 0
        self.tables[slot, :needed] = [self.free_blocks.pop() for _ in range(needed)]
        cleared = [t for layer, pools in zip(self._layer_objects, self.layers) for t in layer.clear_slot(pools, slot)]
        if cleared: Tensor.realize(*cleared)
        return slot

    def release(self, slot: int, positions: int) -> None:
        """Give back a slot and the blocks its sequence of `positions` positions held."""
        self.free_blocks.extend(int(b) for b in self.tables[slot, :self.blocks_for(positions)][::-1])
        self.tables[slot] = 0
        self.free_slots.append(slot)

    def pool_slot(self, slot: int, position: int) -> int:
        """The pool slot (block * block_size + row) of a sequence's position."""
        return int(self.tables[slot, position // self.block_size]) * self.block_size + position % self.block_size


@dataclass
class Request:
    """A sequence being served: its prompt, what it asks for, and how far it has got."""
    id: int
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stops: frozenset[int]
    slot: int = -1
    prefilled: int = 0                       # prompt tokens in the cache
    tokens: list[int] = field(default_factory=list)   # generated so far
    finished: bool = False
    keep_logits: bool = False
    logits: list[np.ndarray] = field(default_factory=list)   # each generated token's logits [vocab] (float32), if kept

    @property
    def positions(self) -> int:
        """The positions its sequence takes at most (prompt and every token but the last, which
        is never fed back)."""
        return len(self.prompt) + self.max_tokens - 1

    @property
    def held(self) -> int:
        """Positions in the cache now: the prompt's prefilled part and every generated token but the last."""
        return self.prefilled + max(len(self.tokens) - 1, 0)


def chunk_rows(remaining: int, chunk: int, pads: bool) -> tuple[int, int]:
    """A prompt's next prefill chunk, `remaining` tokens left, as (prompt rows, rows run): `chunk`
    rows; where fewer remain, all of them run as a multiple of PREFILL_BUCKET rows (at most
    `chunk`) where junk rows after the prompt are allowed (`pads`), else the largest power of two
    up to `remaining`. A prompt of any length then prefills in chunks of a few fixed lengths
    (each a jit)."""
    if remaining >= chunk: return chunk, chunk
    if pads: return remaining, bucket_rows(remaining, chunk)
    rows = 1 << (remaining.bit_length() - 1)
    return rows, rows


class Engine:
    """Continuous batching over a `PagedCache` (see the module's docstring).

    max_sequences: sequences served at once (the decode step's batch); max_length: the longest
    sequence (prompt plus generated tokens); blocks: the pools' blocks (default: every slot at
    `max_length`); prefill_chunk: prompt tokens a step prefills (default the model's)."""

    def __init__(self, model, max_sequences: int = 8, max_length: int = 4096, block_size: int = DEFAULT_BLOCK_SIZE,
                 blocks: int | None = None, prefill_chunk: int | None = None):
        self.model = model
        self.cache = PagedCache(model, max_sequences, max_length, block_size, blocks)
        self.prefill_chunk = prefill_chunk or model.prefill_chunk
        if self.prefill_chunk < 1: raise ValueError(f"Engine: prefill_chunk must be positive, got {self.prefill_chunk}")
        self.pads_prompts = model._right_pads_prompts()   # a prompt's remainder as one padded chunk (`chunk_rows`)
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps: dict[tuple[int, bool], TinyJit] = {}
        self.step_inputs: dict[int, tuple[StepInput, StepInput]] = {}   # a decode bucket's tokens and meta
        self.prefills: dict[tuple[int, bool], TinyJit] = {}
        self.requests: dict[int, Request] = {}   # every request submitted, by id (its tokens and state)
        self._ids = itertools.count()

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, prompt, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               seed: int = 0, stop_tokens: tuple[int, ...] | None = None, keep_logits: bool = False) -> int:
        """Queue a request: `prompt` token ids (at least one), at most `max_tokens` generated
        (stopping at a stop token, yielded; default the model's eos ids); sampling as `generate`;
        `keep_logits`: keep each generated token's logits (`requests[id].logits`, float32 rows
        brought to the host: the decode steps then return logits). Returns its id."""
        prompt = [int(t) for t in prompt]
        if not prompt: raise ValueError("Engine.submit: the prompt needs at least one token")
        if max_tokens < 1: raise ValueError(f"Engine.submit: max_tokens must be positive, got {max_tokens}")
        request = Request(next(self._ids), prompt, max_tokens, Sampler(temperature, top_p, top_k, seed),
                          frozenset(self.model.eos_token_ids if stop_tokens is None else stop_tokens), keep_logits=keep_logits)
        if request.positions > self.cache.max_length:
            raise ValueError(f"Engine.submit: {len(prompt)} prompt tokens and {max_tokens} more exceed max_length "
                             f"{self.cache.max_length}")
        if self.cache.blocks_for(request.positions) > self.cache.blocks:
            raise ValueError(f"Engine.submit: the request needs {self.cache.blocks_for(request.positions)} blocks, the pools "
                             f"hold {self.cache.blocks}")
        self.waiting.append(request)
        self.requests[request.id] = request
        return request.id

    @property
    def busy(self) -> bool:
        """Whether any request is waiting, prefilling or decoding."""
        return bool(self.waiting or self.prefilling or self.running)

    def run(self) -> Iterator[tuple[int, int]]:
        """`step()` until every request has finished, yielding each `(request id, token)`."""
        while self.busy: yield from self.step()

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[tuple[int, int]]:
        """Admit what fits, decode every running sequence once, prefill one chunk; returns the
        `(request id, token)` pairs made, decoded ones first."""
        while self.waiting and self.cache.can_hold(self.waiting[0].positions):
            request = self.waiting.popleft()
            request.slot = self.cache.allocate(request.positions)
            self.prefilling.append(request)
        made = self._decode() if self.running else []
        if self.prefilling: made += self._prefill(self.prefilling[0])
        return made

    def _emit(self, request: Request, token: int) -> tuple[int, int]:
        """Record a request's new token; a stop token or its last one finishes it (slot and blocks freed)."""
        request.tokens.append(token)
        if token in request.stops or len(request.tokens) == request.max_tokens:
            request.finished = True
            self.cache.release(request.slot, request.positions)
        return request.id, token

    def _prefill(self, request: Request) -> list[tuple[int, int]]:
        """One chunk of `request`'s prompt; the last gives its first token."""
        start = request.prefilled
        cache = self.cache
        rows, width = chunk_rows(len(request.prompt) - start, self.prefill_chunk, self.pads_prompts)
        width = min(width, cache.max_length - start)   # no more query rows than the table holds positions
        chunk = request.prompt[start:start + rows] + [0] * (width - rows)
        meta = np.full((1, 4 + width + cache.table_blocks), -1, np.int32)   # junk rows' slots: written nowhere
        meta[0, :4] = (start, start + width, request.slot, rows - 1)
        meta[0, 4:4 + rows] = [cache.pool_slot(request.slot, start + t) for t in range(rows)]
        meta[0, 4 + width:] = cache.tables[request.slot]
        last = start + rows == len(request.prompt)
        step = self._prefill_step(width, last)
        with Context(JIT_BATCH_SIZE=0):   # one graph a chunk
            logits = step(Tensor(np.asarray([chunk], np.int32), device=self.model.device), Tensor(meta, device=self.model.device))
        request.prefilled += rows
        if not last: return []
        self.prefilling.popleft()
        row = logits[:, -1].cast(dtypes.float32).numpy()
        if request.keep_logits: request.logits.append(row[0])
        made = [self._emit(request, request.sampler(row)[0])]
        if not request.finished: self.running.append(request)
        return made

    def _decode(self) -> list[tuple[int, int]]:
        """One token for every running sequence, in one jitted step of the batch's bucket."""
        running = self.running
        bucket = min(1 << (len(running) - 1).bit_length(), self.cache.sequences)
        greedy = all(r.sampler.greedy and not r.keep_logits for r in running)
        cache = self.cache
        meta = np.zeros((bucket, 4 + cache.table_blocks), np.int32)
        meta[:, 1], meta[:, 2], meta[:, 3] = -1, 1, -1                  # idle rows: written nowhere, one position read
        tokens = np.zeros((bucket, 1), np.int32)
        for row, r in enumerate(running):
            position = r.held                                           # where its last token goes
            tokens[row, 0] = r.tokens[-1]
            meta[row, :4] = (position, cache.pool_slot(r.slot, position), position + 1, r.slot)
            meta[row, 4:] = cache.tables[r.slot]
        step = self._step(bucket, greedy)
        if bucket not in self.step_inputs:
            self.step_inputs[bucket] = (StepInput(tokens.shape, self.model.device), StepInput(meta.shape, self.model.device))
        tokens_in, meta_in = self.step_inputs[bucket]
        with Context(JIT_BATCH_SIZE=0):   # one graph a step; the last step's tokens were read back
            out = step(tokens_in.write(tokens), meta_in.write(meta))
        if greedy:
            chosen = out.numpy()[:len(running)].tolist()
        else:
            logits = out[:len(running)].cast(dtypes.float32).numpy()
            for row, r in enumerate(running):
                if r.keep_logits: r.logits.append(logits[row])
            chosen = [r.sampler(logits[row:row + 1])[0] for row, r in enumerate(running)]
        made = [self._emit(r, int(token)) for r, token in zip(running, chosen)]
        self.running = [r for r in running if not r.finished]
        return made

    # ---- the model over pages -----------------------------------------------------------------

    def _prefill_step(self, rows: int, last: bool) -> TinyJit:
        """The jitted prefill of a chunk of `rows` tokens of one request: `(tokens [1, rows], meta
        [1, 4 + rows + M])` to the prompt's last row's logits `[1, 1, vocab]` (`last`: the prompt's
        last chunk) or the chunk's last hidden state; meta's columns are the chunk's start, the
        length after it (start + rows) and the request's state row, the prompt's last row in the
        chunk, then each row's pool slot (-1 for junk rows after the prompt), then its block table
        (`recent_jit`: one per chunk length of `chunk_rows`, each kept)."""
        def make() -> Callable[[Tensor, Tensor], Tensor]:
            def step(tokens: Tensor, meta: Tensor) -> Tensor:
                start, length, sequence, last_row = (meta[:, i].contiguous() for i in range(4))
                writes, tables = meta[:, 4:4 + rows].contiguous(), meta[:, 4 + rows:].contiguous()
                Tensor.realize(start, length, sequence, last_row, writes, tables)
                pages = Pages(start, writes, tables, length, sequence)
                hidden = self.model._hidden(tokens, Positions(0, rows, start, cached=True, pages=pages), self.cache)
                out = self.model._logits(row_by_value(hidden, last_row)) if last else hidden[:, -1:]
                return out.realize(*self.cache.buffers())
            return step
        widths = self.prefill_chunk // PREFILL_BUCKET + self.prefill_chunk.bit_length() + 1
        return recent_jit(self.prefills, (rows, last), make, keep=2 * widths)

    def _step(self, bucket: int, greedy: bool) -> TinyJit:
        """The jitted decode step of `bucket` rows: `(tokens [bucket, 1], meta [bucket, 4 + M])`
        to argmax tokens `[bucket]` int32 (greedy) or logits `[bucket, vocab]`; meta's columns are
        each row's position, pool slot, length and state row, then its block table."""
        key = (bucket, greedy)
        if key not in self.steps:
            def step(tokens: Tensor, meta: Tensor) -> Tensor:
                columns = [meta[:, i].contiguous() for i in range(4)]
                tables = meta[:, 4:].contiguous()
                Tensor.realize(*columns, tables)
                position, write, length, sequence = columns
                pages = Pages(position, write.reshape(-1, 1), tables, length, sequence)
                model = self.model
                hidden = model._hidden(tokens, Positions(0, 1, position, cached=True, pages=pages), self.cache)
                logits = model._logits(hidden)[:, -1]
                out = greedy_tokens(logits) if greedy else logits
                return out.realize(*self.cache.buffers())
            self.steps[key] = TinyJit(step)
        return self.steps[key]
