"""Quantized weights and the products over them (affine, mxfp4, mxfp8, nvfp4): not yet implemented."""
