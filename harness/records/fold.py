"""Folding every rank's result of a cell into the cell's (the ranks must agree): its status,
first failure, worst ratio and repro line."""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from harness.vocabulary.matrix import Cell
from harness.records.record import CellResult, RankResult, first_failure
from harness.vocabulary.status import BY_NAME, SEVERITY


def cell_status(ranks: Sequence[RankResult]) -> str:
    """The cell's status from its ranks': all ranks agreeing give their status; otherwise the
    first not-met one by ``harness.vocabulary.status.SEVERITY`` (harness_error > path_not_taken >
    timeout > error > fail: a harness error on any rank means what the others saw is no
    verdict on the backend, nor is it on the cell's path when TE ran another one); ranks
    that disagree only between met statuses (pass and xfail) make a ``fail``."""
    statuses = {r.status for r in ranks}
    if len(statuses) == 1 and next(iter(statuses)) in BY_NAME:
        return next(iter(statuses))
    return next((s for s in SEVERITY if s in statuses and not BY_NAME[s].met and s != "skipped"), "fail")


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
