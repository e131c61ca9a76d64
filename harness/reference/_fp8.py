"""Low precision in the reference: TE's per-tensor FP8 recipes, written from their definition.

Under ``autocast(enabled=True, recipe=...)`` each reference GEMM multiplies FP8 operands: the
input and the weight (the whole weight: a DistributedWeight's gathered copy) in the forward
format, the output gradient in the gradient format (E4M3 / E5M2 under ``HYBRID``). A quantize
is ``fp32(t * scale)`` rounded to nearest even in the format, saturating; the GEMM multiplies
the codes in fp32 (each product exact) and applies ``fp32(scale_inv_a * scale_inv_b)`` to the
accumulator. The bias gradient is the unquantized gradient's column sum.

Hook-safe by construction: backward re-quantizes what it multiplies (the saved input, the
weight it re-gathers or keeps on ``ctx``) as its forward did - delayed scaling with the
*forward's* scales, kept on the call object; current scaling from the tensor's own amax, as
any current-scaling quantize - so the dgrad and wgrad operands are the forward's codes
whatever a saved-tensor hook did. TE 2.20.2 instead re-quantizes a re-gathered
DistributedWeight with the delayed scale updated since (docs/low-precision.md).

Scales:
- ``Float8CurrentScaling``: ``fp32(fp8_max / amax)`` of the tensor itself (amax 0 or not
  finite: 1).
- ``DelayedScaling``: each tensor's scale starts at 1; every quantize records its amax; at the
  outermost ``autocast`` exit the forward amaxes of the modules that ran are max-reduced over
  ``amax_reduction_group`` (a real all-reduce) and appended to their histories, at the end of
  a module's backward its gradient amaxes likewise; a scale becomes
  ``fp32(fp8_max / amax) / 2^margin`` with ``amax`` the history's maximum (``"max"``) or its
  newest entry (``"most_recent"``), kept when that amax is 0 or not finite.

This module is the reference's own code: the oracle's float64 model of the same recipes
(``harness.rank.quantized``) is written separately, so the two check each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Quantized", "autocast", "ModuleScaling", "for_forward"]

_F32 = torch.float32
_FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
_KINDS = {"DelayedScaling": "delayed", "Float8CurrentScaling": "current"}


def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=_F32)


@dataclass(frozen=True)
class Quantized:
    """One quantized GEMM operand: FP8 codes held as fp32 values, and ``fp32(1 / scale)``.

    ``a @ b`` multiplies the codes in fp32 and applies both scale-inverses to the accumulator
    (their fp32 product, then one fp32 multiply); ``dtype`` is the dtype the operand had
    before quantization (the cell's) and ``recipe`` the recipe that quantized it, which a
    planted perturbation reads."""

    codes: torch.Tensor
    scale_inv: float
    dtype: torch.dtype
    recipe: str = "none"

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def t(self) -> "Quantized":
        return Quantized(self.codes.t(), self.scale_inv, self.dtype, self.recipe)

    def __matmul__(self, other: "Quantized") -> torch.Tensor:
        alpha = _f32(self.scale_inv) * _f32(other.scale_inv)
        return (self.codes @ other.codes) * alpha


def quantize(t: torch.Tensor, scale: float, fmt: str, recipe: str = "none") -> Quantized:
    """``fp32(t * scale)`` rounded to nearest even in ``fmt``, saturating (NaN stays NaN)."""
    dtype, fmax = _FORMATS[fmt]
    codes = (t.detach().to(_F32) * _f32(scale)).clamp(-fmax, fmax).to(dtype).to(_F32)
    return Quantized(codes, float(_f32(1.0) / _f32(scale)), t.dtype, recipe)


def _amax(t: torch.Tensor) -> float:
    a = t.detach().abs().to(_F32)
    return float(torch.nan_to_num(a, nan=0.0).max()) if t.numel() else 0.0


def _scale_from(amax: float, fmt: str, margin: int, previous: float) -> float:
    if not (0.0 < amax < float("inf")):
        return previous
    scale = float((_f32(_FORMATS[fmt][1]) / _f32(amax)) / _f32(2.0**margin))
    return float(torch.finfo(_F32).max) if scale == float("inf") else scale


@dataclass
class TensorScaling:
    """The scaling state of one GEMM operand slot of one module (input, weight or gradient
    of one group member)."""

    fmt: str
    kind: str  # "delayed" or "current"
    margin: int = 0
    history_len: int = 1024
    most_recent: bool = False
    scale: float = 1.0
    history: list[float] = field(default_factory=list)
    pending: float = 0.0

    def next_scale(self, t: torch.Tensor) -> float:
        """The scale this quantize of ``t`` uses; a delayed slot records ``t``'s amax."""
        if self.kind == "current":
            return _scale_from(_amax(t), self.fmt, 0, 1.0)
        self.pending = max(self.pending, _amax(t))
        return self.scale

    def update(self, amax: float) -> None:
        """Delayed scaling's step: the reduced amax joins the history, the scale follows."""
        self.history = (self.history + [amax])[-self.history_len:]
        self.pending = 0.0
        chosen = self.history[-1] if self.most_recent else max(self.history)
        self.scale = _scale_from(chosen, self.fmt, self.margin, self.scale)


@dataclass
class ModuleScaling:
    """A module's FP8 state under one recipe: per group member, its input, weight and
    gradient slots, and the process group its delayed amaxes are reduced over."""

    kind: str
    x: list[TensorScaling]
    w: list[TensorScaling]
    dy: list[TensorScaling]
    reduce: bool = True
    group: Any = None

    def reduce_and_update(self, slots: list[TensorScaling]) -> None:
        """Max-reduce the slots' recorded amaxes over the group, then step each slot."""
        if self.kind != "delayed" or not slots:
            return
        amaxes = torch.tensor([s.pending for s in slots], dtype=_F32)
        if self.reduce and dist.is_available() and dist.is_initialized():
            dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=self.group)
        for s, a in zip(slots, amaxes.tolist()):
            s.update(a)


