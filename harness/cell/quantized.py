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
- ``delayed`` (``DelayedScaling``): :class:`DelayedScaling`.
- ``mxfp8`` and ``blockwise`` (``MXFP8BlockScaling``, ``Float8BlockScaling``): every block of
  an operand along its GEMM's K has a power-of-two scale of its own, so each GEMM reads its
  own quantization of a tensor (:class:`BlockScaling`).
- ``nvfp4`` (``NVFP4BlockScaling``, no Hadamard transform, no stochastic rounding): E2M1
  blocks of 16 along K with E4M3 scales under a tensor scale (:class:`Nvfp4Scaling`).

The module is the float64 twin of te-cpu's kernels (``harness/backends/te_cpu/quant/``, which a rank
may not import: te-cpu is one backend among others); ``cases/test_quantized_oracle.py``
checks the two agree code for code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.vocabulary import recipes
from harness.cell.inputs import CellInputs, group_rows

F64 = torch.float64
FP32_MAX = torch.finfo(torch.float32).max
#: a quantized GEMM applies both operands' scale-inverses to its fp32 accumulator: their
#: product and that product's multiply, two fp32 roundings (``2 u(fp32)``) of a value no
#: larger than the magnitude (te-cpu's ``quant/qgemm.py``; cuBLASLt's scale modes likewise)
SCALE_U = 2 * 2.0**-24
#: the bounds ``(lo, hi)`` of a GEMM input known only within them, per (rank, microbatch)
Bounds = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]

__all__ = ["Fp8", "FORMATS", "cast", "current_scale", "Quantizer", "BlockScaling", "Nvfp4Scaling", "UnquantizedDgradWeight",
           "for_recipe", "ShardScaled"]


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


_TF32_DROPPED_BITS = 23 - 10  # fp32 has 23 explicit mantissa bits, TF32 keeps 10


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) rounded to TF32 precision (10 mantissa bits, ties to even), still fp32: what a
    tensor core's fp32 GEMM under ``CUBLAS_COMPUTE_32F_FAST_TF32`` multiplies (te-cpu's
    ``te-cpu-tf32`` GEMMs, and the self-test's TF32 fault).

    Non-finite values pass through unchanged (a NaN must not round into an infinity).
    """
    if x.dtype != torch.float32:
        raise ValueError(f"round_to_tf32 expects float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    half = 1 << (_TF32_DROPPED_BITS - 1)
    lsb = (bits >> _TF32_DROPPED_BITS) & 1
    rounded = ((bits + half - 1 + lsb) >> _TF32_DROPPED_BITS) << _TF32_DROPPED_BITS
    # back into int32's range (the sign bit lives in bit 31), then reinterpret as fp32
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x).view(x.shape)


def cast(t: torch.Tensor, scale: float, fmt: Fp8) -> torch.Tensor:
    """The FP8 codes (as float64 values) TE writes for ``t`` under ``scale``: ``fp32(t * scale)``
    rounded to nearest even, saturating (torch's cast rounds to nearest even; the clamp first
    makes it saturate, as ``__NV_SATFINITE`` does; NaN stays NaN)."""
    v = (t.to(F64) * scale).to(torch.float32)
    codes = v.clamp(-fmt.max, fmt.max).to(fmt.dtype)
    # the codes' values read from a table of all 256 (torch's FP8 -> float64 conversion took
    # twice as long; the same values, signed zeros and NaNs included)
    return torch.take(_code_values(fmt.dtype), codes.view(torch.uint8).long())


@functools.lru_cache(maxsize=None)
def _code_values(dtype: torch.dtype) -> torch.Tensor:
    """The float64 value of each of the 256 codes of the FP8 ``dtype``, by code."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(F64)


def _amax(t: torch.Tensor) -> float:
    """The largest ``|t|`` in fp32 (NaNs ignored, 0 for an empty tensor), as TE's amax kernel."""
    a = t.detach().abs().to(torch.float32)
    return float(a.nan_to_num(nan=0.0, posinf=math.inf).max()) if t.numel() else 0.0


def _fp32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def current_scale(t: torch.Tensor, fmt: Fp8) -> float:
    """Current scaling's scale for ``t``: ``fp32(fp8_max / amax)`` (one fp32 division)."""
    return _scale_of_amax(_amax(t), fmt)


def _scale_of_amax(amax: float, fmt: Fp8) -> float:
    if amax == 0.0 or amax != amax or amax == float("inf"):
        return 1.0
    scale = float(torch.tensor(fmt.max, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32))
    return FP32_MAX if scale == float("inf") else scale


