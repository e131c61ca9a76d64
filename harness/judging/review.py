"""The verdict on a change under review: per ledger entry, is its defect fixed here, and did
anything else break? (a pure fold over a run record; no torch)

A reviewer sweeps a TE tree (``--te-tree``, or a patched one from ``patch-te``) under the
ledger of the release it changes, naming the entries the change must fix (``--fixes``).
Per entry of the ledger:

- *fixed here*: it reproduces in none of the cells it selects, and at least one of them now
  meets its expectation;
- *still failing*: it reproduces in at least one cell;
- *not exercised*: the run has no cell it selects, or every one fails earlier for another
  entry's defect (widen the selection, or fix that one first, to judge it), or TE ran
  another execution path in them than they name (status ``path_not_taken``: the code under
  review never ran; the reason TE gave is quoted).

A *regression* is a cell that misses its expectation with a failure no reproducing entry
explains (``harness.judging.ledger.unexplained``): a newly broken cell, or a known cell with one more
failure. The change is GREEN when every entry it must fix is fixed here, there is no
regression and no harness error, and the record holds a verdict on every cell of the whole
selection (``harness.judging.gate.incomplete``: a shard, an interrupted or unfinished run can say RED,
never GREEN; a merged record of every shard can). An entry fixed without being named is good
news, never red.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from harness.vocabulary.errors import ReviewError
from harness.judging import gate
from harness.records import provenance
from harness.judging import ledger as ledgers
from harness.records.record import CellResult
from harness.vocabulary.status import HARNESS_ERROR, PATH_NOT_TAKEN

FIXED, FAILING, NOT_EXERCISED = ledgers.FIXED, ledgers.FAILING, ledgers.NOT_EXERCISED
VERDICTS = (FIXED, FAILING, NOT_EXERCISED)
#: how many unexplained failures of a regressed cell the review quotes
QUOTED = 3


@dataclass(frozen=True)
class EntryVerdict:
    id: str
    upstream: str
    title: str
    verdict: str
    selected: int
    reproduced: int
    required: bool
    #: selected cells where TE ran another path than they name, and the reason TE gave
    path_not_taken: int = 0
    why_not_taken: str | None = None


@dataclass(frozen=True)
class Regression:
    cell: str
    status: str
    repro: str
    failures: list[str]  #: the first few failures no reproducing entry explains


@dataclass
class Review:
    ledger: str
    required: list[str]
    entries: list[EntryVerdict] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)
    harness_errors: int = 0
    unfixed_ids: list[str] = field(default_factory=list)
    #: the TE tree under review (``harness.te_tree.tree.Tree`` as recorded), if any
    tree: dict[str, Any] | None = None
    #: why the record cannot judge its whole selection (``harness.judging.gate.incomplete``), None: it can
    incomplete: str | None = None

    @property
    def unfixed(self) -> list[EntryVerdict]:
        """Entries the change must fix that are not fixed here (the ledger's ``unfixed``)."""
        return [e for e in self.entries if e.id in self.unfixed_ids]

    @property
    def red(self) -> bool:
        """Something this run saw is wrong: an entry not fixed, a regression, a harness error."""
        return bool(self.unfixed or self.regressions or self.harness_errors)

    @property
    def green(self) -> bool:
        return not self.red and self.incomplete is None

    @property
    def word(self) -> str:
        """``GREEN``, ``RED``, or ``INCOMPLETE`` (nothing wrong seen, but not the whole selection)."""
        return "GREEN" if self.green else "RED" if self.red else "INCOMPLETE"

    def reasons(self, regressions: bool = True) -> list[str]:
        """One line per reason the change is not green (empty when green); ``regressions=False``
        leaves out the regressions, for a report that lists them with their repro lines."""
        out = [f"ledger entry {e.id} must be fixed by this change but is {e.verdict}"
               + (f" (reproduces in {e.reproduced} of {e.selected} cells)" if e.verdict == FAILING else
                  not_taken(e) if e.verdict == NOT_EXERCISED and e.path_not_taken else
                  f" (its {e.selected} cell(s) all fail earlier, for another entry)" if e.selected and
                  e.verdict == NOT_EXERCISED else " (no cell of this run selects it)" if e.verdict == NOT_EXERCISED
                  else "")
               for e in self.unfixed]
        out += [f"regression: {r.status} {r.cell}: {r.failures[0] if r.failures else 'no failure recorded'}"
                for r in self.regressions if regressions]
        if self.harness_errors:
            out.append(f"{self.harness_errors} cell(s) hit a harness error: no verdict on them")
        if self.incomplete:
            out.append(f"not a verdict on the whole selection: {self.incomplete}")
        return out

    def serialize(self) -> dict[str, Any]:
        return {**asdict(self), "green": self.green}


def not_taken(e: EntryVerdict) -> str:
    """`` (its 3 of 4 cell(s) took another TE path: TE chose ...)``: why an entry whose cells
    ran another path is not exercised."""
    return (f" (its {e.path_not_taken} of {e.selected} cell(s) took another TE path than they name"
            + (f": {e.why_not_taken}" if e.why_not_taken else "") + ")")


def required_entries(patterns: Sequence[str], ledger: ledgers.Ledger) -> list[str]:
    """The entry ids ``--fixes`` names (ids or globs over ids, ``all`` for every entry).

    Raises:
        ReviewError: a pattern matches no entry of the ledger.
    """
    ids = [e.id for e in ledger.entries]
    if not patterns:
        raise ReviewError(f"--fixes names no entry: give entry ids, globs over them or 'all' (ledger {ledger.name}: "
                          f"{', '.join(ids)})")
    out: list[str] = []
    for p in patterns:
        hit = ids if p == "all" else [i for i in ids if fnmatch.fnmatchcase(i, p)]
        if not hit:
            near = difflib.get_close_matches(p, ids, n=1)
            hint = f" - did you mean {near[0]}?" if near else f" (entries: {', '.join(ids)})"
            raise ReviewError(f"--fixes {p!r} names no entry of ledger {ledger.name}{hint}")
        out += [i for i in hit if i not in out]
    return out


def _verdict(e: dict[str, Any]) -> str:
    """An outcome entry's verdict (recomputed for records written before it was stored)."""
    if e.get("verdict"):
        return e["verdict"]
    return FAILING if e.get("reproduced") else FIXED if e.get("stale") else NOT_EXERCISED


def path_reason(cell: dict[str, Any]) -> str:
    """The reason TE gave for running another path than a ``path_not_taken`` cell names: its
    first failure line without the rank."""
    return re.sub(r"^\[rank \d+\] ", "", cell.get("first_failure") or "(no reason recorded)")


def _path_reasons(record: dict[str, Any]) -> dict[str, str]:
    """Cell id -> ``path_reason`` for the ``path_not_taken`` cells of the record."""
    return {c["id"]: path_reason(c) for c in record.get("cells", []) if c.get("status") == PATH_NOT_TAKEN}


def review(record: dict[str, Any]) -> Review | None:
    """The review of a run record judged under a ledger (None without a ledger)."""
    outcome = record.get("ledger")
    if not outcome:
        return None
    required = list(outcome.get("required") or [])
    entries = ledgers.Ledger.from_dict(outcome).entries
    rev = Review(ledger=outcome.get("path") or outcome.get("name", ""), required=required,
                 unfixed_ids=list(outcome.get("unfixed") or []), tree=provenance.tree(record),
                 incomplete=gate.incomplete(record))
    reasons = _path_reasons(record)
    for e in outcome["entries"]:
        other = list(e.get("path_not_taken") or [])
        rev.entries.append(EntryVerdict(e["id"], e["upstream"], e["title"], _verdict(e), len(e.get("selected", [])),
                                        len(e.get("reproduced", [])), e["id"] in required, len(other),
                                        next((reasons[c] for c in other if c in reasons), None)))
    for raw in record.get("cells", []):
        if raw["status"] == HARNESS_ERROR:
            rev.harness_errors += 1
        elif raw["status"] in ledgers.EXPLAINABLE:
            cell = CellResult.from_dict(raw)
            left = ledgers.unexplained(cell, entries)
            rev.regressions.append(Regression(cell.id, cell.status, cell.repro,
                                              [i.describe() for i in left[:QUOTED]]))
    return rev
