"""The tolerance table of the checks, without torch: the CLI records it in every run record
before any rank starts, and a command that launches ranks need not pay torch's import
(seconds) in its own process. The bound itself is :func:`harness.cell.compare.bound`, whose
docstring derives each term of :data:`FORMULA`."""

from __future__ import annotations

from typing import Any

#: unit roundoff per dtype (half the machine epsilon: round-to-nearest)
UNIT_ROUNDOFF: dict[str, float] = {
    "fp64": 2.0**-53,
    "fp32": 2.0**-24,
    "bf16": 2.0**-8,
    "fp16": 2.0**-11,
    # fp32 operands rounded to TF32's 10 mantissa bits (round to nearest)
    "tf32": 2.0**-11,
}
#: the dtype a value is rounded to, per precision name ("tf32": fp32 values, TF32 operands)
OUT_DTYPE: dict[str, str] = {"tf32": "fp32"}
#: half the smallest subnormal spacing: the absolute error of a rounding that underflows
UNDERFLOW: dict[str, float] = {"fp64": 2.0**-1075, "fp32": 2.0**-150, "bf16": 2.0**-134, "fp16": 2.0**-25}
#: the accumulation precision of every GEMM and reduction the contract promises
ACCUMULATION = "fp32"
#: safety factor over the first-order bound (``harness.cell.compare``'s docstring)
MARGIN = 2.0
#: the per-element bound, as every run record and docs/architecture.md state it
FORMULA = ("|actual - oracle| <= C * (u(out) * |oracle| + u(out) * (roundings - 1) * magnitude"
           " + roundings * eta(out) + u(fp32) * sqrt(reduction) * magnitude + 2 * u(tf32) * magnitude"
           " + u(in) * magnitude + slack)")


def policy(fp32_gemm: str = "ieee") -> dict[str, Any]:
    """The tolerance table as recorded in every run record (with the backend's fp32 GEMM)."""
    return {
        "formula": FORMULA,
        "C": MARGIN,
        "accumulation": ACCUMULATION,
        "unit_roundoff": dict(UNIT_ROUNDOFF),
        "underflow": dict(UNDERFLOW),
        "fp32_gemm": fp32_gemm,
    }


def gemm_dtype(cell_dtype: str, fp32_gemm: str = "ieee") -> str:
    """The precision of the values a backend's GEMMs produce in a cell of ``cell_dtype``:
    ``"tf32"`` for fp32 cells of a TF32 backend, else the cell's dtype (module docstring)."""
    return "tf32" if cell_dtype == "fp32" and fp32_gemm == "tf32" else cell_dtype
