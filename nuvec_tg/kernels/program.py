"""The one place a kernel is called: how a kernel source becomes a node of tinygrad's lazy graph.

A kernel family (`Family`) is a stem and its source files in `src/`: helper-only files, then the
kernel's own, which holds helper functions, a line `/* kernel */`, then the body. With it the
family's module keeps its `unsupported(...)` (why the kernel does not take a call, or None) and its
launch-shape plan. `Family.program(backend, defines, params)` specialises it: the `#define`s, the
helpers, a signature written for the backend from the parameter list, then the body, under a name
made once here from the stem and a hash of the text (tinygrad keys its runtimes by name). The
body sees its buffers and scalars by name, and `nv_group` / `nv_thread` (the threadgroup's and the
thread's index); the backend's prelude (`src/prelude_{backend}.h`, then `src/common.h`) supplies
the shared dialect (`simd_sum`, `simd_shuffle_xor`, `THREADGROUP`, `threadgroup_barrier()`,
`DEVICE`, `to_float`, `from_float`, `bits_to_float`, `half2_bits_to_float2`, `mask_or`). A program
whose defines or parameters name `bfloat` starts with `#define NUVEC_BFLOAT 1`; only then does the
Metal prelude name bfloat (the Metal language has it from 3.1, macOS 14, on), so float16 and
float32 programs compile on older Metal too.

`Resources` is what one threadgroup asks of the device (threads, threadgroup memory); each family
states it for its Metal specialisations (`metal_resources`), and `metal_limit_reason` says where
that exceeds an Apple GPU's limits (the routes then take the composition).

`launch(program, ...)` compiles a program once per device (tinygrad's compiler caches by source)
and adds it to the graph as one CALL: inputs may be lazy (tinygrad realises them first), outputs
feed further lazy operations, scalars are bound `int32` Variables (a jitted step recompiles
nothing when they change). Its backward (`Backward`) is the gradient of the composition the
operation passes, on the call's own inputs (MLX's `Custom::vjp`): every kernel is differentiable
through its definition, built here once.

It builds the CALL itself rather than through tinygrad 0.14's `Tensor.custom_kernel`: that gives
the program a global-buffer placeholder for every argument (no slot for a bound Variable, which
the decode kernels' symbolic key count needs) and returns every argument, inputs included, as an
output, while CUDAGraph builds its dependency edges from the program's declared outputs and inputs.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import AddrSpace
from tinygrad.uop.ops import KernelInfo, Ops, ProgramInfo, UOp

from ..tensor import concrete

SOURCE_DIR = Path(__file__).parent / "src"
BODY_MARKER = "/* kernel */"
BACKENDS = ("cuda", "metal")

# The element types a kernel takes and their names in the dialect (both preludes name them alike).
CTYPES = {dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float"}
KERNEL_DTYPES = tuple(CTYPES)

CHUNK_TYPES = {16: "uint4", 8: "uint2", 4: "uint", 2: "ushort"}


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
    if backend not in BACKENDS: raise ValueError(f"prelude: unknown backend {backend!r}")
    return _source(f"prelude_{backend}.h") + _source("common.h")


def chunks(which: str, line_bytes: int, lane_bytes: int) -> dict[str, object]:
    """How a lane reads its `lane_bytes` of each `line_bytes` line: the widest piece (up to 16
    bytes) that divides both, so every piece is aligned; the defines `CHUNK_<which>` (its type)
    and `<which>_CHUNKS` (how many a lane reads)."""
    width = 16
    while line_bytes % width or lane_bytes % width: width //= 2
    return {f"CHUNK_{which}": CHUNK_TYPES[width], f"{which}_CHUNKS": lane_bytes // width}


def _signature(backend: str, name: str, params: Sequence[Param], occupancy: tuple[int, int] | None = None,
               cluster: tuple[int, int, int] | None = None) -> str:
    """The kernel's signature for `backend`, and the lines binding `nv_group` / `nv_thread`.
    `occupancy` (CUDA): (threads, threadgroups) that must fit a multiprocessor together, which caps
    the compiler's registers (`__launch_bounds__`). `cluster` (CUDA sm_90): the threadgroups of a
    cluster along x, y, z, fixed at compile time (`__cluster_dims__`), so a plain launch runs them
    as clusters."""
    if backend == "cuda":
        def param(p: Param) -> str:
            if p.kind == "scalar": return f"const int {p.name}"
            return f"{'const ' if p.kind == 'in' else ''}{p.ctype}* __restrict__ {p.name}"
        bounds = f"__launch_bounds__({occupancy[0]}, {occupancy[1]}) " if occupancy else ""
        if cluster: bounds += f"__cluster_dims__({cluster[0]}, {cluster[1]}, {cluster[2]}) "
        return (f'extern "C" __global__ void {bounds}{name}({", ".join(param(p) for p in params)}) {{\n'
                "  const uint3 nv_group = blockIdx, nv_thread = threadIdx;\n")
    def metal_param(i: int, p: Param) -> str:
        if p.kind == "scalar": return f"constant int& {p.name} [[buffer({i})]]"
        return f"device {'const ' if p.kind == 'in' else ''}{p.ctype}* {p.name} [[buffer({i})]]"
    return (f"kernel void {name}({', '.join(metal_param(i, p) for i, p in enumerate(params))}, "
            "uint3 nv_group [[threadgroup_position_in_grid]], uint3 nv_thread [[thread_position_in_threadgroup]]) {\n")


@dataclass(frozen=True)
class Program:
    """One specialisation of a family for one backend: its unique `name`, its `text` (the
    defines, helpers, signature and body, without the prelude) and its parameters. `backend`
    None: a program in the device's own language, without the dialect (the mechanism's tests)."""
    name: str
    text: str
    params: tuple[Param, ...]
    backend: str | None
    bfloat: bool = False  # whether the program names bfloat (its defines or parameters)
    arch: str | None = None  # CUDA: the architecture it compiles for where not the device's own (sm_90a: wgmma)
    dynamic_bytes: int = 0   # CUDA: dynamic threadgroup memory a launch gives it (past the 48 KB declared statically)
    cluster: tuple[int, int, int] | None = None  # CUDA: threadgroups a cluster along x, y, z (the grid's a multiple)

    @property
    def header(self) -> str:
        """What comes before the prelude: `#define NUVEC_BFLOAT 1` where the program needs the
        dialect's bfloat (the Metal prelude names bfloat only then)."""
        return "#define NUVEC_BFLOAT 1\n" if self.bfloat else ""

    @property
    def source(self) -> str:
        """The whole program: its header, the prelude, then the text."""
        return self.text if self.backend is None else f"{self.header}{prelude(self.backend)}\n{self.text}"


