"""The float64 oracle: what every rank's tensors should be, computed without sharding.

CONTRACTS §5: from the dtype-rounded inputs, in float64, over all W ranks and K
microbatches. Each value comes with its *magnitude* - the same computation on absolute
values (``|A| @ |B|``) - which the tolerance policy scales, so bounds grow with the
reduction length and with cancellation instead of being fixed ``atol``/``rtol`` pairs.
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, TypeVar

import torch

from harness.cell import oracle_store, quantized
from harness.cell.inputs import CellInputs, Norm, group_rows

F64 = torch.float64
T = TypeVar("T")


@dataclass
class Reference:
    """One expected tensor: its value, its magnitude, and how it was produced."""

    value: torch.Tensor
    magnitude: torch.Tensor
    reduction: int            # length of the GEMM reduction behind one element
    roundings: int            # sequential roundings in the value's dtype, the last one included
    #: the unit roundoff of a rounding of the GEMM's operand in another precision than the
    #: value's (LayerNormLinear rounds its normalized input to the cell's dtype, also when the
    #: weight gradient is formed in fp32): it costs ``operand_u * magnitude``
    operand_u: float = 0.0
    #: an absolute half-width the value is known within, on top of the roundings: a GEMM
    #: operand the oracle knows only within an interval (LayerNormLinear's normalized rows
    #: under a recipe, ``quantized.dequantized_box``), propagated through the GEMM
    slack: torch.Tensor | None = None


@dataclass
class RankOracle:
    outputs: list[Reference]          # per microbatch
    dgrads: list[Reference]           # per microbatch
    wgrad_sums: list[Reference]       # per weight: mean over ranks of the sum over microbatches
    bgrad_sums: list[Reference]       # per bias, likewise
    norm_sums: list[Reference]        # per normalization parameter (gamma, then beta), likewise
    #: the quantization the GEMMs' operands went through (delayed scaling: its scales after
    #: the step, which the runner's ``fp8_scales`` check reads)
    quant: quantized.Quantizer


@dataclass
class Sums:
    """The gradients of record every rank shares (:func:`world_oracles`)."""

    wgrad_sums: list[Reference]
    bgrad_sums: list[Reference]
    norm_sums: list[Reference]


@dataclass
class _Normalized:
    """One microbatch's normalization forward, in float64: what the GEMM receives."""

    h: torch.Tensor                   # the normalized rows, scaled and shifted
    magnitude: torch.Tensor           # |xhat| |gamma'| + |beta|: what an error in h scales with
    xhat: torch.Tensor                # (x - mean) * rstd (RMSNorm: x * rstd)
    rstd: torch.Tensor                # (rows, 1)
    scale: torch.Tensor               # gamma' = gamma, or 1 + gamma when zero-centered


def _normalize(x: torch.Tensor, norm: Norm) -> _Normalized:
    """LayerNorm / RMSNorm over the last dimension (CONTRACTS §1 ``LayerNormLinear``)."""
    gamma = norm.gamma.to(F64)
    scale = gamma + 1.0 if norm.zero_centered else gamma
    centred = x - x.mean(-1, keepdim=True) if norm.kind == "LayerNorm" else x
    rstd = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + norm.eps)
    xhat = centred * rstd
    h = xhat * scale
    magnitude = xhat.abs() * scale.abs()
    if norm.beta is not None:
        h = h + norm.beta.to(F64)
        magnitude = magnitude + norm.beta.to(F64).abs()
    return _Normalized(h, magnitude, xhat, rstd, scale)


