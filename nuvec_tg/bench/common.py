"""What the benchmarks share: the device's name, peak bandwidth and L2 size, how many distinct input
sets a timed replay rotates over so that its calls read memory and not the L2, warming the clocks
before every timed measurement, device timing of TinyJit replays and of PyTorch CUDA graphs, and
the table's header line."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import subprocess
import time
from typing import Callable, Sequence

from tinygrad import Device, GlobalCounters, Tensor, TinyJit, dtypes
from tinygrad.helpers import Context

PEAK_BANDWIDTH = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}
# Dense 16-bit matrix-unit peaks (no sparsity), by GPU name.
PEAK_FLOPS = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12}
# L2 sizes by GPU name, where neither PyTorch nor tinygrad's CUDA runtime reads it from the device.
L2_BYTES = {"NVIDIA H200": 50 << 20, "NVIDIA H100 80GB HBM3": 50 << 20}
DEFAULT_L2_BYTES = 128 << 20  # an unknown device's L2: larger than any listed GPU's, so that it rotates enough
L2_MULTIPLE = 2      # a replay's distinct inputs pass this many L2 sizes, so each call's were evicted before it
COPIES = 16          # the fewest calls per timed replay, so that launches, not Python, set the pace
MAX_CALLS = 256      # the most calls (and input sets) per replay: bounds capture time and memory for small calls
WARM_SECONDS = 0.2   # device work right before each timed measurement: compiles and captures idle the GPU for seconds


def device_name() -> str:
    """The GPU's marketing name when PyTorch can read it, else tinygrad's device name."""
    try:
        import torch
        if torch.cuda.is_available(): return torch.cuda.get_device_name()
    except ImportError:
        pass
    return Device.DEFAULT


def commit() -> str:
    """The measured commit: $NUVEC_COMMIT, else git's short HEAD, else 'unknown'."""
    found = os.environ.get("NUVEC_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                               text=True).stdout.strip()
    return found or "unknown"


def is_gpu() -> bool:
    """Whether tinygrad's default device is a GPU (not the CPU or the Python emulator)."""
    return Device.DEFAULT not in ("CPU", "PYTHON")


@functools.cache
def l2_size() -> tuple[int, str]:
    """The device's L2 cache in bytes and where that number comes from: the device (PyTorch's or
    tinygrad's CUDA runtime), the `L2_BYTES` table by name, or `DEFAULT_L2_BYTES` (assumed). Cached,
    so that both sides of a comparison rotate alike; PyTorch is asked first because it must open
    the GPU before tinygrad does (`attention.torch_times`)."""
    if Device.DEFAULT == "CUDA":
        torch = cuda_torch()
        if torch is not None:
            size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
            if size: return size, "read from the device"
        else:
            size = _tinygrad_cuda_l2()
            if size: return size, "read from the device"
    name = device_name()
    if name in L2_BYTES: return L2_BYTES[name], f"{name}'s"
    return DEFAULT_L2_BYTES, "assumed"


def _tinygrad_cuda_l2() -> int | None:
    """The L2 size tinygrad's CUDA runtime reads from the device (None where it cannot)."""
    try:
        import ctypes
        from tinygrad.runtime.autogen import cuda
        size = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(size), cuda.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, Device["CUDA"].cu_device)
        return size.value or None
    except Exception:  # noqa: BLE001 - unreadable: the table by name decides
        return None


@dataclasses.dataclass(frozen=True)
class Rotation:
    """How a timed replay uses its inputs: `calls` calls over `sets` distinct input sets taken in
    turn; `in_l2` when the sets together stay under `L2_MULTIPLE` L2 sizes (capped at `max_calls`),
    so that part of what the calls read may come from the cache."""
    calls: int
    sets: int
    in_l2: bool


