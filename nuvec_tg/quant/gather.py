"""Gathered matrix products (MLX's `gather_mm` and `gather_qmm`): each output batch multiplies one
batch of the left operand by one batch of the right, chosen by index arrays — a mixture-of-experts
layer's tokens times their experts.

Indices are flat over the operands' batch axes and broadcast together; the output is
`broadcast(lhs_indices, rhs_indices).shape + [M, N]`. Without indices an operand's batches are
taken in order (`arange` over its batch shape). An index outside an operand's batches (a negative
one too) selects a batch of zeros (nothing is read out of bounds). `sorted_indices` is a hint for
kernels (rows sorted by expert) and changes no value. On METAL and CUDA, transposed products of at
most 8 rows per entry run the `gather_qmv` kernel (`kernels/quant.py`), each row with the bits of a
one-row `quantized_matmul` of its expert; sorted single-row entries averaging more than 8 rows per
expert, and entries of more than 8 rows, run the gathered `qmm` kernel, an expert's (an entry's)
rows as one product (`grouped_gather`). `quantized_matmul` runs weights with batch axes here. Dense
`gather_mm` takes the same rule where b is the transpose of a `[..., N, K]` weight bank, as a
model's experts are: the gathered tiled kernels (`gemm`, `gemm_wgmma` with GATHER) for the
grouped entries, `gather_gemv` (gemv with GATHER) for up to 8 rows an entry, each row with the
bits of a `fast.linear` of its expert; the rest is the composition.
"""
from __future__ import annotations

import math

import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import Ops

from .. import kernels
from ..kernels import linear as linear_kernel
from ..kernels import quant as qmv_kernel
from ..tensor import broadcast_shape, check, check_floating, check_integer, check_tensor, promote_types, take_rows
from .affine import QuantizedWeight, check_global_scale, check_weight, dense_weights


def _indices(op: str, name: str, given: Tensor | None, batch: tuple[int, ...], device: str) -> Tensor:
    """The index array `name`: the caller's (an integer tensor), or every batch in order."""
    if given is None:
        return Tensor.arange(math.prod(batch), dtype=dtypes.int32).to(device).reshape(batch) if batch else \
            Tensor.zeros((), dtype=dtypes.int32, device=device)
    check_tensor(op, name, given)
    check_integer(op, name, given.dtype)
    return given


def _gather(op: str, a: Tensor, b_batch: tuple[int, ...], lhs_indices, rhs_indices, product) -> Tensor:
    """`product(a rows [P, M, K], b batch indices [P])` over the broadcast indices, `[..., M, N]`."""
    a_batch = tuple(a.shape[:-2])
    lhs = _indices(op, "lhs_indices", lhs_indices, a_batch, a.device)
    rhs = _indices(op, "rhs_indices", rhs_indices, b_batch, a.device)
    shape = broadcast_shape(op, tuple(lhs.shape), tuple(rhs.shape))
    def flat(indices: Tensor, batches: int) -> Tensor:
        # take_rows gives zeros past the end but wraps negative indices: send those past the end too
        indices = indices.cast(dtypes.int32)
        return (indices >= 0).where(indices, batches).expand(shape).reshape(math.prod(shape))
    out = product(take_rows(a.reshape(-1, *a.shape[-2:]), flat(lhs, math.prod(a_batch))), flat(rhs, math.prod(b_batch)))
    return out.reshape(*shape, *out.shape[-2:])


def batched_quantized_matmul(x: Tensor, qw: QuantizedWeight, transpose: bool) -> Tensor:
    """`quantized_matmul` (already checked) of weights with batch axes: x's batches and w's
    broadcast as a matmul's, each pair of batches one of `gather_qmm`'s entries in order, so that
    its kernels take them (the gathered qmm for more than 8 rows an entry, one launch over every
    batch). Returns `broadcast(x batches, w batches) + [M, N]`, or `[..., N]` for x `[K]`."""
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    batches = tuple(qw.weight.shape[:-2])
    shape = broadcast_shape("quantized_matmul", tuple(rows.shape[:-2]), batches)
    picks = np.broadcast_to(np.arange(math.prod(batches)).reshape(batches), shape).reshape(-1)
    out = gather_qmm(rows, qw, transpose=transpose, sorted_indices=bool((picks[1:] >= picks[:-1]).all()))
    return out.reshape(*shape, out.shape[-1]) if x.ndim == 1 else out


