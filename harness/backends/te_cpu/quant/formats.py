"""Element formats of TE's recipes: FP8 (E4M3, E5M2), E8M0 block exponents, FP4 (E2M1).

TE stores quantized data as raw bytes (``torch.uint8``) and says which format they hold
(``tex.DType``); this module converts between those bytes and fp32.

FP8 casts: TE's kernels convert with ``static_cast<fp8e4m3>(float)`` / ``fp8e5m2``, the
``__nv_fp8_*`` constructors, which use ``__NV_SATFINITE``: round to nearest, ties to even;
a value beyond the largest finite one (an infinity included) becomes that largest finite
value with its sign; NaN stays NaN. torch's float8 conversion rounds to nearest-even too but
does not saturate, so values are clamped to the finite range first (clamping before rounding
gives the same result: anything beyond ``max`` rounds to ``max`` or overflows).

E8M0 (MXFP8's block scale): an 8-bit biased exponent, ``2^(e - 127)``; 255 is NaN.
``e8m0_round_up`` is TE's ``ptx::float_to_e8m0`` (``cvt.rp.satfinite.ue8m0x2.f32`` on
Blackwell, the same rule written out for other parts): the exponent of ``val`` rounded up to
the next power of two, saturating at 254.

E2M1 (NVFP4's element): values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; code = sign << 3 | index.
Two codes share a byte, element ``2i`` in the low nibble (TE's ``cast_to_fp4x2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 element format."""

    name: str  #: "e4m3" or "e5m2"
    torch_dtype: torch.dtype
    max: float  #: largest finite value

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (any float dtype, converted to fp32 first) as this format's bytes:
        saturating round-to-nearest-even (module docstring)."""
        x32 = x.to(torch.float32)
        return x32.clamp(-self.max, self.max).to(self.torch_dtype).view(torch.uint8)

    def decode(self, bits: torch.Tensor) -> torch.Tensor:
        """Bytes of this format as fp32 (exact: every FP8 value is an fp32 value)."""
        if bits.dtype != torch.uint8:
            raise TypeError(f"FP8 data must be uint8 bytes, got {bits.dtype}")
        return bits.view(self.torch_dtype).to(torch.float32)


E4M3 = Fp8Format("e4m3", torch.float8_e4m3fn, 448.0)
E5M2 = Fp8Format("e5m2", torch.float8_e5m2, 57344.0)
FP8_FORMATS = {"e4m3": E4M3, "e5m2": E5M2}

# ---- E8M0 -----------------------------------------------------------------------------------
E8M0_BIAS = 127
E8M0_NAN = 255


def e8m0_decode(bits: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes as fp32: ``2^(e - 127)`` (254 -> 2^127, 0 -> 2^-127, a subnormal), 255 -> NaN."""
    if bits.dtype != torch.uint8:
        raise TypeError(f"E8M0 scales must be uint8 bytes, got {bits.dtype}")
    e = bits.to(torch.int32)
    out = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - E8M0_BIAS)
    return torch.where(e == E8M0_NAN, torch.full_like(out, float("nan")), out)


def e8m0_reciprocal(bits: torch.Tensor) -> torch.Tensor:
    """``2^(127 - e)`` as fp32: TE's ``exp2f_rcp`` (the factor a value is multiplied by
    before the FP8 cast); 255 -> NaN."""
    e = bits.to(torch.int32)
    out = torch.ldexp(torch.ones_like(e, dtype=torch.float32), E8M0_BIAS - e)
    return torch.where(e == E8M0_NAN, torch.full_like(out, float("nan")), out)


def e8m0_round_up(val: torch.Tensor) -> torch.Tensor:
    """TE's ``float_to_e8m0``: fp32 ``val`` -> the biased exponent of the smallest power of
    two >= ``val``, saturating at 254; NaN -> 255, inf -> 254, 0 -> 0. ``val`` is >= 0
    (an amax times a reciprocal)."""
    v = val.to(torch.float32).contiguous()
    bits = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    out = exponent + up.to(torch.int64)
    out = torch.where(torch.isinf(v), torch.full_like(out, 0xFE), out)
    out = torch.where(v == 0, torch.zeros_like(out), out)
    out = torch.where(torch.isnan(v), torch.full_like(out, E8M0_NAN), out)
    return out.to(torch.uint8).view(val.shape)


# ---- E2M1 (FP4) -----------------------------------------------------------------------------
E2M1_MAX = 6.0
#: the magnitudes of codes 0..7
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values as E2M1 codes (one per uint8): round to nearest, ties to the even code,
    saturating at +-6; the sign bit kept (also for values that round to zero); NaN -> +6.

    E2M1 is a float with one mantissa bit: its values are evenly spaced by 0.5 below 2, by 1
    in [2, 4), by 2 in [4, 6]; rounding the count of steps half to even rounds to the even
    code (the codes count the values up from 0)."""
    x32 = x.to(torch.float32)
    nan = torch.isnan(x32)
    mag = torch.where(nan, torch.full_like(x32, E2M1_MAX), x32.abs()).clamp(max=E2M1_MAX)
    step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))
    q = (torch.round(mag / step) * step).clamp(max=E2M1_MAX)  # an exact power-of-two division
    code = torch.where(q < 2.0, q * 2, torch.where(q < 4.0, q + 2, q / 2 + 4)).to(torch.uint8)
    sign = torch.signbit(x32) & ~nan
    return code + sign.to(torch.uint8) * 8


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (one per uint8, 0..15) as fp32."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32,
                         device=codes.device)
    return table[codes.to(torch.long)]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[..., 2n]`` -> bytes ``[..., n]``: element ``2i`` in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 data needs an even last dimension, got {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``[..., n]`` -> codes ``[..., 2n]`` (inverse of :func:`pack_fp4`)."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


#: TE's ``DType`` values (``transformer_engine.h``) of the FP8 formats
TE_FP8_DTYPES = {7: E4M3, 8: E5M2}


def fp8_format(te_dtype: object) -> Fp8Format:
    """The FP8 format a TE ``DType`` (TE's Python enum or the extension's) names."""
    value = int(te_dtype)  # type: ignore[call-overload]
    if value not in TE_FP8_DTYPES:
        raise ValueError(f"TE dtype {te_dtype!r} is not an FP8 format")
    return TE_FP8_DTYPES[value]
