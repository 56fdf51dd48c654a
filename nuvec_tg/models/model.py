"""The decoder every family builds: embeddings, blocks, final norm, head; full and cached calls,
the jitted decode step, and generation.

- `model(tokens)`: a causal pass over `[B, T]` tokens from position 0, no cache.
- `model(tokens, cache)`: continues each sequence from `cache.position`; one token per sequence
  runs the jitted decode step, longer inputs the prefill in chunks of `prefill_chunk` tokens.
- The decode step runs under `TinyJit` with the key count a bound symbolic variable, so it
  compiles once per cache (not once per position): on devices whose decode kernels take a
  symbolic key count it reads only the keys written so far; elsewhere it reads the whole cache
  under a mask built from the position (a value, not a shape).
"""
from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from tinygrad import Device, Tensor, TinyJit, UOp, dtypes
from tinygrad.dtype import DType
from tinygrad.helpers import Context

from .. import fast, kernels
from .cache import KVCache, Positions
from .config import Config
from .layers import Attention, Embedding, Linear, Norm
from .sampling import Sampler, greedy_tokens


# The most greedy steps queued on the device before their tokens are read back (a synchronisation
# drains the queue, so a group pays one launch's host time with the device idle).
READ_BACK_GROUP = 16
PREFILL_JITS = 4   # jitted prefills a cache or an engine keeps (`recent_jit`)
# A generation's last prompt chunk runs as a multiple of this many rows (junk rows after the prompt,
# in attention-only models): one prefill jit for every prompt length of a bucket, not one a length.
PREFILL_BUCKET = 64


@dataclass
class GenerationStats:
    """What the last `generate` call measured: tokens and seconds of the prefill and the decode."""
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    device: str = ""

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0


