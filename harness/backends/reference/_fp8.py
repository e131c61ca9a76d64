"""Low precision in the reference: TE's FP8 recipes, written from their definition.

Block recipes (``MXFP8BlockScaling``, ``Float8BlockScaling``) are stateless: each block of
an operand along its GEMM's K gets a power-of-two scale from its own amax
(:class:`BlockQuantized`), so backward's re-quantize of what it multiplies reproduces the
forward's codes. The rest of this docstring is about the per-tensor recipes.

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
(``harness.cell.quantized``) is written separately, so the two check each other.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Quantized", "autocast", "ModuleScaling", "for_forward"]

_F32 = torch.float32
_FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
_KINDS = {"DelayedScaling": "delayed", "Float8CurrentScaling": "current",
          "MXFP8BlockScaling": "mxfp8", "Float8BlockScaling": "blockwise", "NVFP4BlockScaling": "nvfp4"}
#: E2M1's non-negative values; NVFP4's global scale bound (E4M3 max x E2M1 max)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_NVFP4_BOUND = 448.0 * 6.0


@functools.lru_cache(maxsize=None)
def _code_table(dtype: torch.dtype) -> torch.Tensor:
    """The fp32 value of each of the 256 codes of the FP8 ``dtype``, by code."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(_F32)


def _decoded(codes: torch.Tensor) -> torch.Tensor:
    """FP8 ``codes`` as fp32: read from a table of the 256 (torch's FP8 -> fp32 conversion on
    CPU took twice as long; the same values, signed zeros and NaNs included)."""
    return torch.take(_code_table(codes.dtype), codes.view(torch.uint8).long())


def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=_F32)


#: what a block quantizer does with the blocks' amaxes before it takes their scales: given the
#: amaxes (one per block or tile, keeping the blocked dimensions) and the dimension that indexes
#: the blocks along K, the amaxes each block's scale comes from. The reference passes None (each
#: block its own amax); a planted fault (``harness.backends.reference.mutants``) passes another
AmaxMap = Callable[[torch.Tensor, int], torch.Tensor]


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

    def along(self, k_axis: int) -> torch.Tensor:
        """The operand's values as fp32 (exact when ``scale_inv`` is 1: a mixed GEMM's
        unquantized operand)."""
        return self.codes * _f32(self.scale_inv)


def _pow2(v: torch.Tensor, up: bool) -> torch.Tensor:
    """The power of two nearest ``v`` (positive fp32) from above (``up``) or from below."""
    m, e = torch.frexp(v)
    if up:
        e = torch.where(m == 0.5, e - 1, e)
    else:
        e = e - 1
    return torch.ldexp(torch.ones_like(v), e)


def _block_values(blocks: torch.Tensor, dims: tuple[int, ...], rule: str, fmt: str,
                  dtype: torch.dtype, k_dim: int, amax_map: AmaxMap | None = None) -> torch.Tensor:
    """Quantize-dequantize ``blocks`` (fp32), one power-of-two scale per block over ``dims``
    (``k_dim`` indexes the blocks along K; ``amax_map``: :data:`AmaxMap`):
    MXFP8's ``scale_inv`` is the smallest power of two at least ``amax / fp8_max`` (E8M0,
    ``2^-127 .. 2^127``); block scaling's ``scale`` the largest power of two at most
    ``fp8_max / amax`` (an infinite one: ``dtype``'s largest value first). An all-zero
    block keeps scale 1."""
    fp8, fmax = _FORMATS[fmt]
    amax = torch.nan_to_num(blocks.abs(), nan=0.0).amax(dim=dims, keepdim=True)
    if amax_map is not None:
        amax = amax_map(amax, k_dim)
    live = (amax > 0) & torch.isfinite(amax)
    safe = torch.where(live, amax, torch.ones_like(amax))
    if rule == "mxfp8":
        scale = 1.0 / _pow2(safe * _f32(1.0 / fmax), up=True).clamp(2.0**-127, 2.0**127)
    else:
        raw = _f32(fmax) / safe
        scale = _pow2(torch.where(torch.isinf(raw), torch.full_like(raw, torch.finfo(dtype).max), raw), up=False)
    scale = torch.where(live, scale, torch.ones_like(scale))
    return _decoded((blocks * scale).clamp(-fmax, fmax).to(fp8)) / scale


