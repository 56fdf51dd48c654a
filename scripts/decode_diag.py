"""Where a decode call's time goes: per-kernel device times (tinygrad DEBUG=2 style, via
GlobalCounters), jit replays over one K/V set and over rotated sets, and torch for reference."""
import os, time
import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes, GlobalCounters
from tinygrad.helpers import Context
from nuvec_tg.bench.__main__ import kv_sets, time_tinygrad, time_torch, COPIES
from nuvec_tg.kernels.attention import decode_attention

b, hq, hkv, lk, d = 1, 32, 8, 4096, 128
dtype = dtypes.bfloat16
for blocks in (64,):
    attend = lambda q, k, v: decode_attention(q, k, v, d ** -0.5, dtype=dtype, backend="cuda", passes=2, blocks=blocks,
                                              causal=False, window=None, mask=None, sinks=None)
    sets = kv_sets(np.random.default_rng(0), b, hq, hkv, lk, d, dtype)
    with Context(DEBUG=2):
        for _ in range(2): attend(*sets[0]).realize()
    same = [(q, sets[0][1], sets[0][2]) for q, _, _ in sets]
    print("jit rotated", time_tinygrad(attend, sets, 5) * 1e6)
    print("torch", (time_torch(b, hq, hkv, lk, d, "bfloat16", 5) or 0) * 1e6)
    with Context(DEBUG=2):
        @TinyJit
        def step(*t):
            outs = [attend(*t[i:i + 3]) for i in range(0, len(t), 3)]
            Tensor.realize(*outs)
            return outs[0]
        flat = [x for s in sets[:4] for x in s]
        for i in range(4):
            print("--- jit call", i, flush=True)
            st = time.perf_counter(); step(*flat); Device[Device.DEFAULT].synchronize(); print("wall", (time.perf_counter() - st) * 1e6)
