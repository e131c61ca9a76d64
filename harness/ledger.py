"""The known-defects ledger (CONTRACTS §7): which failures of a real backend are known.

A ledger is a plain TOML file shipped with the harness (``harness/ledgers/``), one per
upstream package and version range, or any file a user names with ``--ledger FILE``. Its
entries each name a defect or difference of CONTRACTS §6, its upstream reference, the
cells it affects (a filter over the axes, as ``sweep --filter``) and what it makes fail:
check names (glob patterns such as ``weight*.main_grad``) and/or a regular expression
over a rank's exception (``Type: message``).

Applying a ledger to the verdicts is a pure fold (no torch; used by the sweep, ``merge``,
the pytest plugin and ``repro``):

- a cell that missed its expectation (``fail``, ``error``, ``timeout``) becomes ``known``
  when at least one entry selects it and *every* failing item on every rank (each failed
  check, each exception) is explained by an entry that selects the cell; one unexplained
  item keeps it ``fail``/``error``/``timeout``. A harness error is never ``known``.
- an entry that selects cells of the run but reproduces (explains an item) in none of
  them is *stale*: a fix landed, the gate fails until the entry is deleted.

The fold is idempotent: a ``known`` cell keeps its backend verdict in ``raw_status`` and is
judged again from it.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from harness import matrix
from harness.record import CellResult

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Entry", "Ledger", "LedgerError", "LEDGER_DIR", "apply", "choose", "load", "failing_items",
           "stale_message"]

#: the ledgers shipped with the harness
LEDGER_DIR = Path(__file__).resolve().parent / "ledgers"
#: cell statuses a ledger may explain (a harness error never: it is no verdict on the backend)
EXPLAINABLE = ("fail", "error", "timeout")
KINDS = ("defect", "difference")
_UPSTREAM = re.compile(r"^(unreported|(TE|Megatron-LM|PyTorch) (PR|issue) #\d+( \(\w+\))?)$")


class LedgerError(ValueError):
    """A ledger file that cannot be used: unreadable, malformed, or an entry that is wrong."""


@dataclass(frozen=True)
class Entry:
    """One known defect or difference.

    Attributes:
        id: short, stable name (``seed-grouped-fused``); what reports, xfail reasons and
            ``ledger report`` use.
        title: one line a maintainer reads.
        upstream: ``TE PR #3545`` / ``TE issue #N`` (optionally `` (open)``), or ``unreported``.
        row: the CONTRACTS §6 row it is (its first words suffice).
        kind: ``defect`` (loses or corrupts a gradient, or fails, under a supported use) or
            ``difference`` (a choice upstream may keep).
        cells: filter over the axes selecting the cells it affects (``sweep --filter``).
        checks: glob patterns over the names of the failed checks it explains.
        error: regular expression searched in a rank's exception (``Type: message``).
        where: the upstream source that causes it (file and function).
        contract: the CONTRACTS sentence it breaks (quoted in the upstream report).
    """

    id: str
    title: str
    upstream: str
    row: str
    kind: str
    cells: str
    checks: tuple[str, ...] = ()
    error: str | None = None
    where: str = ""
    contract: str = ""

    def __post_init__(self) -> None:
        where = f"ledger entry {self.id!r}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.id):
            raise LedgerError(f"{where}: id must be lowercase letters, digits and '-'")
        if self.kind not in KINDS:
            raise LedgerError(f"{where}: kind={self.kind!r} (choose from {', '.join(KINDS)})")
        if not _UPSTREAM.match(self.upstream):
            raise LedgerError(f"{where}: upstream={self.upstream!r} (write 'TE PR #N', 'TE issue #N' or 'unreported')")
        if not self.checks and not self.error:
            raise LedgerError(f"{where}: names neither checks nor an error pattern: it would explain nothing")
        if "exception" in self.checks:
            raise LedgerError(f"{where}: 'exception' in checks would explain any exception; give an error pattern")
        if self.error is not None:
            try:
                re.compile(self.error)
            except re.error as exc:
                raise LedgerError(f"{where}: error pattern {self.error!r}: {exc}") from None
        try:
            object.__setattr__(self, "_select", matrix.compile_filter(self.cells))
        except matrix.MatrixError as exc:
            raise LedgerError(f"{where}: cells: {exc}") from None

    def selects(self, axes: dict[str, Any]) -> bool:
        return self._select(matrix.Cell.from_dict(axes))  # type: ignore[attr-defined]

    def explains(self, name: str, text: str) -> bool:
        """Whether this entry explains a failing item (a check's name, or ``exception``)."""
        if name == "exception":
            return self.error is not None and re.search(self.error, text) is not None
        return any(fnmatch.fnmatchcase(name, p) for p in self.checks)

    def serialize(self) -> dict[str, Any]:
        d = asdict(self)
        d["checks"] = list(self.checks)
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "Entry":
        """From a run record's ledger entry, whose per-run outcome keys are dropped."""
        return cls.from_dict({k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "ledger") -> "Entry":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise LedgerError(f"{where}: entry {d.get('id', '?')!r} has unknown key(s) {unknown}")
        missing = [k for k in ("id", "title", "upstream", "row", "kind", "cells") if k not in d]
        if missing:
            raise LedgerError(f"{where}: entry {d.get('id', '?')!r} lacks {', '.join(missing)}")
        return cls(**{**d, "checks": tuple(d.get("checks", ()))})


@dataclass(frozen=True)
class Ledger:
    """A ledger file: which upstream versions it is for, and its entries."""

    name: str
    path: str
    package: str | None
    versions: str | None
    entries: tuple[Entry, ...] = ()

    def serialize(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "package": self.package, "versions": self.versions,
                "entries": [e.serialize() for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Ledger":
        """From ``serialize()`` or a run record's ``ledger`` (whose per-entry outcome is dropped)."""
        entries = tuple(Entry.from_record(e) for e in d.get("entries", []))
        return cls(d["name"], d["path"], d.get("package"), d.get("versions"), entries)

    def entry(self, entry_id: str) -> Entry:
        for e in self.entries:
            if e.id == entry_id:
                return e
        raise LedgerError(f"no entry {entry_id!r} in ledger {self.name} "
                          f"(entries: {', '.join(e.id for e in self.entries) or 'none'})")

    def covers(self, package: str | None, version: str | None) -> bool:
        """Whether this ledger is for ``package`` at ``version``."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        if not package or not version or package != self.package:
            return False
        try:
            return Version(version) in SpecifierSet(self.versions or "")
        except InvalidVersion:
            return False


def load(path: str | Path) -> Ledger:
    """Read and check a ledger file.

    Raises:
        LedgerError: unreadable, not TOML, or an entry that is malformed (one line saying which).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LedgerError(f"ledger {str(path)!r} is not valid TOML: {exc}") from None
    head = data.get("ledger", {})
    unknown = sorted(set(data) - {"ledger", "entry"}) + sorted(set(head) - {"package", "versions", "title"})
    if unknown:
        raise LedgerError(f"ledger {str(path)!r}: unknown key(s) {unknown}")
    if head.get("versions"):
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        try:
            SpecifierSet(head["versions"])
        except InvalidSpecifier:
            raise LedgerError(f"ledger {str(path)!r}: versions={head['versions']!r} is no version range "
                              "(e.g. '>=2.20.2,<2.21')") from None
    entries = tuple(Entry.from_dict(e, str(path)) for e in data.get("entry", []))
    dup = sorted({e.id for e in entries if sum(o.id == e.id for o in entries) > 1})
    if dup:
        raise LedgerError(f"ledger {str(path)!r}: duplicate entry id(s) {dup}")
    return Ledger(path.stem, str(path), head.get("package"), head.get("versions"), entries)


def shipped() -> list[Ledger]:
    return [load(p) for p in sorted(LEDGER_DIR.glob("*.toml"))]


def choose(option: str | None, package: str | None, version: str | None) -> Ledger | None:
    """The ledger a run uses: ``none``; a file; or (``auto``, the default) the shipped ledger
    for the backend's upstream package and version, if there is one.

    Raises:
        LedgerError: the file is unusable, or two shipped ledgers claim the same version.
    """
    if option == "none":
        return None
    if option not in (None, "auto"):
        return load(option)
    found = [l for l in shipped() if l.covers(package, version)]
    if len(found) > 1:
        raise LedgerError(f"ledgers {', '.join(l.path for l in found)} all cover {package} {version}")
    return found[0] if found else None


def failing_items(cell: CellResult) -> list[tuple[int, str, str]]:
    """Every failing item of a cell: ``(rank, name, text)`` per failed check, and a rank's
    exception (name ``exception``, text ``Type: message``) where no failed check carries it."""
    items = []
    for r in cell.ranks:
        if r.status in ("pass", "xfail"):
            continue
        failed = [c for c in r.comparisons if not c.ok]
        mine = [(r.rank, c.name, c.message or "") for c in failed]
        # the exception is its own item unless a failed check carries it; in a cell that
        # must raise (CONTRACTS §2) raising is what the contract asks: its checks say what
        # was wrong with it
        carried = any(c.kind == "exception" for c in failed) or (cell.expect == "error" and failed)
        if r.error and not carried:
            mine.append((r.rank, "exception", f"{r.error.get('type')}: {r.error.get('message')}"))
        if not mine:  # a rank that missed its expectation with nothing to show for it
            mine.append((r.rank, "exception", f"{r.status}: no check and no exception recorded"))
        items.extend(mine)
    if not items:
        items.append((-1, "exception", f"{cell.status}: {cell.first_failure or 'no rank result'}"))
    return items


@dataclass
class _Tally:
    selected: list[str] = field(default_factory=list)
    reproduced: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)


def judge(cell: CellResult, entries: Sequence[Entry]) -> tuple[CellResult, list[Entry], set[str]]:
    """The cell under the ledger, the entries selecting it, and those reproducing in it."""
    base = cell.raw_status if cell.status == "known" and cell.raw_status else cell.status
    raw = replace(cell, status=base, raw_status=None, known=None)
    selecting = [e for e in entries if e.selects(cell.axes)]
    if base not in EXPLAINABLE or not selecting:
        return raw, selecting, set()
    reproduced: set[str] = set()
    unexplained = 0
    for _, name, text in failing_items(raw):
        by = [e.id for e in selecting if e.explains(name, text)]
        reproduced.update(by)
        unexplained += not by
    if unexplained:
        return raw, selecting, reproduced
    ids = [e.id for e in selecting if e.id in reproduced]
    return replace(raw, status="known", raw_status=base, known=ids), selecting, reproduced


def apply(cells: Iterable[CellResult], ledger: Ledger | None, judge_stale: bool = True
          ) -> tuple[list[CellResult], dict[str, Any] | None]:
    """The cells under ``ledger`` and the ledger's outcome for the run record.

    The outcome is the ledger (``Ledger.serialize()``) with, per entry, the cells it
    selects, reproduces in and explains (``known``), and ``stale`` (selects cells, reproduces
    in none); ``stale`` lists the stale entries' ids. With ``judge_stale=False`` (a shard of
    a sweep: the entry may reproduce in another shard) no entry is stale.
    """
    cells = list(cells)
    if ledger is None:
        return [judge(c, ())[0] for c in cells], None
    tally = {e.id: _Tally() for e in ledger.entries}
    out = []
    for cell in cells:
        if cell.status == "skipped":
            out.append(cell)
            continue
        judged, selecting, reproduced = judge(cell, ledger.entries)
        for e in selecting:
            tally[e.id].selected.append(cell.id)
            if e.id in reproduced:
                tally[e.id].reproduced.append(cell.id)
            if judged.known and e.id in judged.known:
                tally[e.id].known.append(cell.id)
        out.append(judged)
    outcome = ledger.serialize()
    stale = []
    for e in outcome["entries"]:
        t = tally[e["id"]]
        e.update(selected=t.selected, reproduced=t.reproduced, known_cells=t.known,
                 stale=judge_stale and bool(t.selected) and not t.reproduced)
        if e["stale"]:
            stale.append(e["id"])
    outcome["stale"] = stale
    outcome["judged_stale"] = judge_stale
    return out, outcome


def stale_message(entry_id: str, outcome: dict[str, Any]) -> str:
    """The gate's line for a stale entry."""
    e = next(x for x in outcome["entries"] if x["id"] == entry_id)
    return (f"ledger entry {entry_id} ({e['upstream']}) no longer reproduces in any of the "
            f"{len(e['selected'])} cell(s) it selects: delete it from {outcome['path']}")