@dataclass(frozen=True)
class Resources:
    """What one threadgroup of a program asks of the device: `threads`, and `threadgroup_bytes`,
    the bytes of its threadgroup arrays, each rounded up to 16 (`threadgroup_array`)."""
    threads: int
    threadgroup_bytes: int


# An Apple GPU's limits per threadgroup (MTLDevice's maxThreadgroupMemoryLength and
# maxThreadsPerThreadgroup on every Apple family).
METAL_LIMITS = Resources(threads=1024, threadgroup_bytes=32768)


def threadgroup_array(count: int, itemsize: int) -> int:
    """The bytes a threadgroup array of `count` elements of `itemsize` bytes takes, rounded up to
    16 (the unit Metal allocates threadgroup memory in)."""
    return -(-count * itemsize // 16) * 16


def metal_limit_reason(*resources: Resources) -> str | None:
    """Why programs of these resources (one per pass) cannot run on an Apple GPU, or None."""
    for r in resources:
        if r.threadgroup_bytes > METAL_LIMITS.threadgroup_bytes:
            return f"{r.threadgroup_bytes} bytes of threadgroup memory (Metal allows {METAL_LIMITS.threadgroup_bytes})"
        if r.threads > METAL_LIMITS.threads:
            return f"{r.threads} threads per threadgroup (Metal allows {METAL_LIMITS.threads})"
    return None


# Every family, in the order their modules define them (the Metal syntax check covers each).
FAMILIES: list[Family] = []


@dataclass(frozen=True)
class Family:
    """A kernel family: the `stem` its programs are named after, its `sources` in `src/`
    (helper-only files, then the kernel's own), `unsupported(...)` (why the kernel does not take a
    call: a reason, or None when it does), `plan(...)` (its launch shape from plain sizes), and the
    backends it is written for. The defines and parameters of a specialisation are what its
    module's `*_program` function passes to `program`."""
    stem: str
    sources: tuple[str, ...]
    unsupported: Callable[..., str | None]
    plan: Callable[..., object]
    backends: tuple[str, ...] = BACKENDS
    arch: str | None = None  # CUDA: the architecture its programs compile for, where not the device's own

    def __post_init__(self) -> None:
        FAMILIES.append(self)

    def program(self, backend: str, defines: dict[str, object], params: Sequence[Param],
                occupancy: tuple[int, int] | None = None, dynamic_bytes: int = 0,
                cluster: tuple[int, int, int] | None = None) -> Program:
        """The family specialised by `defines` for `backend`, with the signature of `params` (in
        launch order: outputs, inputs, then scalars), named `<stem>_<hash of its text>`. It needs
        bfloat where a define's value or a parameter's type names it. `occupancy`: (threads,
        threadgroups) a CUDA multiprocessor must hold at once (`_signature`). `dynamic_bytes`: the
        dynamic threadgroup memory (CUDA) each launch gives it. `cluster`: the threadgroups of a
        cluster (CUDA, `_signature`), None for none."""
        if backend not in self.backends: raise ValueError(f"{self.stem}: no {backend} kernel (only {', '.join(self.backends)})")
        if cluster and backend != "cuda": raise ValueError(f"{self.stem}: clusters of threadgroups are CUDA's (not {backend})")
        helpers, body = _source(self.sources[-1]).split(BODY_MARKER)
        helpers = "".join(_source(f) for f in self.sources[:-1]) + helpers
        define_lines = "".join(f"#define {key} {value}\n" for key, value in defines.items())
        text = f"{define_lines}{helpers}\n{_signature(backend, self.stem, params, occupancy, cluster)}{body}}}\n"
        name = f"{self.stem}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        bfloat = any("bfloat" in str(value) for value in defines.values()) or any(p.ctype == "bfloat" for p in params)
        return Program(name, text.replace(f"{self.stem}(", f"{name}("), tuple(params), backend, bfloat,
                       self.arch if backend == "cuda" else None, dynamic_bytes, cluster)


@functools.lru_cache(maxsize=1024)
def int_buffer(device: str | tuple[str, ...], values: tuple[int, ...]) -> Tensor:
    """A realized int32 buffer of `values` (a kernel's runtime integers), made once: a call reuses
    it rather than copying host memory to the device each time (and a jitted step finds it made).
    The integers travel in a buffer rather than as scalars: one program serves every value, and
    TinyJit keeps a buffer's values where it could not bind a Variable."""
    return Tensor(list(values), dtype=dtypes.int32, device=device).realize()


def int32_indices(indices: Tensor) -> Tensor:
    """Integer indices (class targets, pool slots) as a kernel reads them, int32, naming what they
    name: narrower integers convert exactly; wider ones are read as int64 (as the compositions
    read them) and clamped into int32, where a value from outside stays outside."""
    dtype = concrete(indices.dtype)
    if dtype.itemsize <= 4 and dtype != dtypes.uint32: return indices.cast(dtypes.int32)  # a weak int made concrete too
    return indices.cast(dtypes.int64).clip(-2**31, 2**31 - 1).cast(dtypes.int32)


@functools.cache
def _compiled(device: str, source: str, arch: str | None = None) -> bytes:
    """The program's binary for `device`: through the device's compiler, or for CUDA's `arch` where
    given (tinygrad compiles for the device's own, sm_90, which has no wgmma)."""
    if arch is None: return Device[device].renderer.compiler.compile_cached(source)
    from tinygrad.runtime.support.compiler_cuda import NVRTCCompiler
    return NVRTCCompiler(arch).compile_cached(source)


def _give_dynamic_memory(device: str, program: UOp, dynamic_bytes: int) -> None:
    """Load `program` on `device` with `dynamic_bytes` of dynamic threadgroup memory a launch, into
    the runtime cache where tinygrad looks for it (eager runs and CUDA graphs alike read the
    launch's memory from it): tinygrad loads programs with none, and a launch that uses more than
    it was given fails."""
    from tinygrad.engine.realize import runtime_cache
    key = (program.key, device)
    if getattr(runtime_cache.get(key), "smem", 0) < dynamic_bytes:  # none yet, or one loaded with too little
        runtime_cache[key] = Device[device].runtime_t(Device[device], program.to_elf(), smem=dynamic_bytes)


@dataclass(frozen=True)
class Backward:
    """How a kernel call differentiates: `composition(*inputs)` computes the call's outputs (one
    tensor, or a tuple in the order of the call's outputs) from tensor operations; `inputs` are
    tensors the call reads (the very objects passed in its `ins`); the gradients of `inputs[i]`
    for `i` in `wrt` reach the call's arguments. `op` names the operation in errors."""
    op: str
    composition: Callable[..., Tensor | tuple[Tensor, ...]]
    inputs: tuple[Tensor, ...]
    wrt: tuple[int, ...]


def _match_gradients(op: str, gradients: list[Tensor], outputs: Sequence[Tensor]) -> list[int]:
    """Which output each gradient belongs to. tinygrad passes only the gradients that exist, in
    output order but without saying whose: with all of them that order says; otherwise by shape
    (then dtype), and a gradient that fits two outputs is ambiguous."""
    if len(gradients) == len(outputs): return list(range(len(outputs)))
    matched = []
    for gradient in gradients:
        fits = [i for i, out in enumerate(outputs) if tuple(out.shape) == tuple(gradient.shape)]
        if len(fits) > 1: fits = [i for i in fits if outputs[i].dtype == gradient.dtype]
        if len(fits) != 1:
            raise ValueError(f"{op}: a gradient of one output of a kernel whose outputs share a shape is ambiguous; "
                             "run with nuvec_tg.kernels.compositions_only()")
        matched.append(fits[0])
    return matched


def _grad_fxn(backward: Backward, positions: list[int]) -> Callable:
    """The CALL's backward: `backward.composition` on detached copies of the call's arguments at
    `positions` (those of `backward.inputs`), differentiated by tinygrad."""
    def grad_fxn(*arguments, call=None):
        *gradients, call = arguments if call is None else (*arguments, call)
        args = [Tensor(call.src[1 + p]).detach() for p in positions]
        result = backward.composition(*args)
        outputs = result if isinstance(result, tuple) else (result,)
        gradients = [Tensor(g) for g in gradients]
        owners = _match_gradients(backward.op, gradients, outputs)
        # One target per distinct argument: a tensor passed twice gets its whole gradient once.
        targets: dict[UOp, tuple[int, Tensor]] = {}
        for i in backward.wrt: targets.setdefault(args[i].uop, (positions[i], args[i]))
        tensors = [t for _, t in targets.values()]
        if len(gradients) == 1:
            grads = outputs[owners[0]].gradient(*tensors, gradient=gradients[0])
        else:
            loss = sum((outputs[o].cast(dtypes.float32) * g.cast(dtypes.float32)).sum() for o, g in zip(owners, gradients))
            grads = loss.gradient(*tensors)
        result_grads: list = [None] * (len(call.src) - 1)
        for (position, target), grad in zip(targets.values(), grads):
            result_grads[position] = grad.cast(target.dtype).uop
        return tuple(result_grads)
    return grad_fxn


# What `record_launches` collects: (program name, label) per launch built.
launch_listeners: list[list[tuple[str, str]]] = []


def kernel_input(t: Tensor) -> Tensor:
    """`t` as a kernel's input: itself where it is a whole buffer (realized, or another kernel's
    output) seen through reshapes, which `launch` binds as it is; else `t.contiguous()` (a copy,
    or a view where tinygrad makes one). `.contiguous()` alone would copy a reshaped kernel output:
    one kernel more for every product or norm that reads another's output."""
    u = t.uop
    while u.op is Ops.RESHAPE: u = u.src[0]
    if u.op is Ops.AFTER: u = u.src[0]
    while u.op is Ops.RESHAPE: u = u.src[0]
    return t if u.op is Ops.BUFFER else t.contiguous()


@dataclass(frozen=True)
class StridedView:
    """A tensor as a kernel can read it in place from the buffer beneath it: `base` (the buffer,
    flat), the element `offset` of its first element, and each axis's element `strides`. `moves`
    are the movement operations that make the tensor from `base` (`of`), which a kernel's backward
    differentiates through."""
    base: Tensor
    offset: int
    strides: tuple[int, ...]
    moves: tuple[tuple[Ops, tuple], ...]

    def of(self, base: Tensor) -> Tensor:
        """The tensor, from (a tensor standing for) `base`."""
        for op, arg in self.moves:
            base = base.reshape(arg) if op is Ops.RESHAPE else base.shrink(arg) if op is Ops.SHRINK else base.permute(arg)
        return base


def _reshaped_strides(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of `new` over the same elements as `shape` with `strides`, where a reshape
    needs no copy (numpy's rule: every run of old axes merged into new ones is contiguous); None
    where it would."""
    old = [(size, stride) for size, stride in zip(shape, strides) if size != 1]
    out = [0] * len(new)
    oi = ni = 0
    while ni < len(new) and oi < len(old):
        oj, nj = oi + 1, ni + 1
        old_size, new_size = old[oi][0], new[ni]
        while old_size != new_size:
            if new_size < old_size:
                if nj == len(new): return None
                new_size, nj = new_size * new[nj], nj + 1
            else:
                if oj == len(old): return None
                old_size, oj = old_size * old[oj][0], oj + 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)): return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1): out[k - 1] = out[k] * new[k]
        oi, ni = oj, nj
    if oi != len(old) or any(size != 1 for size in new[ni:]): return None
    return tuple(out)


def strided_view(t: Tensor) -> StridedView | None:
    """`t` as a strided view of a realized buffer (or another kernel's output) through reshapes,
    shrinks and permutes, or None (another movement, a symbolic or empty shape, a reshape that
    would copy)."""
    chain, u = [], t.uop
    while u.op in (Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE):
        chain.append(u)
        u = u.src[0]
    if u.op is Ops.AFTER: u = u.src[0]
    while u.op is Ops.RESHAPE:
        chain.append(u)
        u = u.src[0]
    if u.op is not Ops.BUFFER or not all(isinstance(n, int) and n > 0 for c in chain for n in c.shape): return None
    shape, strides, offset, moves = (u.shape[0],), (1,), 0, []
    for c in reversed(chain):
        if c.op is Ops.RESHAPE:
            strides = _reshaped_strides(shape, strides, tuple(c.shape))
            if strides is None: return None
            moves.append((Ops.RESHAPE, tuple(c.shape)))
        elif c.op is Ops.SHRINK:
            starts = [start for start, _ in c.marg]
            if not all(isinstance(start, int) for start in starts): return None
            offset += sum(start * stride for start, stride in zip(starts, strides))
            moves.append((Ops.SHRINK, tuple((start, start + size) for start, size in zip(starts, c.shape))))
        else:
            strides = tuple(strides[i] for i in c.marg)
            moves.append((Ops.PERMUTE, tuple(c.marg)))
        shape = tuple(c.shape)
    return StridedView(Tensor(u), offset, strides, tuple(moves))


def _split_by_axis(t: Tensor) -> bool:
    """Whether a tensor on several devices is split along an axis (`Tensor.shard`)."""
    try:
        return t.uop.axis is not None
    except RuntimeError:   # split along several axes
        return True


def launch(program: Program, device: str | tuple[str, ...], outs: Sequence[Tensor], ins: Sequence[Tensor], grid: tuple[int, int, int],
           threads: int, *, scalars: Sequence[UOp] = (), backward: Backward | None = None, label: str = "",
           in_place: bool = False) -> list[Tensor]:
    """Add `program` to the graph on `device`, over a grid of `grid` threadgroups of `threads`
    threads; returns `outs` after it ran. Several devices (`kernels.per_device()`): it runs on each
    over that device's buffers.

    outs: buffers the program writes (whole buffers: a view would be written as a copy); ins:
    tensors it reads (anything not a plain buffer, a reshape or a prefix slice is copied first);
    scalars: bound int32 Variables, in the order of the scalar parameters. backward: how the call
    differentiates (None: it does not). tinygrad runs the call once per realize that needs one of
    its outputs, so several outputs are best realized together (`Tensor.realize(a, b)`);
    `in_place` (an output is an existing buffer the program updates) realizes them all now, so
    that the update is applied once. label: what `record_launches` and NUVEC_DEBUG show.
    """
    devices = tuple(Device.canonicalize(d) for d in device) if isinstance(device, tuple) else (Device.canonicalize(device),)
    tensors = list(outs) + list(ins)
    if len(devices) > 1 and any(_split_by_axis(t) for t in tensors):
        raise ValueError(f"{label or program.name}: a kernel takes a tensor on several devices as one buffer a device "
                         "(kernels.per_device()), not split by an axis (Tensor.shard): call it on each device's shard")
    if program.cluster and any(g % c for g, c in zip(grid, program.cluster)):
        raise ValueError(f"{label or program.name}: a grid of {grid} threadgroups in clusters of {program.cluster}")
    lib = _compiled(devices[0], program.source, program.arch)   # `kernels.target` checks that the devices compile alike
    count = len(tensors)
    params = [UOp.placeholder_like(t.uop, i).base for i, t in enumerate(tensors)]
    variables = [UOp.param(count + k, (v := s.unbind()[0]).dtype, (), vmin_vmax=(v.vmin, v.vmax), name=v.expr,
                           addrspace=AddrSpace.ALU) for k, s in enumerate(scalars)]
    sink = UOp.sink(*params, *variables, arg=KernelInfo(name=program.name))
    info = ProgramInfo(name=program.name, global_size=tuple(grid), local_size=(threads, 1, 1), vars=tuple(variables),
                       globals=tuple(range(count)), outs=tuple(range(len(outs))), ins=tuple(range(len(outs), count)))
    program_uop = UOp(Ops.PROGRAM, src=(sink, UOp(Ops.LINEAR, src=(*sink.src, sink)), UOp(Ops.SOURCE, arg=program.source),
                                        UOp(Ops.BINARY, arg=lib)), arg=info)
    if program.dynamic_bytes:
        for d in devices: _give_dynamic_memory(d, program_uop, program.dynamic_bytes)
    grad_fxn = None
    if backward is not None:
        indices = [next((i for i, t in enumerate(ins) if t is given), None) for given in backward.inputs]
        if None in indices: raise ValueError(f"{backward.op}: a backward's inputs must be tensors the call reads")
        grad_fxn = _grad_fxn(backward, [len(outs) + i for i in indices])
    call = program_uop.call(*[t.uop for t in tensors], *scalars, grad_fxn=grad_fxn)
    for listener in launch_listeners: listener.append((program.name, label))
    results = [Tensor(t.uop.after(call)) for t in outs]
    if in_place: Tensor.realize(*results)
    return results