def _normalized_bounds(x: torch.Tensor, n: _Normalized, dtype: torch.dtype,
                       rounded: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a backend's normalized rows lie, before a recipe quantizes them. TE computes them
    in fp32 and hands the quantizer their rounding to the activation dtype (``rounded``:
    current scaling's norm-then-quantize) or, under delayed scaling, its fused kernel's fp32
    value - the reference hands the rounded one: ``None`` takes either. The fp32 error: the
    mean's sum over the ``d`` features errs by up to ``(d - 1) u`` of the row's largest
    ``|x|`` (carried by ``rstd``), the variance's by ``(d + 1) u`` (half of it reaching
    ``rstd`` through the square root), the square root, the scale and the shift by a few
    ``u`` more: charged ``(d + 8) u(fp32)`` of ``|x|_max rstd |gamma'|`` plus the element's
    ``|xhat gamma'| + |beta|``. The rounding is monotone, so the rounded ends bound the
    rounded value."""
    d = x.shape[-1]
    row = (x.abs().amax(-1, keepdim=True) * n.rstd) * n.scale.abs()
    err = (d + 8) * 2.0**-24 * (n.magnitude + row)
    lo, hi = n.h - err, n.h + err
    lo_r, hi_r = lo.to(dtype).to(F64), hi.to(dtype).to(F64)
    if rounded:
        return lo_r, hi_r
    return torch.minimum(lo, lo_r), torch.maximum(hi, hi_r)


def _normalize_backward(n: _Normalized, dh: torch.Tensor, dh_mag: torch.Tensor,
                        layer_norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The input gradient of a normalization, and its magnitude.

    ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` with ``g = dh * gamma'`` (RMSNorm has no
    ``mean(g)`` term). The magnitude is the same linear map with every term made positive,
    applied to ``dh``'s magnitude: an error ``e`` in ``dh`` (its rounding, the dgrad GEMM's
    accumulation) reaches ``dx`` through that map, so ``|J^T e| <= |J^T| |e|``.
    """
    g, g_mag = dh * n.scale, dh_mag * n.scale.abs()
    dx = g - (n.xhat * (g * n.xhat).mean(-1, keepdim=True))
    mag = g_mag + n.xhat.abs() * (g_mag * n.xhat.abs()).mean(-1, keepdim=True)
    if layer_norm:
        dx = dx - g.mean(-1, keepdim=True)
        mag = mag + g_mag.mean(-1, keepdim=True)
    return dx * n.rstd, mag * n.rstd


@dataclass
class WgradTerm:
    """One rank's wgrad GEMM (or bias reduction) of one microbatch for one group member, exact
    (float64): what a defect model rounds (``harness.cell.predict``)."""

    value: torch.Tensor
    magnitude: torch.Tensor
    rows: int                         # the GEMM's reduction length
    slack: torch.Tensor | float = 0.0  # an operand known within an interval (``Reference.slack``)


class _GemmInputs:
    """What the GEMMs of (rank, microbatch) receive: ``x``, or the normalization's ``h`` (each
    (rank, microbatch) normalized once: outputs and gradients share it), and ``dy``; under a
    recipe each group's rows of both as TE quantized them (``harness.cell.quantized``) - the
    normalized rows known within bounds (:func:`_normalized_bounds`), so their quantized value
    is a centre and a half-width (:meth:`slack`)."""

    def __init__(self, inputs: CellInputs, quant: quantized.Quantizer | None = None) -> None:
        self.inputs = inputs
        self.quant = quant or quantized.Quantizer()
        self._done: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, _Normalized | None]] = {}
        self._slack: dict[tuple[int, int], torch.Tensor] = {}
        self._bounds: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._dy: dict[tuple[int, int], torch.Tensor] = {}
        self._wgrad: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        self._normed: dict[tuple[int, int], _Normalized] = {}

    def _normalized(self, r: int, m: int, x: torch.Tensor) -> _Normalized:
        """(rank, microbatch)'s input ``x`` (float64) normalized, once (the GEMM input and the
        bounds of either chain both start from it)."""
        if (r, m) not in self._normed:
            self._normed[r, m] = _normalize(x, self.inputs.norm)
        return self._normed[r, m]

    def __call__(self, r: int, m: int) -> tuple[torch.Tensor, torch.Tensor, _Normalized | None]:
        if (r, m) not in self._done:
            x = self.inputs.x[r][m].to(F64)
            if self.inputs.norm is None:
                x = self._per_group(self.quant.x, r, m, x)
                self._done[r, m] = x, x.abs(), None
            elif self.quant.quantized:
                normed = self._normalized(r, m, x)
                self._bounds[r, m] = _normalized_bounds(x, normed, self.inputs.dtype, self.quant.norm_rounded)
                centre, slack = self._boxed(self.quant.x_box, r, m)
                self._done[r, m] = centre, centre.abs() + slack, normed
                self._slack[r, m] = slack
            else:
                normed = self._normalized(r, m, x)
                self._done[r, m] = normed.h, normed.magnitude, normed
        return self._done[r, m]

    def _boxed(self, box, r: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalized rows' centre and half-width as ``box`` quantizes each group's rows."""
        lo, hi = self._bounds[r, m]
        centre, slack = torch.zeros_like(lo), torch.zeros_like(lo)
        for g, rows in enumerate(group_rows(self.inputs.splits[r][m])):
            centre[rows], slack[rows] = box(r, m, g, lo[rows], hi[rows])
        return centre, slack

    def slack(self, r: int, m: int) -> torch.Tensor | None:
        """The half-width of (rank, microbatch)'s GEMM input (None: known exactly)."""
        self(r, m)
        return self._slack.get((r, m))

    def bounds(self, r: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalized rows' bounds, either chain (``quantized.Bounds``: delayed scaling's
        amaxes)."""
        x = self.inputs.x[r][m].to(F64)
        return _normalized_bounds(x, self._normalized(r, m, x), self.inputs.dtype, None)

    def dy(self, r: int, m: int) -> torch.Tensor:
        """The output gradient the dgrad GEMM multiplies (and the wgrad GEMM, but under a
        block recipe: :meth:`wgrad`; the bias gradient sums the unquantized one)."""
        if (r, m) not in self._dy:
            self._dy[r, m] = self._per_group(self.quant.dy, r, m, self.inputs.dy[r][m].to(F64))
        return self._dy[r, m]

    def wgrad(self, r: int, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What the wgrad GEMM of (rank, microbatch) multiplies: ``(dy, x, |x|, x's slack)``.
        The forward's and the dgrad's operands, but under a block recipe, which quantizes
        both along the rows, the GEMM's K (each group's rows alone)."""
        x, x_mag, _ = self(r, m)
        if not self.quant.by_direction:
            return self.dy(r, m), x, x_mag, self.slack(r, m)
        if (r, m) not in self._wgrad:
            dyw = self._per_group(self.quant.dy_wgrad, r, m, self.inputs.dy[r][m].to(F64))
            if self.inputs.norm is not None:  # the normalized rows' bounds, blocked along the rows
                xw, slack = self._boxed(self.quant.x_box_wgrad, r, m)
                self._wgrad[r, m] = dyw, xw, xw.abs() + slack, slack
            else:
                xw = self._per_group(self.quant.x_wgrad, r, m, self.inputs.x[r][m].to(F64))
                self._wgrad[r, m] = dyw, xw, xw.abs(), None
        return self._wgrad[r, m]

    def _per_group(self, fn, r: int, m: int, t: torch.Tensor) -> torch.Tensor:
        if not self.quant.quantized:
            return t
        out = t.clone()
        for g, rows in enumerate(group_rows(self.inputs.splits[r][m])):
            out[rows] = fn(r, m, g, t[rows])
        return out


def gemm_inputs(inputs: CellInputs, recipe: str = "none", tags: tuple[float, float] = (1.0, 1.0),
                distributed: bool = False, shard_scaled: tuple[int, int] | None = None,
                cached: bool = False) -> _GemmInputs:
    """The GEMM inputs of a cell under ``recipe`` (``quantized.for_recipe``; a normalized
    input's bounds go to the quantizer too: delayed scaling records its amax; ``shard_scaled``:
    a defect model's view of a native weight, ``quantized.ShardScaled``; ``cached``: the
    forward passes ``is_first_microbatch``, so later microbatches reuse the first's FP8 weight)."""
    bounds = _GemmInputs(inputs).bounds if inputs.norm is not None else None
    return _GemmInputs(inputs, quantized.for_recipe(recipe, inputs, tags, distributed, bounds, shard_scaled,
                                                    cached))


def operand_u(inputs: CellInputs, recipe: str = "none") -> float:
    """LayerNormLinear's GEMMs take h rounded to the cell's dtype: charged in that dtype's u;
    under a recipe the quantized operands are the oracle's own (a normalized one known within
    bounds: ``Reference.slack``), and the GEMM's scale-inverses cost ``quantized.scale_u``
    (per-tensor scales; power-of-two block scales are exact: :func:`compute`)."""
    if recipe != "none":  # the quantized operand is modelled, a normalized one within bounds
        return quantized.scale_u(recipe)
    return torch.finfo(inputs.dtype).eps / 2 if inputs.norm is not None else 0.0


def wgrad_terms(inputs: CellInputs, gemm_input: _GemmInputs | None = None,
                recipe: str = "none", distributed: bool = False) -> list[list[list[WgradTerm]]]:
    """``[rank][microbatch][member]``: each microbatch's weight gradient on each rank,
    ``dy[rows]^T @ x[rows]`` over the rows routed to that member (under ``recipe``, of the
    operands as TE quantized them)."""
    gemm_input = gemm_input or gemm_inputs(inputs, recipe, distributed=distributed)
    out = []
    for r in range(len(inputs.x)):
        per_rank = []
        for m in range(len(inputs.x[r])):
            dy, x, x_mag, slack = gemm_input.wgrad(r, m)
            per_rank.append([WgradTerm(dy[rows].t() @ x[rows], dy[rows].abs().t() @ x_mag[rows], rows.stop - rows.start,
                                       dy[rows].abs().t() @ slack[rows] if slack is not None else 0.0)
                             for rows in group_rows(inputs.splits[r][m])])
        out.append(per_rank)
    return out


def bgrad_terms(inputs: CellInputs) -> list[list[list[WgradTerm]]]:
    """``[rank][microbatch][member]``: each microbatch's bias gradient on each rank (the sum
    of ``dy`` over the rows routed to that member), exact."""
    out = []
    for r in range(len(inputs.x)):
        per_rank = []
        for m in range(len(inputs.x[r])):
            dy = inputs.dy[r][m].to(F64)
            per_rank.append([WgradTerm(dy[rows].sum(0), dy[rows].abs().sum(0), rows.stop - rows.start)
                             for rows in group_rows(inputs.splits[r][m])])
        out.append(per_rank)
    return out


def compute(inputs: CellInputs, rank: int, tags: tuple[float, float] = (1.0, 1.0),
            recipe: str = "none", distributed: bool = False,
            unquantized_dgrad_weight: bool = False, fp8_bias_in_bf16: bool = True,
            shard_scaled: int | None = None, cached: bool = False, weight_grads: bool = True,
            sums: Sums | None = None) -> RankOracle:
    """The oracle as seen from ``rank`` (outputs and dgrads are per rank; grads global).

    ``weight_grads=False``: without the weight gradients (``wgrad_sums`` empty), the larger
    part of the work - every rank's wgrad GEMMs - for a caller that reads the rest only (a
    defect model's view: ``harness.cell.predict``).

    ``tags``: the factors of the weight's forward and backward copies (a tagged weight,
    ``harness.vocabulary.weights.Behaviour``): outputs use the forward copy, input gradients the
    backward copy; weight gradients do not involve the weight.

    With a normalization (``inputs.norm``) the GEMMs see its output ``h`` instead of ``x``,
    rounded to the cell's dtype by the backend (``LayerNormLinear`` saves and multiplies
    that rounded ``h``): one more rounding, charged to the magnitude, behind every value
    computed from it. The input gradient goes back through the normalization from ``dh``,
    which the dgrad GEMM rounds to the cell's dtype before the normalization's backward.

    Under a ``recipe`` the GEMMs multiply the operands as TE quantized them
    (``harness.cell.quantized``): exact products of FP8 values and fp32 scale-inverses, so
    the bound keeps its accumulation and output roundings, and the two fp32 roundings of
    applying the scale-inverses to the accumulator (``quantized.SCALE_U``, charged as an
    operand rounding). An fp32 cell's forward bias is rounded to bf16 first (TE: "cuBLAS
    does not support FP8 GEMM with FP32 bias"). A normalization's output is quantized from
    bounds (:func:`_normalized_bounds`): each element takes the centre of the codes it can
    take, and the half-width goes through the GEMMs as ``Reference.slack``.

    ``distributed`` and ``unquantized_dgrad_weight`` are defect models' views of the dgrad
    weight under a recipe (``quantized.for_recipe``, ``quantized.UnquantizedDgradWeight``),
    ``fp8_bias_in_bf16=False`` one of an fp32 cell's forward bias (added unrounded); never
    the oracle's; so is ``shard_scaled`` (shard rows: a native current-scaling weight's shards
    each under its own scale, all applied with this rank's, ``quantized.ShardScaled``). A native
    weight's oracle is the high-precision weight's: its scale is that of the whole weight.
    ``cached``: the forward passes ``is_first_microbatch`` (delayed scaling: every later
    microbatch multiplies the first's FP8 weight, ``quantized.DelayedScaling``).

    Raises:
        NotImplementedError: a recipe the oracle does not model (``quantized.for_recipe``).
    """
    gemm_input = gemm_inputs(inputs, recipe, tags, distributed,
                             None if shard_scaled is None else (shard_scaled, rank), cached)
    if unquantized_dgrad_weight and gemm_input.quant.quantized:
        gemm_input.quant = quantized.UnquantizedDgradWeight(gemm_input.quant)
    gemms = _Gemms(inputs, gemm_input, tags, recipe, fp8_bias_in_bf16)
    outputs, dgrads = gemms.own(rank)
    if sums is None:
        sums = _sums(gemms, tags, weight_grads)
    return RankOracle(outputs, dgrads, sums.wgrad_sums, sums.bgrad_sums, sums.norm_sums, gemm_input.quant)


def world_oracles(inputs: CellInputs, tags: tuple[float, float] = (1.0, 1.0), recipe: str = "none",
                  cached: bool = False) -> tuple[list[RankOracle], Sums]:
    """:func:`compute`'s oracle of every rank, bit for bit, computed in one pass: what the
    ranks share - the quantized weights and GEMM inputs, the gradients of record (every rank's
    wgrad GEMMs, the larger part of the work) - once, not once per rank (``Memo.compute``
    with a store: one of a launch's ranks computes them all). Returns the oracles, rank by
    rank, and the shared gradients."""
    gemm_input = gemm_inputs(inputs, recipe, tags, cached=cached)
    gemms = _Gemms(inputs, gemm_input, tags, recipe, True)
    sums = _sums(gemms, tags, True)
    return [RankOracle(*gemms.own(r), sums.wgrad_sums, sums.bgrad_sums, sums.norm_sums, gemm_input.quant)
            for r in range(len(inputs.x))], sums


class _Gemms:
    """The forward and dgrad GEMMs of one oracle's arguments, the weights quantized once for
    every rank's."""

    def __init__(self, inputs: CellInputs, gemm_input: _GemmInputs, tags: tuple[float, float], recipe: str,
                 fp8_bias_in_bf16: bool) -> None:
        self.inputs, self.gemm_input = inputs, gemm_input
        quant = gemm_input.quant
        W = [w.to(F64) for w in inputs.weights]
        mbs = len(inputs.x[0])
        # [microbatch][member]: under delayed scaling each microbatch's weight has its own scale
        self.Wf = [[quant.weight(m, i, w * tags[0], backward=False) for i, w in enumerate(W)] for m in range(mbs)]
        self.Wb = [[quant.weight(m, i, w * tags[1], backward=True) for i, w in enumerate(W)] for m in range(mbs)]
        self.B = [b.to(F64) for b in inputs.biases]
        to_bf16 = quant.quantized and inputs.dtype == torch.float32 and fp8_bias_in_bf16
        self.Bf = [b.to(torch.bfloat16).to(F64) for b in self.B] if to_bf16 else self.B
        self.op_u = operand_u(inputs, recipe)

    def own(self, rank: int) -> tuple[list[Reference], list[Reference]]:
        """``rank``'s outputs and input gradients, per microbatch."""
        inputs, gemm_input, quant = self.inputs, self.gemm_input, self.gemm_input.quant
        Wf, Wb, B, Bf, op_u = self.Wf, self.Wb, self.B, self.Bf, self.op_u
        out_f, in_f = inputs.weights[0].shape
        norm = inputs.norm
        outputs, dgrads = [], []
        for m in range(len(inputs.x[0])):
            x, x_mag, normed = gemm_input(rank, m)
            dy, x_slack = gemm_input.dy(rank, m), gemm_input.slack(rank, m)
            y, ya = torch.zeros(x.shape[0], out_f, dtype=F64), torch.zeros(x.shape[0], out_f, dtype=F64)
            ys = torch.zeros_like(y) if x_slack is not None else None
            dx, dxa = torch.zeros_like(x), torch.zeros_like(x)
            for i, rows in enumerate(group_rows(inputs.splits[rank][m])):
                y[rows] = x[rows] @ Wf[m][i].t() + (Bf[i] if B else 0.0)
                ya[rows] = x_mag[rows] @ Wf[m][i].abs().t() + (Bf[i].abs() if B else 0.0)
                if ys is not None:
                    ys[rows] = x_slack[rows] @ Wf[m][i].abs().t()
                dx[rows] = dy[rows] @ Wb[m][i]
                dxa[rows] = dy[rows].abs() @ Wb[m][i].abs()
            outputs.append(Reference(y, ya, reduction=in_f, roundings=2 if B else 1, operand_u=op_u, slack=ys))
            if normed is not None:
                dx, dxa = _normalize_backward(normed, dx, dxa, norm.kind == "LayerNorm")
            # with a normalization: dh's rounding (to the cell's dtype, as dx) before its backward
            dgrads.append(Reference(dx, dxa, reduction=max(out_f, in_f),
                                    roundings=2 if normed is not None else 1,
                                    operand_u=quant.scale_u))
        return outputs, dgrads


def _sums(gemms: _Gemms, tags: tuple[float, float], weight_grads: bool) -> Sums:
    """:func:`compute`'s gradients of record, summed over every rank, from the GEMM inputs and
    backward weights ``gemms`` holds (the dgrad GEMMs' ``Wb``)."""
    inputs, gemm_input, quant = gemms.inputs, gemms.gemm_input, gemms.gemm_input.quant
    Wb, B, op_u = gemms.Wb, gemms.B, gemms.op_u
    W = [w.to(F64) for w in inputs.weights]
    norm = inputs.norm
    world, mbs = len(inputs.x), len(inputs.x[0])
    out_f, in_f = W[0].shape
    terms = wgrad_terms(inputs, gemm_input) if weight_grads else []
    members = len(W) if weight_grads else 0
    wsum = [sum(t[i].value for per_rank in terms for t in per_rank) for i in range(members)]
    wabs = [sum(t[i].magnitude for per_rank in terms for t in per_rank) for i in range(members)]
    wslack = [sum(t[i].slack for per_rank in terms for t in per_rank) for i in range(members)]
    bsum = [torch.zeros(out_f, dtype=F64) for _ in range(len(B))]
    babs = [torch.zeros(out_f, dtype=F64) for _ in range(len(B))]
    nparams = len(norm.params) if norm is not None else 0
    nsum = [torch.zeros(in_f, dtype=F64) for _ in range(nparams)]
    nabs = [torch.zeros(in_f, dtype=F64) for _ in range(nparams)]
    for r in range(world):
        for m in range(mbs):
            _, _, normed = gemm_input(r, m)
            dy = inputs.dy[r][m].to(F64)
            for i, rows in enumerate(group_rows(inputs.splits[r][m])):
                if B:  # the bias gradient: the unquantized dy's column sums
                    bsum[i] += dy[rows].sum(0)
                    babs[i] += dy[rows].abs().sum(0)
            if normed is not None:
                # dgamma = sum(dh * xhat), dbeta = sum(dh), from the dgrad GEMM's dh (under a
                # recipe, of the quantized output gradient) of rank r, with the weight as rank
                # r sees it (the same on every rank, but in a view: quantized.ShardScaled)
                dyq = gemm_input.dy(r, m)
                seen = quant.seen_by(r)
                wb = Wb[m][0] if seen is quant else seen.weight(m, 0, W[0] * tags[1], backward=True)
                dh, dh_mag = dyq @ wb, dyq.abs() @ wb.abs()
                nsum[0] += (dh * normed.xhat).sum(0)
                nabs[0] += (dh_mag * normed.xhat.abs()).sum(0)
                if nparams > 1:
                    nsum[1] += dh.sum(0)
                    nabs[1] += dh_mag.sum(0)
    rows_total = inputs.x[0][0].shape[0]
    roundings = increment_roundings(mbs, world)
    wgrads = [Reference(s / world, a / world, rows_total * mbs, roundings, op_u,
                        sl / world if isinstance(sl, torch.Tensor) else None)
              for s, a, sl in zip(wsum, wabs, wslack)]
    bgrads = [Reference(s / world, a / world, rows_total * mbs, roundings) for s, a in zip(bsum, babs)]
    # dh is rounded once before the reduction: one more rounding than a bias gradient
    ngrads = [Reference(s / world, a / world, max(rows_total * mbs, out_f), roundings + 1)
              for s, a in zip(nsum, nabs)]
    return Sums(wgrads, bgrads, ngrads)


def increment_roundings(microbatches: int, world: int) -> int:
    """Sequential roundings behind a weight or bias gradient's increment (``harness.cell.compare``).

    One per microbatch's GEMM (or bias reduction) and one per accumulation of the next
    microbatch, ``W - 1`` adds of the cross-rank reduction and the ``1/W`` scale: each
    rounds a partial value no larger than the magnitude. (The start value's add is
    ``record_of``'s.)
    """
    return 2 * microbatches - 1 + (world - 1) + (1 if world > 1 else 0)


def record_of(ref: Reference, start: torch.Tensor | None, shard: tuple[int, int, int] | None) -> Reference:
    """The gradient of record: ``start + increment``, cut to this rank's shard if sharded.

    Args:
        ref: the global increment (mean over ranks of the sum over microbatches).
        start: the ``main_grad`` start value in the record's shape (None: autograd ``.grad``).
        shard: ``(padded_rows, row0, rows)`` for a GTP weight; padding rows keep ``start``.
    """
    value, magnitude, slack = ref.value, ref.magnitude, ref.slack
    if shard is not None:
        padded, row0, nrows = shard

        def cut(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, 0, padded - t.shape[0]))[row0:row0 + nrows]

        value, magnitude = cut(value), cut(magnitude)
        slack = cut(slack) if slack is not None else None
    roundings = ref.roundings
    if start is not None:
        s = start.to(F64)
        value, magnitude, roundings = value + s, magnitude + s.abs(), roundings + 1
    return Reference(value, magnitude, ref.reduction, roundings, ref.operand_u, slack)


