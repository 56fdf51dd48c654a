"""nuvec_tg: the fused operations large language models spend their time in, for tinygrad.

`nuvec_tg.fast` holds the fused operations (norms, RoPE, softmax family, ...), `nuvec_tg.tensor`
what they share. Every operation is a composition of tinygrad Tensor operations, so it runs and
differentiates on any tinygrad device. Importing the package also lets tinygrad's CPU device find
a clang that knows `__bf16` when `CC` is unset (`nuvec_tg.compiler`).
"""
from . import compiler
from . import fast, quant, tensor

compiler.use_suitable_clang()
compiler.provide_bf16_truncation()

__version__ = "0.1.0"
__all__ = ["fast", "quant", "tensor", "__version__"]
