"""Quantized weights and the products over them: MLX's affine, mxfp4, mxfp8 and nvfp4 formats
(quantize, dequantize, quantized_matmul; swiglu_matmul, a gated MLP's down projection with its
activation) and the gathered products of mixture-of-experts layers
(gather_qmm, gather_mm), as compositions; on METAL and CUDA the products run the qmv, qvm and qmm
kernels where `nuvec_tg.kernels.quant` says they apply."""
from .affine import DEFAULTS, MODES, QuantizedWeight, dequantize, quantize, quantized_matmul, swiglu_matmul
from .gather import gather_mm, gather_qmm

__all__ = ["QuantizedWeight", "quantize", "dequantize", "quantized_matmul", "swiglu_matmul", "gather_mm", "gather_qmm",
           "MODES", "DEFAULTS"]
