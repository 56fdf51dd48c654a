"""PyTorch's decode attention kernels under Nsight Compute: which kernels its
`scaled_dot_product_attention` runs (cuDNN off, as the benchmark has it), their grids and times,
at B = 1 and 8 (32/8 query/key heads, Lk 16384, D 128, bfloat16), to compare its key splitting
with ours (`ncu --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size
python3 tools/profile_torch_decode.py`)."""
import sys

import torch
import torch.nn.functional as F

torch.backends.cuda.enable_cudnn_sdp(False)
shapes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or [(1, 32, 8, 16384), (8, 32, 8, 16384), (32, 32, 4, 16384)]
for b, hq, hkv, lk in shapes:
    k, v = (torch.randn(b, hkv, lk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
    for _ in range(2): F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
    torch.cuda.synchronize()
    print(f"B {b} {hq}/{hkv} Lk {lk} done", flush=True)
