"""Checks against the oracle, with one derived tolerance policy (CONTRACTS §5).

Tolerance, per element (``harness.vocabulary.tolerance.FORMULA``, the text every run record carries),
term by term after the arithmetic the contract promises (GEMMs and reductions accumulate in
fp32 and round to the output dtype once)::

    |actual - oracle| <= C * ( u(out) * |oracle|                  the final rounding
                             + u(out) * (roundings - 1) * magnitude  earlier roundings
                             + roundings * eta(out)                  underflow (subnormals)
                             + u(acc) * sqrt(reduction) * magnitude  fp32 accumulation
                             + 2 * u(operand) * magnitude            TF32 operands only
                             + u(in) * magnitude                     an operand rounded first
                             + slack )                               an operand known within bounds

``magnitude`` is the oracle's computation on absolute values (``|A| @ |B|``, plus ``|start|``
for a ``main_grad``): every intermediate value (a partial sum, a microbatch's wgrad before
it is accumulated, a rank's contribution before the reduction) is at most that large, so
each of the ``roundings - 1`` sequential roundings before the last one (a bias added in the
output dtype, one accumulation per microbatch, one add per rank in a reduction, the 1/W
scale) costs at most ``u(out) * magnitude``. The last rounding lands on the value itself:
``u(out) * |oracle|``. ``eta`` is half the smallest subnormal spacing of the output dtype
(``fl(x) = x(1 + d) + e``, ``|e| <= eta``): it matters only for fp16, whose subnormals
start at 6e-5. The GEMM's own accumulation in fp32 adds a random-walk ``sqrt(reduction) *
u(fp32)``; an fp32 GEMM whose operands are rounded to TF32 (TE on CUDA, ``te-cpu-tf32``:
``FP32_GEMM = "tf32"``) errs by up to ``2 * u(tf32)`` per product on top. ``u(in)`` is the
unit roundoff of a precision an operand was rounded to before the GEMM, when that differs
from the value's own: ``LayerNormLinear`` rounds its normalized input to the cell's dtype,
and its fp32 weight gradient of record is formed from that (``Reference.operand_u``). ``slack``
is the absolute half-width, carried through the GEMM on absolute values, of an operand the
oracle knows only within bounds: under a recipe, the quantized normalized input of
``LayerNormLinear``, whose FP8 code may be either neighbour where the fp32 normalization, or
its rounding to the cell's dtype, can land on either side of a rounding boundary
(``Reference.slack``; docs/low-precision.md). ``C = 2`` is the
safety margin; the self-test records the largest ratio error/bound seen per dtype and
tensor kind, and the smallest planted relative error each catches (``harness.orchestration.sensitivity``).

Why not the one-term ``C * u(out) * (roundings + sqrt(reduction)) * magnitude`` used
before: it charges the output dtype's unit roundoff to the accumulation, which admits a
GEMM accumulated in bf16 (the class of fault TE PR #3397 fixes) and left bf16 bounds about
10x the largest error correct code ever showed. Fixed ``atol``/``rtol`` pairs are not used:
they fail a fraction of a correct bf16 matmul's elements and do not scale with the reduction.

``out`` is the dtype in which the compared value is produced: the cell's dtype for outputs,
input gradients, bias gradients and ``.grad``; ``main_grad``'s (fp32) for a weight gradient
of record that the contract says is formed in ``main_grad``'s dtype (fused accumulation, or
a distributed weight with a ``main_grad``). The precision names passed in are the cell's
dtype or ``"tf32"`` (an fp32 value produced by TF32 GEMMs: ``gemm_dtype``); 16-bit operands
are exact in TF32, so bf16/fp16 cells, including their fp32 ``main_grad``, are unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.cell.faults import HarnessBug  # noqa: F401 (re-exported: runner raises compare.HarnessBug)
from harness.cell.oracle import Reference
from harness.records.record import Check
from harness.vocabulary.tolerance import (ACCUMULATION, MARGIN, OUT_DTYPE, UNDERFLOW, UNIT_ROUNDOFF,  # noqa: F401 (re-exported)
                               gemm_dtype, policy)


def bound(ref: Reference, precision: str, margin: float = MARGIN) -> torch.Tensor:
    """The per-element bound of the module docstring for a value produced in ``precision``."""
    out = OUT_DTYPE.get(precision, precision)
    u_out, u_acc = UNIT_ROUNDOFF[out], UNIT_ROUNDOFF[ACCUMULATION if out != "fp64" else "fp64"]
    u_op = UNIT_ROUNDOFF["tf32"] if precision == "tf32" else 0.0
    earlier = max(ref.roundings - 1, 0)
    per_magnitude = (u_out * earlier + u_acc * math.sqrt(max(ref.reduction, 1)) + 2.0 * u_op
                     + ref.operand_u)
    # margin * (u_out |value| + per_magnitude magnitude + roundings eta + slack), in that
    # order, each step in place on one new tensor (the same bits as the expression)
    limit = ref.value.abs().mul_(u_out)
    limit.add_(per_magnitude * ref.magnitude).add_(max(ref.roundings, 1) * UNDERFLOW[out])
    if ref.slack is not None:
        limit.add_(ref.slack)
    return limit.mul_(margin)


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(i) for i in idx) + (",)" if len(idx) == 1 else ")")


def unravel(flat: int, shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """The index of element ``flat`` of a row-major tensor of ``shape`` (``()`` for a scalar):
    what ``torch.unravel_index`` gives, in plain integers - it built tensors to do this, a few
    percent of a sweep's samples where every check reports where its worst element is."""
    index = []
    for size in reversed(tuple(shape)):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def compare_tensor(name: str, actual: torch.Tensor | None, ref: Reference, dtype: str,
                   margin: float = MARGIN) -> Check:
    """Compare one tensor with its oracle; the message follows ``assert_close``'s shape."""
    __tracebackhide__ = True
    if actual is not None and not isinstance(actual, torch.Tensor):
        return Check(name, "tensor", False, message=f"{name} is a {type(actual).__name__}, not a tensor "
                     f"(the oracle expects a tensor of shape {tuple(ref.value.shape)})")
    if actual is None:
        return Check(name, "tensor", False, message=f"{name} is None (the oracle expects a tensor "
                     f"of shape {tuple(ref.value.shape)})")
    if tuple(actual.shape) != tuple(ref.value.shape):
        return Check(name, "tensor", False, message=f"{name} has shape {tuple(actual.shape)}, the "
                     f"oracle's is {tuple(ref.value.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    numel = a.numel()
    if numel == 0:
        return Check(name, "tensor", True, numel=0, mismatched=0, max_abs=0.0, max_rel=0.0, ratio=0.0)
    err = torch.sub(a, ref.value).abs_()
    limit = bound(ref, dtype, margin)
    if not bool(torch.isfinite(err).all()):  # a non-finite value is infinitely wrong
        err = torch.where(torch.isfinite(a), err, torch.full_like(err, math.inf))
    mismatched = int((err > limit).sum())
    if bool((limit > 0).all()):  # as the general case below where every bound is positive
        ratio_t = err / limit
    else:
        ratio_t = torch.where(limit > 0, err / limit, torch.where(err > 0, math.inf, 0.0))
    worst = int(ratio_t.argmax())
    idx = unravel(worst, err.shape)
    rel = err / ref.value.abs().clamp_min_(torch.finfo(torch.float64).tiny)
    check = Check(
        name, "tensor", mismatched == 0, numel=numel, mismatched=mismatched,
        max_abs=float(err.max()), max_rel=float(rel.max()), ratio=float(ratio_t.flatten()[worst]),
        bound_at_worst=float(limit.flatten()[worst]), index=list(idx),
    )
    if mismatched:
        abs_i = int(err.argmax())
        abs_idx = unravel(abs_i, err.shape)
        check.message = (
            f"Tensors are not close! Mismatched elements: {mismatched} / {numel} "
            f"({100.0 * mismatched / numel:.1f}%) · greatest abs diff {float(err.flatten()[abs_i]):.6g} "
            f"at {_fmt_index(abs_idx)} (up to {float(limit.flatten()[abs_i]):.3g} allowed)\n"
            f"fp64 oracle at {_fmt_index(idx)}: expected {float(ref.value[idx]):.6g}, got "
            f"{float(a[idx]):.6g}, error/bound {check.ratio:.3g}\n"
            f"The failure occurred for item {name}"
        )
    return check


def compare_value(name: str, kind: str, actual: Any, expected: Any) -> Check:
    """An exact check (call count, flag, dtype): no tolerance clause in the message."""
    ok = actual == expected
    msg = None if ok else f"{name}: expected {expected!r}, got {actual!r}"
    return Check(name, kind, ok, message=msg, expected=expected, actual=actual)
