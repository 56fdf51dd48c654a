"""nuvec_tg: the fused operations large language models spend their time in, for tinygrad.

`nuvec_tg.fast` holds the fused operations (norms, RoPE, softmax family, ...), `nuvec_tg.tensor`
what they share. Every operation is a composition of tinygrad Tensor operations, so it runs and
differentiates on any tinygrad device.
"""
from . import fast, quant, tensor

__version__ = "0.1.0"
__all__ = ["fast", "quant", "tensor", "__version__"]