def fingerprint(inputs: CellInputs) -> bytes:
    """A digest of every value ``inputs`` holds (each tensor's dtype, shape and bytes, the
    splits, the normalization): two cells with equal digests have the same oracle."""
    h = hashlib.blake2b(digest_size=20)

    def add(t: torch.Tensor | None) -> None:
        if t is None:
            h.update(b"none")
            return
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())

    h.update(str(inputs.dtype).encode())
    for t in [*inputs.weights, *inputs.biases, *(x for per in inputs.x for x in per),
              *(d for per in inputs.dy for d in per)]:
        add(t)
    h.update(repr(inputs.splits).encode())
    norm = inputs.norm
    if norm is not None:
        h.update(f"{norm.kind}{norm.zero_centered}{norm.eps!r}".encode())
        add(norm.gamma)
        add(norm.beta)
    return h.digest()


def _code_of(fn: Callable[..., Any]) -> str:
    """A function's name and a digest of its code: bytecode, names and constants, nested code
    objects (its comprehensions, lambdas) by theirs - the same in every process."""
    h = hashlib.blake2b(digest_size=8)

    def add(item: Any) -> None:
        if isinstance(item, types.CodeType):
            h.update(item.co_code + repr(item.co_names).encode())
            for const in item.co_consts:
                add(const)
        elif isinstance(item, tuple):
            for part in item:
                add(part)
        elif isinstance(item, frozenset):  # its order follows the process's string hashes
            h.update(repr(sorted(map(repr, item))).encode())
        else:
            h.update(repr(item).encode())

    add(getattr(fn, "__code__", None) or repr(fn))
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}:{h.hexdigest()}"


