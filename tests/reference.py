"""What the tests share: inputs rounded to a dtype, comparisons with the seeds' tolerances, and
central finite differences; for the kernels on a GPU, their tolerances and what proves a kernel
ran (`expect_launches`). References themselves are float64 numpy, written in each test file,
never the package's code."""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
from tinygrad import Tensor, dtypes

from nuvec_tg import fast
from nuvec_tg.fast import PlanTarget
from nuvec_tg.kernels import gpu_class, kernel_backend, multiprocessors, record_launches, warpgroup_products
from nuvec_tg.kernels.program import Program
from nuvec_tg.tensor import promote_types

HALF_DTYPES = (dtypes.float16, dtypes.bfloat16)
DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)

# The seeds' tolerances: relative to max(|want|, 1).
TOLERANCE = {dtypes.float64: 1e-9, dtypes.float32: 2e-5, dtypes.float16: 4e-3, dtypes.bfloat16: 5e-2}


def round_to(values: np.ndarray, dtype) -> np.ndarray:
    """`values` rounded (to nearest even) to `dtype`, returned as float64."""
    values = np.asarray(values, dtype=np.float64)
    if dtype == dtypes.float64: return values
    if dtype == dtypes.float32: return values.astype(np.float32).astype(np.float64)
    if dtype == dtypes.float16: return values.astype(np.float16).astype(np.float64)
    if dtype == dtypes.bfloat16:
        bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return bits.view(np.float32).astype(np.float64)
    raise ValueError(dtype)


def tensor(values: np.ndarray, dtype, device: str) -> Tensor:
    """A tinygrad tensor of `values` (already representable in `dtype`) on `device`."""
    values = np.asarray(values)
    if dtype == dtypes.float64: return Tensor(values.astype(np.float64), device=device)
    if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_: return Tensor(values, device=device).cast(dtype)
    return Tensor(values.astype(np.float32), device=device).cast(dtype)


def random(rng: np.random.Generator, shape, dtype, device: str, spread: float = 1.0) -> tuple[Tensor, np.ndarray]:
    """A random tensor in `dtype` and its exact values as float64."""
    values = round_to(rng.uniform(-spread, spread, size=shape), dtype)
    return tensor(values, dtype, device), values


def values(t: Tensor) -> np.ndarray:
    """A tensor's values as float64 (exactly, for every float dtype).

    Half tensors are read through their bits: tinygrad folds a lazy `cast(half)` followed by
    `cast(float)` into nothing, so casting them up would read the values before their rounding."""
    if t.dtype == dtypes.float16: return t.bitcast(dtypes.uint16).numpy().view(np.float16).astype(np.float64)
    if t.dtype == dtypes.bfloat16:
        return (t.bitcast(dtypes.uint16).numpy().astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return t.numpy().astype(np.float64)


def assert_close(name: str, got, want, tol: float) -> None:
    """Every element within `tol * max(|want|, 1)` of `want` (equal infinities and NaNs pass)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: `same` covers them
        close = np.abs(got - want) <= tol * np.maximum(np.abs(want), 1.0)
    bad = ~(same | close)
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} elements differ, first at {tuple(i)}: "
                             f"{got[tuple(i)]} vs {want[tuple(i)]} (tol {tol})")


def assert_rows_close(name: str, got, want, tol: float) -> None:
    """Every row (the last axis) within `tol * max|want row|` of `want`, element by element.

    The kernels' tests use this rather than `assert_close`: their outputs (attention's, a gated
    delta step's, a product's) can be far below 1 in magnitude, where a floor of 1 would pass an
    all-zero output or a dropped block. A row that is all zeros in `want` must be zeros in `got`.
    Non-finite values must match exactly (same infinities, NaN where `want` has NaN)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    finite = np.isfinite(want)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert (same | finite).all(), f"{name}: non-finite values differ"
    scale = np.where(finite, np.abs(want), 0).max(axis=-1, keepdims=True) if want.ndim else np.abs(want)
    with np.errstate(invalid="ignore"):
        close = np.abs(got - want) <= tol * scale
    bad = ~(same | (close & finite))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        worst = np.nanmax(np.where(bad, np.abs(got - want) / np.maximum(scale, 1e-300), 0))
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} elements differ, first at {i}: {got[i]} vs {want[i]} "
                             f"(tol {tol} of the row's largest |want|; worst {worst:.3g} of it)")


