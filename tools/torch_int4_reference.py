"""PyTorch's own 4-bit weight-only product on CUDA, as a reference for what a 4-bit decode product
reaches on this GPU (`python3 tools/torch_int4_reference.py`, PyTorch with CUDA needed; tinygrad
is only used for the shared timing helpers' constants). `torch._weight_int4pack_mm` (tinygemm:
4-bit codes, groups of 64, a bfloat16 scale and zero per group, x bfloat16) for M in {1, 4} at
the benchmark's three (K, N), each timed as `nuvec_tg.bench quant` times PyTorch (a CUDA graph of
calls over rotated weights, best of REPEATS): µs per call, weight TB/s (codes, scales and
zeros read once: the bytes of nuvec_tg's affine 4-bit format) and the share of peak, with the
largest error against the same weights dequantized and multiplied densely."""
import sys


from nuvec_tg.bench.common import PEAK_BANDWIDTH, cuda_torch, rotation, torch_graph_seconds

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
GROUP = 64
REPEATS = 3


def packed_weight(torch, codes):
    """tinygemm's packing of `codes` [N, K] (int32 in 0..15): two codes a byte (the even k in the
    high nibble), then `_convert_weight_to_int4pack` with 8 inner k tiles."""
    as_bytes = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
    return torch._convert_weight_to_int4pack(as_bytes, 8)


def main() -> int:
    torch = cuda_torch()
    if torch is None:
        print("torch_int4_reference: needs PyTorch with CUDA")
        return 2
    peak = PEAK_BANDWIDTH.get(torch.cuda.get_device_name())
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; tinygemm int4, groups of {GROUP}, x bfloat16")
    for k, n in SHAPES:
        moved = n * k // 2 + (n * k // GROUP) * 4
        turn = rotation(moved)
        weights = []
        for _ in range(turn.sets):
            codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
            scales_and_zeros = torch.randn(k // GROUP, n, 2, device="cuda", dtype=torch.bfloat16) * 0.01
            weights.append((codes, packed_weight(torch, codes), scales_and_zeros))
        for m in (1, 4):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(turn.calls)]
            codes, packed, scales_and_zeros = weights[0]
            got = torch._weight_int4pack_mm(xs[0], packed, GROUP, scales_and_zeros).float()
            scale = scales_and_zeros[..., 0].float().t().repeat_interleave(GROUP, dim=1)  # [N, K]
            zero = scales_and_zeros[..., 1].float().t().repeat_interleave(GROUP, dim=1)
            dense = (codes.float() - 8) * scale + zero
            want = xs[0].float() @ dense.t()
            error = float((got - want).abs().max() / want.abs().max())

            def run():
                for i, x in enumerate(xs): torch._weight_int4pack_mm(x, weights[i % turn.sets][1], GROUP, weights[i % turn.sets][2])
            seconds = torch_graph_seconds(run, turn.calls, REPEATS)
            print(f"M {m} K {k} N {n}: {seconds * 1e6:.1f} µs, {moved / seconds / 1e12:.2f} TB/s, "
                  f"{f'{moved / seconds / peak:.0%}' if peak else 'unknown share'} of peak | max rel. error {error:.1e}", flush=True)
        del weights
    return 0


if __name__ == "__main__":
    sys.exit(main())