#: the module's own :func:`compute`, as imported: the one whose oracles a store shares
_COMPUTE = compute


def _without_sums(o: RankOracle) -> RankOracle:
    """A rank's own part of its oracle (the shared gradients are kept once, beside)."""
    return replace(o, wgrad_sums=[], bgrad_sums=[], norm_sums=[])


class Memo:
    """What a rank computed lately from a cell's inputs - its oracles and its defect models
    (``harness.cell.predict.Predictor``, whose lazy parts then fill once) - by what they are a
    function of: the inputs' values (:func:`fingerprint`, read after the step, so inputs changed
    in place are new inputs) and the other arguments. A hooked cell has its hooks-off twin's
    inputs (a cell's seed leaves its hook mode out), and so has the same cell under another
    backend (the self-test's clean reference, mutants and perturbations): the float64 oracle, a
    third of a reference rank's time, is computed once for them, not once per cell. Both are
    read, never written, by the checks (:func:`record_of` makes new tensors)."""

    def __init__(self, size: int = 64, store: oracle_store.Store | None = None) -> None:
        self.size = size
        self._kept: OrderedDict[tuple, Any] = OrderedDict()
        self.hits = 0
        #: oracles shared with other processes (``oracle_store``: ``DW_ORACLE_CACHE``)
        self.store = store

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        """The value kept under ``key``, or ``make()``'s, kept (the oldest goes once ``size``
        are kept)."""
        if key in self._kept:
            self._kept.move_to_end(key)
            self.hits += 1
            return self._kept[key]
        found = self._kept[key] = make()
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return found

    def compute(self, inputs: CellInputs, rank: int, tags: tuple[float, float] = (1.0, 1.0),
                recipe: str = "none", cached: bool = False, digest: bytes | None = None) -> RankOracle:
        """:func:`compute` of these arguments, kept (``digest``: the inputs' fingerprint, if known).

        The key also names the function this process computes oracles with, by its code: a
        process that replaced it (a planted harness bug, ``fixtures/harness_bug.py``) neither
        reads the oracles the module's own function computed elsewhere nor keeps its own as
        theirs."""
        fn = compute  # this module's, as this process has it now
        code = _code_of(fn)
        digest = digest or fingerprint(inputs)
        key = ("oracle", digest, rank, tuple(tags), recipe, cached, code)
        if self.store is None or fn is not _COMPUTE:  # a replaced oracle computes alone, keeps nothing
            def make() -> RankOracle:
                return fn(inputs, rank, tags, recipe, cached=cached)

            return self.get(key, make)
        store = self.store

        def shared() -> RankOracle:
            # one of a launch's ranks (the store's claim) computes every rank's oracle at once
            # and keeps each rank's own part, then the part they share; the others read both
            def own_key(r: int) -> tuple:
                return ("own", digest, r, tuple(tags), recipe, cached, code)

            mine: list[RankOracle] = []  # this rank's, when this process computed every rank's

            def every_rank() -> Sums:
                oracles, sums = world_oracles(inputs, tags, recipe, cached)
                for r, o in enumerate(oracles):
                    store.put(own_key(r), _without_sums(o))
                mine.append(oracles[rank])
                return sums

            sums = store.get(("sums", digest, tuple(tags), recipe, cached, code, _code_of(world_oracles)), every_rank)
            if mine:
                return mine[0]
            own = store.get(own_key(rank), lambda: _without_sums(fn(inputs, rank, tags, recipe, cached=cached,
                                                                       sums=sums)))
            return replace(own, wgrad_sums=sums.wgrad_sums, bgrad_sums=sums.bgrad_sums, norm_sums=sums.norm_sums)

        return self.get(key, shared)
