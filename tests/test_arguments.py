"""Bad arguments raise ValueError (shapes, values) or TypeError (dtypes, non-tensors) naming the
operation, before anything is built."""
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg import fast

x = Tensor.full((2, 4), 1.0, device="CPU")
x3 = Tensor.full((1, 2, 4), 1.0, device="CPU")
zero = Tensor(0, device="CPU", dtype=dtypes.int32)

CASES = [
    # The seeds' cases.
    (ValueError, "rms_norm", lambda: fast.rms_norm(Tensor(1.0, device="CPU"))),
    (ValueError, "rms_norm", lambda: fast.rms_norm(x, Tensor.ones(3, device="CPU"))),
    (TypeError, "layer_norm", lambda: fast.layer_norm(x.cast(dtypes.int32))),
    (ValueError, "rope", lambda: fast.rope(x, 4, offset=zero)),
    (ValueError, "rope", lambda: fast.rope(x3, 3, offset=zero)),
    (ValueError, "rope", lambda: fast.rope(x3, 4, base=None, offset=zero)),
    (TypeError, "rope", lambda: fast.rope(x3, 4, offset=Tensor(0.5, device="CPU"))),
    (ValueError, "cross_entropy", lambda: fast.cross_entropy(x, Tensor.zeros(3, device="CPU", dtype=dtypes.int32))),
    (TypeError, "cross_entropy", lambda: fast.cross_entropy(x, Tensor.zeros(2, device="CPU"))),
    # Norm parameters and options.
    (ValueError, "rms_norm", lambda: fast.rms_norm(x, Tensor.ones(1, 4, device="CPU"))),
    (TypeError, "rms_norm", lambda: fast.rms_norm(x, Tensor.ones(4, device="CPU", dtype=dtypes.int32).cast(dtypes.int32) > 0)),
    (TypeError, "rms_norm", lambda: fast.rms_norm(x.numpy())),
    (TypeError, "rms_norm", lambda: fast.rms_norm(x, None, "1e-5")),
    (ValueError, "rms_norm", lambda: fast.rms_norm(x, None, float("nan"))),
    (TypeError, "rms_norm", lambda: fast.rms_norm(x.cast(dtypes.int8))),
    (ValueError, "layer_norm", lambda: fast.layer_norm(x, None, Tensor.ones(5, device="CPU"))),
    (ValueError, "add_rms_norm", lambda: fast.add_rms_norm(x, Tensor.ones(3, device="CPU"))),
    (ValueError, "add_rms_norm", lambda: fast.add_rms_norm(x, x, Tensor.ones(2, device="CPU"))),
    (TypeError, "add_rms_norm", lambda: fast.add_rms_norm(x.cast(dtypes.int32), x.cast(dtypes.int32))),
    (ValueError, "residual_rms_norm", lambda: fast.residual_rms_norm(x, x, Tensor.ones(3, device="CPU"), 1e-5)),
    (ValueError, "residual_rms_norm", lambda: fast.residual_rms_norm(x, x, None, 1e-5)),
    (ValueError, "residual_rms_norm",
     lambda: fast.residual_rms_norm(x, x, Tensor.ones(4, device="CPU"), 1e-5, scale=Tensor.ones(2, device="CPU"))),
    (ValueError, "residual_rms_norm",
     lambda: fast.residual_rms_norm(x, x, Tensor.ones(4, device="CPU"), 1e-5, next=(Tensor.ones(5, device="CPU"), 1e-5))),
    (ValueError, "residual_rms_norm",
     lambda: fast.residual_rms_norm(x, x, Tensor.ones(4, device="CPU"), 1e-5, next=Tensor.ones(4, device="CPU"))),
    (ValueError, "residual_rms_norm", lambda: fast.residual_rms_norm(Tensor.ones(3, device="CPU"), x, Tensor.ones(4, device="CPU"), 1e-5)),
    # RoPE options.
    (ValueError, "rope", lambda: fast.rope(x3, 6, offset=zero)),
    (ValueError, "rope", lambda: fast.rope(x3, 0)),
    (TypeError, "rope", lambda: fast.rope(x3, 4.0)),
    (ValueError, "rope", lambda: fast.rope(x3, 4, freqs=Tensor.ones(2, device="CPU"))),
    (ValueError, "rope", lambda: fast.rope(x3, 4, base=None, freqs=Tensor.ones(3, device="CPU"))),
    (TypeError, "rope", lambda: fast.rope(x3, 4, base=None, freqs=Tensor.ones(2, device="CPU", dtype=dtypes.int32))),
    (ValueError, "rope", lambda: fast.rope(x3, 4, base=-2.0)),
    (ValueError, "rope", lambda: fast.rope(x3, 4, offset=Tensor.zeros(2, device="CPU", dtype=dtypes.int32))),
    (ValueError, "rope", lambda: fast.rope(x3, 4, offset=Tensor.zeros(1, 1, device="CPU", dtype=dtypes.int32))),
    (TypeError, "rope", lambda: fast.rope(x3, 4, offset=1.5)),
    (ValueError, "rope", lambda: fast.rope(x3, 4, offset=2**31 - 1)),
    (TypeError, "rope", lambda: fast.rope(x3.cast(dtypes.int32), 4)),
    # The softmax family.
    (ValueError, "softmax", lambda: fast.softmax(Tensor(1.0, device="CPU"))),
    (ValueError, "softmax", lambda: fast.softmax(x, 2)),
    (TypeError, "softmax", lambda: fast.softmax(x, 0.5)),
    (TypeError, "softmax", lambda: fast.softmax(x.cast(dtypes.int32))),
    (ValueError, "logsumexp", lambda: fast.logsumexp(x, -3)),
    (TypeError, "logsumexp", lambda: fast.logsumexp(x.cast(dtypes.uint8))),
    (ValueError, "cross_entropy", lambda: fast.cross_entropy(Tensor(1.0, device="CPU"), zero)),
    (TypeError, "cross_entropy", lambda: fast.cross_entropy(x.cast(dtypes.int32), Tensor.zeros(2, device="CPU", dtype=dtypes.int32))),
    # Dense products: w [N, K] against x [..., K], bias [N].
    (ValueError, "linear", lambda: fast.linear(x, Tensor.ones(3, 5, device="CPU"))),
    (ValueError, "linear", lambda: fast.linear(x, Tensor.ones(4, device="CPU"))),
    (ValueError, "linear", lambda: fast.linear(x, Tensor.ones(1, 3, 4, device="CPU"))),
    (ValueError, "linear", lambda: fast.linear(Tensor(1.0, device="CPU"), Tensor.ones(3, 1, device="CPU"))),
    (ValueError, "linear", lambda: fast.linear(x, Tensor.ones(3, 4, device="CPU"), Tensor.ones(4, device="CPU"))),
    (ValueError, "linear", lambda: fast.linear(x, Tensor.ones(3, 4, device="CPU"), Tensor.ones(1, 3, device="CPU"))),
    (TypeError, "linear", lambda: fast.linear(x.cast(dtypes.int32), Tensor.ones(3, 4, device="CPU"))),
    (TypeError, "linear", lambda: fast.linear(x, Tensor.ones(3, 4, device="CPU", dtype=dtypes.int8))),
    (TypeError, "linear", lambda: fast.linear(x, Tensor.ones(3, 4, device="CPU"), Tensor.ones(3, device="CPU") > 0)),
    (TypeError, "linear", lambda: fast.linear(x.numpy(), Tensor.ones(3, 4, device="CPU"))),
    (TypeError, "linear", lambda: fast.linear(x, Tensor.ones(3, 4, device="CPU"), [0.0, 1.0, 2.0])),
]


@pytest.mark.parametrize("error, op, call", CASES)
def test_invalid_arguments_are_rejected(error, op, call):
    with pytest.raises(error, match=f"^{op}: "):
        call()