def _to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 ``v`` rounded to the nearest E2M1 value, ties to the value whose code is even
    (0, 1, 2, 4 among the halves' neighbours), saturating at 6."""
    sign = torch.where(torch.signbit(v), -1.0, 1.0)
    m = v.abs().clamp(max=6.0)
    # E2M1 is a 1-bit-mantissa float: spacing 0.5 below 2, 1 in [2, 4), 2 in [4, 6]
    step = torch.where(m < 2.0, 0.5, torch.where(m < 4.0, 1.0, 2.0))
    q = torch.round(m / step) * step  # torch.round: half to even, on the step count
    return sign * q.clamp(max=6.0)


def nvfp4_codes(src: torch.Tensor, tile: bool, amax: torch.Tensor, amax_map: AmaxMap | None = None) -> torch.Tensor:
    """``src`` (2-D fp32, K along its last axis) as ``code * block_scale`` (fp32, exact): 16-long
    blocks along the last axis (``tile``: 16x16 tiles), E4M3 block scales from each block's
    amax (``amax_map``: :data:`AmaxMap`) under the tensor scale of ``amax``; the tensor factor
    ``amax / (448 * 6)`` is the GEMM's (``BlockQuantized.__matmul__``)."""
    r, c = src.shape
    enc = torch.clamp(_f32(_NVFP4_BOUND) / amax, max=torch.finfo(_F32).max)
    enc = torch.where((amax == 0) | (enc == 0), _f32(1.0), enc)
    dec = torch.tensor(1.0 / float(enc), dtype=torch.float64).to(_F32)
    rows, nb = (-(-r // 16) * 16 if tile else r), -(-c // 16)
    x = torch.nn.functional.pad(src, (0, nb * 16 - c, 0, rows - r))
    blocks = x.reshape(rows, nb, 16)
    bamax = torch.nan_to_num(blocks.abs(), nan=0.0).amax(-1)
    if tile:
        bamax = bamax.reshape(rows // 16, 16, nb).amax(1)
        bamax = (bamax if amax_map is None else amax_map(bamax, 1)).repeat_interleave(16, dim=0)
    elif amax_map is not None:
        bamax = amax_map(bamax, 1)
    scale = _decoded((bamax * (enc * _f32(1.0 / 6.0))).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
    inv = torch.clamp(_f32(1.0) / (scale * dec), max=torch.finfo(_F32).max)
    vals = _to_e2m1(blocks * inv.unsqueeze(-1)) * scale.unsqueeze(-1)
    return vals.reshape(rows, nb * 16)[:r, :c]


def nvfp4_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor) -> torch.Tensor:
    """What an NVFP4 GEMM multiplies its accumulator by: ``amax_a * amax_b * fp32(1 / (6 * 6 *
    448 * 448))``, fp32."""
    return amax_a * amax_b * (_f32(1.0) / _f32(_NVFP4_BOUND * _NVFP4_BOUND))


def block_quantized(src: torch.Tensor, rule: str, axis: int, fmt: str, dtype: torch.dtype,
                    amax: float | None = None, amax_map: AmaxMap | None = None) -> torch.Tensor:
    """``src`` (2-D fp32) quantize-dequantized by ``rule``: ``"mxfp8"`` (blocks of 32 along
    ``axis``), ``"1d"`` (blocks of 128 along ``axis``), ``"2d"`` (128x128 tiles, ``axis``
    ignored); a short last block is a block too. Exact: every scale is a power of two.
    ``"nvfp4"`` / ``"nvfp4-2d"`` (16 along ``axis`` / 16x16 tiles): ``code * block_scale``,
    without the tensor factor (:func:`nvfp4_codes`), under the tensor amax ``amax`` (``src``'s
    own when None). ``amax_map``: :data:`AmaxMap` (the blocks indexed along ``axis``; a tile's
    along ``src``'s columns)."""
    if rule.startswith("nvfp4"):
        a = _f32(amax) if amax is not None else (torch.nan_to_num(src.abs(), nan=0.0).max() if src.numel()
                                                  else _f32(0.0))
        tile = rule == "nvfp4-2d"
        v = src if tile else src.movedim(axis, -1)  # a tile's blocks are indexed along the columns
        out = nvfp4_codes(v, tile, a, amax_map)
        return out if tile else out.movedim(-1, axis)
    if rule == "2d":
        r, c = src.shape
        br, bc = -(-r // 128), -(-c // 128)
        tiles = torch.nn.functional.pad(src, (0, bc * 128 - c, 0, br * 128 - r)).reshape(br, 128, bc, 128)
        return _block_values(tiles, (1, 3), rule, fmt, dtype, 2, amax_map).reshape(br * 128, bc * 128)[:r, :c]
    size = 32 if rule == "mxfp8" else 128
    v = src.movedim(axis, -1)
    n = v.shape[-1]
    nb = -(-n // size)
    blocks = torch.nn.functional.pad(v, (0, nb * size - n)).reshape(*v.shape[:-1], nb, size)
    out = _block_values(blocks, (-1,), rule, fmt, dtype, -2, amax_map).reshape(*v.shape[:-1], nb * size)[..., :n]
    return out.movedim(-1, axis)


@dataclass(frozen=True)
class BlockQuantized:
    """One GEMM operand of a block recipe: the high-precision tensor, quantized when a GEMM
    reads it - along that GEMM's K, which is the last axis of a left operand and the first of
    a right one (TE keeps a row-wise and a column-wise quantization of each tensor, each from
    the high-precision values). ``a @ b`` multiplies the exactly dequantized values in fp32
    (the products are exact; only the accumulation rounds)."""

    src: torch.Tensor          # fp32, in the orientation it was quantized from
    rule: str                  # "mxfp8", "1d" or "2d" (``block_quantized``)
    fmt: str
    dtype: torch.dtype
    recipe: str
    transposed: bool = False
    #: NVFP4: the amax its tensor scale comes from, when not the tensor's own (a planted fault)
    tensor_amax: float | None = None

    @property
    def shape(self) -> torch.Size:
        return self.src.t().shape if self.transposed else self.src.shape

    @property
    def device(self) -> torch.device:
        return self.src.device

    def t(self) -> "BlockQuantized":
        return replace(self, transposed=not self.transposed)

    def along(self, k_axis: int) -> torch.Tensor:
        """The dequantized values (as this operand is oriented) blocked along ``k_axis``."""
        vals = block_quantized(self.src, self.rule, k_axis ^ int(self.transposed), self.fmt, self.dtype,
                               self.tensor_amax)
        return vals.t() if self.transposed else vals

    def amax(self) -> torch.Tensor:
        """The tensor's amax (fp32): an NVFP4 operand's tensor scale comes from it."""
        if self.tensor_amax is not None:
            return _f32(self.tensor_amax)
        a = torch.nan_to_num(self.src.abs(), nan=0.0)
        return a.max() if a.numel() else _f32(0.0)

    def __matmul__(self, other: "Quantized | BlockQuantized") -> torch.Tensor:
        out = self.along(1) @ other.along(0)
        if self.rule.startswith("nvfp4") and isinstance(other, BlockQuantized) and other.rule.startswith("nvfp4"):
            return out * nvfp4_alpha(self.amax(), other.amax())
        return out


#: a quantized GEMM operand of any recipe
QUANTIZED = (Quantized, BlockQuantized)


def quantize(t: torch.Tensor, scale: float, fmt: str, recipe: str = "none") -> Quantized:
    """``fp32(t * scale)`` rounded to nearest even in ``fmt``, saturating (NaN stays NaN)."""
    dtype, fmax = _FORMATS[fmt]
    codes = _decoded((t.detach().to(_F32) * _f32(scale)).clamp(-fmax, fmax).to(dtype))
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
    #: a block recipe's rule for the input, the weight and the gradient (``block_quantized``);
    #: empty for a per-tensor recipe
    rules: tuple[str, str, str] = ()

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
    rules = _block_rules(recipe, kind)
    common = dict(kind=kind, margin=int(getattr(recipe, "margin", 0)),
                  history_len=int(getattr(recipe, "amax_history_len", 1024)),
                  most_recent=getattr(recipe, "amax_compute_algo", "max") == "most_recent")
    return ModuleScaling(kind, [TensorScaling(fwd, **common) for _ in range(n)],
                         [TensorScaling(fwd, **common) for _ in range(n)],
                         [TensorScaling(bwd, **common) for _ in range(n)],
                         bool(getattr(recipe, "reduce_amax", True)), group, rules)


def _block_rules(recipe: Any, kind: str) -> tuple[str, str, str]:
    """The block rules of ``recipe`` (input, weight, gradient); () for a per-tensor one."""
    if kind == "nvfp4":
        if not (getattr(recipe, "disable_rht", False) and getattr(recipe, "disable_stochastic_rounding", False)):
            raise NotImplementedError("the reference runs NVFP4BlockScaling with disable_rht and "
                                      "disable_stochastic_rounding only")
        return ("nvfp4", "nvfp4" if getattr(recipe, "disable_2d_quantization", False) else "nvfp4-2d", "nvfp4")
    if kind == "mxfp8":
        if getattr(recipe, "enable_2d_quantization", False):
            raise NotImplementedError("the reference runs MXFP8 with 1-D blocks only")
        return ("mxfp8", "mxfp8", "mxfp8")
    if kind != "blockwise":
        return ()
    for q in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
        if not getattr(getattr(recipe, q, None), "power_2_scale", True):
            raise NotImplementedError("the reference runs Float8BlockScaling with power-of-two scales only")
    dims = (getattr(recipe, f"{t}_block_scaling_dim", d) for t, d in (("x", 1), ("w", 2), ("grad", 1)))
    return tuple(f"{int(d)}d" for d in dims)  # type: ignore[return-value]


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
        from harness.backends.reference.recipe import DelayedScaling
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


class BlockCallScaling(CallScaling):
    """A block recipe's call: stateless (every block's scale from its own amax), so backward
    re-quantizes what it multiplies from the high-precision tensor and gets the forward's
    codes. No per-tensor scale to take from a shard (``amax_of`` is a per-tensor recipe's)."""

    def _q(self, t: torch.Tensor, which: int, fmt: str) -> BlockQuantized:
        return BlockQuantized(t.detach().to(_F32), self.state.rules[which], fmt, t.dtype, self.state.kind)

    def forward_x(self, i: int, x: torch.Tensor) -> BlockQuantized:
        return self._q(x, 0, self.state.x[i].fmt)

    def forward_w(self, i: int, w: torch.Tensor, amax_of: torch.Tensor | None = None) -> BlockQuantized:
        return self._q(w, 1, self.state.w[i].fmt)

    def saved_x(self, i: int, x: torch.Tensor) -> BlockQuantized:
        return self.forward_x(i, x)

    def saved_w(self, i: int, w: torch.Tensor) -> BlockQuantized:
        return self.forward_w(i, w)

    def grad(self, i: int, dy: torch.Tensor, fmt: str | None = None) -> BlockQuantized:
        return self._q(dy, 2, fmt or self.state.dy[i].fmt)


def cached_weight(fp8: CallScaling, module: torch.nn.Module, i: int, w: torch.Tensor,
                  first: bool | None) -> Quantized | BlockQuantized:
    """Member ``i``'s forward weight under ``is_first_microbatch=first`` (TE's FP8 weight
    caching, ``quantize_weight``): None quantizes afresh; True quantizes and keeps the result
    on the module; False reuses what was kept - codes and scale, recording no amax - and
    backward re-quantizes a kept weight with that scale (the codes the workspace holds)."""
    if first is None:
        return fp8.forward_w(i, w)
    kept: dict[int, tuple[Quantized | BlockQuantized, float]] = module.__dict__.setdefault("_fp8_weight_workspaces", {})
    if not first and i in kept:
        operand, fp8.sw[i] = kept[i]
        return operand
    operand = fp8.forward_w(i, w.detach().clone())  # a workspace owns its data: the gathered buffer is reused
    kept[i] = (operand, fp8.sw[i])
    return operand


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
    return (BlockCallScaling if state.rules else CallScaling)(state, [1.0] * n, [1.0] * n)
