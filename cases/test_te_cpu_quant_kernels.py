"""te-cpu's quantization numerics (``harness/backends/te_cpu/quant``) against hand-computed values.

In-process: the numerics modules import only torch and each other, so they are loaded by path
as a stand-alone package (importing ``harness.backends.te_cpu.backend`` would patch torch and import TE; this
process never does). Every expected value below is written out from the format's or recipe's
definition (TE's ``common/recipe/*.cu``, ``util/ptx_arch_spec.cuh``, the FP8 formats), not
computed by the code under test; the exhaustive FP8 checks compare with a reference rounding
written here in plain Python.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from fixtures.quant_numerics import load

formats = load("formats")
scaling = load("scaling")
swizzle = load("swizzle")
mxfp8 = load("mxfp8")
blockwise = load("blockwise")
per_tensor = load("per_tensor")
qgemm = load("qgemm")
nvfp4 = load("nvfp4")


# ---- FP8: a reference rounding in plain Python ----------------------------------------------
def _fp8_values(exp_bits: int, man_bits: int, bias: int, e4m3: bool) -> list[float]:
    """Every finite non-negative value of the format, ascending."""
    vals = []
    for e in range(2 ** exp_bits):
        for m in range(2 ** man_bits):
            if e4m3 and e == 2 ** exp_bits - 1 and m == 2 ** man_bits - 1:
                continue  # E4M3's NaN
            if not e4m3 and e == 2 ** exp_bits - 1:
                continue  # E5M2's inf / NaN
            if e == 0:
                vals.append(m / 2 ** man_bits * 2.0 ** (1 - bias))
            else:
                vals.append((1 + m / 2 ** man_bits) * 2.0 ** (e - bias))
    return vals


E4M3_GRID = _fp8_values(4, 3, 7, True)
E5M2_GRID = _fp8_values(5, 2, 15, False)


def _round_ref(x: float, grid: list[float]) -> float:
    """Round-to-nearest-even onto ``grid`` with saturation (SATFINITE)."""
    if math.isnan(x):
        return x
    sign = -1.0 if math.copysign(1.0, x) < 0 else 1.0
    a = abs(x)
    if a >= grid[-1]:
        return sign * grid[-1]
    for i in range(len(grid) - 1):
        lo, hi = grid[i], grid[i + 1]
        if lo <= a <= hi:
            if a - lo < hi - a:
                return sign * lo
            if hi - a < a - lo:
                return sign * hi
            return sign * (lo if i % 2 == 0 else hi)  # tie: the even code (grid index parity)
    raise AssertionError(a)


@pytest.mark.parametrize("fmt_name, grid", [("e4m3", E4M3_GRID), ("e5m2", E5M2_GRID)])
def test_fp8_cast_matches_reference_rounding_everywhere(fmt_name: str, grid: list[float]) -> None:
    """Every grid value, every midpoint (ties to even), points just around midpoints, values
    past the largest finite one, infinities: saturating round-to-nearest-even."""
    fmt = formats.FP8_FORMATS[fmt_name]
    probes = list(grid)
    for lo, hi in zip(grid, grid[1:]):
        mid = (lo + hi) / 2
        probes += [mid, math.nextafter(mid, 0.0), math.nextafter(mid, math.inf)]
    probes += [grid[-1] * 1.03, grid[-1] * 2, 1e30, math.inf]
    probes = [float(torch.tensor(p, dtype=torch.float32)) for p in probes]  # as fp32 inputs
    x = torch.tensor(probes + [-p for p in probes], dtype=torch.float32)
    got = fmt.decode(fmt.encode(x)).tolist()
    want = [_round_ref(p, grid) for p in x.tolist()]
    bad = [(p, g, w) for p, g, w in zip(x.tolist(), got, want) if g != w]
    assert not bad, bad[:10]


def test_fp8_hand_values() -> None:
    """A few bit patterns written out: saturation, subnormals, ties, NaN, signed zero."""
    e4m3, e5m2 = formats.E4M3, formats.E5M2
    x = torch.tensor([448.0, 464.0, 500.0, float("inf"), -float("inf"), 2.0 ** -9, 2.0 ** -10,
                      1.5 * 2.0 ** -10, 2.0 ** -6 * 1.0625, -0.0, float("nan")])
    # 448 = 0x7E (max); 464 (midpoint to the NaN code) saturates; 2^-9 = 0x01 (min subnormal);
    # 2^-10 is the tie 0 / 2^-9 -> 0 (even); 1.5 * 2^-10 -> 2^-9; 2^-6 * 1.0625 is the tie between
    # 2^-6 (0x08, even) and 2^-6 * 1.125 (0x09) -> 0x08
    assert e4m3.encode(x).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00, 0x01, 0x08, 0x80, 0x7F]
    y = torch.tensor([57344.0, 61440.0, float("inf"), 2.0 ** -16, 2.0 ** -17, 1.25 * 2.0 ** -14])
    # 57344 = 0x7B (max); 61440 (midpoint to inf) saturates; 2^-16 = 0x01; 2^-17 tie -> 0;
    # 1.25 * 2^-14 = 0x05 exactly
    assert e5m2.encode(y).tolist() == [0x7B, 0x7B, 0x7B, 0x01, 0x00, 0x05]


# ---- E8M0 and E2M1 --------------------------------------------------------------------------
def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_e8m0_round_up_edges() -> None:
    """``float_to_e8m0``: powers of two exact, anything above rounds up, the 2^-127 boundary
    among subnormals, saturation at 254, NaN 255."""
    vals = [1.0, 1.5, 2.0, _f32(0x40000001), 0.0, _f32(0x00400000), _f32(0x00400001),
            _f32(0x00000001), 2.0 ** 127, 2.0 ** 127 * 1.5, float("inf"), float("nan")]
    want = [127, 128, 128, 129, 0, 0, 1, 0, 254, 254, 254, 255]
    assert formats.e8m0_round_up(torch.tensor(vals, dtype=torch.float32)).tolist() == want
    dec = formats.e8m0_decode(torch.tensor([0, 127, 254, 255], dtype=torch.uint8)).tolist()
    assert dec[:3] == [2.0 ** -127, 1.0, 2.0 ** 127] and math.isnan(dec[3])
    rcp = formats.e8m0_reciprocal(torch.tensor([0, 127, 254], dtype=torch.uint8)).tolist()
    assert rcp == [2.0 ** 127, 1.0, 2.0 ** -127]


def test_e2m1_ties_saturation_and_packing() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.1, -0.3, -6.0, 0.0, 2.9])
    # ties to the even code: 0.25->0 (0), 0.75->1.0 (2), 1.25->1.0 (2), 1.75->2.0 (4), 2.5->2.0 (4),
    # 3.5->4.0 (6), 5.0->4.0 (6); saturation 7, 100 -> 6.0 (7); sign kept: -0.1 -> -0 (8),
    # -0.3 -> -0.5 (9), -6 (15); 2.9 -> 3.0 (5)
    codes = formats.e2m1_encode(x)
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 9, 15, 0, 5]
    assert formats.e2m1_decode(codes).tolist() == [0, 1, 1, 2, 2, 4, 4, 6, 6, -0.0, -0.5, -6, 0, 3]
    packed = formats.pack_fp4(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8))
    assert packed.tolist() == [[0x21, 0x0F]]  # element 2i in the low nibble
    assert formats.unpack_fp4(packed).tolist() == [[1, 2, 15, 0]]


# ---- scale rules ----------------------------------------------------------------------------
def test_current_scaling_scale_rule() -> None:
    """``compute_scale_from_amax``: max / amax rounded once; 0, inf, NaN -> 1; an infinite
    scale -> fp32 max; power-of-two scales round down; the epsilon floor."""
    amax = torch.tensor([448.0, 3.0, 0.0, float("inf"), float("nan"), 1e-45, 2.0 ** -140], dtype=torch.float32)
    s = scaling.scale_from_amax(amax, 448.0, force_pow_2=False, epsilon=0.0)
    assert s.tolist()[:5] == [1.0, float(torch.tensor(448.0) / torch.tensor(3.0)), 1.0, 1.0, 1.0]
    assert s[5].item() == scaling.FP32_MAX and s[6].item() == scaling.FP32_MAX
    p = scaling.scale_from_amax(torch.tensor([3.0, 448.0, 1.0]), 448.0, force_pow_2=True, epsilon=0.0)
    assert p.tolist() == [128.0, 1.0, 256.0]  # 149.33 -> 128, 1 -> 1, 448 -> 256
    e = scaling.scale_from_amax(torch.tensor([0.0, 1e-3]), 448.0, force_pow_2=False, epsilon=0.5)
    assert e.tolist() == [896.0, 896.0]  # amax floored at epsilon before the 0 test
    big = scaling.scale_from_amax(torch.tensor([2.0 ** -140]), 448.0, force_pow_2=True, epsilon=0.0,
                                  value_for_inf=float(torch.finfo(torch.bfloat16).max))
    assert big.item() == 2.0 ** 127  # bf16's max, mantissa cleared


def test_delayed_scaling_history_and_scale() -> None:
    """``kernel_bulk``: the history rolls only when the newest amax is nonzero; "max" takes the
    rolled window; the margin; a zero or infinite amax keeps the previous scale."""
    hist = torch.tensor([[2.0, 0.0], [7.0, 0.0], [3.0, 0.0]])  # length 3, two scales
    scale = torch.tensor([1.0, 5.0])
    scaling.delayed_update(hist, scale, None, algo="max", scaled_max=scaling.delayed_scaled_max(448.0, 1))
    # scale 0: newest 2 -> window [7, 3, 2], row 0 zeroed: [[0], [3], [2]]; amax 7 -> 224 / 7 = 32
    # scale 1: newest 0 -> nothing rolls, scale kept
    assert hist.tolist() == [[0.0, 0.0], [3.0, 0.0], [2.0, 0.0]]
    assert scale.tolist() == [32.0, 5.0]
    hist2 = torch.tensor([[4.0], [100.0]])
    scale2 = torch.tensor([1.0])
    scaling.delayed_update(hist2, scale2, torch.tensor([8.0]), algo="most_recent", scaled_max=448.0)
    assert hist2.tolist() == [[0.0], [8.0]] and scale2.tolist() == [56.0]  # the buffer's 8 wins
    hist3, scale3 = torch.tensor([[float("inf")]]), torch.tensor([3.0])
    scaling.delayed_update(hist3, scale3, None, algo="most_recent", scaled_max=448.0)
    assert scale3.tolist() == [3.0]
    with pytest.raises(RuntimeError, match="Unsupported amax compute algorithm"):
        scaling.delayed_update(hist3, scale3, None, algo="mean", scaled_max=448.0)


def test_amax_ignores_nan_and_takes_magnitude() -> None:
    assert scaling.amax(torch.tensor([1.0, float("nan"), -3.5])).tolist() == [3.5]
    assert scaling.amax(torch.empty(0)).tolist() == [0.0]


# ---- block formats --------------------------------------------------------------------------
def test_mxfp8_block_hand_values() -> None:
    """One block of 32: amax 3 -> 3 / 448 rounds up to 2^-7 (E8M0 120); elements times 2^7."""
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 3.0, -1.0, 0.01
    data, exps = mxfp8.quantize_blocks(x, formats.E4M3)
    assert exps.tolist() == [[120]]
    assert formats.E4M3.decode(data)[0, :3].tolist() == [384.0, -128.0, 1.25]  # 1.28 -> 1.25
    back = mxfp8.decode_blocks(data, exps, formats.E4M3)
    assert back[0, :3].tolist() == [3.0, -1.0, 1.25 / 128]
    zero_data, zero_exp = mxfp8.quantize_blocks(torch.zeros(1, 32), formats.E4M3)
    assert zero_exp.tolist() == [[0]] and zero_data.abs().sum() == 0  # amax 0 -> E8M0 0 (2^-127)


def test_swizzle_layout_and_inverse() -> None:
    """Scale (r, c) of a 128x4 tile lands at (r % 32) * 16 + (r // 32) * 4 + c."""
    s = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    sw = swizzle.swizzle(s).reshape(-1)
    for r, c in [(0, 0), (1, 0), (33, 2), (127, 3), (130, 5), (255, 7)]:
        tile = (r // 128) * 2 + c // 4
        pos = tile * 512 + (r % 128 % 32) * 16 + (r % 128 // 32) * 4 + c % 4
        assert sw[pos].item() == s[r, c].item()
    assert torch.equal(swizzle.unswizzle(swizzle.swizzle(s)), s)
    col = torch.arange(4 * 128, dtype=torch.int32).reshape(4, 128)
    assert torch.equal(swizzle.unswizzle_columnwise(swizzle.swizzle_columnwise(col)), col)


class _Q:
    force_pow_2_scales = True
    amax_epsilon = 0.0


def test_blockwise_1d_and_2d_scales() -> None:
    """1D: one scale per 128 elements of a row; 2D: one per 128x128 tile; power-of-two scales
    (448 / amax rounded down), scale_inv their reciprocals."""
    x = torch.ones(2, 256)
    x[0, 5], x[1, 200] = 3.0, 0.5
    data, sinv = blockwise.quantize_1d(x, formats.E4M3, _Q(), torch.bfloat16)
    assert sinv.tolist() == [[1 / 128, 1 / 256], [1 / 256, 1 / 256]]  # 448/3 -> 128; 448/1 -> 256
    assert formats.E4M3.decode(data)[0, 5].item() == 384.0
    d2, s2 = blockwise.quantize_2d(x, formats.E4M3, _Q(), torch.bfloat16)
    assert s2.tolist() == [[1 / 128, 1 / 256]]


def _round32(v: float) -> float:
    """``v`` rounded to fp32 (plain Python, not the code under test)."""
    return struct.unpack("f", struct.pack("f", v))[0]


def test_nvfp4_two_level_hand_values() -> None:
    """NVFP4 worked by hand. Tensor amax 10.5: ``S_enc = 2688 / 10.5 = 256``, ``S_dec = 2^-8``.
    Block 0 (amax 10.5): ``10.5 * fp32(256 * fp32(1/6)) = 448.0000134`` -> fp32 448 -> E4M3 448;
    elements times ``fp32(1 / (448 * 2^-8)) = fp32(1/1.75)``: 10.5 -> 6, 1 -> 0.571 -> 0.5,
    -2 -> -1.143 -> -1, 0.4375 -> ``0.25000001118`` rounded to fp32 is 0.25, the tie between
    0 and 0.5 -> 0 (the even code), 2.625 -> 1.5.
    Block 1 (amax 0.65625): ``0.65625 * 42.666668 = 28.0000008`` -> fp32 28 -> E4M3 28; elements
    times ``fp32(256 / 28)``: 0.65625 -> 6, 7/128 -> fp32 0.5 -> 0.5, 7/64 -> 1."""
    x = torch.zeros(1, 32)
    x[0, :5] = torch.tensor([10.5, 1.0, -2.0, 0.4375, 2.625])
    x[0, 16:19] = torch.tensor([0.65625, 7 / 128, 7 / 64])
    assert _round32(10.5 * _round32(256 * _round32(1 / 6))) == 448.0 and _round32(0.65625 * _round32(256 * _round32(1 / 6))) == 28.0
    data, scales = nvfp4.quantize_rows(x, torch.tensor(10.5), tile=False)
    assert formats.E4M3.decode(scales).tolist() == [[448.0, 28.0]]
    codes = formats.e2m1_decode(formats.unpack_fp4(data))
    assert _round32(0.4375 * _round32(1 / 1.75)) == 0.25
    assert codes[0, :5].tolist() == [6.0, 0.5, -1.0, 0.0, 1.5] and codes[0, 5:16].abs().sum() == 0
    assert codes[0, 16:19].tolist() == [6.0, 0.5, 1.0] and codes[0, 19:].abs().sum() == 0
    assert nvfp4.decode_rows(data, scales)[0, :3].tolist() == [2688.0, 224.0, -448.0]
    # the GEMM's alpha: amax_A * amax_B * fp32(1 / (6 * 6 * 448 * 448)), fp32 left to right
    assert nvfp4.gemm_alpha(1.0, torch.tensor(10.5), torch.tensor(2.0)) == \
        _round32(_round32(10.5 * 2.0) * _round32(1 / 7225344))
    # a zero tensor: S_enc 1, scales 0, codes 0
    zd, zs = nvfp4.quantize_rows(torch.zeros(16, 16), torch.tensor(0.0), tile=True)
    assert zd.abs().sum() == 0 and zs.abs().sum() == 0


def test_nvfp4_tiles_share_one_scale_both_ways() -> None:
    """2-D (TE's weights): one E4M3 scale per 16x16 tile, the same for the row-wise data and the
    transpose's; 1-D blocks of a row see only their own 16 elements."""
    x = torch.ones(32, 32)
    x[3, 20] = 12.0  # tile (0, 1)
    amax = torch.tensor(12.0)
    _, s_rows = nvfp4.quantize_rows(x, amax, tile=True)
    _, s_cols = nvfp4.quantize_rows(x.t().contiguous(), amax, tile=True)
    tiles = formats.E4M3.decode(s_rows)
    assert torch.equal(tiles[::16], formats.E4M3.decode(s_cols)[::16].t())  # one row per tile
    assert tiles[:16, 1].unique().tolist() == [448.0] and tiles[:16, 0].unique().tolist() == [tiles[0, 0].item()]
    assert tiles[0, 0].item() < 448.0  # the tile without the 12 has its own, smaller scale
    _, s_1d = nvfp4.quantize_rows(x, amax, tile=False)
    assert formats.E4M3.decode(s_1d)[3, 1].item() == 448.0 and formats.E4M3.decode(s_1d)[4, 1].item() < 448.0
    assert nvfp4.scale_shape([32, 48], columnwise=False) == [128, 4]
    assert nvfp4.scale_shape([32, 48], columnwise=True) == [128, 4]
    with pytest.raises(RuntimeError, match="divisible by 16"):
        nvfp4.scale_shape([8, 32], columnwise=False)


# ---- the quantized GEMM ---------------------------------------------------------------------
def test_qgemm_per_tensor_factor_and_epilogue() -> None:
    """fp32 accumulation of exact products, the factors' product applied, bias in fp32, one
    rounding: against float64 of the same operands."""
    g = torch.Generator().manual_seed(0)
    a = formats.E4M3.decode(formats.E4M3.encode(torch.randn(8, 32, generator=g) * 50))
    b = formats.E4M3.decode(formats.E4M3.encode(torch.randn(4, 32, generator=g) * 50))
    fa, fb = torch.tensor(0.0123), torch.tensor(3.5)
    acc = qgemm.accumulate(qgemm.Operand(b, fb), qgemm.Operand(a, fa))
    bias = torch.randn(8, generator=g).to(torch.bfloat16)
    out = qgemm.epilogue(acc, out_shape=[4, 8], out_dtype=torch.bfloat16, out=None, alpha=1.0, beta=0.0, bias=bias)
    ref = (b.double() @ a.double().t()) * (float(fa) * float(fb)) + bias.double()
    # fp32 accumulation (32 terms) and the factor product, then one bf16 rounding
    bound = 40 * 2.0 ** -24 * ((b.double().abs() @ a.double().abs().t()) * abs(float(fa) * float(fb)) + bias.double().abs()) \
        + 2.0 ** -8 * ref.abs()
    assert ((out.double() - ref).abs() <= bound).all()


def test_qgemm_k_blocked_scales() -> None:
    """Block-scaled accumulation: each K block's partial sum times its scales."""
    a = torch.ones(2, 256)
    b = torch.ones(1, 256)
    a_sc = torch.tensor([[1.0, 2.0], [0.5, 0.25]])
    b_sc = torch.tensor([[4.0, 1.0]])
    acc = qgemm.accumulate(qgemm.Operand(b, torch.tensor(1.0), b_sc, 128), qgemm.Operand(a, torch.tensor(1.0), a_sc, 128))
    assert acc.tolist() == [[128 * (4 * 1 + 1 * 2), 128 * (4 * 0.5 + 1 * 0.25)]]


def test_per_tensor_cast_and_transpose() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 500.0, -7.0]])
    data = per_tensor.cast(x, torch.tensor(2.0), formats.E4M3)
    assert formats.E4M3.decode(data).tolist() == [[2.0, 4.0, 6.0], [8.0, 448.0, -14.0]]
    assert per_tensor.transpose_2d(data).tolist() == data.t().tolist()
    assert per_tensor.decode(data, torch.tensor(0.5), formats.E4M3).tolist() == [[1.0, 2.0, 3.0], [4.0, 224.0, -7.0]]