def gather_mm(a: Tensor, b: Tensor, lhs_indices: Tensor | None = None, rhs_indices: Tensor | None = None, *,
              sorted_indices: bool = False) -> Tensor:
    """`a[lhs_indices] @ b[rhs_indices]` over flat batch indices.

    a: `[..., M, K]`, b: `[..., K, N]` (float dtypes, promoted as MLX); indices: integer tensors
    whose shapes broadcast. Returns `broadcast(indices).shape + [M, N]`. Gradients reach a and b.
    """
    op = "gather_mm"
    check_tensor(op, "a", a)
    check_tensor(op, "b", b)
    check_floating(op, "a", a.dtype)
    check_floating(op, "b", b.dtype)
    check(a.ndim >= 2 and b.ndim >= 2, op, f"a and b must have at least 2 dimensions, got {tuple(a.shape)} and {tuple(b.shape)}")
    check(a.shape[-1] == b.shape[-2], op, f"a's last dimension ({a.shape[-1]}) must equal b's second to last ({b.shape[-2]})")
    dtype = promote_types(a.dtype, b.dtype)
    b = b.cast(dtype)
    b_flat = b.reshape(-1, *b.shape[-2:])
    k, n = b.shape[-2], b.shape[-1]
    w = _rows_of(b)
    w_flat = None if w is None else w.reshape(-1, n, k)

    def product(rows: Tensor, picks: Tensor) -> Tensor:
        entries, m = rows.shape[0], rows.shape[1]
        kernel, reason = linear_kernel.gather_route(dtype, dtype, entries, m, k, n, b_flat.shape[0], sorted_indices=sorted_indices,
                                                    rows_of_w=w is not None, target=kernels.target(a.device))
        backend = kernels.choose(op, f"{entries} entries of {m} x {k} x {tuple(b.shape)} on {a.device}", a.device, kernel,
                                 lambda backend: reason)
        if backend is None: return rows @ take_rows(b_flat, picks)
        if kernel == "gather_gemv":  # each entry's few rows against its own weight batch
            return linear_kernel.gather_gemv(rows, w_flat, picks, out_dtype=dtype, backend=backend,
                                             composition=lambda x, w, p: x @ take_rows(w, p).transpose(-1, -2))
        # an expert's rows as one product: the route takes single-row entries, each with its own weight batch
        run = linear_kernel.gemm_wgmma if kernel == "gemm_wgmma" else linear_kernel.gemm
        out = run(rows.reshape(entries, k), w_flat, None, out_dtype=dtype, backend=backend, picks=picks,
                  composition=lambda x, w, _: (x.reshape(-1, 1, k) @ take_rows(w, picks).transpose(-1, -2)).reshape(-1, n))
        return out.reshape(entries, 1, n)
    return _gather(op, a.cast(dtype), tuple(b.shape[:-2]), lhs_indices, rhs_indices, product)


def _rows_of(b: Tensor) -> Tensor | None:
    """w `[..., N, K]` where b is `w.transpose(-1, -2)` (a model's expert bank, which the kernels
    read as rows without a copy), else None."""
    u, order = b.uop, tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2)
    return Tensor(u.src[0]) if u.op is Ops.PERMUTE and u.arg == order else None


