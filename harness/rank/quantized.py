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
from harness.rank.inputs import CellInputs, group_rows

F64 = torch.float64
FP32_MAX = torch.finfo(torch.float32).max
#: a quantized GEMM applies both operands' scale-inverses to its fp32 accumulator: their
#: product and that product's multiply, two fp32 roundings (``2 u(fp32)``) of a value no
#: larger than the magnitude (te-cpu's ``quant/qgemm.py``; cuBLASLt's scale modes likewise)
SCALE_U = 2 * 2.0**-24

__all__ = ["Fp8", "FORMATS", "cast", "current_scale", "Quantizer", "UnquantizedDgradWeight", "for_recipe"]


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
    ``dy`` likewise (the output gradient, for dgrad and wgrad only); ``weight(m, g, t,
    backward)``: group ``g``'s full weight as microbatch ``m``'s forward or backward sees it.
    """

    quantized = False

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
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

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.fwd), self.fwd)


def _amax(t: torch.Tensor) -> float:
    """The largest ``|t|`` in fp32 (NaNs ignored, 0 for an empty tensor), as TE's amax kernel."""
    a = t.detach().abs().to(torch.float32)
    return float(torch.where(torch.isnan(a), 0.0, a).max()) if t.numel() else 0.0


def _delayed_scale(amax: float, fmt: Fp8, previous: float) -> float:
    """Delayed scaling's update from the window's amax: ``fp32(fp8_max / amax)`` (margin 0)
    when that amax is finite and positive, else the previous scale; infinite: fp32's max."""
    if not (0.0 < amax < float("inf")):
        return previous
    scale = float(torch.tensor(fmt.max, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32))
    return FP32_MAX if scale == float("inf") else scale


class DelayedScaling(Quantizer):
    """``DelayedScaling`` with TE's defaults (``HYBRID``, margin 0, ``amax_history_len`` 1024,
    ``amax_compute_algo="max"``, ``reduce_amax``), stepped as TE steps it over a cell's
    microbatches. Every scale starts at 1 (the first microbatch quantizes with scale 1). A
    quantize records its tensor's amax; at ``autocast``'s exit after each forward the forward
    amaxes (input, weight) are max-reduced over the ranks (the default process group) and each
    scale becomes ``fp8_max / max(window)``; at the end of each backward the output gradient's
    likewise. The window (1024 steps) holds every microbatch of a cell, so the amax used is the
    running maximum of everything recorded before the update.

    The weight the input gradient multiplies: a plain weight's forward operand, saved on ctx;
    a DistributedWeight's is never saved (TE's ``linear.py``: backward re-gathers it and
    quantizes it again with the layer's quantizer), so its dgrad operand is the backward copy
    quantized with the weight's scale *as updated after this microbatch's forward* - and that
    quantize's amax enters the next update.
    """

    quantized = True

    def __init__(self, fwd: Fp8, bwd: Fp8, inputs: CellInputs, tags: tuple[float, float],
                 distributed: bool) -> None:
        self.fwd, self.bwd = fwd, bwd
        groups, mbs, world = len(inputs.weights), len(inputs.x[0]), len(inputs.x)
        W = [w.to(F64) for w in inputs.weights]
        self.sx: dict[tuple[int, int], float] = {}
        self.sdy: dict[tuple[int, int], float] = {}
        self.swf: dict[tuple[int, int], float] = {}
        self.swb: dict[tuple[int, int], float] = {}
        s_x, s_w, s_dy = [1.0] * groups, [1.0] * groups, [1.0] * groups
        m_x, m_w, m_dy = [0.0] * groups, [0.0] * groups, [0.0] * groups
        #: the scales after the cell's last update, per operand and member (``scales_after``)
        self.after: dict[str, list[float]] = {"input": s_x, "weight": s_w, "grad_output": s_dy}
        for m in range(mbs):
            rows = [group_rows(inputs.splits[r][m]) for r in range(world)]
            for g in range(groups):
                self.sx[m, g], self.swf[m, g] = s_x[g], s_w[g]
                m_x[g] = max(m_x[g], *(_amax(inputs.x[r][m][rows[r][g]]) for r in range(world)))
                m_w[g] = max(m_w[g], _amax(W[g] * tags[0]))
                s_x[g] = _delayed_scale(m_x[g], fwd, s_x[g])
                s_w[g] = _delayed_scale(m_w[g], fwd, s_w[g])
            for g in range(groups):
                self.sdy[m, g] = s_dy[g]
                if distributed:  # quantized again with the updated scale; its amax is recorded
                    self.swb[m, g] = s_w[g]
                    m_w[g] = max(m_w[g], _amax(W[g] * tags[1]))
                else:
                    self.swb[m, g] = self.swf[m, g]
                m_dy[g] = max(m_dy[g], *(_amax(inputs.dy[r][m][rows[r][g]]) for r in range(world)))
                s_dy[g] = _delayed_scale(m_dy[g], bwd, s_dy[g])

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, self.sx[m, g], self.fwd)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, self.sdy[m, g], self.bwd)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return dequantized(t, (self.swb if backward else self.swf)[m, g], self.fwd)


class UnquantizedDgradWeight(Quantizer):
    """``base`` with the input gradient multiplying the backward copy of the weight as it is,
    in the cell's dtype, beside the quantized output gradient: a defect model's view (TE
    2.20.2's ``GroupedLinear`` re-gathers a DistributedWeight and hands it to the dgrad GEMM
    without the re-quantize ``Linear`` does), never the oracle's."""

    quantized = True

    def __init__(self, base: Quantizer) -> None:
        self.base = base

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.x(r, m, g, t)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.dy(r, m, g, t)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return t if backward else self.base.weight(m, g, t, backward)


def for_recipe(recipe: str, inputs: CellInputs | None = None, tags: tuple[float, float] = (1.0, 1.0),
               distributed: bool = False) -> Quantizer:
    """The cell's quantizer (``inputs``, ``tags`` and ``distributed``: what delayed scaling's
    steps depend on; ``distributed`` models TE's re-quantized dgrad weight, a defect model's
    view, never the oracle's: the oracle's dgrad weight is the forward's, as for a plain weight).

    Raises:
        NotImplementedError: the oracle does not model ``recipe`` yet (``recipes.MODELLED``;
            the CLI refuses such cells before a launch), or delayed scaling without ``inputs``.
    """
    kind = recipes.KINDS[recipe]
    if not kind.quantized:
        return Quantizer()
    if recipe == "current":
        return CurrentScaling(FORMATS[kind.forward], FORMATS[kind.backward])
    if recipe == "delayed" and inputs is not None:
        return DelayedScaling(FORMATS[kind.forward], FORMATS[kind.backward], inputs, tags, distributed)
    raise NotImplementedError(f"the oracle does not model recipe {recipe!r} yet "
                              f"(it models {', '.join(recipes.MODELLED)})")