@dataclass
class Model:
    """A decoder-only language model built by a family module (see `nuvec_tg.models`)."""
    config: Config
    embed: Embedding
    layers: list
    norm: Norm
    head: Linear | None            # None: the tied embeddings are the head
    dtype: DType
    device: str | tuple[str, ...]   # several: tensor-parallel over them (`models.parallel`)
    directory: pathlib.Path
    embed_scale: float | None = None
    logit_softcap: float | None = None   # logits become `tanh(logits / c) * c` (Gemma's final soft-capping)
    prefill_chunk: int = 512
    eos_token_ids: tuple[int, ...] = ()
    last_generation: GenerationStats = field(default_factory=GenerationStats)
    _tokenizer: object = None
    _generation_cache: KVCache | None = None   # the last generation's, reused by the next of its shape

    @property
    def vocab_size(self) -> int:
        return self.config.integer("vocab_size")

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer (`nuvec_tg.models.tokenizer.Tokenizer`; needs `tokenizers`)."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer(self.directory)
        return self._tokenizer

    # ---- forward ------------------------------------------------------------------------------

    # Each of these builds its graph inside `kernels.per_device()`: a tensor-parallel model's
    # tensors are one buffer a device (`models.parallel`), whose kernels run on every device.

    def _hidden(self, tokens: Tensor, positions: Positions, cache: KVCache | None) -> Tensor:
        with kernels.per_device(): return self._layers(tokens, positions, cache)

    def _layers(self, tokens: Tensor, positions: Positions, cache: KVCache | None) -> Tensor:
        h = self.embed(tokens, self.dtype)
        if self.embed_scale is not None: h = h * self.embed_scale
        delta = None   # the stream is `delta + h` while a block's last add waits to be fused with the next norm
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layers[i]
            if getattr(layer, "fuses_residual", False):
                h, delta = layer.residual_call(h, delta, positions, layer_cache)
                continue
            if delta is not None: h, delta = delta + h, None
            h = layer(h, positions, layer_cache)
        if delta is None: return self.norm(h)
        return fast.add_rms_norm(delta, h, self.norm.weight, self.norm.eps)[1]

    def _logits(self, hidden: Tensor) -> Tensor:
        with kernels.per_device():
            logits = self.embed.as_linear(hidden) if self.head is None else self.head(hidden)
        if self.logit_softcap is not None: logits = (logits / self.logit_softcap).tanh() * self.logit_softcap
        return logits

    def _tokens(self, tokens) -> Tensor:
        if not isinstance(tokens, Tensor):
            tokens = Tensor(np.asarray(tokens, dtype=np.int32), device=self.device)
        if tokens.ndim != 2: raise ValueError(f"model: tokens must be [B, T], got shape {tuple(tokens.shape)}")
        if not dtypes.is_int(tokens.dtype): raise TypeError(f"model: tokens must be integers, got {tokens.dtype}")
        return tokens.to(self.device).cast(dtypes.int32)

    def __call__(self, tokens, cache: KVCache | None = None) -> Tensor:
        """Logits `[B, T, vocab]` (the model's dtype) for tokens `[B, T]` (int32 tensor or array).

        Without a cache, a causal pass from position 0. With one, the tokens continue each
        sequence from `cache.position` (which then moves on by T); one token runs the jitted
        decode step, more the prefill in chunks. The result equals the full pass's rows."""
        tokens = self._tokens(tokens)
        batch, length = tokens.shape
        if cache is None:
            return self._logits(self._hidden(tokens, Positions(0, length, 0), None)).realize()
        self._check_cache(cache, batch, length)
        if length == 1:
            logits = self._step(cache, tokens, greedy=False).clone().realize()
            return logits.reshape(batch, 1, -1)
        chunks = []
        for start in range(0, length, self.prefill_chunk):   # cloned: each is a jit's output buffer
            chunks.append(self._prefill_chunk(cache, tokens[:, start:start + self.prefill_chunk], "all").clone())
        return (chunks[0] if len(chunks) == 1 else chunks[0].cat(*chunks[1:], dim=1)).realize()

    def _check_cache(self, cache: KVCache, batch: int, length: int) -> None:
        if not isinstance(cache, KVCache): raise TypeError(f"model: cache must come from make_cache, got {type(cache).__name__}")
        if batch != cache.batch: raise ValueError(f"model: the cache holds {cache.batch} sequences, got tokens for {batch}")
        if cache.position + length > cache.max_length:
            raise ValueError(f"model: {length} tokens at position {cache.position} do not fit a cache of {cache.max_length}")

    def make_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache for `batch` sequences of up to `max_length` tokens (`[B, Hkv, max_length, D]`
        keys and values per attention layer, zeroed)."""
        if batch < 1 or max_length < 1: raise ValueError(f"make_cache: batch and max_length must be positive, got {batch}, {max_length}")
        return KVCache([layer.make_cache(batch, max_length, self.dtype, self.device) for layer in self.layers],
                       batch, max_length, self.device)

    def _positions(self, cache: KVCache, start: int, rows: int) -> Positions:
        """Eager positions of `rows` tokens at cache row `start`: read `start + rows` keys."""
        offset = start if cache.pads is None else (Tensor(start, dtype=dtypes.int32, device=self.device) - cache.pads)
        return Positions(start, rows, offset, cached=True, key_count=start + rows, pads=cache.pads, capacity=cache.max_length)

    def _prefill_chunk(self, cache: KVCache, tokens: Tensor, output: str, rows: int | None = None) -> Tensor:
        """A chunk continuing from `cache.position`, through the cache's jitted prefill of this
        position, length and output (`_prefill_jit`); the cache then moves on by `rows` (default
        the chunk's length). output: "all" (every row's logits), "last" (row `rows - 1`'s logits:
        the rows after it are junk, written into cache rows that no query reads before a decode
        step overwrites them) or "none" (the last row's hidden state: the cache's writes are the
        point). The result is the jit's output buffer: its next replay overwrites it."""
        length = tokens.shape[1]
        rows = length if rows is None else rows
        jit = self._prefill_jit(cache, cache.position, length, output)
        last_row = (Tensor([rows - 1], dtype=dtypes.int32, device=self.device),) if output == "last" else ()
        out = jit(tokens.contiguous(), *last_row)
        cache.position += rows
        return out

    def _prefill_jit(self, cache: KVCache, start: int, rows: int, output: str) -> TinyJit:
        """The cache's jitted prefill of `rows` tokens from cache row `start` (`recent_jit`); "last"
        takes a second input, the row whose logits it gives. A generation's prompt is one chunk
        from row 0 (its last chunk a multiple of PREFILL_BUCKET rows where the model allows), so
        a prompt of a length prefilled before replays; a change of padding kind drops the cache's
        prefills with its decode steps."""
        def make() -> Callable[..., Tensor]:
            def prefill(tokens: Tensor, last_row: Tensor | None = None) -> Tensor:
                hidden = self._hidden(tokens, self._positions(cache, start, rows), cache)
                if output == "all": out = self._logits(hidden)
                elif output == "none": out = hidden[:, -1:]
                else: out = self._logits(row_by_value(hidden, last_row))   # one jit serves every prompt length of its rows
                return out.realize(*cache.buffers())
            return prefill
        return recent_jit(cache.prefills, (start, rows, output), make)

    def _right_pads_prompts(self) -> bool:
        """Whether a prompt's last chunk may carry junk rows after it: every layer's cache is
        attention's (rows no earlier query reads), none a recurrent state the junk would enter."""
        return all(isinstance(getattr(layer, "attention", None), Attention) for layer in self.layers)

    # ---- the jitted decode step ---------------------------------------------------------------

    def _symbolic_keys(self, cache: KVCache) -> bool:
        """Whether attention's decode kernels take this cache's key count as a symbolic size."""
        # the first softmax-attention layer (hybrids start with linear-attention layers)
        attention = next((a for a in (getattr(layer, "attention", None) for layer in self.layers) if isinstance(a, Attention)), None)
        if attention is None or cache.pads is not None: return False
        q = (cache.batch, attention.heads, 1, attention.head_dim)
        k = (cache.batch, attention.kv_heads, cache.max_length, attention.head_dim)
        with kernels.per_device(): plan = fast.plan_attention(q, k, k, self.dtype, mask="causal", device=self.device)
        return isinstance(plan.kernel, fast.Vector)

    def _next(self, cache: KVCache, symbolic_keys: bool, greedy: bool, tokens: Tensor, length: UOp) -> Tensor:
        """One token per sequence at cache row `length - 1`, unrealized: the next tokens' logits
        `[B, vocab]` (the model's dtype), or with `greedy` their argmax `[B]` int32."""
        start = length - 1
        # written once a step into a buffer that every layer's kernels read (tinygrad keeps a tensor of
        # the variable alone as an expression, which each of them would compute again)
        query_start = cache.query_start.assign((Tensor(length, device=self.device) - 1).reshape(1)).realize().reshape(())
        offset = query_start if cache.pads is None else query_start - cache.pads
        positions = Positions(start, 1, offset, cached=True, key_count=length if symbolic_keys else None,
                              query_start=query_start, pads=cache.pads, capacity=cache.max_length)
        logits = self._logits(self._hidden(tokens, positions, cache))[:, -1]
        return greedy_tokens(logits) if greedy else logits

    def _decode(self, cache: KVCache, symbolic_keys: bool, greedy: bool, tokens: Tensor, length: UOp) -> Tensor:
        """`_next`, realized with the cache's writes."""
        return self._next(cache, symbolic_keys, greedy, tokens, length).realize(*cache.buffers())

    def _decode_chained(self, cache: KVCache, symbolic_keys: bool, length: UOp) -> None:
        """The greedy step on the device alone: the token at `cache.history[:, length - 1]` in, its
        argmax written to `cache.history[:, length]` (no host data in or out)."""
        tokens = cache.history[:, length - 1:length]
        cache.history[:, length:length + 1].assign(self._next(cache, symbolic_keys, True, tokens, length).reshape(-1, 1))
        Tensor.realize(cache.history, *cache.buffers())

    def _jit(self, cache: KVCache, key: str) -> TinyJit:
        """The cache's jitted step `key` ("greedy", "logits" or "chained"), made on first use."""
        if key not in cache.steps:
            symbolic = self._symbolic_keys(cache)
            if key == "chained": step = lambda n: self._decode_chained(cache, symbolic, n)  # noqa: E731
            else: step = lambda t, n, greedy=key == "greedy": self._decode(cache, symbolic, greedy, t, n)  # noqa: E731
            cache.steps[key] = TinyJit(step)
            cache.steps.setdefault("length", UOp.variable("cache_length", 1, cache.max_length, dtype=dtypes.int32))
        return cache.steps[key]

    def _step(self, cache: KVCache, tokens: Tensor, greedy: bool) -> Tensor:
        """Run the cache's jitted decode step on tokens `[B, 1]` at `cache.position`."""
        step = self._jit(cache, "greedy" if greedy else "logits")
        cache.position += 1
        tokens = tokens.contiguous().realize()
        with Context(JIT_BATCH_SIZE=0):   # captured as one graph: one launch, not tinygrad's batches of 32, 64, ...
            return step(tokens, cache.steps["length"].bind(cache.position))

    def _step_chained(self, cache: KVCache) -> None:
        """Queue the chained greedy step at `cache.position` (returns without waiting for the device)."""
        step = self._jit(cache, "chained")
        cache.position += 1
        with Context(JIT_BATCH_SIZE=0):
            step(cache.steps["length"].bind(cache.position))

    # ---- generation ---------------------------------------------------------------------------

    def generate(self, prompts, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int = 0, chat: bool = False, stop_tokens: tuple[int, ...] | None = None) -> Iterator:
        """Generate from `prompts`, yielding text as it is produced.

        prompts: a string, a list of token ids, or a list of either (a batch; shorter prompts
        are left-padded). chat: wrap string prompts in the tokenizer's chat template as a user
        message. Sampling: greedy at temperature 0, else softmax of logits / temperature over
        the `top_k` most probable tokens (0: all) and the smallest set whose probability reaches
        `top_p`, drawn with numpy's generator seeded by `seed`. A sequence stops at one of the
        `stop_tokens` (default: generation_config.json's eos ids) or after `max_tokens`.
        Yields a string per step for one prompt, a list of strings for a batch.
        `last_generation` holds the timings afterwards.
        """
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], (int, np.integer)))
        batch_prompts = [prompts] if single else list(prompts)
        token_lists = [self._encode(p, chat) for p in batch_prompts]
        from .tokenizer import StreamingDecoder
        streams = [StreamingDecoder(self.tokenizer) for _ in token_lists]
        for step_tokens in self.generate_tokens(token_lists, max_tokens, temperature, top_p, top_k, seed, stop_tokens):
            pieces = [stream.add(t) if t is not None else "" for stream, t in zip(streams, step_tokens)]
            yield pieces[0] if single else pieces
        tails = [stream.finish() for stream in streams]
        if any(tails): yield tails[0] if single else tails

    def _encode(self, prompt, chat: bool) -> list[int]:
        if isinstance(prompt, str):
            if chat:
                text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
                return self.tokenizer.encode(text, add_special_tokens=False)
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate_tokens(self, prompts: list[list[int]], max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                        top_k: int = 0, seed: int = 0, stop_tokens: tuple[int, ...] | None = None) -> Iterator[list[int | None]]:
        """Generate from token-id prompts; yields each step's new token per sequence (None for a
        sequence that has stopped). The stop token itself is yielded; nothing after it."""
        if not prompts or any(len(p) == 0 for p in prompts): raise ValueError("generate: every prompt needs at least one token")
        if max_tokens < 1: return
        stops = set(self.eos_token_ids if stop_tokens is None else stop_tokens)
        sampler = Sampler(temperature, top_p, top_k, seed)
        batch, longest = len(prompts), max(len(p) for p in prompts)
        cache = self._cache_for_generation(batch, _round_up(longest + max_tokens, 256), [longest - len(p) for p in prompts])
        padded = np.array([[0] * (longest - len(p)) + list(p) for p in prompts], dtype=np.int32)
        stats = self.last_generation = GenerationStats(prompt_tokens=sum(len(p) for p in prompts), device=self.device)
        cache.in_use = True
        try:
            yield from self._generation(cache, padded, sampler, max_tokens, stops, stats)
        finally:
            cache.in_use = False

    def _generation(self, cache: KVCache, padded: np.ndarray, sampler: Sampler, max_tokens: int, stops: set[int],
                    stats: GenerationStats) -> Iterator[list[int | None]]:
        """`generate_tokens`'s prefill and decode loop over a cache made for it."""
        batch, longest = padded.shape

        began = time.perf_counter()
        logits = None
        for start in range(0, longest, self.prefill_chunk):
            rows = min(self.prefill_chunk, longest - start)
            chunk = padded[:, start:start + rows]
            if start + rows < longest:
                self._prefill_chunk(cache, Tensor(chunk, device=self.device), "none")
                continue
            if self._right_pads_prompts():   # one jit for every length of its bucket (the cache's rows are whole 256s)
                chunk = np.pad(chunk, ((0, 0), (0, bucket_rows(rows, self.prefill_chunk) - rows)))
            logits = self._prefill_chunk(cache, Tensor(chunk, device=self.device), "last", rows)
        next_tokens = sampler(logits[:, -1].cast(dtypes.float32))
        stats.prompt_seconds = time.perf_counter() - began

        began = time.perf_counter()
        steps = self._greedy_steps(cache, next_tokens, max_tokens) if sampler.greedy else \
            self._sampled_steps(cache, next_tokens, max_tokens, sampler)
        done = [False] * batch
        for step_tokens in steps:
            out = [None if d else int(t) for d, t in zip(done, step_tokens)]
            stats.generated_tokens += sum(t is not None for t in out)
            done = [d or (t is not None and t in stops) for d, t in zip(done, out)]
            yield out
            if all(done): break
        stats.generation_seconds = time.perf_counter() - began

    def _sampled_steps(self, cache: KVCache, first: list[int], max_tokens: int, sampler: Sampler) -> Iterator[list[int]]:
        """Each step's tokens, sampled on the host from the jitted step's logits."""
        tokens, host = first, StepInput((len(first), 1), self.device)
        for step in range(max_tokens):
            yield tokens
            if step == max_tokens - 1: break
            logits = self._step(cache, host.write(tokens), greedy=False)   # the last step's logits were read back
            tokens = sampler(logits)

    def _greedy_steps(self, cache: KVCache, first: list[int], max_tokens: int) -> Iterator[list[int]]:
        """Each step's greedy tokens, the steps chained on the device: each step reads its token
        from `cache.history` and writes the next there, so the host queues steps ahead of the
        device and reads their tokens back in groups (1, 2, 4, ... up to READ_BACK_GROUP steps,
        one synchronisation a group). A sequence's stop is seen a group late: the steps queued
        past it are computed and dropped."""
        column = cache.position                     # the first token's column; step s writes column + s
        cache.history[:, column:column + 1].assign(
            Tensor(np.asarray(first, dtype=np.int32).reshape(-1, 1), device=self.device)).realize()
        yield first
        queued = read = 0
        group = 1
        while read < max_tokens - 1:
            while queued < min(max_tokens - 1, read + group):
                self._step_chained(cache)
                queued += 1
            tokens = cache.history[:, column + 1 + read:column + 1 + queued].numpy()
            read = queued
            yield from (tokens[:, i].tolist() for i in range(tokens.shape[1]))
            group = min(2 * group, READ_BACK_GROUP)

    def _cache_for_generation(self, batch: int, max_length: int, pads: list[int]) -> KVCache:
        """The previous generation's cache, emptied, when it has this shape (its jitted decode
        steps then replay at once: a new cache's steps are captured anew, seconds for a large
        model); else a new one, which replaces it (or, while another generation runs on the
        kept one, a cache of its own)."""
        kept = self._generation_cache
        free = kept is not None and not kept.in_use   # else another generation is under way on it
        if free and (kept.batch, kept.max_length) == (batch, max_length):
            kept.reset(pads)
            return kept
        if free: self._generation_cache = None   # its buffers freed before the new ones are made
        cache = self.make_cache(batch, max_length)
        cache.set_padding(pads)
        if kept is None or free: self._generation_cache = cache
        return cache


