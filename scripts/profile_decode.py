"""One decode-attention launch per shape in the sweep's best launch shapes, for a profiler:
`ncu --clock-control none -k regex:nuvec_sdpa python3 scripts/profile_decode.py`."""
import numpy as np
from tinygrad import dtypes

from nuvec_tg.bench.attention import kv_sets
from nuvec_tg.kernels.attention import decode_attention

for b, hq, hkv, lk, blocks, warps, unroll in ((1, 32, 8, 65536, 64, 4, 2), (32, 32, 8, 16384, 1, 8, 2)):
    q, k, v = kv_sets(np.random.default_rng(0), b, hq, hkv, lk, 128, dtypes.bfloat16)[0]
    decode_attention(q, k, v, 128 ** -0.5, dtype=dtypes.bfloat16, backend="cuda", passes=1 if blocks == 1 else 2, blocks=blocks,
                     causal=False, window=None, mask=None, sinks=None, warps=warps, unroll=unroll).realize()
