"""The dequantize kernel (`src/dequantize.h`: `quant.dequantize`, and the first half of qmm's
dequantized route on Hopper) on the CPU from its CUDA rendering (`kernel_emulator`), against the
weights decoded in float64 numpy (`quant_reference.dequantized`): every affine width and group,
each floating-point mode, into each float dtype, batched weights, nvfp4's half chunk at K = 16 mod
32, rows longer than a threadgroup; every element written, nothing read or written outside the
buffers (the emulator's bounds check); and the route that picks it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from kernel_emulator import COMPILER, build
from nuvec_tg.kernels import Target
from nuvec_tg.kernels import linear
from nuvec_tg import quant
from nuvec_tg.kernels import quant as kernel
from quant_reference import dequantized
from reference import random
from test_qmv_emulated import as_float, emulated_qmm_wgmma, quantized, raw

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
# One rounding of the exact value to the destination (the kernel's fma rounds to float32 first)
ULP = {dtypes.float32: 2.0**-23, dtypes.float16: 2.0**-10, dtypes.bfloat16: 2.0**-7}

# (mode, group, bits, scales' and the result's dtype, weight shape [..., N, K])
CASES = [("affine", 32, bits, dtypes.bfloat16, (5, 96)) for bits in (2, 3, 5, 6)] + [
    ("affine", 64, 4, dtypes.bfloat16, (7, 256)), ("affine", 128, 8, dtypes.float16, (3, 384)),
    ("affine", 64, 4, dtypes.float32, (2, 3, 128)), ("mxfp4", 32, 4, dtypes.bfloat16, (6, 160)),
    ("mxfp8", 32, 8, dtypes.float16, (4, 64)), ("nvfp4", 16, 4, dtypes.float32, (5, 48)),
    ("nvfp4", 16, 4, dtypes.bfloat16, (2, 4, 80)), ("affine", 32, 1, dtypes.bfloat16, (3, 64)),
    # rows of more pieces than a threadgroup has threads: a row over several threadgroups (nvfp4: the half chunk in one)
    ("affine", 64, 4, dtypes.bfloat16, (3, 2112)), ("nvfp4", 16, 4, dtypes.float16, (2, 2064))]


def emulate(qw, dtype, edit=None, pieces=kernel.DEQUANTIZE_PIECES) -> np.ndarray:
    """The kernel's raw rows `[R, K]` in `dtype` (16-bit as uint16), launched as `quant.dequantize`
    launches it (`pieces` pieces a thread), over a result poisoned with NaN (an element it misses
    stays NaN)."""
    *lead, words = qw.weight.shape
    k, rows = words * 32 // qw.bits, int(np.prod(lead))
    program = kernel.dequantize_program("cuda", qw.scales.dtype, dtype, mode=qw.mode, group_size=qw.group_size,
                                        bits=qw.bits, k=k, pieces=pieces)
    if edit is not None: program = edit(program)
    y = np.full((rows, k), np.nan, np.float32) if dtype == dtypes.float32 else np.full((rows, k), 0x7FFF, np.uint16)
    buffers = [y, raw(qw.weight).reshape(rows, words), raw(qw.scales).reshape(rows, -1)]
    if qw.biases is not None: buffers.append(raw(qw.biases).reshape(rows, -1))
    groups = kernel.dequantize_groups(rows, k, pieces)
    build(program)(buffers + [np.array([rows, k, groups * kernel.DEQUANTIZE_THREADS], np.int32)], groups, kernel.DEQUANTIZE_THREADS)
    return y


@pytest.mark.parametrize("mode, group, bits, dtype, shape", CASES, ids=str)
def test_the_kernel_writes_each_weight_rounded_once(mode, group, bits, dtype, shape):
    rng = np.random.default_rng(7)
    qw = quantized(random(rng, shape, dtype, "CPU")[0], mode, group, bits)
    got = as_float(emulate(qw, dtype), dtype).reshape(shape)
    want = dequantized(qw)
    assert not np.isnan(got).any(), "an element was not written"
    np.testing.assert_array_less(np.abs(got - want), ULP[dtype] * np.abs(want) + 1e-30)


@pytest.mark.parametrize("pieces", [2, 4])
@pytest.mark.parametrize("case", [CASES[4], CASES[-2], CASES[-1], CASES[8]], ids=str)
def test_several_pieces_a_thread_write_the_same_weights(case, pieces):
    """More pieces a thread (the probe's sweep of `DEQUANTIZE_PIECES`): the same bits as a piece a
    thread, a grid's last pieces past the end doing nothing (nvfp4's half chunks among them)."""
    mode, group, bits, dtype, shape = case
    rng = np.random.default_rng(11)
    qw = quantized(random(rng, shape, dtype, "CPU")[0], mode, group, bits)
    np.testing.assert_array_equal(emulate(qw, dtype, pieces=pieces), emulate(qw, dtype, pieces=1))


@pytest.mark.parametrize("mode, magnitude", [("mxfp4", 2.0**118), ("mxfp4", 2.0**-130), ("mxfp8", 2.0**118)])
def test_extreme_scales_give_each_weight_rounded_once(mode, magnitude):
    """Weights near bfloat16's largest and smallest: e8m0 scales whose product with the codes'
    factor (2^14 for e2m1) would overflow a float32 (codes from 241), or whose weights are
    subnormal."""
    rng = np.random.default_rng(9)
    w = Tensor((rng.uniform(-1, 1, (4, 128)) * magnitude).astype(np.float32), device="CPU").cast(dtypes.bfloat16)
    qw = quantized(w, mode, 32, 4 if mode == "mxfp4" else 8)
    got = as_float(emulate(qw, dtypes.bfloat16), dtypes.bfloat16).reshape(4, 128)
    want = dequantized(qw)
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_less(np.abs(got - want), ULP[dtypes.bfloat16] * np.abs(want) + 2.0**-133)


def test_a_planted_fault_is_caught():
    """A chunk's last piece scaled with the previous group's scale: the comparison sees it."""
    qw = quantized(random(np.random.default_rng(8), (4, 128), dtypes.bfloat16, "CPU")[0], "affine", 32, 4)

    def fault(program):
        text = program.text.replace("scales[group]", "scales[group - (part[i] == 3 && group > 0)]")
        assert text != program.text
        return dataclasses.replace(program, text=text)
    faulty = as_float(emulate(qw, dtypes.bfloat16, edit=fault), dtypes.bfloat16).reshape(4, 128)
    assert np.abs(faulty - dequantized(qw)).max() > 0.01


@pytest.mark.parametrize("mode, group, bits, dtype", [("affine", 64, 4, dtypes.bfloat16), ("affine", 32, 3, dtypes.float16),
                                                     ("mxfp4", 32, 4, dtypes.bfloat16), ("nvfp4", 16, 4, dtypes.bfloat16)], ids=str)
def test_dequantized_rows_through_gemm_wgmma_give_qmm_wgmmas_bits(mode, group, bits, dtype):
    """The route's claim, in the emulator's warpgroup products: w dequantized, then gemm_wgmma over
    its rows, equals qmm_wgmma's product bit for bit (M 20, N 130: tiles with tails; K 192)."""
    rng = np.random.default_rng(9)
    rows, n, k = 20, 130, 192
    qw = quantized(random(rng, (n, k), dtype, "CPU")[0], mode, group, bits)
    x = raw(random(rng, (rows, k), dtype, "CPU")[0].realize())
    tiles = linear.wgmma_plan(rows, n)
    program = linear.wgmma_program(dtype, None, dtype, tiles=tiles)
    y = np.full((rows, n), 0xFFFF, np.uint16)
    groups, groups_y, _ = tiles.grid(rows, n)
    build(program)([y, x, emulate(qw, dtype), np.array([rows, n, k], np.int32)], groups, tiles.threads, groups_y)
    np.testing.assert_array_equal(y, emulated_qmm_wgmma(x, qw, dtype, kernel.qmm_wgmma_plan(rows, n)))


