"""The gated delta rule computed directly in float64 numpy, for the gated delta tests."""
import math
import pathlib

import numpy as np

from nuvec_tg.kernels.gated_delta import CHUNK
from reference import KERNEL_TOLERANCE, round_to


def chunked_tolerance(dtype, steps: int) -> float:
    """The chunked prefill against the float64 recurrence, relative to a row's largest element: its
    products take 16-bit operands (the state and each chunk's corrections rounded to q's dtype
    `dtype`), and each chunk's rounding is carried into the next chunk's state, so the tolerance
    is the kernels' for that dtype grown with the logarithm of the number of chunks."""
    return KERNEL_TOLERANCE[dtype] * (1 + math.log2(max(-(-steps // CHUNK), 1)))


def gated_delta_reference(q, k, v, g, beta, state, storage=None):
    """The seeds' recurrence in float64, one value head and step at a time: `(y [B, T, Hv, Dv],
    final state [B, Hv, Dv, Dk], every step's state [B, T, Hv, Dv, Dk])`. storage: a tinygrad
    dtype each step's state is rounded to before the next step reads it (as `gated_delta_steps`),
    or None (no rounding)."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    s = np.array(state, np.float64)
    y, states = np.zeros((b, t, hv, dv)), np.zeros((b, t, hv, dv, dk))
    for bi in range(b):
        for h in range(hv):
            kh = h // (hv // hk)
            for ti in range(t):
                rows = s[bi, h] * g[bi, ti, h]                                   # [Dv, Dk]
                delta = (v[bi, ti, h] - rows @ k[bi, ti, kh]) * beta[bi, ti, h]  # [Dv]
                rows = rows + np.outer(delta, k[bi, ti, kh])
                if storage is not None: rows = round_to(rows, storage)
                s[bi, h] = states[bi, ti, h] = rows
                y[bi, ti, h] = rows @ q[bi, ti, kh]
    return y, s, states


TRANSFORMERS_FIXTURE = pathlib.Path(__file__).parent / "data" / "gated_delta_transformers.npz"


def transformers_cases() -> dict[str, dict[str, np.ndarray]]:
    """transformers' chunked rule on small inputs (`scripts/make_gated_delta_fixture.py`): per case,
    `q, k, v, log_g, beta, state` (float32 arrays; q, k, v of values a bfloat16 holds) and its
    outputs `y`, `final` in nuvec_tg's layout, for `gated_delta_chunked(q, k, v, log_g, beta, state)`."""
    with np.load(TRANSFORMERS_FIXTURE) as data:
        names = sorted({key.rsplit("_", 1)[0] for key in data.files if key.endswith("_y")})
        return {name: {key: data[f"{name}_{key}"] for key in ("q", "k", "v", "log_g", "beta", "state", "y", "final")}
                for name in names}
