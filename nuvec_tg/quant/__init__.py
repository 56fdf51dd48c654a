"""Quantized weights and the products over them: MLX's affine, mxfp4, mxfp8 and nvfp4 formats
(quantize, dequantize, quantized_matmul). gather_qmm, gather_mm and the qmv/qmm kernels have not
landed."""
from .affine import DEFAULTS, MODES, QuantizedWeight, dequantize, quantize, quantized_matmul

__all__ = ["QuantizedWeight", "quantize", "dequantize", "quantized_matmul", "MODES", "DEFAULTS"]
