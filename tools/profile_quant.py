"""Quantized-product launches for a profiler: `--rows` rows of x (default 1: qmv; 9-64: the few
rows' qmm_wgmma_rs on Hopper) against affine 4-bit weights in groups of 64, x bfloat16, for the
benchmark's three (K, N), twice each (the first compiles).

    ncu --clock-control none -k regex:nuvec_qmv --section SpeedOfLight --section WarpStateStats python3 tools/profile_quant.py
    ncu --clock-control none -k regex:nuvec_qmm_wgmma_rs --section WarpStateStats --section SchedulerStats \\
        python3 tools/profile_quant.py --rows 16
"""
import argparse

import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg import quant

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", type=int, default=1, help="rows of x (M)")
args = parser.parse_args()
rng = np.random.default_rng(0)
for k, n in ((4096, 4096), (4096, 14336), (14336, 4096)):
    qw = quant.quantize(Tensor(rng.standard_normal((n, k), dtype=np.float32) * 0.02).cast(dtypes.bfloat16), 64, 4, mode="affine")
    qw = quant.QuantizedWeight(qw.weight.contiguous().realize(), qw.scales.contiguous().realize(), qw.biases.contiguous().realize(),
                               "affine", 64, 4)
    x = Tensor(rng.standard_normal((args.rows, k), dtype=np.float32)).cast(dtypes.bfloat16).contiguous().realize()
    for _ in range(2): quant.quantized_matmul(x, qw).realize()
