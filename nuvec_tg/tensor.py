"""What the operations of `fast` and `quant` share.

- MLX's dtype promotion for the dtypes tinygrad has (`promote_types`), and the float / integer
    classes of dtypes.
- The argument checks and the format of their messages: every message starts with the
    operation's name (`rms_norm: weight must be 1-D with 4 elements, got shape (3,)`); shapes and
    values raise `ValueError`, dtypes and non-tensors `TypeError`. Checks run before anything is
    built.
- The dtype that reductions and transcendental math run in (`compute_dtype`), and the lowest
    finite value of each float dtype.
- The gathers and scatters tinygrad lacks (`take_rows`, `put_rows`), and `zero_after`, which
    orders blocks of work.
"""
from __future__ import annotations

import math
from typing import NoReturn

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

FLOAT_DTYPES: tuple[DType, ...] = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
SIGNED_DTYPES: tuple[DType, ...] = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
UNSIGNED_DTYPES: tuple[DType, ...] = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
INTEGER_DTYPES: tuple[DType, ...] = SIGNED_DTYPES + UNSIGNED_DTYPES
SUPPORTED_DTYPES: tuple[DType, ...] = (dtypes.bool,) + INTEGER_DTYPES + FLOAT_DTYPES

_SIGNED_OF_SIZE = {d.itemsize: d for d in SIGNED_DTYPES}


_NAMES = {getattr(dtypes, name): name for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                                  "uint64", "float16", "bfloat16", "float32", "float64")}


def dtype_name(dtype: DType) -> str:
    """`dtype`'s name as numpy and MLX spell it (`float16`, `bfloat16`, `float64`, ...)."""
    return _NAMES.get(dtype, dtype.name)


def concrete(dtype: DType) -> DType:
    """`dtype` with tinygrad's weak dtypes (of Python-number tensors such as `Tensor(3)`) made
    concrete as tinygrad makes them: weakint is int32, weakfloat float32."""
    return {dtypes.weakint: dtypes.int32, dtypes.weakfloat: dtypes.float32}.get(dtype, dtype)


def is_floating(dtype: DType) -> bool:
    """Whether `dtype` is one of the float dtypes the operations take (float16, bfloat16, float32, float64)."""
    return concrete(dtype) in FLOAT_DTYPES


def is_integer(dtype: DType) -> bool:
    """Whether `dtype` is a signed or unsigned integer dtype (bool is not)."""
    return concrete(dtype) in INTEGER_DTYPES


def promote_types(a: DType, b: DType) -> DType:
    """The dtype MLX gives a binary operation on `a` and `b`.

    bool gives way to anything; a float wins over integers; float16 with bfloat16 is float32;
    integers of one signedness take the wider; an unsigned with a signed integer takes the signed
    integer wide enough for both (twice the unsigned width), and uint64 with a signed one is float32.
    """
    a, b = concrete(a), concrete(b)
    for d in (a, b):
        if d not in SUPPORTED_DTYPES:
            raise TypeError(f"promote_types: unsupported dtype {d}")
    if a == b: return a
    if a == dtypes.bool: return b
    if b == dtypes.bool: return a
    if is_floating(a) or is_floating(b):
        if not is_floating(a): return b
        if not is_floating(b): return a
        if dtypes.float64 in (a, b): return dtypes.float64
        if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
        return a if a.itemsize > b.itemsize else b
    if (a in SIGNED_DTYPES) == (b in SIGNED_DTYPES): return a if a.itemsize > b.itemsize else b
    unsigned, signed = (a, b) if a in UNSIGNED_DTYPES else (b, a)
    if unsigned.itemsize < signed.itemsize: return signed
    if unsigned == dtypes.uint64: return dtypes.float32
    return _SIGNED_OF_SIZE[2 * unsigned.itemsize]


def compute_dtype(dtype: DType) -> DType:
    """The dtype reductions and transcendental math run in: float32 for float16/bfloat16/float32, float64 for float64."""
    return dtypes.float64 if dtype == dtypes.float64 else dtypes.float32


def lowest_finite(dtype: DType) -> float:
    """The most negative finite value of the float dtype `dtype` (`-finfo(dtype).max`)."""
    finite_max = {
        dtypes.float16: 65504.0,
        dtypes.bfloat16: float.fromhex("0x1.fep127"),
        dtypes.float32: float.fromhex("0x1.fffffep127"),
        dtypes.float64: float.fromhex("0x1.fffffffffffffp1023"),
    }
    if dtype not in finite_max:
        raise TypeError(f"lowest_finite: {dtype} is not a float dtype")
    return -finite_max[dtype]


# ---- argument checks -------------------------------------------------------------------------

def fail(op: str, message: str) -> NoReturn:
    """Raise the `ValueError` of a bad shape or value: `"{op}: {message}"`."""
    raise ValueError(f"{op}: {message}")