def test_the_route_dequantizes_from_its_rows_on_hopper_only():
    hopper, ampere = Target("cuda", warpgroups=True), Target("cuda")
    bf16 = dtypes.bfloat16
    route = lambda rows, k, target, n=14336, bits=4: kernel.product_route(bf16, bf16, bf16, rows, k, n, bits=bits, mode="affine",  # noqa: E731
                                                                          transpose=True, batched=False, target=target)
    assert route(kernel.DEQUANTIZED_ROWS, 4096, hopper, bits=3) == ("qmm_dequantized", None)
    assert route(kernel.DEQUANTIZED_ROWS - 1, 4096, hopper, bits=3) == ("qmm", None)
    # where qmm_wgmma_rs takes the format (affine 4-bit), from its own rows at every N
    assert kernel.takes_qmm_wgmma_rs("affine", 4) and not kernel.takes_qmm_wgmma_rs("affine", 3)
    for n in (14336, kernel.DEQUANTIZED_NARROW_N, 1000):
        assert route(kernel.DEQUANTIZED_RS_ROWS, 4096, hopper, n=n) == ("qmm_dequantized", None), n
        assert route(kernel.DEQUANTIZED_RS_ROWS - 1, 4096, hopper, n=n) == ("qmm", None), n
    # other formats at N up to DEQUANTIZED_NARROW_N from fewer rows
    narrow = lambda rows, n=kernel.DEQUANTIZED_NARROW_N: route(rows, 4096, hopper, n=n, bits=3)  # noqa: E731
    assert narrow(kernel.DEQUANTIZED_NARROW_ROWS) == ("qmm_dequantized", None)
    assert narrow(kernel.DEQUANTIZED_NARROW_ROWS - 1) == ("qmm", None)
    assert narrow(kernel.DEQUANTIZED_NARROW_ROWS, kernel.DEQUANTIZED_NARROW_N + 1) == ("qmm", None)
    # below the route, affine 4-bit runs qmm_wgmma_rs by its plan; qmm_wgmma_ws only where routed
    for rows, n in ((65, 14336), (512, 14336), (512, 4096), (128, 1000)):
        assert kernel.qmm_hopper_tiles(rows, n, 4, 132, k=4096) == kernel.qmm_wgmma_rs_plan(rows, n, 132), (rows, n)
    assert kernel.qmm_hopper_family(512, 4096, 3, 132, k=4096) == "nuvec_qmm_wgmma"
    assert kernel.qmm_hopper_family(512, 14336, 4, 132, mode="mxfp4", k=4096) == \
        ("nuvec_qmm_wgmma_ws" if kernel.takes_qmm_wgmma_ws("mxfp4", 4) else "nuvec_qmm_wgmma")
    assert route(4096, 4096 + 32, hopper) == ("qmm", None)  # K not whole steps of 64: qmm.h, as qmm_wgmma's rule
    assert route(4096, 4096, ampere) == ("qmm", None)
    # untransposed w [K, N]: past qvm's rows, dequantized on Hopper (no other kernel takes them)
    untransposed = lambda rows, target, x=bf16: kernel.product_route(x, bf16, x, rows, 4096, 14336, bits=4, mode="affine",  # noqa: E731
                                                                    transpose=False, batched=False, target=target)
    assert untransposed(kernel.MAX_ROWS, hopper) == ("qvm", None)
    assert untransposed(kernel.MAX_ROWS + 1, hopper) == ("qmm_dequantized", None)
    assert untransposed(kernel.MAX_ROWS + 1, ampere)[0] == "qmm" and untransposed(kernel.MAX_ROWS + 1, ampere)[1] is not None
    assert untransposed(kernel.MAX_ROWS + 1, hopper, dtypes.float32)[1] is not None   # 16-bit rows only, as qmm
    assert kernel.dequantize_unsupported(bf16, dtypes.float64, 4, 64, hopper) is not None
    assert kernel.dequantize_unsupported(bf16, bf16, 0, 64, hopper) == "an empty weight"