def amax_bounds(lo: torch.Tensor, hi: torch.Tensor) -> tuple[float, float]:
    """The smallest and largest amax a tensor anywhere in the box ``[lo, hi]`` can have."""
    least = torch.where(lo * hi > 0, torch.minimum(lo.abs(), hi.abs()), torch.zeros_like(lo))
    return _amax(least), _amax(torch.maximum(lo.abs(), hi.abs()))


def dequantized_box(lo: torch.Tensor, hi: torch.Tensor, scales: tuple[float, float] | tuple[torch.Tensor, torch.Tensor],
                    fmt: Fp8) -> tuple[torch.Tensor, torch.Tensor]:
    """The centre and half-width of every value the quantize-dequantize of an element in
    ``[lo, hi]`` under any scale in ``scales`` (smallest, largest; numbers, or per-element
    power-of-two tensors: a block recipe's) can give. The cast is monotone in ``x * scale``,
    so the codes are extremal at the box's corners; so is ``code * scale_inv``."""
    codes = [cast(t, s, fmt) for t in (lo, hi) for s in scales]
    cmin, cmax = torch.stack(codes).min(0).values, torch.stack(codes).max(0).values
    invs = [1.0 / s if isinstance(s, torch.Tensor) else _fp32(1.0 / _fp32(s)) for s in scales]
    vals = [c * inv for c in (cmin, cmax) for inv in invs]
    vmin, vmax = torch.stack(vals).min(0).values, torch.stack(vals).max(0).values
    return (vmin + vmax) / 2, (vmax - vmin) / 2


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
    #: the unit roundoff of applying the operands' scale-inverses to a GEMM's fp32 accumulator
    #: (per-tensor scales: :data:`SCALE_U`; power-of-two block scales are exact: 0)
    scale_u = 0.0
    #: whether the wgrad GEMM reads the input and the gradient quantized otherwise than the
    #: forward and dgrad GEMMs (a block recipe blocks them along the GEMM's K)
    by_direction = False
    #: whether a normalized GEMM input reaches the quantizer rounded to the activation dtype
    #: (True), or may reach it in fp32 too (None): ``oracle._normalized_bounds``
    norm_rounded: bool | None = None

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def seen_by(self, rank: int) -> "Quantizer":
        """The quantizer as rank ``rank``'s GEMMs see the weight: the same on every rank,
        but in a view whose weight depends on the rank (:class:`ShardScaled`)."""
        return self

    def x_box(self, r: int, m: int, g: int, lo: torch.Tensor,
              hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The GEMM input known only within ``[lo, hi]`` (LayerNormLinear's normalized rows):
        the centre and half-width of what its quantize-dequantize can give."""
        raise NotImplementedError(f"{type(self).__name__} has no interval input")

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return t

    def x_box_wgrad(self, r: int, m: int, g: int, lo: torch.Tensor,
                    hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An interval input as the wgrad GEMM reads it (a block recipe: along the rows)."""
        return self.x_box(r, m, g, lo, hi)

    def x_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        """The input as the wgrad GEMM reads it (a block recipe blocks it along the rows)."""
        return self.x(r, m, g, t)

    def dy_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        """The output gradient as the wgrad GEMM reads it."""
        return self.dy(r, m, g, t)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return t


class CurrentScaling(Quantizer):
    """``Float8CurrentScaling`` (``HYBRID``): every operand scaled from its own amax. The
    weight a DistributedWeight re-gathers in backward is quantized again with the layer's
    quantizer (TE's ``linear.py``), from its own amax: the forward operand again. A
    normalization's output is quantized after its rounding to the activation dtype (TE's
    ``normalization.cpp``: no fused kernel for this quantizer)."""

    quantized = True
    scale_u = SCALE_U
    norm_rounded = True

    def __init__(self, fwd: Fp8, bwd: Fp8) -> None:
        self.fwd, self.bwd = fwd, bwd

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.fwd), self.fwd)

    def x_box(self, r: int, m: int, g: int, lo: torch.Tensor,
              hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        least, most = amax_bounds(lo, hi)  # the scale from the tensor's own amax, either end
        return dequantized_box(lo, hi, (_scale_of_amax(most, self.fwd), _scale_of_amax(least, self.fwd)), self.fwd)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.bwd), self.bwd)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return dequantized(t, current_scale(t, self.fwd), self.fwd)


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

    ``cached`` (``is_first_microbatch``: True, then False): the FP8 weight the first
    microbatch quantized is the workspace every later forward multiplies (TE's
    ``quantize_weight`` with ``update_workspace=False``), codes and scale alike; those forwards
    record no weight amax, which changes no scale here (the window's maximum already holds the
    same weight's).

    The weight the input gradient multiplies: a plain weight's forward operand, saved on ctx;
    a DistributedWeight's is never saved (TE's ``linear.py``: backward re-gathers it and
    quantizes it again with the layer's quantizer), so its dgrad operand is the backward copy
    quantized with the weight's scale *as updated after this microbatch's forward* - and that
    quantize's amax enters the next update.
    """

    quantized = True
    scale_u = SCALE_U

    def __init__(self, fwd: Fp8, bwd: Fp8, inputs: CellInputs, tags: tuple[float, float],
                 distributed: bool, x_bounds: Bounds | None = None, cached: bool = False) -> None:
        self.fwd, self.bwd = fwd, bwd
        groups, mbs, world = len(inputs.weights), len(inputs.x[0]), len(inputs.x)
        W = [w.to(F64) for w in inputs.weights]
        #: the input's scales as a (from the largest amax, from the smallest) pair: an input
        #: known within bounds (``x_bounds``) records an amax known within bounds
        self.sx: dict[tuple[int, int], tuple[float, float]] = {}
        self.sdy: dict[tuple[int, int], float] = {}
        self.swf: dict[tuple[int, int], float] = {}
        self.swb: dict[tuple[int, int], float] = {}
        s_x, s_x2, s_w, s_dy = [1.0] * groups, [1.0] * groups, [1.0] * groups, [1.0] * groups
        m_x, m_x2, m_w, m_dy = [0.0] * groups, [0.0] * groups, [0.0] * groups, [0.0] * groups
        #: the scales after the cell's last update, per operand and member (``scales_after``);
        #: ``after_input_bounds`` the input's other end (equal but for an interval input)
        self.after: dict[str, list[float]] = {"input": s_x, "weight": s_w, "grad_output": s_dy}
        self.after_input_bounds = s_x2
        for m in range(mbs):
            rows = [group_rows(inputs.splits[r][m]) for r in range(world)]
            boxes = [x_bounds(r, m) if x_bounds else (inputs.x[r][m], inputs.x[r][m]) for r in range(world)]
            for g in range(groups):
                self.sx[m, g] = (s_x[g], s_x2[g])
                self.swf[m, g] = self.swf[0, g] if cached and m > 0 else s_w[g]
                amaxes = [amax_bounds(lo[rows[r][g]], hi[rows[r][g]]) for r, (lo, hi) in enumerate(boxes)]
                m_x[g] = max(m_x[g], *(most for _, most in amaxes))
                m_x2[g] = max(m_x2[g], *(least for least, _ in amaxes))
                m_w[g] = max(m_w[g], _amax(W[g] * tags[0]))
                s_x[g] = _delayed_scale(m_x[g], fwd, s_x[g])
                s_x2[g] = _delayed_scale(m_x2[g], fwd, s_x2[g])
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
        return dequantized(t, self.sx[m, g][0], self.fwd)

    def x_box(self, r: int, m: int, g: int, lo: torch.Tensor,
              hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return dequantized_box(lo, hi, self.sx[m, g], self.fwd)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return dequantized(t, self.sdy[m, g], self.bwd)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return dequantized(t, (self.swb if backward else self.swf)[m, g], self.fwd)


def _pow2_up(v: torch.Tensor) -> torch.Tensor:
    """The smallest power of two at least ``v`` (positive), elementwise: ``v = m 2^e`` with
    ``m`` in ``[0.5, 1)`` is ``2^(e - 1)`` when ``m`` is 0.5, else ``2^e``."""
    m, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), torch.where(m == 0.5, e - 1, e))


def _pow2_down(v: torch.Tensor) -> torch.Tensor:
    """The largest power of two at most ``v`` (positive): the fp32 mantissa bits cleared."""
    _, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), e - 1)


def _block_amax(blocks: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    # NaN counts as 0 (TE's amax kernel); an infinity stays one
    return blocks.abs().to(torch.float32).nan_to_num(nan=0.0, posinf=math.inf).amax(dim=dims).to(F64)


def mxfp8_scale_inv(amax: torch.Tensor, fmt: Fp8) -> torch.Tensor:
    """MXFP8's block scale-inverse (the E8M0 value) from the block's fp32 amax: the smallest
    power of two at least ``fp32(amax * fp32(1 / fp8_max))``, within E8M0's ``2^-127 ..
    2^127`` (an all-zero block: ``2^-127``; its codes are 0 whatever the scale)."""
    rcp = torch.tensor(1.0 / fmt.max, dtype=torch.float32)
    v = (amax.to(torch.float32) * rcp).to(F64)
    up = torch.where(v > 0, _pow2_up(torch.where(v > 0, v, torch.ones_like(v))), torch.full_like(v, 2.0**-127))
    return up.clamp(2.0**-127, 2.0**127)


def block_scale(amax: torch.Tensor, fmt: Fp8, input_dtype: torch.dtype) -> torch.Tensor:
    """``Float8BlockScaling``'s block scale (TE's defaults: power-of-two scales, no epsilon):
    ``fp32(fp8_max / amax)``, an infinite one replaced by the input dtype's largest value,
    rounded down to a power of two; amax 0, inf or NaN: 1."""
    a = amax.to(torch.float32)
    s = torch.full_like(a, fmt.max) / a
    s = torch.where(torch.isinf(s), torch.full_like(s, torch.finfo(input_dtype).max), s).to(F64)
    usable = (a > 0) & torch.isfinite(a)
    return torch.where(usable, _pow2_down(torch.where(usable, s, torch.ones_like(s))), torch.ones_like(s))


def _blocks_of(t: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """``t`` (2-D, float64) as ``[..., blocks, size]`` along ``axis``, zero-padded."""
    v = t.movedim(axis, -1)
    nb = -(-v.shape[-1] // size)
    return torch.nn.functional.pad(v.to(F64), (0, nb * size - v.shape[-1])).reshape(*v.shape[:-1], nb, size)


def _unblock(blocks: torch.Tensor, like: torch.Tensor, axis: int) -> torch.Tensor:
    v = like.movedim(axis, -1)
    return blocks.reshape(*v.shape[:-1], blocks.shape[-2] * blocks.shape[-1])[..., :v.shape[-1]].movedim(-1, axis)


def _rule_scale(amax: torch.Tensor, fmt: Fp8, rule: str, dtype: torch.dtype) -> torch.Tensor:
    return 1.0 / mxfp8_scale_inv(amax, fmt) if rule == "mxfp8" else block_scale(amax, fmt, dtype)


def blocked_box(lo: torch.Tensor, hi: torch.Tensor, axis: int, size: int, fmt: Fp8, rule: str,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The centre and half-width of what :func:`blocked` can give for a tensor known only
    within ``[lo, hi]``: each block's scale from the smallest or the largest amax the block
    can have (:func:`amax_bounds`, per block), every element at either end."""
    blo, bhi = _blocks_of(lo, axis, size), _blocks_of(hi, axis, size)
    least = torch.where(blo * bhi > 0, torch.minimum(blo.abs(), bhi.abs()), torch.zeros_like(blo))
    most = torch.maximum(blo.abs(), bhi.abs())
    scales = tuple(_rule_scale(_block_amax(a, (-1,)), fmt, rule, dtype).unsqueeze(-1).expand_as(blo)
                   for a in (most, least))
    centre, half = dequantized_box(blo, bhi, scales, fmt)  # type: ignore[arg-type]
    return _unblock(centre, lo, axis), _unblock(half, lo, axis)


