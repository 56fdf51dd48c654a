"""The quantized matrix-vector kernel (`src/qmv.h`): `y = x · wᵀ` for up to 8 rows of x over
packed weights of any affine width or floating-point mode, float32 accumulation."""
from __future__ import annotations

import functools
import hashlib
import math

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from .program import Param, launch, prelude, specialise

WARPS, ROWS_PER_WARP = 2, 4   # SIMD groups per threadgroup, output columns per SIMD group
MAX_ROWS = 8                  # rows of x the kernel takes (more: the composition, until qmm lands)
# Consecutive k per lane, the same for any number of rows: a row's sum then runs in one order
# whatever rows it shares the call with, so each row gets the bits of a one-row product.
VALUES = 8
_CTYPES = {dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float"}
_MODES = {"affine": 0, "mxfp4": 1, "mxfp8": 2, "nvfp4": 3}


def supported(x_dtype: DType, scales_dtype: DType, out_dtype: DType, rows: int) -> bool:
    """Whether the kernel takes the call: half/bfloat/float activations and output, at most 8 rows."""
    return 0 < rows <= MAX_ROWS and x_dtype in _CTYPES and out_dtype in _CTYPES and (
        scales_dtype in _CTYPES or scales_dtype == dtypes.uint8)


@functools.lru_cache(maxsize=256)
def _int_buffer(device: str, values: tuple[int, ...]) -> Tensor:
    return Tensor(list(values), dtype=dtypes.int32, device=device).realize()


def qmv(x: Tensor, weight: Tensor, scales: Tensor, biases: Tensor | None, *, mode: str, group_size: int, bits: int,
        out_dtype: DType, backend: str, grad_fxn=None) -> Tensor:
    """`x [M, K] · wᵀ` for packed `weight [N, K * bits / 32]`, `scales` (and affine `biases`)
    `[N, K / group_size]`; returns `[M, N]` in `out_dtype`."""
    rows, k = x.shape
    n = weight.shape[0]
    defines = dict(TX=_CTYPES[x.dtype], TS=_CTYPES.get(scales.dtype, "uchar"), TY=_CTYPES[out_dtype], BITS=bits,
                   GROUP=group_size, VALUES=VALUES, XM=rows, WARPS=WARPS, ROWS_PER_WARP=ROWS_PER_WARP,
                   MODE=_MODES[mode])
    params = [Param("y", "out", defines["TY"]), Param("x", "in", defines["TX"]), Param("w", "in", "uint"),
              Param("scales", "in", defines["TS"])]
    ins = [x.contiguous(), weight.contiguous(), scales.contiguous()]
    if biases is not None:
        params.append(Param("biases", "in", defines["TS"]))
        ins.append(biases.contiguous())
    params.append(Param("ints", "in", "int"))
    ins.append(_int_buffer(x.device, (n, k, weight.shape[1])))
    text = specialise(backend, "nuvec_qmv", "qmv.h", defines, params)
    name = f"nuvec_qmv_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    y = Tensor.empty(rows, n, dtype=out_dtype, device=x.device)
    return launch(name, prelude(backend) + text.replace("nuvec_qmv(", f"{name}("), x.device, [y], ins, [],
                  (math.ceil(n / (WARPS * ROWS_PER_WARP)), 1, 1), (32 * WARPS, 1, 1), grad_fxn=grad_fxn,
                  label=f"{backend} qmv {mode} {bits}-bit g{group_size} M{rows}")[0]