class StepInput:
    """A jitted step's int32 input `[shape]` from the host, kept in one realized buffer into which
    each step's values are copied (the device allocator's copy-in). A new tensor a step costs
    tinygrad a schedule and a realize on the host (`tools/engine_host.py`; the Engine's decode
    step made two), where the copy is a memcpy and an asynchronous transfer. Write
    only between steps whose outputs were read back: nothing on the device may still be reading
    the buffer (on CUDA the transfer is ordered on the stream anyway; Metal's is a plain memcpy).
    Several devices (a sharded model): a new tensor each write, as before."""

    def __init__(self, shape: tuple[int, ...], device):
        self.shape, self.device = shape, device
        self.tensor = None if isinstance(device, tuple) else \
            Tensor.zeros(*shape, dtype=dtypes.int32, device=device).contiguous().realize()

    def write(self, values) -> Tensor:
        """The input holding `values` (an int32-convertible array of the input's shape)."""
        values = np.ascontiguousarray(values, dtype=np.int32).reshape(self.shape)
        if self.tensor is None: return Tensor(values, device=self.device)
        buffer = self.tensor.uop.buffer
        buffer.allocator._copyin(buffer._buf, memoryview(values).cast("B"))
        return self.tensor


def bucket_rows(rows: int, chunk: int) -> int:
    """The rows a prompt's last chunk of `rows` tokens runs as where junk rows after it are allowed
    (`Model._right_pads_prompts`): a multiple of PREFILL_BUCKET, at most `chunk` (a full chunk)."""
    return min(_round_up(rows, PREFILL_BUCKET), chunk)


