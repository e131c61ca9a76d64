"""Folding every rank's result of a cell into one verdict (the ranks must agree)."""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from harness.matrix import Cell
from harness.record import CellResult, RankResult, first_failure
from harness.status import HARNESS_ERROR


def cell_status(ranks: Sequence[RankResult]) -> str:
    """harness_error > timeout > error > fail > (all xfail: xfail) > pass; a pass/xfail mix
    is a fail (ranks disagree). A harness error on any rank makes the cell one: what the
    other ranks saw is not a verdict on the backend then."""
    statuses = {r.status for r in ranks}
    for s in (HARNESS_ERROR, "timeout", "error", "fail"):
        if s in statuses:
            return s
    if statuses == {"xfail"}:
        return "xfail"
    if statuses == {"pass"}:
        return "pass"
    return "fail"


def worst_ratio(ranks: Sequence[RankResult]) -> float | None:
    ratios = [c.ratio for r in ranks for c in r.comparisons if c.kind == "tensor" and c.ratio is not None]
    return max(ratios) if ratios else None


def repro_command(cell_id: str, backend: str, example: dict[str, Any] | None = None) -> str:
    parts = ["python", "-m", "harness", "repro", cell_id, "--backend", backend]
    if example:
        parts += ["--example", ",".join(f"{k}={v}" for k, v in sorted(example.items()) if k != "shrunk")]
    return shlex.join(parts)


def merge(cell: Cell, ranks: Sequence[RankResult], duration_s: float, backend: str,
          example: dict[str, Any] | None = None) -> CellResult:
    ranks = sorted(ranks, key=lambda r: r.rank)
    return CellResult(
        id=cell.id, axes=cell.serialize(), expect=cell.expect, status=cell_status(ranks),
        duration_s=round(duration_s, 4), worst_ratio=worst_ratio(ranks),
        first_failure=first_failure(ranks), repro=repro_command(cell.id, backend, example),
        ranks=list(ranks), example=example,
    )
