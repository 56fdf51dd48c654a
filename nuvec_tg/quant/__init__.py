"""Quantized weights and the products over them. MLX's affine format is here (quantize,
dequantize, quantized_matmul); the floating-point modes (mxfp4, mxfp8, nvfp4), gather_qmm,
gather_mm and the qmv/qmm kernels have not landed."""
from .affine import QuantizedWeight, dequantize, quantize, quantized_matmul

__all__ = ["QuantizedWeight", "quantize", "dequantize", "quantized_matmul"]
