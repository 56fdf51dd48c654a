"""A Qwen3-style decoder block with random weights: a 128-token prefill, then 32 decode steps
with a KV cache, on tinygrad's default device.

The block: RMSNorm, q/k/v/o projections, per-head RMSNorm of q and k with RoPE (`norm_rope`, the
keys written into the KV cache as they are rotated), grouped-query attention
(`scaled_dot_product_attention`), then add-and-RMSNorm and a SwiGLU MLP, all nuvec_tg's
operations. Decode steps run under TinyJit with the position as a tensor, so the step compiles
once; the last step is checked against a full causal recompute.

    python examples/qwen3_layer.py [--hidden 1024] [--prefill 128] [--steps 32] [--dtype float32]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes

from nuvec_tg import fast


@dataclass(frozen=True)
class Config:
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 3072
    eps: float = 1e-6
    rope_base: float = 1_000_000.0


class DecoderBlock:
    """One Qwen3 decoder block and its KV cache (`[1, kv_heads, max_len, head_dim]`)."""

    def __init__(self, config: Config, max_len: int, dtype, seed: int = 0):
        self.config, self.max_len = config, max_len
        rng = np.random.default_rng(seed)
        c = config

        def weight(*shape):
            return Tensor((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)).cast(dtype).realize()

        def norm_weight(size):
            return Tensor((1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)).cast(dtype).realize()

        self.input_norm, self.post_norm = norm_weight(c.hidden), norm_weight(c.hidden)
        self.q_norm, self.k_norm = norm_weight(c.head_dim), norm_weight(c.head_dim)
        self.wq, self.wk = weight(c.heads * c.head_dim, c.hidden), weight(c.kv_heads * c.head_dim, c.hidden)
        self.wv, self.wo = weight(c.kv_heads * c.head_dim, c.hidden), weight(c.hidden, c.heads * c.head_dim)
        self.w_gate, self.w_up = weight(c.intermediate, c.hidden), weight(c.intermediate, c.hidden)
        self.w_down = weight(c.hidden, c.intermediate)
        self.k_cache = Tensor.zeros(1, c.kv_heads, max_len, c.head_dim, dtype=dtype).contiguous().realize()
        self.v_cache = Tensor.zeros(1, c.kv_heads, max_len, c.head_dim, dtype=dtype).contiguous().realize()
        self.rotation = fast.Rotation(c.head_dim, base=c.rope_base)
        self.decode_step = TinyJit(self._decode)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The normalised input's projections, as `[1, heads, T, head_dim]`."""
        c, length = self.config, x.shape[1]
        h = fast.rms_norm(x, self.input_norm, c.eps)
        q = (h @ self.wq.T).reshape(1, length, c.heads, c.head_dim).transpose(1, 2)
        k = (h @ self.wk.T).reshape(1, length, c.kv_heads, c.head_dim).transpose(1, 2)
        v = (h @ self.wv.T).reshape(1, length, c.kv_heads, c.head_dim).transpose(1, 2)
        return q, k, v

    def _finish(self, x: Tensor, attention: Tensor) -> Tensor:
        """Output projection, residual add-and-norm, SwiGLU MLP, residual."""
        c, length = self.config, x.shape[1]
        attention = attention.transpose(1, 2).reshape(1, length, c.heads * c.head_dim) @ self.wo.T
        h, y = fast.add_rms_norm(x, attention, self.post_norm, c.eps)
        return h + ((y @ self.w_gate.T).silu() * (y @ self.w_up.T)) @ self.w_down.T

    def _rotate_and_cache(self, q: Tensor, k: Tensor, v: Tensor, offset: int | Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head norms and RoPE of q and k at `offset`; returns q and the caches with k and v
        written at `offset`."""
        c, length = self.config, q.shape[2]
        q = fast.norm_rope(q, self.q_norm, c.eps, self.rotation, offset)
        k_cache = fast.norm_rope(k, self.k_norm, c.eps, self.rotation, offset, cache=self.k_cache)
        # The contiguous cache is a paged pool of one block: slot = position.
        slots = Tensor.arange(length, dtype=dtypes.int32) + offset
        v_cache = fast.paged_write(self.v_cache, v.transpose(1, 2).reshape(length, c.kv_heads, c.head_dim), slots)
        return q, k_cache, v_cache

    def forward(self, x: Tensor) -> Tensor:
        """A causal pass over `x` `[1, T, hidden]` from position 0, without the cache."""
        c = self.config
        q, k, v = self._project(x)
        q = fast.norm_rope(q, self.q_norm, c.eps, self.rotation, 0)
        k = fast.norm_rope(k, self.k_norm, c.eps, self.rotation, 0)
        return self._finish(x, fast.scaled_dot_product_attention(q, k, v, c.head_dim ** -0.5, mask="causal"))

    def prefill(self, x: Tensor) -> Tensor:
        """`forward`, keeping the keys and values in the cache's first `T` rows."""
        c, length = self.config, x.shape[1]
        q, k, v = self._project(x)
        q, k_cache, v_cache = self._rotate_and_cache(q, k, v, 0)
        self.k_cache.assign(k_cache)
        self.v_cache.assign(v_cache)
        keys, values = self.k_cache[:, :, :length], self.v_cache[:, :, :length]
        attention = fast.scaled_dot_product_attention(q, keys, values, c.head_dim ** -0.5, mask="causal")
        return self._finish(x, attention).realize(self.k_cache, self.v_cache)

    def _decode(self, x: Tensor, position: Tensor) -> Tensor:
        """One token `[1, 1, hidden]` at `position` (an int32 tensor of one element)."""
        c = self.config
        q, k, v = self._project(x)
        q, k_cache, v_cache = self._rotate_and_cache(q, k, v, position)
        self.k_cache.assign(k_cache)
        self.v_cache.assign(v_cache)
        visible = Tensor.arange(self.max_len, dtype=dtypes.int32).reshape(1, 1, 1, self.max_len) <= position.reshape(())
        attention = fast.scaled_dot_product_attention(q, self.k_cache, self.v_cache, c.head_dim ** -0.5, mask=visible)
        return self._finish(x, attention).realize(self.k_cache, self.v_cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="default: float32 on the CPU, bfloat16 on GPUs")
    args = parser.parse_args()
    device = Device.DEFAULT
    dtype_name = args.dtype or ("float32" if device == "CPU" else "bfloat16")
    dtype = getattr(dtypes, dtype_name)
    config = Config(hidden=args.hidden, heads=args.hidden // 64, kv_heads=args.hidden // 128, intermediate=3 * args.hidden)
    total = args.prefill + args.steps
    block = DecoderBlock(config, max_len=total, dtype=dtype)
    rng = np.random.default_rng(1)
    tokens = Tensor(rng.standard_normal((1, total, config.hidden)).astype(np.float32)).cast(dtype).realize()
    print(f"device {device}, dtype {dtype_name}")
    print(f"Qwen3-style block: hidden {config.hidden}, {config.heads} query / {config.kv_heads} KV heads of "
          f"{config.head_dim}, MLP {config.intermediate}; prefill {args.prefill} tokens, {args.steps} decode steps")

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        Device[device].synchronize()
        return out, (time.perf_counter() - start) * 1e3

    prompt = tokens[:, :args.prefill].clone().realize()
    _, first_ms = timed(lambda: block.prefill(prompt))
    _, prefill_ms = timed(lambda: block.prefill(prompt))
    print(f"prefill: {prefill_ms:.1f} ms ({first_ms:.0f} ms the first time, with compilation)")

    step_ms = []
    for step in range(args.steps):
        position = Tensor([args.prefill + step], dtype=dtypes.int32).realize()
        # TinyJit inputs must own their buffers: a realized slice can be a view of `tokens`.
        x = tokens[:, args.prefill + step:args.prefill + step + 1].clone().realize()
        out, ms = timed(lambda: block.decode_step(x, position))
        step_ms.append(ms)
    warm = step_ms[2:] if len(step_ms) > 2 else step_ms
    print(f"decode: {np.mean(warm):.2f} ms per step (median {np.median(warm):.2f}; "
          f"first steps {', '.join(f'{m:.0f}' for m in step_ms[:2])} ms with compilation)")

    # The last decode step against a causal pass over the whole sequence.
    full = block.forward(tokens)[:, -1:].cast(dtypes.float32).numpy()
    last = out.cast(dtypes.float32).numpy()
    error = float(np.max(np.abs(full - last)) / np.max(np.abs(full)))
    print(f"last decode step vs a full causal recompute: max relative difference {error:.2e}")
    if error > (1e-4 if dtype == dtypes.float32 else 5e-2):
        raise SystemExit("decode with the KV cache disagrees with the full recompute")


if __name__ == "__main__":
    main()
