"""nuvec_tg.tensor: MLX's promotion, dtype classes, lowest finite values, broadcasting."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from nuvec_tg.tensor import (FLOAT_DTYPES, INTEGER_DTYPES, SUPPORTED_DTYPES, broadcast_shape, is_floating, is_integer,
                             lowest_finite, promote_types)

d = dtypes
# Rows of MLX's promotion table (mlx/dtype.cpp), for the dtypes tinygrad has.
PAIRS = [
    (d.bool, d.bool, d.bool), (d.bool, d.uint8, d.uint8), (d.bool, d.bfloat16, d.bfloat16),
    (d.uint8, d.int8, d.int16), (d.uint8, d.int16, d.int16), (d.uint16, d.int8, d.int32),
    (d.uint16, d.int32, d.int32), (d.uint32, d.int8, d.int64), (d.uint32, d.int64, d.int64),
    (d.uint64, d.int8, d.float32), (d.uint64, d.int64, d.float32), (d.uint64, d.uint8, d.uint64),
    (d.int8, d.int32, d.int32), (d.uint16, d.uint32, d.uint32),
    (d.int64, d.float16, d.float16), (d.uint64, d.bfloat16, d.bfloat16), (d.int32, d.float32, d.float32),
    (d.float16, d.bfloat16, d.float32), (d.float16, d.float32, d.float32), (d.bfloat16, d.float32, d.float32),
    (d.bfloat16, d.float64, d.float64), (d.float32, d.float64, d.float64), (d.float16, d.float16, d.float16),
]


@pytest.mark.parametrize("a, b, want", PAIRS, ids=str)
def test_promotion_follows_mlx(a, b, want):
    assert promote_types(a, b) == want
    assert promote_types(b, a) == want


def test_promotion_is_a_symmetric_total_function():
    for a in SUPPORTED_DTYPES:
        for b in SUPPORTED_DTYPES:
            assert promote_types(a, b) == promote_types(b, a) in SUPPORTED_DTYPES
    # Python-number tensors have tinygrad's weak dtypes, made concrete.
    assert promote_types(Tensor(3).dtype, d.int8) == d.int32
    assert promote_types(Tensor(1.5).dtype, d.float16) == d.float32
    with pytest.raises(TypeError, match="promote_types"):
        promote_types(d.fp8e4m3, d.float32)


def test_dtype_classes():
    assert all(is_floating(t) and not is_integer(t) for t in FLOAT_DTYPES)
    assert all(is_integer(t) and not is_floating(t) for t in INTEGER_DTYPES)
    assert not is_integer(d.bool) and not is_floating(d.bool)
    assert is_integer(Tensor(3).dtype) and is_floating(Tensor(1.5).dtype)


def test_lowest_finite_values():
    assert lowest_finite(d.float16) == float(np.finfo(np.float16).min)
    assert lowest_finite(d.float32) == float(np.finfo(np.float32).min)
    assert lowest_finite(d.float64) == float(np.finfo(np.float64).min)
    assert lowest_finite(d.bfloat16) == -(2 - 2**-7) * 2.0**127
    # Representable: casting it to the dtype keeps it finite and exact.
    for t in FLOAT_DTYPES:
        assert Tensor([lowest_finite(t)], device="CPU", dtype=d.float64).cast(t).cast(d.float64).item() == lowest_finite(t)
    with pytest.raises(TypeError):
        lowest_finite(d.int32)


def test_broadcast_shape():
    assert broadcast_shape("op", (3, 1, 5), (4, 1)) == (3, 4, 5)
    assert broadcast_shape("op", (), (2,)) == (2,)
    with pytest.raises(ValueError, match="^op: shapes"):
        broadcast_shape("op", (3,), (4,))
