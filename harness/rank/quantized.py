"""The operands TE quantizes under a recipe, in float64: what the oracle's GEMMs multiply.

Under a per-tensor FP8 recipe (``current``, ``delayed``; ``HYBRID``, TE's default) TE's
``Linear`` quantizes the GEMM input and the weight - the full weight, after a
DistributedWeight's gather - to E4M3 and the output gradient to E5M2; forward multiplies
``x_q W_q^T``, the input gradient ``dy_q W_q``, the weight gradient ``dy_q^T x_q`` (the input
as forward quantized it); the bias gradient is the column sum of the unquantized ``dy``. A
``GroupedLinear`` (split path) quantizes each group's rows and each group's weight with a
quantizer of its own. Each quantize is TE's cast, reproduced exactly: ``v = fp32(x * scale)``
(the product of an fp32 scale and a 16-bit or fp32 value is exact in float64, so rounding it
to fp32 is TE's fp32 multiply), rounded to nearest even in the FP8 format, saturating at its
largest finite value (TE's ``__NV_SATFINITE``); the value the GEMM sees is ``code *
scale_inv`` with ``scale_inv = fp32(1 / scale)``.

- ``current`` (``Float8CurrentScaling``): ``scale = fp32(fp8_max / amax)`` from the tensor's
  own amax (amax 0, inf or NaN: scale 1; an infinite scale: fp32's max).

The module is the float64 twin of te-cpu's kernels (``harness/te_cpu/quant/``, which a rank
may not import: te-cpu is one backend among others); ``cases/test_quantized_oracle.py``
checks the two agree code for code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness import recipes

F64 = torch.float64
FP32_MAX = torch.finfo(torch.float32).max
#: a quantized GEMM applies both operands' scale-inverses to its fp32 accumulator: their
#: product and that product's multiply, two fp32 roundings (``2 u(fp32)``) of a value no
#: larger than the magnitude (te-cpu's ``quant/qgemm.py``; cuBLASLt's scale modes likewise)
SCALE_U = 2 * 2.0**-24

__all__ = ["Fp8", "FORMATS", "cast", "current_scale", "Quantizer", "for_recipe"]


@dataclass(frozen=True)
class Fp8:
    """One FP8 element format: its torch dtype and largest finite value."""

    name: str
    dtype: torch.dtype
    max: float


FORMATS: dict[str, Fp8] = {
    "e4m3": Fp8("e4m3", torch.float8_e4m3fn, 448.0),
    "e5m2": Fp8("e5m2", torch.float8_e5m2, 57344.0),
}


def cast(t: torch.Tensor, scale: float, fmt: Fp8) -> torch.Tensor:
    """The FP8 codes (as float64 values) TE writes for ``t`` under ``scale``: ``fp32(t * scale)``
    rounded to nearest even, saturating (torch's cast rounds to nearest even; the clamp first
    makes it saturate, as ``__NV_SATFINITE`` does; NaN stays NaN)."""
    v = (t.to(F64) * scale).to(torch.float32)
    return v.clamp(-fmt.max, fmt.max).to(fmt.dtype).to(F64)


def _fp32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def current_scale(t: torch.Tensor, fmt: Fp8) -> float:
    """Current scaling's scale for ``t``: ``fp32(fp8_max / amax)`` (one fp32 division)."""
    a = t.detach().abs().to(torch.float32)
    amax = float(torch.where(torch.isnan(a), 0.0, a).max()) if t.numel() else 0.0  # NaNs ignored
    if amax == 0.0 or amax != amax or amax == float("inf"):
        return 1.0
    scale = float(torch.tensor(fmt.max, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32))
    return FP32_MAX if scale == float("inf") else scale


def dequantized(t: torch.Tensor, scale: float, fmt: Fp8) -> torch.Tensor:
    """``t`` as the quantized GEMM sees it: ``code * fp32(1 / scale)``, exact in float64."""
    return cast(t, scale, fmt) * _fp32(1.0 / _fp32(scale))


class Quantizer:
    """The quantize-dequantize of each GEMM operand of a cell (identity without a recipe).

    ``x(r, m, g, t)``: the GEMM input of rank ``r``, microbatch ``m``, group ``g`` (its rows);
    ``dy`` likewise (the output gradient, for dgrad and wgrad only); ``weight(g, t, backward)``:
    group ``g``'s full weight as forward or backward sees it.
    """

    quantized = False

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def weight(self, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return t


class CurrentScaling(Quantizer):
    """``Float8CurrentScaling`` (``HYBRID``): every operand scaled from its own amax. The
    weight a DistributedWeight re-gathers in backward is quantized again with the layer's
    quantizer (TE's ``linear.py``), from its own amax: the forward operand again."""

    quantized = True

    def __init__(self, fwd: Fp8, bwd: Fp8) -> None:
        self.fwd, self.bwd = fwd, bwd

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.fwd), self.fwd)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.bwd), self.bwd)

    def weight(self, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.fwd), self.fwd)


def for_recipe(recipe: str) -> Quantizer:
    """The cell's quantizer.

    Raises:
        NotImplementedError: the oracle does not model ``recipe`` yet (``recipes.MODELLED``;
            the CLI refuses such cells before a launch).
    """
    kind = recipes.KINDS[recipe]
    if not kind.quantized:
        return Quantizer()
    if recipe == "current":
        return CurrentScaling(FORMATS[kind.forward], FORMATS[kind.backward])
    raise NotImplementedError(f"the oracle does not model recipe {recipe!r} yet "
                              f"(it models {', '.join(recipes.MODELLED)})")