def rotation(call_bytes: int, l2_bytes: int | None = None, max_calls: int = MAX_CALLS) -> Rotation:
    """The rotation for calls that each read `call_bytes`: as many distinct sets as pass
    `L2_MULTIPLE` x `l2_bytes` (the device's L2 by default), at most `max_calls`, each used once a
    replay where they are at least `COPIES`, else taken in turn by `COPIES` calls (a set's reuse
    still comes after `L2_MULTIPLE` L2 sizes of other reads)."""
    if call_bytes < 1 or max_calls < 1:
        raise ValueError(f"bench rotation: call_bytes and max_calls must be positive, got {call_bytes} and {max_calls}")
    target = L2_MULTIPLE * (l2_size()[0] if l2_bytes is None else l2_bytes)
    sets = min(max_calls, max(1, -(-target // call_bytes)))
    return Rotation(calls=max(COPIES, sets), sets=sets, in_l2=sets * call_bytes < target)


def l2_marker(*rotations: Rotation) -> str:
    """` (L2)` after a row's first cell when any side's rotation stays within the cache, else nothing."""
    return " (L2)" if any(r.in_l2 for r in rotations) else ""


def warm_up(seconds: float = WARM_SECONDS) -> None:
    """Keep the device busy with tinygrad's matmuls for a moment so that its clocks are up when
    timing starts (an idle GPU runs its first microseconds of work at a fraction of its clock).
    Not on the CPU."""
    if not is_gpu(): return
    step = _warm_step()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end: step()
    Device[Device.DEFAULT].synchronize()


@functools.cache
def _warm_step() -> Callable[[], Tensor]:
    """A jitted 4096 x 4096 float16 matmul: replays cost the host little, so the GPU stays busy."""
    a = Tensor.rand(4096, 4096, dtype=dtypes.float16).realize()
    step = TinyJit(lambda x: (x @ x.T).realize())
    return lambda: step(a)


def warm_up_torch(seconds: float = WARM_SECONDS) -> None:
    """`warm_up` for PyTorch's side, with PyTorch's matmuls (tinygrad must not open the GPU before
    PyTorch's measurements end: `attention.torch_times`)."""
    import torch
    a = torch.rand(4096, 4096, device="cuda", dtype=torch.float16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end: a @ a.T
    torch.cuda.synchronize()


def device_seconds(run: Callable[[], object]) -> float:
    """The device time of `run()`'s launches, as tinygrad measures it at DEBUG=2 (events around
    each launch; a TinyJit replay is one graph launch), without its printing: the host's own
    replay overhead is left out, as it is from the CUDA-event times of PyTorch's graph replays."""
    before = GlobalCounters.time_sum_s
    with Context(DEBUG=2), contextlib.redirect_stdout(io.StringIO()): run()
    return GlobalCounters.time_sum_s - before


def time_jit(fn: Callable[..., Tensor], calls: Sequence[tuple[Tensor, ...]], repeats: int) -> float:
    """Device seconds per call of `fn(*call)` (a Tensor or a tuple of them) for the `calls`, all in
    one TinyJit replay; the best of `repeats` replays, started on warm clocks.

    Each call is realized on its own: calls that take the same input set (fewer sets than calls)
    build the same lazy graph, which tinygrad would compute once in a joint realize (its graphs
    are hash-consed), so a composition's row counted one run as several."""
    unique = list({id(t): t for call in calls for t in call}.values())  # TinyJit takes each buffer once
    position = {id(t): i for i, t in enumerate(unique)}
    layout = [tuple(position[id(t)] for t in call) for call in calls]

    @TinyJit
    def step(*tensors):
        first = None
        for call in layout:
            result = fn(*(tensors[i] for i in call))
            outs = list(result) if isinstance(result, tuple) else [result]
            Tensor.realize(*outs)
            first = outs[0] if first is None else first
        return first
    for _ in range(3): step(*unique)  # the second call captures, the third replays
    Device[Device.DEFAULT].synchronize()
    warm_up()  # the compiles and the capture above may have left the GPU idle long enough to clock down
    return min(device_seconds(lambda: step(*unique)) for _ in range(repeats)) / len(calls)


def torch_graph_seconds(run: Callable[[], None], calls: int, repeats: int) -> float:
    """Seconds per call of PyTorch's `run()` (which makes `calls` calls), replayed as a CUDA graph
    (as our calls are by TinyJit: kernel time, not Python's launches); the best of `repeats`,
    started on warm clocks."""
    import torch
    side = torch.cuda.Stream()  # warm up off the default stream before capturing, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3): run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): run()
    warm_up_torch()  # as in time_jit: after the capture, right before the timed replays
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); graph.replay(); end.record(); torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best / calls


def cuda_torch():
    """PyTorch when it is importable and sees a CUDA GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def release_torch() -> None:
    """Give PyTorch's cached GPU memory back before tinygrad allocates its own."""
    torch = cuda_torch()
    if torch is not None: torch.cuda.empty_cache()


def method_note(max_calls: int = MAX_CALLS) -> str:
    """The caption's words on rotation and clocks, with the device's L2 size and its source."""
    size, source = l2_size()
    calls = f"{COPIES} calls" if max_calls <= COPIES else f"{COPIES} to {max_calls} calls"
    return (f"each replay makes {calls} over distinct input sets that together pass {L2_MULTIPLE}x the L2 "
            f"({size / 2**20:.0f} MiB, {source}), so that every call reads memory; a row marked (L2) cannot (its inputs "
            f"stay under {L2_MULTIPLE}x the L2 at {max_calls} calls) and reads partly from the cache; the GPU's clocks "
            f"warmed for {WARM_SECONDS} s right before each side's timing")


def start_table(what: str, method: str, columns: Sequence[str], max_calls: int = MAX_CALLS) -> tuple[list[str], float | None]:
    """Print a table's caption and header (what, the device, the commit, how it was timed, the
    rotation and L2 note, the peak bandwidth); returns the lines and the peak bandwidth (None
    unknown). The timers warm the clocks themselves, right before each measurement."""
    name = device_name()
    peak = PEAK_BANDWIDTH.get(name)
    lines = [f"{what} on {name} ({Device.DEFAULT}), commit {commit()}; {method}; {method_note(max_calls)}; peak bandwidth "
             f"{'%.1f TB/s' % (peak / 1e12) if peak else 'unknown'}.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    print("\n".join(lines), flush=True)
    return lines, peak


def rate_cells(seconds: float, moved_bytes: int, peak: float | None) -> str:
    """`µs | TB/s | % peak |` cells."""
    rate = moved_bytes / seconds
    share = f"{100 * rate / peak:.0f}%" if peak else "-"
    return f"{seconds * 1e6:.1f} | {rate / 1e12:.2f} | {share} |"


def optional_us(seconds: float | None) -> str:
    return f"{seconds * 1e6:.1f} |" if seconds else "- |"


def part_of(grid: list, part: str = "1/1", batches: str | None = None) -> list:
    """The `I`-th of `N` interleaved slices of a benchmark's grid (`part` "I/N", 1-based), of the
    rows whose batch size (a row's first entry) is in `batches` ("B,...") when given."""
    index, count = (int(x) for x in part.split("/"))
    if not 1 <= index <= count: raise ValueError(f"bench: --part must be I/N with 1 <= I <= N, got {part}")
    if batches is not None:
        wanted = {int(b) for b in batches.split(",")}
        grid = [row for row in grid if row[0] in wanted]
    return grid[index - 1::count]
