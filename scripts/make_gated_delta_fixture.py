"""Write tests/data/gated_delta_transformers.npz: transformers' chunked gated delta rule
(`torch_chunk_gated_delta_rule` of modeling_qwen3_next, chunks of 64, float32) on small random
inputs, the reference the chunked prefill is tested against beside the float64 recurrence.

Per case `<name>_`: `q`, `k` [B, T, Hk, Dk], `v` [B, T, Hv, Dv] (values a bfloat16 holds, stored as
float32), `log_g`, `beta` [B, T, Hv] and `state` [B, Hv, Dv, Dk] (nuvec_tg's layout) as float32;
`y` [B, T, Hv, Dv] and `final` [B, Hv, Dv, Dk], transformers' outputs. transformers scales its
queries by Dk^-0.5 and keeps the state as [B, Hv, Dk, Dv]: it is handed q * Dk^0.5 and the
state transposed, so that its outputs are nuvec_tg's `gated_delta_chunked(q, k, v, log_g, beta,
state)` (keys of unit length, as the model layers feed them).

Run from the repository root with torch + transformers (CI never runs this; the file is committed):

    /work/fixenv/bin/python scripts/make_gated_delta_fixture.py
"""
import pathlib

import numpy as np
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "gated_delta_transformers.npz"
# name: (B, T, Hk, Hv, Dk, Dv): two of transformers' chunks (the second partial) and three of ours;
# one whole chunk of ours at a Qwen3.5 head size, grouped value heads.
CASES = {"grouped": (2, 100, 1, 2, 32, 16), "qwen_head": (1, 32, 2, 4, 128, 32)}


def bf16_values(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x.astype(np.float32)).bfloat16().float().numpy()


def main() -> None:
    rng = np.random.default_rng(0x25)
    arrays = {}
    for name, (b, t, hk, hv, dk, dv) in CASES.items():
        k = rng.standard_normal((b, t, hk, dk))
        q = bf16_values(rng.standard_normal((b, t, hk, dk)) * 0.5)
        k = bf16_values(k / np.linalg.norm(k, axis=-1, keepdims=True))
        v = bf16_values(rng.standard_normal((b, t, hv, dv)))
        log_g = np.log(rng.uniform(0.75, 1.0, (b, t, hv))).astype(np.float32)
        beta = rng.uniform(0.3, 1.0, (b, t, hv)).astype(np.float32)
        state = (rng.standard_normal((b, hv, dv, dk)) * 0.3).astype(np.float32)
        y, final = torch_chunk_gated_delta_rule(
            torch.from_numpy(q * np.float32(dk ** 0.5)), torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(log_g),
            torch.from_numpy(beta), chunk_size=64, initial_state=torch.from_numpy(state).transpose(-1, -2).contiguous(),
            output_final_state=True)
        arrays.update({f"{name}_{key}": value for key, value in dict(
            q=q, k=k, v=v, log_g=log_g, beta=beta, state=state, y=y.float().numpy(),
            final=final.transpose(-1, -2).float().numpy()).items()})
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
