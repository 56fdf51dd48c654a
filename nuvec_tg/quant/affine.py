"""MLX's quantized weights: the formats, quantize, dequantize and the quantized matrix product.

The floating-point modes (mxfp4, mxfp8, nvfp4) encode as `floating.py` says; the affine mode:

Per group of `group_size` consecutive values of a row, in float32 (MLX's rule; each division
one IEEE float32 division and each round C's `rint`, ties to even, as MLX's CPU quantize: `exact`):

    scale = max((max - min) / (2^bits - 1), 1e-7), its sign chosen so that the larger-magnitude
            end of the group is the edge mapped to code 0 (scale < 0 when that end is the max)
    q0 = round(edge / scale); scale = edge / q0 and bias = edge when q0 != 0, else bias = 0
    code = clip(round((w - bias) / scale), 0, 2^bits - 1)

so the larger-magnitude end is exact and zero is exact (one bit: scale = max - min, bias = min,
as MLX does). Codes are packed as one
least-significant-bit-first stream per row in uint32 words (3, 5 and 6 bits straddle words);
scales and biases are stored in the weight's dtype. `w ≈ scale * code + bias`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .. import kernels
from ..fast.linear import linear
from ..kernels import linear as linear_kernels
from ..kernels import quant as qmv_kernel
from ..tensor import check, check_floating, check_tensor, dtype_name, promote_types
from . import exact, floating

GROUP_SIZES = (32, 64, 128)
BITS = (1, 2, 3, 4, 5, 6, 8)
MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")
# A mode's (group size, bits) when the caller gives none (MLX's).
DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """Quantized weights: `weight` uint32 `[..., N, K * bits / 32]` packed codes, `scales`
    `[..., N, K / group_size]` (affine: in the original dtype, with `biases` alike; floating-point
    modes: uint8 codes, no biases), the format, and nvfp4's optional float32 `global_scale` (one
    value)."""
    weight: Tensor
    scales: Tensor
    biases: Tensor | None
    mode: str = "affine"
    group_size: int = 64
    bits: int = 4
    global_scale: Tensor | None = None

    @property
    def columns(self) -> int:
        """K: the unpacked row length."""
        return self.weight.shape[-1] * 32 // self.bits


def _format(op: str, mode: str, group_size: int | None, bits: int | None) -> tuple[int, int]:
    """The format's group size and bits (the mode's defaults where None), checked."""
    check(isinstance(mode, str) and mode in MODES, op, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    expected_group, expected_bits = DEFAULTS[mode]
    group_size = expected_group if group_size is None else group_size
    bits = expected_bits if bits is None else bits
    if mode == "affine":
        check(group_size in GROUP_SIZES, op, f"group_size must be 32, 64 or 128, got {group_size}")
        check(bits in BITS, op, f"bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    else:
        check(group_size == expected_group, op, f"{mode} quantization requires group size {expected_group} but got {group_size}")
        check(bits == expected_bits, op, f"{mode} quantization requires bits to be {expected_bits} but got {bits}")
    return group_size, bits


def check_global_scale(op: str, mode: str, global_scale: Tensor | None, entries: int = 1) -> None:
    """nvfp4's global scale: float32, `entries` values (one, or one per expert of a gather)."""
    if global_scale is None: return
    check(mode == "nvfp4", op, f"Global scale is only supported for 'nvfp4' quantization, not {mode!r}")
    check_tensor(op, "global_scale", global_scale)
    if global_scale.dtype != dtypes.float32:
        raise TypeError(f"{op}: the global scale must be float32 (dtype float32), got {global_scale.dtype}")
    what = "must have one element" if entries == 1 else f"needs one entry per expert ({entries})"
    check(global_scale.numel() == entries, op, f"the global scale {what}, got shape {tuple(global_scale.shape)}")


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Codes `[..., K]` (below 2^bits) as one LSB-first bit stream per row in uint32 words
    `[..., K * bits / 32]` (K * bits must be a multiple of 32)."""
    *lead, columns = codes.shape
    stream = (codes.cast(dtypes.uint8).unsqueeze(-1) >> Tensor.arange(bits, dtype=dtypes.uint8)) & 1
    stream = stream.reshape(*lead, columns * bits // 8, 8)
    # The stream's bytes, read four at a time as little-endian words (every tinygrad device's
    # order): a sum of eight terms compiles far faster than one of 32.
    stream_bytes = (stream << Tensor.arange(8, dtype=dtypes.uint8)).sum(-1, dtype=dtypes.uint8)
    return stream_bytes.contiguous().bitcast(dtypes.uint32)


def unpack_codes(words: Tensor, bits: int) -> Tensor:
    """The inverse of `pack_codes`: uint32 words `[..., W]` to codes `[..., W * 32 / bits]` (uint32)."""
    *lead, count = words.shape
    stream = (words.cast(dtypes.uint32).unsqueeze(-1) >> Tensor.arange(32, dtype=dtypes.uint32)) & 1
    stream = stream.reshape(*lead, count * 32 // bits, bits)
    return (stream << Tensor.arange(bits, dtype=dtypes.uint32)).sum(-1, dtype=dtypes.uint32)


def quantize(w: Tensor, group_size: int | None = None, bits: int | None = None, mode: str = "affine", *,
             global_scale: Tensor | None = None) -> QuantizedWeight:
    """Quantize `w` `[..., N, K]` (a float dtype, K a multiple of the group size) row-group-wise.

    group_size, bits: default to the mode's (affine 64 and 4; mxfp4 32 and 4; mxfp8 32 and 8;
    nvfp4 16 and 4), which the floating-point modes also require. global_scale: nvfp4 only, a
    float32 tensor of one element. Returns a `QuantizedWeight`: packed uint32 codes; affine scales
    and biases in w's dtype, floating-point modes uint8 scale codes and no biases.
    """
    op = "quantize"
    group_size, bits = _format(op, mode, group_size, bits)
    check_tensor(op, "w", w)
    check_floating(op, "w", w.dtype)
    check(mode == "affine" or w.dtype != dtypes.float64, op, f"{mode} takes float32, float16 or bfloat16 weights, not float64")
    check_global_scale(op, mode, global_scale)
    check(w.ndim >= 2, op, f"w must have at least 2 dimensions, got shape {tuple(w.shape)}")
    check(w.shape[-1] % group_size == 0, op,
          f"the last dimension ({w.shape[-1]}) must be a multiple of the group size {group_size}")
    kernels.composition(op, f"{tuple(w.shape)} {mode} {bits}-bit on {w.device}")
    *lead, columns = w.shape
    if mode != "affine":
        groups = w.reshape(*lead, columns // group_size, group_size)
        scale = None if global_scale is None else global_scale.reshape(())
        codes, scale_codes = floating.quantize_groups(groups, mode, scale)
        packed = pack_codes(codes.reshape(*lead, columns), bits)
        return QuantizedWeight(packed, scale_codes.cast(dtypes.uint8), None, mode, group_size, bits, global_scale)
    groups = w.cast(dtypes.float32).reshape(*lead, columns // group_size, group_size)
    # Stored once each, the group extremes and then the group rule's scales and biases, so that no
    # later kernel repeats a reduction or a division (per element, or per bit of a code).
    top, bottom = groups.max(-1, keepdim=True).cat(groups.min(-1, keepdim=True), dim=-1).contiguous().split(1, dim=-1)
    levels = 2 ** bits - 1
    # Every quotient is MLX's float32 division, rounded once (`exact.divide`), before it is rounded
    # to an integer as C's rint does (`exact.rint`) or stored.
    scale = exact.divide(top - bottom, levels).maximum(1e-7)
    if bits == 1:  # MLX's one-bit rule: the group's minimum and its range
        bias = bottom
    else:
        low_end = exact.absolute(bottom) > exact.absolute(top)
        scale = low_end.where(scale, -scale)
        edge = low_end.where(bottom, top)
        first = exact.rint(exact.divide(edge, scale))
        snapped = first == 0
        scale = snapped.where(scale, exact.divide(edge, first))
        bias = snapped.where(0.0, edge)
    scale, bias = scale.cat(bias, dim=-1).contiguous().split(1, dim=-1)
    # Clipped to a byte here and to the width when packed: one codes kernel for every width.
    codes = exact.rint(exact.divide(groups - bias, scale)).clip(0, 255).cast(dtypes.uint8).contiguous()
    packed = pack_codes(codes.reshape(*lead, columns).minimum(levels), bits)
    # Stored (tinygrad would fold a later cast back to float32 into this one and keep the unrounded value).
    scale, bias = (floating.rounded_to(x.squeeze(-1), w.dtype) for x in (scale, bias))
    return QuantizedWeight(packed, scale, bias, mode, group_size, bits)


def check_weight(op: str, qw: QuantizedWeight) -> None:
    """Check that `qw` is a well-formed `QuantizedWeight` (format, dtypes, shapes of its parts)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{op}: expected a QuantizedWeight, got {type(qw).__name__}")
    _format(op, qw.mode, qw.group_size, qw.bits)
    check_global_scale(op, qw.mode, qw.global_scale)
    check_tensor(op, "weight", qw.weight)
    check_tensor(op, "scales", qw.scales)
    if qw.weight.dtype != dtypes.uint32:
        raise TypeError(f"{op}: the packed weight must be uint32, got {qw.weight.dtype}")
    if qw.mode == "affine":
        check_floating(op, "scales", qw.scales.dtype)
        check(qw.biases is not None, op, "biases must be provided for affine quantization")
        check_tensor(op, "biases", qw.biases)
        check_floating(op, "biases", qw.biases.dtype)
    else:
        check(qw.biases is None, op, f"biases must be null for {qw.mode} quantization")
        if qw.scales.dtype != dtypes.uint8:
            raise TypeError(f"{op}: the scale type must be uint8 for {qw.mode} quantization, got {qw.scales.dtype}")
    check(qw.weight.ndim >= 2, op, f"the packed weight must have at least 2 dimensions, got {tuple(qw.weight.shape)}")
    expected = (*qw.weight.shape[:-1], qw.weight.shape[-1] * 32 // qw.bits // qw.group_size)
    given = [tuple(qw.scales.shape)] + ([tuple(qw.biases.shape)] if qw.biases is not None else [])
    check(qw.weight.shape[-1] * 32 % (qw.bits * qw.group_size) == 0 and all(g == expected for g in given), op,
          f"scales{' and biases' if qw.biases is not None else ''} must be {expected} for a packed weight "
          f"{tuple(qw.weight.shape)} with group size {qw.group_size} and {qw.bits} bits, got {', '.join(map(str, given))}")


def dense_weights(qw: QuantizedWeight, dtype: DType, global_scale: Tensor | None = None) -> Tensor:
    """The weights `[..., N, K]` in `dtype` (computed in float32, rounded once to `dtype`).
    global_scale: nvfp4's, broadcastable to the scales `[..., N, K / group]` (default: qw's own)."""
    codes = unpack_codes(qw.weight, qw.bits)
    *lead, columns = codes.shape
    grouped = codes.reshape(*lead, columns // qw.group_size, qw.group_size)
    if qw.mode != "affine":
        if global_scale is None and qw.global_scale is not None: global_scale = qw.global_scale.reshape(())
        return floating.dequantize_groups(grouped, qw.scales, qw.mode, global_scale, dtype).reshape(*lead, columns).cast(dtype)
    scales = qw.scales.cast(dtype).cast(dtypes.float32).unsqueeze(-1)
    biases = qw.biases.cast(dtype).cast(dtypes.float32).unsqueeze(-1)
    return (grouped.cast(dtypes.float32) * scales + biases).reshape(*lead, columns).cast(dtype)


def dequantize(qw: QuantizedWeight, dtype: DType | None = None) -> Tensor:
    """The dense weights `[..., N, K]` of `qw`, in `dtype` (default: the scales' dtype; bfloat16
    for the floating-point modes, as MLX)."""
    op = "dequantize"
    check_weight(op, qw)
    if dtype is not None: check_floating(op, "dtype", dtype)
    dtype = dtype or (qw.scales.dtype if qw.mode == "affine" else dtypes.bfloat16)
    rows, k = math.prod(qw.weight.shape[:-1]), qw.columns
    backend = kernels.choose(op, f"{qw.mode} {qw.bits}-bit {tuple(qw.weight.shape)} into {dtype_name(dtype)} on {qw.weight.device}",
                             qw.weight.device, "dequantize", lambda backend: _dequantize_unsupported(qw, dtype, rows, k))
    if backend is None: return dense_weights(qw, dtype)
    return qmv_kernel.dequantize(qw.weight, qw.scales, qw.biases, mode=qw.mode, group_size=qw.group_size, bits=qw.bits,
                                 out_dtype=dtype, backend=backend, composition=_dense_rows(qw, dtype))


def _dequantize_unsupported(qw: QuantizedWeight, dtype: DType, rows: int, k: int) -> str | None:
    """Why `dequantize` runs its composition on the weights' device (None where the kernel takes
    it): a global scale, or affine scales of a dtype other than the result's (the composition
    rounds them to it first), beside the kernel's own reasons."""
    if qw.global_scale is not None: return "a global scale"
    if qw.mode == "affine" and qw.scales.dtype != dtype:
        return f"{dtype_name(qw.scales.dtype)} scales into {dtype_name(dtype)} (the kernel reads the scales as they are)"
    return qmv_kernel.dequantize_unsupported(qw.scales.dtype, dtype, rows, k, kernels.target(qw.weight.device))


def quantized_matmul(x: Tensor, qw: QuantizedWeight, transpose: bool = True) -> Tensor:
    """`x · wᵀ` (`transpose`, w `[..., N, K]`) or `x · w` (w `[..., K, N]`) for quantized `w`.

    x: `[..., M, K]` or `[K]`; batch axes broadcast (weights with batch axes run as `gather_qmm`'s
    entries, one a pair of batches). Returns `promote(x, scales)` (affine) or x's dtype
    (floating-point modes). Gradients reach x and, for affine weights, the scales and the
    biases (codes, uint8 scales and the global scale are not differentiable). As in MLX, weights
    with a global scale are for `dequantize` only.
    """
    op = "quantized_matmul"
    check_tensor(op, "x", x)
    check_floating(op, "x", x.dtype)
    check_weight(op, qw)
    check(qw.mode == "affine" or x.dtype != dtypes.float64, op,
          f"{qw.mode} weights take float32, float16 or bfloat16 activations, not float64")
    check(qw.global_scale is None, op, "a global scale is not supported (dequantize the weights instead)")
    rows, columns = qw.weight.shape[-2], qw.columns
    inner = columns if transpose else rows
    check(x.ndim >= 1 and x.shape[-1] == inner, op,
          f"x's last dimension must be {inner} for weights of {rows} x {columns} "
          f"({'transposed' if transpose else 'not transposed'}), got shape {tuple(x.shape)}")
    if qw.weight.ndim > 2:   # weight batches: each pair of batches one of gather_qmm's entries (its kernels)
        from .gather import batched_quantized_matmul   # gather.py builds on this module
        return batched_quantized_matmul(x, qw, transpose)
    dtype = promote_types(x.dtype, qw.scales.dtype) if qw.mode == "affine" else x.dtype
    rows_of_x = math.prod(x.shape[:-1])
    outputs = rows if transpose else columns
    kernel, reason = qmv_kernel.product_route(dtype, qw.scales.dtype, dtype, rows_of_x, inner, outputs, bits=qw.bits, mode=qw.mode,
                                              transpose=transpose, batched=False, target=kernels.target(x.device))
    backend = kernels.choose(op, f"{tuple(x.shape)} x {qw.mode} {qw.bits}-bit {tuple(qw.weight.shape)} on {x.device}",
                             x.device, kernel, lambda backend: reason)
    if backend is not None and kernel == "qmm_dequantized":   # fast.linear's gemm_wgmma over the dequantized rows
        dense = qmv_kernel.dequantize(qw.weight, qw.scales, qw.biases, mode=qw.mode, group_size=qw.group_size, bits=qw.bits,
                                      out_dtype=dtype, backend=backend, composition=_dense_rows(qw, dtype))
        return linear(x.cast(dtype), dense if transpose else dense.T)   # untransposed: w [K, N], linear's w [N, K]
    if backend is not None:
        launch = {"qmv": qmv_kernel.qmv, "qmv_mma": qmv_kernel.qmv_mma, "qvm": qmv_kernel.qvm, "qmm": qmv_kernel.qmm}[kernel]
        out = launch(x.cast(dtype).reshape(rows_of_x, inner), qw.weight, qw.scales, qw.biases, mode=qw.mode,
                     group_size=qw.group_size, bits=qw.bits, out_dtype=dtype, backend=backend,
                     composition=_dense_product(qw, dtype, transpose))
        return out.reshape(*x.shape[:-1], outputs)
    dense = dense_weights(qw, dtype)
    return x.cast(dtype) @ (dense.transpose(-1, -2) if transpose else dense)


def _activated(gate_up: Tensor) -> Tensor:
    """`silu(gate) * up` of a gated MLP's `[..., 2K]` projection (gate, then up), in its dtype: what
    swiglu_matmul multiplies (the models' `layers.swiglu` over the halves)."""
    k = gate_up.shape[-1] // 2
    return gate_up[..., :k].silu() * gate_up[..., k:]


def swiglu_matmul(gate_up: Tensor, qw: QuantizedWeight | Tensor) -> Tensor:
    """`(silu(gate) * up) · wᵀ`, a gated MLP's down projection after its activation.

    gate_up: `[..., 2K]`, the gate's K values, then the up's, float16, bfloat16 or float32; qw:
    quantized `[N, K]` without a global scale, or a dense weight `[N, K]`. Returns `[..., N]` as
    `quantized_matmul(silu(gate) * up, qw)` (or `fast.linear(silu(gate) * up, w)`) would (its dtype
    and values: the activation computed in gate_up's dtype). On METAL and CUDA up to 8 rows run
    qmv (dense: gemv) with the activation computed in its loads of x (the MLP's activation is no
    kernel of its own) where gate_up's dtype is the product's (dense: any) and K a multiple of 8
    (dense: any); otherwise the activation, then the product. Gradients as the product's.
    """
    op = "swiglu_matmul"
    check_tensor(op, "gate_up", gate_up)
    check_floating(op, "gate_up", gate_up.dtype)
    if isinstance(qw, Tensor): return _swiglu_linear(op, gate_up, qw)
    check_weight(op, qw)
    check(qw.global_scale is None, op, "a global scale is not supported (dequantize the weights instead)")
    k, n = qw.columns, qw.weight.shape[-2]
    check(gate_up.ndim >= 1 and gate_up.shape[-1] == 2 * k, op,
          f"gate_up's last dimension must be 2 x {k} (gate and up) for weights of {n} x {k}, got {tuple(gate_up.shape)}")
    dtype = promote_types(gate_up.dtype, qw.scales.dtype) if qw.mode == "affine" else gate_up.dtype
    rows = math.prod(gate_up.shape[:-1])
    kernel, reason = qmv_kernel.product_route(dtype, qw.scales.dtype, dtype, rows, k, n, bits=qw.bits, mode=qw.mode, transpose=True,
                                              batched=qw.weight.ndim != 2, target=kernels.target(gate_up.device))
    if reason is None and kernel == "qmv_mma": reason = f"{rows} rows of 16-bit x (qmv_mma's, without the fused activation)"
    if reason is None and kernel != "qmv": reason = f"{rows} rows (the fused activation is qmv's, at most {qmv_kernel.MAX_ROWS})"
    if reason is None and dtype != gate_up.dtype: reason = f"{gate_up.dtype} gate_up against {dtype} scales"
    if reason is None and k % 8: reason = f"K = {k} (the up half's loads need a multiple of 8)"
    backend = kernels.choose(op, f"{tuple(gate_up.shape)} x {qw.mode} {qw.bits}-bit {tuple(qw.weight.shape)} on "
                                 f"{gate_up.device}", gate_up.device, "qmv", lambda backend: reason)
    if backend is None: return quantized_matmul(_activated(gate_up), qw)
    dense_product = _dense_product(qw, dtype, True)
    out = qmv_kernel.qmv(gate_up.reshape(rows, 2 * k), qw.weight, qw.scales, qw.biases, mode=qw.mode,
                         group_size=qw.group_size, bits=qw.bits, out_dtype=dtype, backend=backend, glu=True,
                         composition=lambda x, weight, scales, biases: dense_product(_activated(x), weight, scales, biases))
    return out.reshape(*gate_up.shape[:-1], n)


def _swiglu_linear(op: str, gate_up: Tensor, w: Tensor) -> Tensor:
    """swiglu_matmul of a dense weight `[N, K]`: gemv with the activation in its loads, else
    `fast.linear` of the activation."""
    check_floating(op, "w", w.dtype)
    check(w.ndim == 2 and gate_up.ndim >= 1 and gate_up.shape[-1] == 2 * w.shape[1], op,
          f"gate_up's last dimension must be 2 x K (gate and up) for w [N, K] of shape {tuple(w.shape)}, got {tuple(gate_up.shape)}")
    n, k = w.shape
    dtype = promote_types(gate_up.dtype, w.dtype)
    rows = math.prod(gate_up.shape[:-1]) if all(isinstance(size, int) for size in gate_up.shape) else 0
    kernel, reason = linear_kernels.route(gate_up.dtype, w.dtype, None, dtype, rows, k, n, kernels.target(gate_up.device))
    if reason is None and kernel != "gemv": reason = f"{rows} rows (the fused activation is gemv's, at most {linear_kernels.MAX_ROWS})"
    backend = kernels.choose(op, f"{tuple(gate_up.shape)} x {tuple(w.shape)} on {gate_up.device}", gate_up.device, "gemv",
                             lambda backend: reason)
    if backend is None: return linear(_activated(gate_up), w)
    out = linear_kernels.gemv(gate_up.reshape(rows, 2 * k), w, None, out_dtype=dtype, backend=backend, glu=True,
                              composition=lambda x, w, bias: (_activated(x).cast(dtype) @ w.cast(dtype).T))
    return out.reshape(*gate_up.shape[:-1], n)


def _dense_rows(qw: QuantizedWeight, dtype: DType):
    """`(weight, scales, biases) -> w` in `dtype` through the composition: the dequantize kernel's
    backward."""
    return lambda weight, scales, biases: dense_weights(QuantizedWeight(weight, scales, biases, qw.mode, qw.group_size, qw.bits),
                                                        dtype)


def _dense_product(qw: QuantizedWeight, dtype: DType, transpose: bool):
    """`(x, weight, scales, biases) -> x · w(ᵀ)` through the dense weights, as the composition."""
    def product(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None) -> Tensor:
        dense = dense_weights(QuantizedWeight(weight, scales, biases, qw.mode, qw.group_size, qw.bits), dtype)
        return x @ (dense.transpose(-1, -2) if transpose else dense)
    return product