def finite_differences(loss, arrays: list[np.ndarray], step: float = 1e-6) -> list[np.ndarray]:
    """Central differences of the scalar function `loss(*arrays)` with respect to every array."""
    grads = []
    for k, a in enumerate(arrays):
        grad = np.zeros_like(a, dtype=np.float64)
        for i in np.ndindex(a.shape):
            args_plus = [x.copy() for x in arrays]
            args_minus = [x.copy() for x in arrays]
            args_plus[k][i] += step
            args_minus[k][i] -= step
            grad[i] = (loss(*args_plus) - loss(*args_minus)) / (2 * step)
        grads.append(grad)
    return grads


def gradients(out: Tensor, cotangent: Tensor, inputs: list[Tensor]) -> list[np.ndarray]:
    """`d sum(out * cotangent) / d input` for each input, as float64 arrays."""
    loss = (out.cast(dtypes.float64 if out.dtype == dtypes.float64 else dtypes.float32) * cotangent).sum()
    grads = loss.gradient(*inputs)
    Tensor.realize(*grads)  # one schedule for all of them
    return [values(g) for g in grads]


# ---- kernel comparisons on a GPU --------------------------------------------------------------

# Tolerances of a kernel's output against float64 numpy, for `assert_rows_close` (relative to
# each row's largest |want|). A correct kernel is off by its output's rounding (half an ulp of the
# row's largest element at most: 2^-8 in bfloat16, 2^-11 in float16) plus float32 arithmetic and,
# in attention's matrix pass, softmax weights rounded to 16 bits. Numpy models of the kernels
# (test_kernel_tolerances.py) over test_gpu_attention's shapes reach at most float32 1.6e-6,
# float16 6.5e-4, bfloat16 4.7e-3 (gated delta and quant less): 2-60x inside. Planted faults
# measure far above: a zero output 1; attention's last 1/16 of keys dropped 0.12 (under the old
# floor of 1: 0.005-0.014 at Lk 2048-9000, which passed), its last 64 keys 0.09, scores scaled by
# ln 2 0.06, query heads on the wrong key head 1.4; gated delta's last update dropped, beta or
# the gate ignored 0.17 (y and state together); quant's K tail dropped 0.12, a group's scale and
# bias taken from its neighbour 0.05, columns shifted 1.2.
KERNEL_TOLERANCE = {dtypes.float32: 1e-4, dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2}
# Two rounded results against each other (a kernel against the composition on the GPU, whose
# 16-bit dense weights or intermediates round too, or against another launch): each is within
# KERNEL_TOLERANCE of the exact result, so the two are within twice that.
COMPOSITION_TOLERANCE = {dtype: 2 * tol for dtype, tol in KERNEL_TOLERANCE.items()}


def row_error(got, want) -> float:
    """The largest `|got - want|` in units of its row's largest `|want|` (the last axis; an
    all-zero row of `want` counts any difference as infinite): what `assert_rows_close` bounds,
    for finite values."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = np.abs(want).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        error = np.where(got == want, 0.0, np.abs(got - want) / scale)
    return float(error.max()) if error.size else 0.0


@contextlib.contextmanager
def expect_launches(device: str, kernel: str | None) -> Iterator[list[tuple[str, str]]]:
    """Record the kernel launches built inside the block (`nuvec_tg.kernels.record_launches`) and,
    on leaving it, assert what ran: where `device` has kernels (METAL, CUDA) and `kernel` names
    one (a program name prefix, `"nuvec_qmv"`), a program of that name launched; elsewhere (the
    CPU, or `kernel` None: the plan chose the composition) nothing launched.

    Whether kernels are switched off (`NUVEC_KERNELS=0`) is not consulted: the GPU tests mean the
    kernels, and fail where they did not run. Launches are recorded as calls are built, so the
    operation's call, not only its realize, belongs in the block."""
    with record_launches() as launches:
        yield launches
    names = [name for name, _ in launches]
    if kernel is None or kernel_backend(device) is None:
        assert not names, f"{device}: expected the composition (no kernel launch), got {names}"
    else:
        assert any(name.startswith(kernel) for name in names), \
            f"{device}: expected a launch of {kernel}, got {names or 'no launch'}"