def blocked(t: torch.Tensor, axis: int, size: int, fmt: Fp8, rule: str, dtype: torch.dtype) -> torch.Tensor:
    """``t`` (2-D) quantize-dequantized in blocks of ``size`` consecutive elements along
    ``axis`` (the GEMM's K; the last block may be short), each block with its own scale:
    ``rule`` ``"mxfp8"`` (:func:`mxfp8_scale_inv`) or ``"block"`` (:func:`block_scale`;
    ``dtype`` is the tensor's before quantization, the cell's). Every scale is a power of two: exact, so only the FP8 cast rounds."""
    padded = _blocks_of(t, axis, size)
    scale = _rule_scale(_block_amax(padded, (-1,)), fmt, rule, dtype).unsqueeze(-1)
    return _unblock(cast(padded, scale, fmt) / scale, t, axis)


def tiled(t: torch.Tensor, size: int, fmt: Fp8, dtype: torch.dtype) -> torch.Tensor:
    """``t`` (2-D) quantize-dequantized in ``size x size`` tiles, one power-of-two scale each
    (:func:`block_scale`): ``Float8BlockScaling``'s weights, the same tiles whichever way a
    GEMM reads them."""
    r, c = t.shape
    br, bc = -(-r // size), -(-c // size)
    padded = torch.nn.functional.pad(t.to(F64), (0, bc * size - c, 0, br * size - r))
    tiles = padded.reshape(br, size, bc, size)
    scale = block_scale(_block_amax(tiles, (1, 3)), fmt, dtype)[:, None, :, None]
    return (cast(tiles, scale, fmt) / scale).reshape(br * size, bc * size)[:r, :c]


class BlockScaling(Quantizer):
    """``MXFP8BlockScaling`` and ``Float8BlockScaling`` (TE's defaults: E4M3 everywhere): every
    block of a GEMM operand along the GEMM's K has its own power-of-two scale, from its own
    amax - stateless, so a re-quantize (a DistributedWeight's backward re-gather, a saved
    input) gives the forward's codes again. A tensor is quantized once per direction it is
    read in (TE's row-wise and column-wise data, each from the high-precision tensor):

    - the input: along its features for forward, along its rows for wgrad;
    - the output gradient: along its features for dgrad, along its rows for wgrad;
    - the weight: ``mxfp8`` along ``in`` for forward, along ``out`` for dgrad; ``blockwise``
      in 128x128 tiles (TE's 2-D weight scaling), the same for both.

    ``mxfp8`` blocks are 32 long (E8M0 scales); ``blockwise`` blocks of the input and the
    gradient are 128 long (1-D scaling). A GroupedLinear quantizes each group's rows alone, so
    a wgrad block never spans two groups (``oracle._GemmInputs``).
    """

    quantized = True
    scale_u = 0.0
    by_direction = True

    def __init__(self, rule: str, fmt: Fp8, dtype: torch.dtype) -> None:
        self.rule, self.fmt, self.dtype = rule, fmt, dtype
        self.size = 32 if rule == "mxfp8" else 128

    def _along(self, t: torch.Tensor, axis: int) -> torch.Tensor:
        return blocked(t, axis, self.size, self.fmt, self.rule, self.dtype)

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self._along(t, 1)

    def x_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self._along(t, 0)

    def _box(self, lo: torch.Tensor, hi: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
        return blocked_box(lo, hi, axis, self.size, self.fmt, self.rule, self.dtype)

    def x_box(self, r: int, m: int, g: int, lo: torch.Tensor,
              hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._box(lo, hi, 1)

    def x_box_wgrad(self, r: int, m: int, g: int, lo: torch.Tensor,
                    hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._box(lo, hi, 0)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self._along(t, 1)

    def dy_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self._along(t, 0)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        if self.rule == "block":
            return tiled(t, self.size, self.fmt, self.dtype)
        return self._along(t, 0 if backward else 1)


#: NVFP4's two maxima (E4M3 block scales, E2M1 elements) and the E2M1 values
NVFP4_GLOBAL = 448.0 * 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: an NVFP4 GEMM folds both tensor amaxes into ``alpha`` (``amax_A * amax_B``, times the
#: fp32 constant ``1 / (6 * 6 * 448 * 448)``, three roundings) and multiplies the accumulator
#: by it (a fourth): te-cpu's ``quant/nvfp4.py gemm_alpha``, cuBLASLt's scale mode likewise
NVFP4_SCALE_U = 4 * 2.0**-24


def e2m1(v: torch.Tensor) -> torch.Tensor:
    """The E2M1 value (float64) nearest ``v`` (fp32 values), ties to the even code, saturating
    at +-6 (``cvt.rn.satfinite.e2m1x2.f32``): the number of midpoints between neighbouring
    values below ``|v|`` is the lower neighbour's index; on a midpoint the even index wins."""
    grid = torch.tensor(E2M1_GRID, dtype=F64)
    mids = (grid[1:] + grid[:-1]) / 2
    mag = v.to(F64).abs().clamp(max=6.0).contiguous()
    i = torch.searchsorted(mids, mag)  # midpoints strictly below
    tie = (i < len(mids)) & (mag == mids[i.clamp(max=len(mids) - 1)])
    i = torch.where(tie & (i % 2 == 1), i + 1, i)
    return torch.where(torch.signbit(v.to(F64)), -grid[i], grid[i])


def nvfp4_scales(amax: float) -> tuple[float, float]:
    """NVFP4's tensor scales from the tensor's fp32 amax: ``S_enc = fp32(448 * 6 / amax)`` (at
    most fp32's max; amax 0: 1) and ``S_dec = fp32(1 / S_enc)``."""
    if amax == 0.0:
        return 1.0, 1.0
    enc = min(_fp32(NVFP4_GLOBAL / _fp32(amax)), FP32_MAX) if amax != float("inf") else 1.0
    enc = 1.0 if enc == 0.0 else enc
    return enc, _fp32(1.0 / enc)


def _nvfp4_values(t: torch.Tensor, blocks_amax: torch.Tensor, amax: float) -> torch.Tensor:
    """``t`` (``[..., blocks, 16]``, float64) quantize-dequantized as NVFP4 with each block's
    amax ``blocks_amax`` (``[..., blocks, 1]``) and the tensor amax ``amax``: ``e2m1(x * inv) *
    scale * amax / (448 * 6)``, ``scale = e4m3(block_amax * fp32(S_enc * fp32(1 / 6)))``,
    ``inv = fp32(1 / fp32(scale * S_dec))``."""
    enc, dec = nvfp4_scales(amax)
    mult = _fp32(enc * _fp32(1.0 / 6.0))
    dec_b = (blocks_amax.to(torch.float32) * mult).to(F64).clamp(max=FP32_MAX)
    scale = cast(dec_b, 1.0, FORMATS["e4m3"])
    inv = (1.0 / (scale * dec).to(torch.float32).to(F64)).to(torch.float32).to(F64).clamp(max=FP32_MAX)
    codes = e2m1((t.to(F64) * inv).to(torch.float32))
    return codes * scale * (amax / NVFP4_GLOBAL)


def nvfp4_blocked(t: torch.Tensor, axis: int, amax: float | None = None) -> torch.Tensor:
    """``t`` (2-D) as an NVFP4 GEMM reads it: blocks of 16 along ``axis`` (the GEMM's K), the
    tensor scale from ``amax`` (``t``'s own unless given)."""
    a = _amax(t) if amax is None else amax
    blocks = _blocks_of(t, axis, 16)
    return _unblock(_nvfp4_values(blocks, _block_amax(blocks, (-1,)).unsqueeze(-1), a), t, axis)


def nvfp4_tiled(t: torch.Tensor) -> torch.Tensor:
    """``t`` (2-D) in 16x16 tiles, one E4M3 scale each (TE's NVFP4 weights: the same tiles
    whichever way a GEMM reads them)."""
    r, c = t.shape
    br, bc = -(-r // 16), -(-c // 16)
    padded = torch.nn.functional.pad(t.to(F64), (0, bc * 16 - c, 0, br * 16 - r))
    tiles = padded.reshape(br, 16, bc, 16).permute(0, 2, 1, 3).reshape(br, bc, 256)
    vals = _nvfp4_values(tiles, _block_amax(tiles, (-1,)).unsqueeze(-1), _amax(t))
    return vals.reshape(br, bc, 16, 16).permute(0, 2, 1, 3).reshape(br * 16, bc * 16)[:r, :c]


def _e4m3_grid() -> torch.Tensor:
    """Every non-negative finite E4M3 value, ascending (float64)."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)  # 0x7F is NaN
    return codes.view(torch.float8_e4m3fn).to(F64)


def nvfp4_box(lo: torch.Tensor, hi: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The centre and half-width of what :func:`nvfp4_blocked` can give for a tensor known only
    within ``[lo, hi]``. The tensor amax lies in ``[least, most]`` (:func:`amax_bounds`), each
    block's likewise; the result is not monotone in them (a block scale rounds to another E4M3
    value, the elements' codes follow), so the enclosure is built per block scale: every E4M3
    value the block's scale can take (between the one of the smallest block amax under the
    largest tensor amax and the one of the largest under the smallest), and for each the codes
    at the corners of ``x`` in ``[lo, hi]`` and ``S_dec`` in its range (the code is monotone in
    both), times the scale, times the tensor factor at either end."""
    least_t, most_t = amax_bounds(lo, hi)
    (enc_hi, dec_lo), (enc_lo, dec_hi) = nvfp4_scales(least_t), nvfp4_scales(most_t)
    blo, bhi = _blocks_of(lo, axis, 16), _blocks_of(hi, axis, 16)
    least_b = _block_amax(torch.where(blo * bhi > 0, torch.minimum(blo.abs(), bhi.abs()), torch.zeros_like(blo)), (-1,))
    most_b = _block_amax(torch.maximum(blo.abs(), bhi.abs()), (-1,))
    fmt = FORMATS["e4m3"]

    def scale_of(bamax: torch.Tensor, enc: float) -> torch.Tensor:
        dec_b = (bamax.to(torch.float32) * _fp32(enc * _fp32(1.0 / 6.0))).to(F64).clamp(max=FP32_MAX)
        return cast(dec_b, 1.0, fmt)

    grid = _e4m3_grid()
    first = torch.searchsorted(grid, scale_of(least_b, enc_lo))
    last = torch.searchsorted(grid, scale_of(most_b, enc_hi))
    factors = (least_t / NVFP4_GLOBAL, most_t / NVFP4_GLOBAL)
    vmin = vmax = None
    for k in range(int((last - first).max()) + 1 if first.numel() else 1):
        sc = grid[torch.minimum(first + k, last)].unsqueeze(-1)  # a scale the block can take
        vals = []
        for dec in (dec_lo, dec_hi):
            inv = (1.0 / (sc * dec).to(torch.float32).to(F64)).to(torch.float32).to(F64).clamp(max=FP32_MAX)
            for x in (blo, bhi):
                code = e2m1((x * inv).to(torch.float32))
                vals += [code * sc * f for f in factors]
        stack = torch.stack(vals)
        lo_k, hi_k = stack.min(0).values, stack.max(0).values
        vmin = lo_k if vmin is None else torch.minimum(vmin, lo_k)
        vmax = hi_k if vmax is None else torch.maximum(vmax, hi_k)
    # the tensor factor makes the values inexact in float64: the centre's and the half-width's
    # own roundings (an ulp of the larger end) are added, so both ends stay inside
    half = (vmax - vmin) / 2 + 2.0**-52 * torch.maximum(vmin.abs(), vmax.abs())
    return _unblock((vmin + vmax) / 2, lo, axis), _unblock(half, lo, axis)


class Nvfp4Scaling(BlockScaling):
    """``NVFP4BlockScaling`` without the Hadamard transform and stochastic rounding: every
    operand E2M1 in blocks of 16 along its GEMM's K with an E4M3 scale each, under a tensor
    scale from the whole tensor's amax (a GroupedLinear's group: its own rows); the weight in
    16x16 tiles (TE's 2-D weight quantization), the same for both directions. Stateless, as the
    block recipes: a re-quantize gives the forward's codes again. The directions are
    :class:`BlockScaling`'s; the block rule, the box and the weight's tiles are NVFP4's."""

    scale_u = NVFP4_SCALE_U

    def __init__(self) -> None:
        super().__init__("nvfp4", FORMATS["e4m3"], torch.float32)
        self.size = 16

    def _along(self, t: torch.Tensor, axis: int) -> torch.Tensor:
        return nvfp4_blocked(t, axis)

    def _box(self, lo: torch.Tensor, hi: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
        return nvfp4_box(lo, hi, axis)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return nvfp4_tiled(t)


class _Delegating(Quantizer):
    """``base`` with one rule changed by a subclass; everything else is ``base``'s."""

    quantized = True

    def __init__(self, base: Quantizer) -> None:
        self.base = base
        self.norm_rounded = base.norm_rounded
        self.scale_u, self.by_direction = base.scale_u, base.by_direction

    def x_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.x_wgrad(r, m, g, t)

    def x_box_wgrad(self, r: int, m: int, g: int, lo: torch.Tensor,
                    hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.x_box_wgrad(r, m, g, lo, hi)

    def dy_wgrad(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.dy_wgrad(r, m, g, t)

    def x_box(self, r: int, m: int, g: int, lo: torch.Tensor,
              hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.x_box(r, m, g, lo, hi)

    def x(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.x(r, m, g, t)

    def dy(self, r: int, m: int, g: int, t: torch.Tensor) -> torch.Tensor:
        return self.base.dy(r, m, g, t)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return self.base.weight(m, g, t, backward)


class UnquantizedDgradWeight(_Delegating):
    """``base`` with the input gradient multiplying the backward copy of the weight as it is,
    in the cell's dtype, beside the quantized output gradient: a defect model's view (TE
    2.20.2's ``GroupedLinear`` re-gathers a DistributedWeight and hands it to the dgrad GEMM
    without the re-quantize ``Linear`` does), never the oracle's."""

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        return t if backward else self.base.weight(m, g, t, backward)


class ShardScaled(_Delegating):
    """A defect model's view of a native current-scaling weight (``native_local_scale``):
    each rank's ``shard_rows`` rows of the padded weight quantized with the scale of their own
    amax (what TE's ``quantized_model_init`` gives a shard-sized parameter when nothing reduces
    the amax over the GTP group), and every shard's codes multiplied by rank ``local``'s
    scale-inverse (what a per-tensor all-gather that keeps the local scale gives). Never the
    oracle's: a weight's scale is the whole weight's."""

    def __init__(self, base: Quantizer, shard_rows: int, local: int) -> None:
        super().__init__(base)
        if not isinstance(base, CurrentScaling):
            raise ValueError("shard-own scales are modelled for per-tensor current scaling only")
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.shard_rows, self.local = shard_rows, local

    def seen_by(self, rank: int) -> "ShardScaled":
        return self if rank == self.local else ShardScaled(self.base, self.shard_rows, rank)

    def weight(self, m: int, g: int, t: torch.Tensor, backward: bool) -> torch.Tensor:
        n, fmt = self.shard_rows, self.base.fwd
        shards = [t[i:i + n] for i in range(0, t.shape[0], n)]
        local = shards[self.local] if self.local < len(shards) else t[:0]  # a rank holding only padding
        inv = _fp32(1.0 / _fp32(current_scale(local, fmt)))
        return torch.cat([cast(s, current_scale(s, fmt), fmt) * inv for s in shards])


def scale_u(recipe: str) -> float:
    """What applying ``recipe``'s scale-inverses costs a GEMM: its quantizer class's
    ``scale_u`` (the one home of that rule)."""
    return _quantizer_class(recipe).scale_u


def _quantizer_class(recipe: str) -> type[Quantizer]:
    """The oracle's quantizer class for ``recipe``.

    Raises:
        NotImplementedError: the oracle does not model ``recipe`` yet (``recipes.MODELLED``).
    """
    kind = recipes.KINDS[recipe]
    if not kind.quantized:
        return Quantizer
    if recipe == "current":
        return CurrentScaling
    if kind.block == "nvfp4":
        return Nvfp4Scaling
    if kind.block in ("mxfp8", "block"):
        return BlockScaling
    if recipe == "delayed":
        return DelayedScaling
    raise NotImplementedError(f"the oracle does not model recipe {recipe!r} yet "
                              f"(it models {', '.join(recipes.MODELLED)})")


def for_recipe(recipe: str, inputs: CellInputs | None = None, tags: tuple[float, float] = (1.0, 1.0),
               distributed: bool = False, x_bounds: Bounds | None = None,
               shard_scaled: tuple[int, int] | None = None, cached: bool = False) -> Quantizer:
    """The cell's quantizer; ``shard_scaled``: ``(shard_rows, local rank)`` of a defect
    model's view of a native weight (:class:`ShardScaled`); ``cached``: the forward passes
    ``is_first_microbatch`` (the first microbatch's FP8 weight is reused). The rest:
    :func:`_for_recipe`."""
    quant = _for_recipe(recipe, inputs, tags, distributed, x_bounds, cached)
    return quant if shard_scaled is None else ShardScaled(quant, *shard_scaled)


def _for_recipe(recipe: str, inputs: CellInputs | None = None, tags: tuple[float, float] = (1.0, 1.0),
                distributed: bool = False, x_bounds: Bounds | None = None, cached: bool = False) -> Quantizer:
    """The cell's quantizer (``inputs``, ``tags``, ``distributed`` and ``x_bounds`` - the GEMM
    input's bounds per (rank, microbatch) when it is known only within them - : what delayed
    scaling's steps depend on; ``distributed`` models TE's re-quantized dgrad weight, a defect model's
    view, never the oracle's: the oracle's dgrad weight is the forward's, as for a plain weight).

    Raises:
        NotImplementedError: the oracle does not model ``recipe`` yet (``recipes.MODELLED``;
            the CLI refuses such cells before a launch), or delayed scaling without ``inputs``.
    """
    kind, cls = recipes.KINDS[recipe], _quantizer_class(recipe)
    if cls in (Quantizer, Nvfp4Scaling):
        return cls()
    if cls is CurrentScaling:
        return CurrentScaling(FORMATS[kind.forward], FORMATS[kind.backward])
    if cls is BlockScaling:
        return BlockScaling(kind.block, FORMATS[kind.forward], inputs.dtype if inputs is not None else torch.float32)
    if inputs is None:
        raise NotImplementedError("the oracle models delayed scaling from a cell's inputs: none given")
    return DelayedScaling(FORMATS[kind.forward], FORMATS[kind.backward], inputs, tags, distributed, x_bounds, cached)
