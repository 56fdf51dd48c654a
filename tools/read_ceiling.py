"""What the memory system gives a kernel that only reads, at the byte counts of the quantized
benchmark's decode rows (`DEV=CUDA python3 tools/read_ceiling.py`): for each format and shape of
`python -m nuvec_tg.bench quant` at M = 1, a kernel that reads the same bytes (16-byte loads, all of
a thread's loads issued before any is used, coalesced, nothing else) timed exactly as the benchmark
times a product (`bench.common.time_jit`: TinyJit replays of calls over rotated buffers), the
fastest of a few launch shapes. No product over those bytes can beat it under that method; the
table beside it says what 75% of peak bandwidth (`bench.common.PEAK_BANDWIDTH`) and 3x PyTorch's
dense bfloat16 matvec ask. CUDA."""
import sys

from tinygrad import Device, Tensor, dtypes

from nuvec_tg.bench.common import rotation, start_table, time_jit
from nuvec_tg.bench.quant import FORMATS, time_torch, weight_bytes
from nuvec_tg.kernels import kernel_backend
from nuvec_tg.kernels.program import Program, launch, prelude

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
REPEATS = 5

# Each thread XORs READS 16-byte pieces a threadgroup's width apart; the result is written only if
# it equals a constant it never equals, so no load is cut.
READ_PROBE = """
extern "C" __global__ void NAME(uint* out, const uint4* __restrict__ in) {
  const int first = blockIdx.x * blockDim.x * READS + threadIdx.x;
  uint4 v[READS];
  #pragma unroll
  for (int r = 0; r < READS; r++) v[r] = first + r * (int)blockDim.x < PIECES ? in[first + r * blockDim.x] : uint4{0u, 0u, 0u, 0u};
  uint acc = 0u;
  #pragma unroll
  for (int r = 0; r < READS; r++) acc ^= v[r].x ^ v[r].y ^ v[r].z ^ v[r].w;
  if (acc == 0x9E3779B9u) out[0] = acc;
}
"""
LAUNCHES = [(reads, threads) for reads in (1, 2, 4, 8) for threads in (256, 512, 1024)]


def read_seconds(moved: int) -> tuple[float, str]:
    """Device seconds per call of the fastest read probe over `moved` bytes, and its launch shape."""
    pieces = moved // 16
    turn = rotation(moved)
    buffers = [Tensor.empty(pieces * 4, dtype=dtypes.uint32).contiguous().realize() for _ in range(turn.sets)]
    calls = [(buffers[i % turn.sets],) for i in range(turn.calls)]
    best = (float("inf"), "")
    for reads, threads in LAUNCHES:
        name = f"nuvec_read_probe_{reads}_{pieces}"
        text = prelude("cuda") + f"#define READS {reads}\n#define PIECES {pieces}\n" + READ_PROBE.replace("NAME", name)

        def probe(buffer, name=name, text=text, reads=reads, threads=threads):
            return launch(Program(name, text, (), None), buffer.device, [Tensor.empty(1, dtype=dtypes.uint32)], [buffer],
                          (-(-pieces // (threads * reads)), 1, 1), threads)[0]
        best = min(best, (time_jit(probe, calls, REPEATS), f"{reads} x {threads}"))
    return best


def main() -> int:
    if kernel_backend(Device.DEFAULT) != "cuda":
        print(f"read_ceiling: needs CUDA, not {Device.DEFAULT}")
        return 2
    torch_seconds = {(k, n): time_torch(1, k, n, REPEATS) for k, n in SHAPES}
    _, peak = start_table("A kernel that only reads each M = 1 row's bytes", "timed as `bench quant` times a product",
                          ["format", "K", "N", "MB", "read-only µs", "TB/s", "% peak", "loads x threads", "75% of peak µs",
                           "torch bf16 µs", "3x torch µs"])
    for fmt in FORMATS:
        for k, n in SHAPES:
            moved = weight_bytes(fmt, k, n)
            seconds, shape = read_seconds(moved)
            torch_s = torch_seconds[(k, n)]
            torch_cells = f"{torch_s * 1e6:.1f} | {torch_s * 1e6 / 3:.1f}" if torch_s else "- | -"
            peak_cells = f"{moved / seconds / peak:.0%} | {shape} | {moved / (0.75 * peak) * 1e6:.1f}" if peak else f"- | {shape} | -"
            print(f"| {fmt} | {k} | {n} | {moved / 1e6:.1f} | {seconds * 1e6:.1f} | {moved / seconds / 1e12:.2f} | "
                  f"{peak_cells} | {torch_cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