def gather_qmm(x: Tensor, qw: QuantizedWeight, lhs_indices: Tensor | None = None, rhs_indices: Tensor | None = None, *,
               transpose: bool = True, sorted_indices: bool = False, global_scale: Tensor | None = None) -> Tensor:
    """`x[lhs_indices] · w[rhs_indices]ᵀ` (or `· w[...]` when not `transpose`) for quantized weights.

    x: `[..., M, K]`; qw: a batch of quantized weights `[..., N, K]` (`[..., K, N]` when not
    transposed). global_scale: nvfp4 only, float32 `[E]` (one per weight batch), with indices.
    Returns `broadcast(indices).shape + [M, N]` in quantized_matmul's dtype; only the selected
    weight batches are dequantized. Gradients reach x and, for affine weights, scales and biases.
    """
    op = "gather_qmm"
    check_tensor(op, "x", x)
    check_floating(op, "x", x.dtype)
    check_weight(op, qw)
    check(qw.global_scale is None, op, "pass nvfp4's per-batch global scale as global_scale=, not inside the weight")
    batches = tuple(qw.weight.shape[:-2])
    check_global_scale(op, qw.mode, global_scale, entries=math.prod(batches))
    check(global_scale is None or lhs_indices is not None or rhs_indices is not None, op,
          "a global scale cannot be used without indices")
    rows, columns = qw.weight.shape[-2], qw.columns
    inner = columns if transpose else rows
    check(x.ndim >= 2 and x.shape[-1] == inner, op,
          f"x's last dimension must be {inner} for weights of {rows} x {columns} "
          f"({'transposed' if transpose else 'not transposed'}), got shape {tuple(x.shape)}")
    check(x.dtype != dtypes.float64 or qw.mode == "affine", op, f"{qw.mode} weights take float32, float16 or bfloat16 activations")
    dtype = promote_types(x.dtype, qw.scales.dtype) if qw.mode == "affine" else x.dtype
    flat = lambda t: None if t is None else t.reshape(-1, *t.shape[-2:])  # noqa: E731
    weight, scales, biases = flat(qw.weight), flat(qw.scales), flat(qw.biases)
    scale_per_batch = None if global_scale is None else global_scale.reshape(-1, 1)

    def composed(x_rows: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, picks: Tensor) -> Tensor:
        chosen = QuantizedWeight(take_rows(weight, picks), take_rows(scales, picks),
                                 None if biases is None else take_rows(biases, picks), qw.mode, qw.group_size, qw.bits)
        # each chosen batch's own global scale, broadcast over its scales [P, N, groups]
        scale = None if scale_per_batch is None else take_rows(scale_per_batch, picks).reshape(-1, 1, 1)
        dense = dense_weights(chosen, dtype, scale)
        return x_rows.cast(dtype) @ (dense.transpose(-1, -2) if transpose else dense)

    def product(x_rows: Tensor, picks: Tensor) -> Tensor:
        entries, m = x_rows.shape[0], x_rows.shape[1]
        kernel, reason = qmv_kernel.gather_route(dtype, qw.scales.dtype, dtype, entries, m, columns, rows, weight.shape[0],
                                                 bits=qw.bits, transpose=transpose, sorted_indices=sorted_indices,
                                                 global_scale=global_scale is not None, target=kernels.target(x.device))
        backend = kernels.choose(op, f"{entries} entries of {m} x {columns} x {qw.mode} {qw.bits}-bit {tuple(qw.weight.shape)} "
                                 f"on {x.device}", x.device, kernel, lambda backend: reason)
        if backend is None: return composed(x_rows, weight, scales, biases, picks)
        if kernel == "gather_qmv":
            return qmv_kernel.gather_qmv(x_rows.cast(dtype), weight, scales, biases, picks, mode=qw.mode,
                                         group_size=qw.group_size, bits=qw.bits, out_dtype=dtype, backend=backend,
                                         composition=composed)
        # the gathered qmm: every entry's single row with its own weight batch, sorted by batch
        def composed_rows(x_flat, weight, scales, biases, row_picks):
            return composed(x_flat.reshape(-1, 1, columns), weight, scales, biases, row_picks).reshape(-1, rows)
        out = qmv_kernel.qmm(x_rows.cast(dtype).reshape(entries * m, columns), weight, scales, biases, mode=qw.mode,
                             group_size=qw.group_size, bits=qw.bits, out_dtype=dtype, backend=backend,
                             picks=picks.reshape(-1, 1).expand(entries, m).reshape(-1), composition=composed_rows)
        return out.reshape(entries, m, rows)
    return _gather(op, x, batches, lhs_indices, rhs_indices, product)
