"""Hand-written Metal / CUDA programs and the mechanism that injects them into tinygrad's graph: not yet implemented."""