# The 16-bit types' stored mantissa bits, the bits of 1.0, and a bias far below a weight's ulp
# (bfloat16: 2^-40; half: its smallest subnormal, 2^-24)
PAIR_TYPES = {dtypes.bfloat16: (7, 0x3F80, 2.0 ** -40), dtypes.float16: (10, 0x3C00, 2.0 ** -24)}


def tie_case(mantissa_bits: int) -> tuple[int, float]:
    """A 4-bit code q and a scale s of a type with `mantissa_bits` stored bits whose product lies
    exactly halfway between two values of that type, the even one below: with a tiny positive bias,
    the weight rounded once is the value above, while the float32 fma (which drops the bias) then
    the rounding gives the one below."""
    for mantissa in range(2 ** mantissa_bits):
        s = 1 + mantissa / 2 ** mantissa_bits
        for q in range(1, 16):
            v = q * s
            units = v * 2.0 ** (mantissa_bits - np.floor(np.log2(v)))  # in ulps: a tie is a half, its floor even
            if units % 1 == 0.5 and np.floor(units) % 2 == 0: return q, s
    raise AssertionError("no tie")


@pytest.mark.parametrize("dtype", list(PAIR_TYPES), ids=str)
def test_every_kernel_rounds_a_4_bit_affine_weight_once_from_the_exact_value(dtype):
    """PAIRS: dequantize, qmm_wgmma, qmm_wgmma_rs (the few rows' too), qmm_wgmma_ws and qmv_mma all
    decode a weight at a rounding tie that a tiny bias breaks as the exact value does (one rounding,
    up), not as a float32 fma then the rounding would (down). x's one-hot rows pick each product's
    weights out, so y is w's columns."""
    mantissa_bits, one, bias = PAIR_TYPES[dtype]
    q, s = tie_case(mantissa_bits)
    n, k = 130, 64
    codes = np.zeros((n, k), np.uint32)
    codes[:, 1::3] = q
    words = (codes.reshape(n, k // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32)
    scales = Tensor(np.full((n, 1), s, np.float32), device="CPU").cast(dtype).contiguous().realize()
    biases = Tensor(np.full((n, 1), bias, np.float32), device="CPU").cast(dtype).contiguous().realize()
    assert as_float(raw(biases), dtype)[0, 0] == bias
    qw = quant.QuantizedWeight(Tensor(words, device="CPU").contiguous().realize(), scales, biases, "affine", 64, 4)
    above = q * s + 2.0 ** (np.floor(np.log2(q * s)) - mantissa_bits - 1)  # the tie plus half an ulp: the value above
    want = np.where(codes == q, above, bias)
    assert np.float32(q * s + bias) == q * s  # the float32 fma drops the bias: its rounding would take the even value below
    assert_every_kernel_writes(qw, dtype, want)


def assert_every_kernel_writes(qw, dtype, want: np.ndarray) -> None:
    """dequantize, qmm_wgmma, qmm_wgmma_rs (the few rows' too), qmm_wgmma_ws and qmv_mma each give
    exactly the weights `want` `[N, K]` of `qw` (x's one-hot rows pick each product's weights out,
    so y is w's columns)."""
    from test_qmv_mma_emulated import emulated_qmv_mma
    n, k = want.shape
    one = PAIR_TYPES[dtype][1]
    np.testing.assert_array_equal(as_float(emulate(qw, dtype), dtype), want, err_msg="dequantize")
    for rows, tiles in ((70, kernel.QMM_WGMMA_SMALL), (70, kernel.QMM_WGMMA_RS_SMALL), (70, kernel.QMM_WGMMA_WS_LARGE),
                        (13, kernel.few_rows_tiles(13, k, n))):
        picks = np.arange(rows) % k
        x = np.zeros((rows, k), np.uint16)
        x[np.arange(rows), picks] = one
        got = as_float(emulated_qmm_wgmma(x, qw, dtype, tiles), dtype)
        np.testing.assert_array_equal(got, want[:, picks].T, err_msg=str(tiles))
    x = np.zeros((2, k), np.uint16)
    x[0, 1], x[1, 2] = one, one
    got = as_float(emulated_qmv_mma(x, qw, dtype, dtype, kernel.QmvMmaPlan(2, 1)), dtype)
    np.testing.assert_array_equal(got, want[:, [1, 2]].T, err_msg="qmv_mma")


# e2m1's codes 0-15 as values (bit 3 the sign)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "general"])
def test_every_kernel_writes_each_mxfp4_weight_exactly_into_bfloat16(pairs, monkeypatch):
    """Every e2m1 code under e8m0 scales from 2^-127 (code 0, a bfloat16 subnormal, as is the
    weight 0.5 · 2^-127) up to those whose largest weights are bfloat16's largest powers of two:
    each weight is the exact product (it always fits a bfloat16), negative zeros included, in
    every kernel, with PAIRS (bfloat16 fmas) and without (float32 products); then the products
    that overflow to infinity, in the dequantization."""
    monkeypatch.setattr(kernel, "PAIR_DECODING", pairs)
    assert kernel._pairs(dtypes.bfloat16, dtypes.uint8, "mxfp4", 4) == int(pairs)
    n, k = 130, 64
    codes = np.arange(n * k, dtype=np.uint32).reshape(n, k) % 16
    scale_codes = np.concatenate([np.arange(0, 12), np.arange(113, 141), np.arange(240, 253)]).astype(np.uint8)
    scale_codes = np.resize(scale_codes, (n, k // 32))   # every code of the list, then again
    scale_codes[-1] = 252  # 6 · 2^125: bfloat16's range holds every weight

    def weights(scale_codes):
        words = (codes.reshape(n, k // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32)
        scales = Tensor(scale_codes, device="CPU").contiguous().realize()
        qw = quant.QuantizedWeight(Tensor(words, device="CPU").contiguous().realize(), scales, None, "mxfp4", 32, 4)
        exponents = np.repeat(scale_codes.astype(np.float64) - 127, 32, axis=1)
        return qw, E2M1[codes] * np.exp2(exponents)
    qw, want = weights(scale_codes)
    assert np.isfinite(want).all() and np.signbit(want).sum() == n * k // 2
    assert_every_kernel_writes(qw, dtypes.bfloat16, want)
    np.testing.assert_array_equal(np.signbit(as_float(emulate(qw, dtypes.bfloat16), dtypes.bfloat16)), np.signbit(want))
    scale_codes[:] = 254  # 2^127: weights from 2 up overflow
    qw, want = weights(scale_codes)
    with np.errstate(over="ignore"):
        want = want.astype(np.float32).astype(np.float64)  # the overflow: float32's and bfloat16's largest exponent is the same
    assert np.isinf(want).any()
    np.testing.assert_array_equal(as_float(emulate(qw, dtypes.bfloat16), dtypes.bfloat16), want, err_msg="overflow")


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes (bias 7, no infinities) as float64."""
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 7).astype(np.float64)
    return sign * np.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8) * np.exp2(exponent.astype(np.float64) - 7))


@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "general"])
@pytest.mark.parametrize("dtype", list(PAIR_TYPES), ids=str)
def test_every_kernel_writes_each_nvfp4_weight_exactly(dtype, pairs, monkeypatch):
    """Every e2m1 code under every e4m3 scale but NaN (subnormal, negative and zero scales among
    them): each weight is the exact product, which both 16-bit types hold, in every kernel, with
    PAIRS (fmas in x's type) and without (float32 products)."""
    monkeypatch.setattr(kernel, "PAIR_DECODING", pairs)
    assert kernel._pairs(dtype, dtypes.uint8, "nvfp4", 4) == int(pairs)
    n, k = 130, 64
    codes = np.arange(n * k, dtype=np.uint32).reshape(n, k) % 16
    scale_codes = np.resize(np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8), (n, k // 16))
    words = (codes.reshape(n, k // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32)
    qw = quant.QuantizedWeight(Tensor(words, device="CPU").contiguous().realize(),
                               Tensor(scale_codes, device="CPU").contiguous().realize(), None, "nvfp4", 16, 4)
    want = E2M1[codes] * np.repeat(e4m3_values(scale_codes), 16, axis=1)
    assert_every_kernel_writes(qw, dtype, want)
