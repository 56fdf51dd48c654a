"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p.

Sampling runs on the host in float64 with numpy's generator (seeded once per generation, so a
seed repeats its tokens); the greedy decode step takes its argmax on the device instead and only
the token ids come back.
"""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

ARGMAX_CHUNK = 256   # columns a first-stage reduction of `greedy_tokens` takes


def greedy_tokens(logits: Tensor) -> Tensor:
    """Each row's argmax, `[B, vocab]` -> `[B]` int32 (the first of several equal largest, as
    `argmax(-1)`), in two stages: every chunk of ARGMAX_CHUNK columns its largest and where, then
    the chunks'. tinygrad reduces a whole row of a large vocabulary in a few threadgroups
    (`benchmarks/models_h200.md`); chunks spread the row over the device."""
    batch, vocab = logits.shape
    count = -(-vocab // ARGMAX_CHUNK)
    chunks = logits.pad(((0, 0), (0, count * ARGMAX_CHUNK - vocab)), value=float("-inf")).reshape(batch, count, ARGMAX_CHUNK)
    # each stage stored: fused, tinygrad computes every chunk's argmax again inside the gather
    best = chunks.max(-1).contiguous().argmax(-1, keepdim=True)                   # [B, 1]: the first chunk holding the largest
    within = chunks.argmax(-1).contiguous().gather(-1, best)                      # its first column holding it
    return (best * ARGMAX_CHUNK + within).reshape(batch).cast(dtypes.int32)


class Sampler:
    """Greedy at temperature 0; otherwise softmax(logits / temperature) restricted to the `top_k`
    most probable tokens (0: no limit) and then to the smallest set of the most probable whose
    probability reaches `top_p` (1: no limit), renormalised and drawn from."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0):
        if not temperature >= 0: raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1: raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"generate: top_k must be a non-negative int, got {top_k!r}")
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), top_k
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __call__(self, logits: Tensor | np.ndarray) -> list[int]:
        """Next tokens for logits `[B, vocab]`."""
        values = (logits.float().numpy() if isinstance(logits, Tensor) else np.asarray(logits)).astype(np.float64)
        if self.greedy: return [int(i) for i in values.argmax(-1)]
        return [self._draw(row) for row in values]

    def _draw(self, logits: np.ndarray) -> int:
        scaled = logits / self.temperature
        if self.top_k and self.top_k < len(scaled):
            candidates = np.argpartition(-scaled, self.top_k - 1)[:self.top_k]
            order = candidates[np.argsort(-scaled[candidates], kind="stable")]
        else:
            order = np.argsort(-scaled, kind="stable")              # most probable first
        kept = scaled[order]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        if self.top_p < 1.0:
            before = np.cumsum(probs) - probs                        # mass of the more probable tokens
            keep = before < self.top_p
            order, probs = order[keep], probs[keep] / probs[keep].sum()
        return int(order[self.rng.choice(len(order), p=probs)])
