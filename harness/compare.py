"""Checks against the oracle, with one derived tolerance policy (CONTRACTS §5).

Tolerance, per element::

    |actual - oracle| <= C * u(dtype) * (roundings + sqrt(reduction)) * magnitude

``magnitude`` is the oracle's computation on absolute values (``|A| @ |B|``, plus ``|start|``
for a ``main_grad``). First-order error analysis bounds each rounding of a value of size
``<= magnitude`` by ``u * magnitude``; there are ``roundings`` of those after the GEMM
(bias add, one accumulation per microbatch, one per rank in a reduction, the final add),
and a GEMM accumulated in the compute dtype adds a random-walk ``sqrt(reduction) * u``.
``C = 2`` is the safety margin; the self-test records the largest ratio error/bound seen per
dtype so the margin stays visible. Fixed ``atol``/``rtol`` pairs are not used: they fail a
fraction of a correct bf16 matmul's elements and do not scale with the reduction length.

``u`` is the unit roundoff of the dtype in which the compared value is produced: the cell's
dtype for outputs, input gradients, bias gradients and ``.grad``; ``main_grad``'s (fp32) for
a weight gradient of record that the contract says is formed in ``main_grad``'s dtype
(fused accumulation, or a distributed weight with a ``main_grad``).

A backend whose fp32 GEMMs run as TF32 (TE on CUDA, ``te-cpu-tf32``; it declares
``FP32_GEMM = "tf32"``) rounds fp32 operands to 10 mantissa bits: in an fp32 cell every value
its GEMMs produce - outputs, input, weight and (epilogue) bias gradients - is judged with
TF32's ``u = 2^-11`` (CONTRACTS §5). 16-bit operands are exact in TF32, so bf16/fp16 cells,
including their fp32 ``main_grad``, keep their ``u``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.oracle import Reference
from harness.record import Check

#: unit roundoff per dtype (half the machine epsilon: round-to-nearest)
UNIT_ROUNDOFF: dict[str, float] = {
    "fp64": 2.0**-53,
    "fp32": 2.0**-24,
    "bf16": 2.0**-8,
    "fp16": 2.0**-11,
    # fp32 operands rounded to TF32's 10 mantissa bits (round to nearest)
    "tf32": 2.0**-11,
}
#: safety factor over the first-order bound (see the module docstring)
MARGIN = 2.0


class HarnessBug(RuntimeError):
    """The harness itself failed (set-up, oracle, checks); never a verdict on the backend.

    ``harness.runner`` raises it for any exception of a harness-owned phase; the cell's
    status is then ``harness_error`` and the run exits 3.
    """


def policy(fp32_gemm: str = "ieee") -> dict[str, Any]:
    """The tolerance table as recorded in every run record (with the backend's fp32 GEMM)."""
    return {
        "formula": "C * u(dtype) * (roundings + sqrt(reduction)) * magnitude",
        "C": MARGIN,
        "unit_roundoff": dict(UNIT_ROUNDOFF),
        "fp32_gemm": fp32_gemm,
    }


def gemm_dtype(cell_dtype: str, fp32_gemm: str = "ieee") -> str:
    """The precision of the values a backend's GEMMs produce in a cell of ``cell_dtype``:
    ``"tf32"`` for fp32 cells of a TF32 backend, else the cell's dtype (module docstring)."""
    return "tf32" if cell_dtype == "fp32" and fp32_gemm == "tf32" else cell_dtype


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(i) for i in idx) + (",)" if len(idx) == 1 else ")")


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
    err = (a - ref.value).abs()
    scale = margin * UNIT_ROUNDOFF[dtype] * (ref.roundings + math.sqrt(max(ref.reduction, 1)))
    bound = ref.magnitude * scale
    err = torch.where(torch.isfinite(a), err, torch.full_like(err, math.inf))
    bad = err > bound
    numel = err.numel()
    mismatched = int(bad.sum())
    if numel == 0:
        return Check(name, "tensor", True, numel=0, mismatched=0, max_abs=0.0, max_rel=0.0, ratio=0.0)
    ratio_t = torch.where(bound > 0, err / bound, torch.where(err > 0, math.inf, 0.0))
    worst = int(ratio_t.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
    rel = err / ref.value.abs().clamp_min(torch.finfo(torch.float64).tiny)
    check = Check(
        name, "tensor", mismatched == 0, numel=numel, mismatched=mismatched,
        max_abs=float(err.max()), max_rel=float(rel.max()), ratio=float(ratio_t.flatten()[worst]),
        bound_at_worst=float(bound.flatten()[worst]), index=list(idx),
    )
    if mismatched:
        abs_i = int(err.argmax())
        abs_idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(abs_i), err.shape))
        check.message = (
            f"Tensors are not close! Mismatched elements: {mismatched} / {numel} "
            f"({100.0 * mismatched / numel:.1f}%) · greatest abs diff {float(err.flatten()[abs_i]):.6g} "
            f"at {_fmt_index(abs_idx)} (up to {float(bound.flatten()[abs_i]):.3g} allowed)\n"
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