def check(condition: bool, op: str, message: str) -> None:
    """Raise `ValueError("{op}: {message}")` unless `condition` holds."""
    if not condition: fail(op, message)


def check_tensor(op: str, what: str, value: object) -> Tensor:
    """`value` itself when it is a tinygrad Tensor; else a `TypeError` naming `what`."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: {what} must be a tinygrad Tensor, got {type(value).__name__}")
    return value


def check_floating(op: str, what: str, dtype: DType) -> None:
    """A `TypeError` unless `dtype` is float16, bfloat16, float32 or float64."""
    if not is_floating(dtype):
        raise TypeError(f"{op}: {what} must be float16, bfloat16, float32 or float64, got {dtype}")


def check_integer(op: str, what: str, dtype: DType) -> None:
    """A `TypeError` unless `dtype` is a signed or unsigned integer dtype."""
    if not is_integer(dtype):
        raise TypeError(f"{op}: {what} must be an integer tensor, got {dtype}")


def check_number(op: str, what: str, value: object) -> float:
    """`value` as a finite Python float; a `TypeError` for a non-number, a `ValueError` for NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {what} must be a number, got {type(value).__name__}")
    check(math.isfinite(value), op, f"{what} must be finite, got {value}")
    return float(value)


def check_int(op: str, what: str, value: object, smallest: int | None = None) -> int:
    """`value` as an int (a `TypeError` for anything else, bool included), at least `smallest`
    when given (a `ValueError` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {what} must be an int, got {type(value).__name__}")
    if smallest is not None: check(value >= smallest, op, f"{what} must be at least {smallest}, got {value}")
    return value


def check_weight(op: str, what: str, weight: object, features: int) -> Tensor:
    """A 1-D float parameter of `features` elements (a norm's weight or bias)."""
    weight = check_tensor(op, what, weight)
    check(weight.ndim == 1 and weight.shape[0] == features, op,
                f"{what} must be 1-D with {features} elements, got shape {tuple(weight.shape)}")
    check_floating(op, what, weight.dtype)
    return weight


def broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `shapes` broadcast to (numpy's rules); a `ValueError` naming them when they don't."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for sizes in zip(*padded):
        wanted = {n for n in sizes if n != 1}
        check(len(wanted) <= 1, op, "shapes " + ", ".join(str(tuple(s)) for s in shapes) + " do not broadcast")
        out.append(wanted.pop() if wanted else 1)
    return tuple(out)


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    """`axis` counted from the front, in `0..ndim-1`; a `ValueError` when it is out of range."""
    check_int(op, "axis", axis)
    check(-ndim <= axis < ndim, op, f"axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


# ---- gathers ---------------------------------------------------------------------------------

def take_rows(x: Tensor, indices: Tensor) -> Tensor:
    """`x[indices]` along the first axis: `[*indices.shape, *x.shape[1:]]`.

    `indices` must already lie in `0..x.shape[0]-1` (callers clamp or mask them): tinygrad's
    tensor indexing selects rows by comparison, so an index out of range gives a row of zeros.
    """
    return x[indices.reshape(-1)].reshape(*indices.shape, *x.shape[1:])


def put_rows(base: Tensor, rows: Tensor, indices: Tensor) -> Tensor:
    """`base` with `rows[i]` written at row `indices[i]` of its first axis.

    base: `[P, ...]`; rows: `[N, ...]` (the same trailing shape); indices: `[N]` integers. An index
    outside `0..P-1` writes nothing; when two rows name one index the later one wins.
    """
    count, places = indices.shape[0], base.shape[0]
    if count == 0: return base
    names = indices.reshape(count, 1).cast(dtypes.int64) == Tensor.arange(places, dtype=dtypes.int64).reshape(1, places)
    writer = names.where(Tensor.arange(count, dtype=dtypes.int32).reshape(count, 1), -1).max(0)   # [P]: -1 none
    written = take_rows(rows.cast(base.dtype), writer.clip(0, count - 1))
    return (writer >= 0).reshape(places, *([1] * (base.ndim - 1))).where(written, base)


# ---- scheduling ------------------------------------------------------------------------------

def zero_after(before: Tensor, dtype: DType = dtypes.float32) -> Tensor:
    """A scalar 0.0 of `dtype` that tinygrad can only compute once `before` has been computed.

    tinygrad's scheduler runs independent kernels breadth-first, so work split into blocks to
    bound its memory (attention under `max_score_bytes`) would otherwise run every block's first
    kernel before any block finishes. Adding this zero to a scalar of the next block orders the
    blocks. It is exact for any value of `before` (NaN and infinities included): two shifts of
    the bits always give 0, and tinygrad 0.14's rewriter does not fold them away (a test measures
    the memory). No gradient flows through it.
    """
    unsigned = {2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[before.dtype.itemsize]
    bits = before.flatten()[0].bitcast(unsigned)
    return ((bits >> (8 * before.dtype.itemsize - 1)) >> 1).cast(dtype).detach()
