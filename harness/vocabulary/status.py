"""The cell status vocabulary, defined once.

Every other place reads this table: the run record (``harness.records.record``), the sweep's
summary and exit code, the pytest plugin, the reports (Python renderers, and the report's
JavaScript through the data the page embeds) and the CSS colours the page generates. Adding
a status is one new ``Status`` line here.

Order matters: it is the column order of every table and the order of the legend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Status:
    """One cell status and how it counts.

    Attributes:
        name: the value stored in ``CellResult.status``.
        label: what a reader sees (legend, pills, tables).
        glyph: the short text on a report chip.
        color: the report's colour for it (CSS).
        good: the cell does not fail the gate (a sweep with only good cells exits 0): it met
            its expectation, or (``path_not_taken``) TE itself ran another path than the one
            the cell names, so the cell has no verdict on it.
        bad: the backend or the harness went wrong (skipped cells are neither good nor bad).
        met: the cell met its expectation (pass, expected error met, known defect): what a
            ledger entry counts as "met" and a review as judged.
        severity: smaller says more against the cell: folding a cell's ranks
            (``harness.records.fold``) keeps the first not-met status in this order - a harness
            error or a path not taken (no verdict on what the cell names), then a rank that
            hung, one that raised, a check that failed.
    """

    name: str
    label: str
    glyph: str
    color: str
    good: bool
    bad: bool
    severity: int
    met: bool = False


TABLE: tuple[Status, ...] = (
    Status("pass", "pass", "ok", "#1f883d", good=True, bad=False, severity=8, met=True),
    Status("xfail", "expected error met", "xf", "#0f7b8a", good=True, bad=False, severity=7, met=True),
    # every failure of the cell is explained by known-defect ledger entries (CONTRACTS §7)
    Status("known", "known defect", "kd", "#9a6700", good=True, bad=False, severity=6, met=True),
    # TE chose another execution path than the cell's module value names (e.g. no grouped GEMM
    # in this cuBLASLt): no verdict on the named path, never "met" for a ledger entry
    Status("path_not_taken", "path not taken", "path", "#3e63dd", good=True, bad=False, severity=1),
    Status("fail", "fail", "\u2717", "#cf222e", good=False, bad=True, severity=4),
    Status("error", "error", "err", "#d4570b", good=False, bad=True, severity=3),
    Status("timeout", "timeout", "t/o", "#8250df", good=False, bad=True, severity=2),
    # the harness itself failed on this cell (set-up or checking); never a verdict on the backend
    Status("harness_error", "harness error", "H!", "#6e7781", good=False, bad=True, severity=0),
    Status("skipped", "skipped", "skip", "#8c959f", good=False, bad=False, severity=5),
)

BY_NAME: dict[str, Status] = {s.name: s for s in TABLE}
STATUSES: tuple[str, ...] = tuple(s.name for s in TABLE)
#: statuses that do not fail the gate; everything else makes a sweep exit non-zero.
GOOD_STATUSES: tuple[str, ...] = tuple(s.name for s in TABLE if s.good)
#: statuses that mean "the backend or the harness went wrong".
BAD_STATUSES: tuple[str, ...] = tuple(s.name for s in TABLE if s.bad)
#: statuses that meet the cell's expectation.
MET_STATUSES: tuple[str, ...] = tuple(s.name for s in TABLE if s.met)
#: most against the cell first (``Status.severity``).
SEVERITY: tuple[str, ...] = tuple(s.name for s in sorted(TABLE, key=lambda s: s.severity))
STATUS_LABELS: dict[str, str] = {s.name: s.label for s in TABLE}
#: the one status a harness bug gets (exit 3, never counted against the backend).
HARNESS_ERROR = "harness_error"
#: TE ran another execution path than the cell names (``harness.cell.te_path``): exit 0, but the
#: cell counts toward no ledger verdict (a required entry it selects is "not exercised")
PATH_NOT_TAKEN = "path_not_taken"


def label(name: str) -> str:
    """The reader's word for a stored status (the name itself for one this table lacks)."""
    return STATUS_LABELS.get(name, name)


def counts_text(counts: dict[str, int]) -> str:
    """``"3 pass, 1 expected error met, 2 fail"``: the non-zero counts, in table order, labelled."""
    order = list(STATUSES) + [s for s in counts if s not in BY_NAME]
    return ", ".join(f"{counts[s]:,} {label(s)}" for s in order if counts.get(s))


def vocabulary() -> list[dict[str, Any]]:
    """The table as plain JSON, for the report page's JavaScript."""
    return [asdict(s) for s in TABLE]


def run_exit_code(statuses: Iterable[str], stale: bool = False) -> int:
    """The exit code of a run with these cell statuses: 3 when the harness failed on any
    cell (a harness bug), 1 when any cell missed its expectation or a ledger entry is stale
    (``stale``: it reproduces in none of its cells, CONTRACTS §7), else 0."""
    from harness.vocabulary import errors as exitcodes

    seen = set(statuses)
    if HARNESS_ERROR in seen:
        return exitcodes.HARNESS_BUG
    return exitcodes.OK if seen <= set(GOOD_STATUSES) and not stale else exitcodes.MISMATCH
