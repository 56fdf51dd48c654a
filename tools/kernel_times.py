"""Device time of each kernel of one decode-attention call (tinygrad's DEBUG=2 timings), for
telling kernel time from launch overhead: `DEBUG=2 python3 tools/kernel_times.py`."""
import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg import fast

rng = np.random.default_rng(0)
for b, hq, hkv, lk, d in ((1, 32, 8, 4096, 128), (1, 32, 8, 65536, 128), (8, 32, 8, 16384, 128)):
    make = lambda *s: Tensor(rng.standard_normal(s, dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()  # noqa: E731
    q, k, v = make(b, hq, 1, d), make(b, hkv, lk, d), make(b, hkv, lk, d)
    for _ in range(3):
        print(f"--- B {b} {hq}/{hkv} Lk {lk} D {d}", flush=True)
        fast.scaled_dot_product_attention(q, k, v, d ** -0.5).realize()
