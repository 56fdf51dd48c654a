"""Row operations (`python -m nuvec_tg.bench rows`): each of the operations over the last axis at
4096 rows of 4096 and at 32 rows of 4096 (a decode step's), in bfloat16 and float32: nuvec_tg,
tinygrad's composition (the same call inside `compositions_only()`) and PyTorch (when it imports
and sees a GPU), each timed on the device, with the op's bytes per second (each input read once,
each output written once: `moved_bytes`) and the share of peak bandwidth.

The operations and PyTorch's counterparts (eager kernels, captured in a CUDA graph):
- rms_norm (with a weight): `F.rms_norm`.
- add_rms_norm (h = x + residual, y = rms_norm(h, weight); both written): `x + r`, then `F.rms_norm`.
- residual_rms_norm (Gemma's sandwich: s = h + rms_norm(x, w), y = rms_norm(s, w2); both
  written): `h + F.rms_norm(x)`, then `F.rms_norm(s)`.
- layer_norm (weight and bias): `F.layer_norm`.
- softmax (last axis; a bfloat16 input gives bfloat16): `torch.softmax`.
- logsumexp (last axis): `torch.logsumexp`.
- cross_entropy (int32 targets for ours, the int64 PyTorch requires for its; per row):
  `F.cross_entropy(reduction='none')`. Ours writes float32 losses, PyTorch's are the logits'
  dtype; the bytes count ours' (the difference is a row's few bytes).
- rope (rotate-half / NeoX pairs, 128 features a head, all rotated, base 10000): 4096 x 4096 as
  `[1, 32, 4096, 128]` (32 heads of 4096 positions from 0, a prefill), 32 x 4096 as
  `[32, 32, 1, 128]` (a decode step: 32 sequences each at its own position, ours given them as
  an int32 tensor of per-batch offsets). PyTorch: transformers' `q * cos + rotate_half(q) * sin`
  with cos and sin precomputed in x's dtype, `[B, 1, T, 128]`, as transformers' rotary embedding
  makes them once a forward for every layer; each call reads them, the bytes do not count them.
- copy (the ceiling of this timing method, not an operation of ours): a device-to-device copy of
  x, tinygrad's `Tensor.clone()` in the nuvec and composition columns, PyTorch's `x.clone()`: the
  rate a kernel that reads each byte once and writes it once reaches here.
- max (the ceiling of a kernel that reads each byte once and writes a value a row, as logsumexp
  and cross_entropy do; not an operation of ours): each row's maximum, tinygrad's `x.max(-1)` in
  the nuvec and composition columns, PyTorch's `x.amax(-1)`.
- norm_rope (Qwen3's per-head q/k norm, then rope, as rope's rows, weight `[128]`): ours the fused
  kernel (a row read once, written once); PyTorch `F.rms_norm` over the head, then transformers'
  rope as above. norm_then_rope: the same call as our two kernels of before, `rms_norm` then
  `rope` (what the fusion saves; its composition and PyTorch columns are norm_rope's again).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from tinygrad import Tensor, dtypes

from .. import fast
from ..kernels import compositions_only
from .common import COPIES, MAX_CALLS, Rotation, cuda_torch, l2_marker, part_of, release_torch, rotation, \
    start_table, time_jit, torch_graph_seconds

OPS = ("rms_norm", "add_rms_norm", "residual_rms_norm", "layer_norm", "softmax", "logsumexp", "cross_entropy", "rope",
       "norm_rope", "norm_then_rope", "copy", "max")
ROPE_OPS = ("rope", "norm_rope", "norm_then_rope")  # rows of heads: `Shape.rope_shape`
DTYPES = ("bfloat16", "float32")
HEAD = 128          # rope's head size (all of it rotated)
BASE = 10000.0      # rope's base
NORM_EPS = 1e-6     # the RMS norms' eps (Qwen's, Llama's)
LAYER_NORM_EPS = 1e-5
DECODE_POSITIONS = 4096  # a decode row's sequences are at positions below this (rope)
WINDOW = 1 << 16    # how far apart two input sets' windows of the normals can start (`normals`)


@dataclasses.dataclass(frozen=True)
class Shape:
    """`rows` rows of `width`; `decode`: rope takes them as a decode step's `[rows, width / head, 1,
    head]` (a sequence a row, at its own position), else as a prefill's `[1, width / head, rows,
    head]` (one sequence, positions 0 to rows - 1)."""
    rows: int
    width: int
    decode: bool

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.width}"

    def rope_shape(self, head: int = HEAD) -> tuple[int, int, int, int]:
        heads = self.width // head
        return (self.rows, heads, 1, head) if self.decode else (1, heads, self.rows, head)


SHAPES = (Shape(4096, 4096, False), Shape(32, 4096, True))
SMALL_SHAPES, SMALL_HEAD = (Shape(16, 64, False), Shape(2, 64, True)), 32


def moved_bytes(op: str, shape: Shape, itemsize: int, head: int = HEAD) -> int:
    """The bytes a call must move: each input read once, each output written once (int32 targets,
    rope's int32 per-batch offsets, float32 cross-entropy losses, norm_rope's `[head]` weight)."""
    n, row = shape.rows * shape.width * itemsize, shape.width * itemsize
    counts = {
        "rms_norm": 2 * n + row,                   # x, weight; y
        "add_rms_norm": 4 * n + row,               # x, residual, weight; h, y
        "residual_rms_norm": 4 * n + 2 * row,      # h, x, two weights; s, y
        "layer_norm": 2 * n + 2 * row,             # x, weight, bias; y
        "softmax": 2 * n,                          # x; y
        "copy": 2 * n,                             # x; its copy
        "logsumexp": n + shape.rows * itemsize,    # x; one value a row
        "max": n + shape.rows * itemsize,          # x; one value a row
        "cross_entropy": n + shape.rows * (4 + 4),  # logits, int32 targets; float32 losses
        "rope": 2 * n + (shape.rows * 4 if shape.decode else 0),  # x (and the offsets); y
    }
    counts["norm_rope"] = counts["norm_then_rope"] = counts["rope"] + head * itemsize  # and the head's weight
    if op not in counts: raise ValueError(f"bench rows: no operation {op!r} (of {', '.join(OPS)})")
    return counts[op]


def our_call(op: str, head: int):
    """nuvec_tg's call for `op`, taking the tensors `inputs` makes."""
    return {
        "rms_norm": lambda x, w: fast.rms_norm(x, w, NORM_EPS),
        "add_rms_norm": lambda x, r, w: fast.add_rms_norm(x, r, w, NORM_EPS),
        "residual_rms_norm": lambda h, x, w, w2: fast.residual_rms_norm(h, x, w, NORM_EPS, next=(w2, NORM_EPS)),
        "layer_norm": lambda x, w, b: fast.layer_norm(x, w, b, LAYER_NORM_EPS),
        "softmax": lambda x: fast.softmax(x, -1),
        "copy": lambda x: x.clone(),
        "max": lambda x: x.max(-1),
        "logsumexp": lambda x: fast.logsumexp(x, -1),
        "cross_entropy": lambda x, t: fast.cross_entropy(x, t),
        "rope": lambda x, *offsets: fast.rope(x, head, base=BASE, offset=offsets[0] if offsets else 0),
        "norm_rope": lambda x, w, *offsets: fast.norm_rope(x, w, NORM_EPS, fast.Rotation(head, base=BASE),
                                                           offsets[0] if offsets else 0),
        "norm_then_rope": lambda x, w, *offsets: fast.rope(fast.rms_norm(x, w, NORM_EPS), head, base=BASE,
                                                           offset=offsets[0] if offsets else 0),
    }[op]


@functools.lru_cache(maxsize=4)
def _normals(count: int) -> np.ndarray:
    """`count + WINDOW` float32 standard normals, drawn once a size."""
    return np.random.default_rng(2).standard_normal(count + WINDOW, dtype=np.float32)


def normals(rng, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Standard normals of `shape` times `scale`: a window of `_normals` at a random start, so that
    distinct sets differ without drawing 16M normals each (0.4 s a set on a slow host)."""
    count = math.prod(shape)
    start = int(rng.integers(0, WINDOW))
    return _normals(count)[start:start + count].reshape(shape) * np.float32(scale)


def random_inputs(rng, op: str, shape: Shape, head: int) -> dict[str, np.ndarray]:
    """One call's inputs as float32 (int32 for indices) numpy arrays, by name: rows of standard
    normals, weights near 1, biases near 0, targets and positions uniform."""
    rows, width = shape.rows, shape.width
    normal = lambda *s, scale=1.0: normals(rng, s, scale)  # noqa: E731
    weight = lambda: 1.0 + normal(width, scale=0.1)  # noqa: E731
    if op in ROPE_OPS:
        made = {"x": normal(*shape.rope_shape(head))}
        if op != "rope": made["weight"] = 1.0 + normal(head, scale=0.1)
        if shape.decode: made["offsets"] = rng.integers(0, DECODE_POSITIONS, rows, dtype=np.int32)
        return made
    made = {
        "rms_norm": lambda: {"x": normal(rows, width), "weight": weight()},
        "add_rms_norm": lambda: {"x": normal(rows, width), "residual": normal(rows, width), "weight": weight()},
        "residual_rms_norm": lambda: {"h": normal(rows, width), "x": normal(rows, width), "weight": weight(),
                                      "weight2": weight()},
        "layer_norm": lambda: {"x": normal(rows, width), "weight": weight(), "bias": normal(width, scale=0.1)},
        "softmax": lambda: {"x": normal(rows, width)},
        "copy": lambda: {"x": normal(rows, width)},
        "max": lambda: {"x": normal(rows, width)},
        "logsumexp": lambda: {"x": normal(rows, width)},
        "cross_entropy": lambda: {"logits": normal(rows, width), "targets": rng.integers(0, width, rows, dtype=np.int32)},
    }
    if op not in made: raise ValueError(f"bench rows: no operation {op!r} (of {', '.join(OPS)})")
    return made[op]()


def to_tensor(array: np.ndarray, dtype) -> Tensor:
    """A float32 `array` as a tensor of the float `dtype` (an integer array as it is), copied in
    without a kernel where it can be: a decode row makes hundreds of sets, and a cast kernel for
    each costs the host more than the copy (bfloat16: rounded to nearest even here)."""
    if array.dtype != np.float32 or dtype == dtypes.float32: return Tensor(array)
    if dtype == dtypes.bfloat16:
        bits = array.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return Tensor(rounded.tobytes(), dtype=dtypes.bfloat16).reshape(array.shape)
    return Tensor(array).cast(dtype).contiguous()


def inputs(rng, op: str, shape: Shape, dtype_name: str, head: int, turn: Rotation) -> list[tuple[Tensor, ...]]:
    """`turn.calls` calls' tensors for `our_call`, `turn.sets` distinct sets taken in turn (float
    inputs in `dtype_name`, indices int32), realized together."""
    dtype = getattr(dtypes, dtype_name)
    made = [tuple(to_tensor(a, dtype) for a in random_inputs(rng, op, shape, head).values()) for _ in range(turn.sets)]
    Tensor.realize(*(t for s in made for t in s))
    return [made[i % turn.sets] for i in range(turn.calls)]


def torch_call(torch, op: str, head: int):
    """PyTorch's call for `op` (see the module's docstring), taking the tensors `torch_inputs` makes."""
    F = torch.nn.functional

    def rotate_half(x):  # transformers' (models/llama/modeling_llama.py)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def residual_rms_norm(h, x, w, w2):
        s = h + F.rms_norm(x, (x.shape[-1],), w, NORM_EPS)
        return s, F.rms_norm(s, (s.shape[-1],), w2, NORM_EPS)

    def add_rms_norm(x, r, w):
        h = x + r
        return h, F.rms_norm(h, (h.shape[-1],), w, NORM_EPS)

    def norm_rope(x, w, cos, sin):
        y = F.rms_norm(x, (x.shape[-1],), w, NORM_EPS)
        return y * cos + rotate_half(y) * sin
    return {
        "rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, NORM_EPS),
        "add_rms_norm": add_rms_norm,
        "residual_rms_norm": residual_rms_norm,
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LAYER_NORM_EPS),
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "copy": lambda x: x.clone(),
        "max": lambda x: x.amax(dim=-1),
        "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
        "cross_entropy": lambda x, t: F.cross_entropy(x, t, reduction="none"),
        "rope": lambda x, cos, sin: x * cos + rotate_half(x) * sin,
        "norm_rope": norm_rope,
        "norm_then_rope": norm_rope,
    }[op]


def torch_inputs(torch, rng, op: str, shape: Shape, dtype_name: str, head: int) -> tuple:
    """One call's tensors for `torch_call` on the GPU: `random_inputs`' (float in `dtype_name`,
    targets int64); for rope (and the norm's weight before), x with cos and sin `[B, 1, T, head]`
    of its positions, computed in float32 as transformers' rotary embedding does and cast to x's
    dtype."""
    dtype = getattr(torch, dtype_name)
    made = random_inputs(rng, op, shape, head)
    if op in ROPE_OPS:
        x = torch.from_numpy(made["x"]).to("cuda", dtype)
        weight = (torch.from_numpy(made["weight"]).to("cuda", dtype),) if "weight" in made else ()
        positions = made["offsets"].reshape(-1, 1) if shape.decode else np.arange(shape.rows).reshape(1, -1)
        positions = torch.from_numpy(positions.astype(np.float32)).cuda()  # [B, T]
        inv_freq = 1.0 / (BASE ** (torch.arange(0, head, 2, device="cuda", dtype=torch.float32) / head))
        freqs = positions[..., None] * inv_freq  # [B, T, head / 2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, head]
        return x, *weight, emb.cos().to(dtype), emb.sin().to(dtype)
    return tuple(torch.from_numpy(a).to("cuda", dtype) if a.dtype == np.float32 else torch.from_numpy(a.astype(np.int64)).cuda()
                 for a in made.values())


def time_torch(op: str, shape: Shape, dtype_name: str, head: int, repeats: int, max_calls: int = MAX_CALLS) -> float | None:
    """PyTorch's seconds per call of `op` (rotated as ours), or None without PyTorch and a GPU (or
    where PyTorch fails, saying why)."""
    torch = cuda_torch()
    if torch is None: return None
    turn = rotation(moved_bytes(op, shape, getattr(torch, dtype_name).itemsize, head), max_calls=max_calls)
    rng = np.random.default_rng(1)
    call = torch_call(torch, op, head)
    try:
        sets = [torch_inputs(torch, rng, op, shape, dtype_name, head) for _ in range(turn.sets)]

        def run():
            for i in range(turn.calls): call(*sets[i % turn.sets])
        return torch_graph_seconds(run, turn.calls, repeats)
    except Exception as error:  # noqa: BLE001 - one row's failure (memory, a capture) leaves the others
        print(f"PyTorch {op} {shape.name} {dtype_name} failed: {error}", flush=True)
        return None


def torch_times(grid, head: int, repeats: int, max_calls: int = MAX_CALLS) -> dict:
    """PyTorch's seconds per call for each grid row, all measured before tinygrad opens the device
    (`attention.torch_times` says why)."""
    times = {(shape, op, dt): time_torch(op, shape, dt, head, repeats, max_calls) for shape, op, dt in grid}
    release_torch()
    return times


def rate_cells(seconds: float | None, moved: int, peak: float | None) -> str:
    """`µs | GB/s | % peak |` cells (dashes where there is no time)."""
    if not seconds: return "- | - | - |"
    rate = moved / seconds
    gb = f"{rate / 1e9:.0f}" if rate >= 100e9 else f"{rate / 1e9:#.3g}"  # three figures at least
    return f"{seconds * 1e6:.1f} | {gb} | " + (f"{100 * rate / peak:.0f}% |" if peak else "- |")


def grid_of(args) -> tuple[list[tuple[Shape, str, str]], int]:
    """The rows `(shape, op, dtype name)` the options ask for (`--ops`: these operations only), and
    rope's head size."""
    types = ("bfloat16",) if args.quick else DTYPES
    grid = [(shape, op, dt) for op in OPS for shape in SHAPES for dt in types]
    head = HEAD
    if args.small:  # every op once in float32, and rope's decode layout too: each new shape compiles on the CPU
        rows_shape, decode_shape = SMALL_SHAPES
        grid, head = [(rows_shape, op, "float32") for op in OPS] + [(decode_shape, "rope", "float32")], SMALL_HEAD
    if getattr(args, "batches", None):  # --batches: these row counts
        wanted = {int(b) for b in args.batches.split(",")}
        grid = [row for row in grid if row[0].rows in wanted]
    if getattr(args, "ops", None):  # --ops: these operations
        ops = args.ops.split(",")
        if unknown := [op for op in ops if op not in OPS]:
            raise ValueError(f"bench rows: no operation {', '.join(unknown)} (of {', '.join(OPS)})")
        grid = [row for row in grid if row[1] in ops]
    return part_of(grid, args.part), head


def run(args) -> list[str]:
    """The table's lines (printed as they come)."""
    grid, head = grid_of(args)
    max_calls = COPIES if args.small else MAX_CALLS  # tiny shapes check the benchmark, not the cache
    torch_seconds = torch_times(grid, head, args.repeats, max_calls)
    have_torch = cuda_torch() is not None
    rope_shapes = "; ".join(f"{s.name} as {list(s.rope_shape(head))}" for s in dict.fromkeys(shape for shape, _, _ in grid))
    lines, peak = start_table(
        f"Row operations over the last axis (rope: {head} features a head, rotate-half pairs, {rope_shapes}, "
        "the decode shape at per-batch positions; PyTorch's rope as transformers' rotate_half with cos/sin precomputed "
        "in x's dtype)",
        f"µs per call (best of {args.repeats} replays of the calls over rotated inputs: TinyJit for ours and the "
        "composition, a CUDA graph of PyTorch's eager kernels), GB/s of the op's bytes (each input read once, each output "
        "written once) and share of peak" + ("" if have_torch else "; PyTorch with a CUDA GPU not available: its columns are -"),
        ["op", "shape", "dtype", "nuvec µs", "GB/s", "% peak", "composition µs", "GB/s", "% peak", "torch µs", "GB/s",
         "% peak", "vs torch"], max_calls)
    rng = np.random.default_rng(0)
    for shape, op, dt in grid:
        moved = moved_bytes(op, shape, getattr(dtypes, dt).itemsize, head)
        turn = rotation(moved, max_calls=max_calls)  # PyTorch's calls rotate alike
        calls = inputs(rng, op, shape, dt, head, turn)
        call = our_call(op, head)
        ours = time_jit(call, calls, args.repeats)
        with compositions_only():
            composed = time_jit(call, calls, max(2, args.repeats // 2))
        torch_s = torch_seconds[(shape, op, dt)]
        row = f"| {op}{l2_marker(turn)} | {shape.name} | {dt} | " + rate_cells(ours, moved, peak) + " " + \
            rate_cells(composed, moved, peak) + " " + rate_cells(torch_s, moved, peak)
        row += f" {torch_s / ours:.2f}x |" if torch_s else " - |"
        print(row, flush=True)
        lines.append(row)
        del calls
    return lines