def row_by_value(hidden: Tensor, row: Tensor) -> Tensor:
    """Row `row` (an int32 tensor of one element, read on the device) of `hidden [B, T, D]` as
    `[B, 1, D]`, exact (the row and zeros summed; the other rows may hold anything, even NaN), so
    that a jitted prefill of T rows serves prompts that end at any of them."""
    rows = hidden.shape[1]
    chosen = Tensor.arange(rows, dtype=dtypes.int32).to(row.device).reshape(1, rows, 1) == row.reshape(1, 1, 1)
    return chosen.where(hidden, 0).sum(1, keepdim=True)


def recent_jit(jits: dict, key: tuple, make: Callable[[], Callable], keep: int = PREFILL_JITS) -> TinyJit:
    """`jits[key]`, else a TinyJit of `make()` captured on its first call (a prefill's: run eagerly,
    tinygrad schedules its hundreds of kernels again every call, which bounds it by the host,
    `benchmarks/models_h200.md`). `jits` keeps the `keep` most recently used: each holds its
    intermediate buffers."""
    if (jit := jits.pop(key, None)) is None:
        jit = TinyJit(make())
        jit.cnt = 1   # TinyJit runs a first call eagerly and captures the second
        for old in list(jits)[:max(0, len(jits) - keep + 1)]: del jits[old]
    jits[key] = jit   # most recent last
    return jit


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def device_description(device: str | tuple[str, ...]) -> str:
    """The device's name and, where tinygrad knows it, the hardware's (each of several, joined)."""
    if isinstance(device, tuple): return ", ".join(device_description(d) for d in device)
    try:
        arch = getattr(Device[device].renderer, "arch", None) or getattr(Device[device], "arch", None)
    except Exception:  # noqa: BLE001 - a description only
        arch = None
    return f"{device}{f' ({arch})' if arch else ''}"
