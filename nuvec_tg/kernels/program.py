"""The one mechanism that turns a kernel source into a node of tinygrad's lazy graph.

A kernel source (`src/*.h`) holds helper functions, then a line `/* kernel */`, then the body.
`render` puts the backend's prelude (the shared dialect: `simd_sum`, `simd_shuffle_xor`,
`THREADGROUP`, `threadgroup_barrier()`, `DEVICE`, `to_float`, `from_float`, and the bit-level
helpers `bits_to_float`, `half2_bits_to_float2`, `mask_or`), the specialising
`#define`s and the helpers before a signature it writes for the backend from the parameter list;
the body sees its buffers and scalars by name, and `nv_group` / `nv_thread` (the threadgroup's
and the thread's index). `launch` compiles a rendering once per device (tinygrad's compiler
caches by source) and adds the program to the graph as one CALL: inputs may be lazy (tinygrad
realises them first), outputs feed further lazy operations, scalars are bound `int32` Variables
(so a jitted step recompiles nothing when they change), and the backward is `grad_fxn`'s.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import AddrSpace
from tinygrad.uop.ops import KernelInfo, Ops, ProgramInfo, UOp

SOURCE_DIR = Path(__file__).parent / "src"
BODY_MARKER = "/* kernel */"


@dataclass(frozen=True)
class Param:
    """A kernel parameter: `kind` "out" (a buffer written), "in" (a buffer read) or "scalar"
    (an int32); `ctype` the buffer's element type in the dialect (`T`, `float`, `int`, ...)."""
    name: str
    kind: str
    ctype: str = "int"


@functools.cache
def _source(filename: str) -> str:
    return (SOURCE_DIR / filename).read_text()


def prelude(backend: str) -> str:
    """The backend's half of the dialect (`src/prelude_{backend}.h`), then the helpers common to
    every backend (`src/common.h`)."""
    if backend not in ("cuda", "metal"): raise ValueError(f"render: unknown backend {backend!r}")
    return _source(f"prelude_{backend}.h") + _source("common.h")


@functools.lru_cache(maxsize=1024)
def int_buffer(device: str, values: tuple[int, ...]) -> Tensor:
    """A realized int32 buffer of `values` (a kernel's runtime integers), made once: a call reuses
    it rather than copying host memory to the device each time (and a jitted step finds it made)."""
    return Tensor(list(values), dtype=dtypes.int32, device=device).realize()


# The element types a kernel takes and their names in the dialect (both preludes name them alike).
CTYPES = {dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float"}
KERNEL_DTYPES = tuple(CTYPES)

_CHUNK_TYPES = {16: "uint4", 8: "uint2", 4: "uint", 2: "ushort"}


def chunks(which: str, line_bytes: int, lane_bytes: int) -> dict[str, object]:
    """How a lane reads its `lane_bytes` of each `line_bytes` line: the widest piece (up to 16
    bytes) that divides both, so every piece is aligned; the defines `CHUNK_<which>` (its type)
    and `<which>_CHUNKS` (how many a lane reads)."""
    width = 16
    while line_bytes % width or lane_bytes % width: width //= 2
    return {f"CHUNK_{which}": _CHUNK_TYPES[width], f"{which}_CHUNKS": lane_bytes // width}


def specialise(backend: str, name: str, source: str | tuple[str, ...], defines: dict[str, object],
               params: Sequence[Param]) -> str:
    """Kernel `name` from `source` (a file in `src/`, or several: helper-only files, then the
    kernel's) for `backend`, without the prelude: the `#define`s, the helpers, the signature
    written from `params`, and the body."""
    files = (source,) if isinstance(source, str) else source
    helpers, body = _source(files[-1]).split(BODY_MARKER)
    helpers = "".join(_source(f) for f in files[:-1]) + helpers
    define_lines = "".join(f"#define {key} {value}\n" for key, value in defines.items())
    if backend == "cuda":
        def param(i: int, p: Param) -> str:
            if p.kind == "scalar": return f"const int {p.name}"
            return f"{'const ' if p.kind == 'in' else ''}{p.ctype}* __restrict__ {p.name}"
        signature = (f'extern "C" __global__ void {name}({", ".join(param(i, p) for i, p in enumerate(params))}) {{\n'
                     "  const uint3 nv_group = blockIdx, nv_thread = threadIdx;\n")
    else:
        def param(i: int, p: Param) -> str:
            if p.kind == "scalar": return f"constant int& {p.name} [[buffer({i})]]"
            return f"device {'const ' if p.kind == 'in' else ''}{p.ctype}* {p.name} [[buffer({i})]]"
        signature = (f"kernel void {name}({', '.join(param(i, p) for i, p in enumerate(params))}, "
                     "uint3 nv_group [[threadgroup_position_in_grid]], uint3 nv_thread [[thread_position_in_threadgroup]]) {\n")
    return f"{define_lines}{helpers}\n{signature}{body}}}\n"


def render(backend: str, name: str, source: str, defines: dict[str, object], params: Sequence[Param]) -> str:
    """The full program text of kernel `name`: the prelude, then `specialise(...)`."""
    return f"{prelude(backend)}\n{specialise(backend, name, source, defines, params)}"


@functools.cache
def _compiled(device: str, source: str) -> bytes:
    return Device[device].renderer.compiler.compile_cached(source)


# What `record_launches` collects: (kernel name, specialisation) per launch built.
_listeners: list[list[tuple[str, str]]] = []


def launch(name: str, source: str, device: str, outs: Sequence[Tensor], ins: Sequence[Tensor], scalars: Sequence[UOp],
           global_size: tuple[int, int, int], local_size: tuple[int, int, int],
           grad_fxn: Callable | None = None, label: str = "", in_place: bool = False) -> list[Tensor]:
    """Add program `name` (`source`, already rendered) to the graph; returns `outs` after it ran.

    outs: buffers the program writes (whole buffers: a view would be written as a copy); ins:
    tensors it reads (anything not a plain buffer, a reshape or a prefix slice is copied first);
    scalars: bound int32 Variables, in the order of the scalar parameters. tinygrad runs the call
    once per realize that needs one of its outputs, so several outputs are best realized together
    (`Tensor.realize(a, b)`); `in_place` (an output is an existing buffer the program updates)
    realizes them all now, so that the update is applied once.
    """
    lib = _compiled(device, source)
    tensors = list(outs) + list(ins)
    count = len(tensors)
    params = [UOp.placeholder_like(t.uop, i).base for i, t in enumerate(tensors)]
    variables = [UOp.param(count + k, (v := s.unbind()[0]).dtype, (), vmin_vmax=(v.vmin, v.vmax), name=v.expr,
                           addrspace=AddrSpace.ALU) for k, s in enumerate(scalars)]
    sink = UOp.sink(*params, *variables, arg=KernelInfo(name=name))
    info = ProgramInfo(name=name, global_size=tuple(global_size), local_size=tuple(local_size), vars=tuple(variables),
                       globals=tuple(range(count)), outs=tuple(range(len(outs))), ins=tuple(range(len(outs), count)))
    program = UOp(Ops.PROGRAM, src=(sink, UOp(Ops.LINEAR, src=(*sink.src, sink)), UOp(Ops.SOURCE, arg=source),
                                    UOp(Ops.BINARY, arg=lib)), arg=info)
    call = program.call(*[t.uop for t in tensors], *scalars, grad_fxn=grad_fxn)
    for listener in _listeners: listener.append((name, label))
    results = [Tensor(t.uop.after(call)) for t in outs]
    if in_place: Tensor.realize(*results)
    return results