def stand_in_program(name: str, params, body: str) -> Program:
    """A C program for the CPU in a kernel's place, with the kernel's parameters and `body` over
    them: for testing on the CPU what an operation does around its kernel's launch."""
    signature = ", ".join(f"{'const ' if p.kind == 'in' else ''}{p.ctype}* restrict {p.name}" for p in params)
    return Program(name, f"void {name}({signature}) {{ {body} }}", tuple(params), None)


def launched(launches: list[tuple[str, str]]) -> list[str]:
    """The program names of `record_launches`' launches."""
    return [name for name, _ in launches]


def kernel_target(device: str) -> PlanTarget:
    """The attention plan's target for `device` with its kernels on, whatever the switches say (a
    test's expectation of a kernel must not follow `NUVEC_KERNELS=0`)."""
    backend = kernel_backend(device)
    if backend == "metal": return PlanTarget("metal", gpu_class(device))
    if backend == "cuda": return PlanTarget("cuda", multiprocessors=multiprocessors(device), warpgroups=warpgroup_products(device))
    return PlanTarget(None)


def attention_kernel(device: str, q_shape, k_shape, v_shape, dtype, **options) -> str | None:
    """`"nuvec_sdpa_decode"` where the plan for `device` (kernels on) runs the decode kernels for
    these shapes and options (`fast.plan_attention`'s), else None."""
    plan = fast.plan_attention(q_shape, k_shape, v_shape, dtype, device=kernel_target(device), **options)
    return "nuvec_sdpa_decode" if isinstance(plan.kernel, fast.Vector) else None


def checked_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, **options) -> Tensor:
    """`fast.scaled_dot_product_attention(q, k, v, scale, **options)`, realized, asserting that the
    decode kernels launched where the plan for q's device (kernels on) runs them and that nothing
    launched elsewhere: what the device-parametrised tests call."""
    dtype = promote_types(promote_types(q.dtype, k.dtype), v.dtype)
    with expect_launches(q.device, attention_kernel(q.device, q.shape, k.shape, v.shape, dtype, **options)):
        return fast.scaled_dot_product_attention(q, k, v, scale, **options).realize()


# ---- float64 references of the row operations (the emulator's and the GPU's tests) ----------------

def softmax_reference(x):
    """float64; a row whose maximum is infinite gives NaN (inf - inf), as the composition does."""
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def logsumexp_reference(x):
    """float64; a row whose maximum is infinite gives that maximum."""
    m = x.max(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = np.log(np.exp(x - m[..., None]).sum(-1)) + m
    return np.where(np.isinf(m), m, finite)


def int32_positions(offsets, shape):
    """`offset + t` in int32 (wrapping), shaped to broadcast against the rows `[B, ..., T]`."""
    offsets = np.asarray(offsets, np.int64).reshape((-1,) + (1,) * (len(shape) - 2))
    wide = offsets + np.arange(shape[-2])
    return ((wide - -2**31) % 2**32 + -2**31).astype(np.int32)


def rope_reference(x, dims, traditional, offsets, scale, inv_freq):
    """float64 rotation by the contract's float32 angles: `(float(p) * scale) * inv_freq`."""
    positions = int32_positions(offsets, x.shape).astype(np.float32) * np.float32(scale)
    angles = (positions[..., None] * np.asarray(inv_freq, np.float32)).astype(np.float64)   # float32 products
    cos, sin = np.cos(angles), np.sin(angles)
    out = x.copy()
    half = dims // 2
    first, second = (slice(0, dims, 2), slice(1, dims, 2)) if traditional else (slice(0, half), slice(half, dims))
    a, b = x[..., first], x[..., second]
    out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
    return out
