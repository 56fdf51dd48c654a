"""Decode-attention launches for a profiler, the matrix pass at B = 8, 32/8 heads, 16384 keys,
D 128, bfloat16: 4 blocks one per threadgroup against 16 blocks taken 4 at a time by the same
number of threadgroups (the plan's batch-invariant blocks): what the grouped launch loses.
`ncu --clock-control none -k regex:nuvec_sdpa_decode --section SpeedOfLight --section WarpStateStats
python3 tools/profile_decode.py` (each launch twice, the first warming caches and compiles).
`--shape B,HQ,HKV,LK --cells BLOCKS:GROUPS,...` launches those cells of that shape instead (GROUPS:
the plan's `block_groups`, 0 for one threadgroup a block)."""
import sys


import numpy as np
from tinygrad import dtypes

from nuvec_tg.bench.attention import kv_sets
from nuvec_tg.kernels.attention import Launch, Vector, decode_attention

# (B, Hq, Hkv, Lk) and its launches (blocks, block_groups): at B = 8, 4 blocks one per threadgroup
# against the plan's 16 taken 4 at a time; at B = 1 the plan's 16 blocks, one per threadgroup (128
# threadgroups of 4 SIMD groups).
RUNS = [((8, 32, 8, 16384), [(4, 0), (16, 4)]), ((1, 32, 8, 16384), [(16, 0)])]
if "--shape" in sys.argv:
    RUNS = [(tuple(int(n) for n in sys.argv[sys.argv.index("--shape") + 1].split(",")),
             [tuple(int(n) for n in cell.split(":")) for cell in sys.argv[sys.argv.index("--cells") + 1].split(",")])]
for (b, hq, hkv, lk), cells in RUNS:
    q, k, v = kv_sets(np.random.default_rng(0), b, hq, hkv, lk, 128, dtypes.bfloat16)[0]
    for blocks, block_groups in cells:
        for _ in range(2):
            decode_attention(q, k, v, 128 ** -0.5, Vector(2, blocks, 2, True, block_groups), dtype=dtypes.bfloat16,
                             backend="cuda", causal=False, window=None, mask=None, sinks=None, shape=Launch(4, 2)).realize()