def _formats(recipe: Any) -> tuple[str, str]:
    fmt = getattr(getattr(recipe, "fp8_format", None), "name", "HYBRID")
    return {"HYBRID": ("e4m3", "e5m2"), "E4M3": ("e4m3", "e4m3"), "E5M2": ("e5m2", "e5m2")}[fmt]


def _new_state(recipe: Any, n: int, group: Any) -> ModuleScaling:
    kind = _KINDS.get(type(recipe).__name__)
    if kind is None:
        raise NotImplementedError(f"the reference runs {', '.join(_KINDS)} only, not {type(recipe).__name__}")
    fwd, bwd = _formats(recipe)
    common = dict(kind=kind, margin=int(getattr(recipe, "margin", 0)),
                  history_len=int(getattr(recipe, "amax_history_len", 1024)),
                  most_recent=getattr(recipe, "amax_compute_algo", "max") == "most_recent")
    return ModuleScaling(kind, [TensorScaling(fwd, **common) for _ in range(n)],
                         [TensorScaling(fwd, **common) for _ in range(n)],
                         [TensorScaling(bwd, **common) for _ in range(n)],
                         bool(getattr(recipe, "reduce_amax", True)), group)


@dataclass
class _Region:
    recipe: Any
    group: Any
    ran: dict[int, ModuleScaling] = field(default_factory=dict)


_REGIONS: list[_Region] = []


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Any = None,
             amax_reduction_group: Any = None, _graph: bool = False) -> Iterator[None]:
    """TE's ``autocast``: the reference modules called inside run their GEMMs in FP8 under
    ``recipe`` (default: ``DelayedScaling()``; nested, the innermost applies). At the
    outermost exit, with gradients enabled, delayed scaling reduces and steps the forward
    amaxes of every module that ran."""
    if not enabled:
        yield
        return
    if recipe is None:
        from harness.reference.recipe import DelayedScaling
        recipe = DelayedScaling()
    region = _Region(recipe, amax_reduction_group)
    _REGIONS.append(region)
    try:
        yield
    finally:
        _REGIONS.pop()
        if not _REGIONS and torch.is_grad_enabled():
            for state in region.ran.values():
                state.reduce_and_update(state.x + state.w)


@dataclass
class CallScaling:
    """What one forward under a recipe hands its backward: the module's state and the
    forward's scales of each member's input and weight (backward re-quantizes with them)."""

    state: ModuleScaling
    sx: list[float]
    sw: list[float]

    def forward_x(self, i: int, x: torch.Tensor) -> Quantized:
        self.sx[i] = self.state.x[i].next_scale(x)
        return quantize(x, self.sx[i], self.state.x[i].fmt, self.state.kind)

    def forward_w(self, i: int, w: torch.Tensor, amax_of: torch.Tensor | None = None) -> Quantized:
        """The forward's weight; its scale (current) or recorded amax (delayed) from
        ``amax_of`` when given (the whole weight is the correct source: ``w``)."""
        self.sw[i] = self.state.w[i].next_scale(w if amax_of is None else amax_of)
        return quantize(w, self.sw[i], self.state.w[i].fmt, self.state.kind)

    def saved_x(self, i: int, x: torch.Tensor) -> Quantized:
        return quantize(x, self.sx[i], self.state.x[i].fmt, self.state.kind)

    def saved_w(self, i: int, w: torch.Tensor) -> Quantized:
        """The weight backward multiplies (kept, or re-gathered): current scaling quantizes
        it as any tensor, from its own amax; delayed scaling with the forward's scale."""
        slot = self.state.w[i]  # a current-scaling slot records nothing: next_scale is the rule
        scale = slot.next_scale(w) if slot.kind == "current" else self.sw[i]
        return quantize(w, scale, slot.fmt, self.state.kind)

    def grad(self, i: int, dy: torch.Tensor, fmt: str | None = None) -> Quantized:
        """The output gradient in the gradient format (``fmt``: another, for a planted fault)."""
        slot = self.state.dy[i]
        if fmt is not None and slot.kind == "current":  # current scaling: from that format's max
            return quantize(dy, _scale_from(_amax(dy), fmt, 0, 1.0), fmt, self.state.kind)
        return quantize(dy, slot.next_scale(dy), fmt or slot.fmt, self.state.kind)

    def backward_done(self) -> None:
        """The end of this module's backward: delayed scaling steps the gradient slots."""
        self.state.reduce_and_update(self.state.dy)


def for_forward(module: torch.nn.Module, n: int) -> CallScaling | None:
    """The recipe state of ``module``'s forward when an ``autocast`` is active, else None.

    The module keeps one state per recipe object (a new recipe object, a new state, as TE
    keys its amax buffers by the recipe)."""
    if not _REGIONS:
        return None
    inner, outer = _REGIONS[-1], _REGIONS[0]  # nested: the innermost recipe applies (TE's rule)
    states: dict[int, tuple[Any, ModuleScaling]] = module.__dict__.setdefault("_fp8_states", {})
    key = id(inner.recipe)
    if key not in states or states[key][0] is not inner.recipe:
        states[key] = (inner.recipe, _new_state(inner.recipe, n, inner.group))
    state = states[key][1]
    state.group = inner.group
    outer.ran[id(state)] = state  # its forward amaxes are stepped at the outermost exit
    return CallScaling(state, [1.0] * n, [1.0] * n)
