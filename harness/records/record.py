"""The run record: the one JSON document (``results.json.gz``) every report is rendered from.

Data flows one way: every verdict is appended to the run's result stream
(``harness.records.stream``) the moment it exists; the sweep folds the stream into a ``RunRecord``,
so an interrupted sweep still leaves a valid, ``incomplete`` record behind. Reports
(``harness_reports``) are pure functions of ``RunRecord.serialize()`` and never import torch.

Schema (``schema = 1``), all plain JSON:

``RunRecord``
    schema, status ("complete" | "incomplete"), started/finished (ISO-8601 UTC),
    duration_s, command (the shell line that reproduces the whole sweep), argv, backend,
    environment (torch, python, platform, hostname, device, pg_backend, git_commit),
    selection (preset, axis overrides, filter, examples), tolerance (policy table and any
    override), world_sizes, launches (one ``LaunchRecord`` per torchrun launch), counts
    (status -> number of cells), failure (why the run ended without verdicts: a launch
    failure; else None), ledger (the known-defects ledger applied: its file, package,
    versions, entries each with the cells it selects / reproduces in / explains and
    ``stale``, and ``stale``: the stale entries' ids; None without a ledger), cells
    (``CellResult`` list in matrix order).

``CellResult``
    id (the stable cell id), axes (axis -> value), expect ("pass" | "error"), status (one of
    ``harness.vocabulary.status.STATUSES``), duration_s, worst_ratio (largest error/bound over all tensor checks, or
    None), first_failure (one line, or None), repro (command line), ranks (``RankResult``
    per rank), example (the shape/split example that ran, with ``shrunk`` when hypothesis
    shrank a failure to it; None for the cell's default example); for a ``known`` cell only:
    known (the ledger entry ids that explain its failures) and raw_status (the backend's
    verdict: fail, error or timeout).

``RankResult``
    rank, status, comparisons (``Check`` list), error ({type, message, traceback} or None);
    by_peer (true only when the rank's failure is its peers' doing: ``harness.records.fold``
    does not count it while another rank failed on its own; absent otherwise).

``Check``
    name (path such as ``mb0.output`` or ``weight1.main_grad``), kind ("tensor" | "count" |
    "flag" | "dtype" | "exception" | "scale": a recipe's scales), ok, message (assert_close-style text when not ok),
    and for tensors: numel, mismatched, max_abs, max_rel, ratio (max error/bound),
    bound_at_worst, index (of the worst element), and when it fails, models (its ratio under
    each defect model of ``harness.vocabulary.defects`` that applies, optional); for counts/flags/dtypes:
    expected, actual.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from harness.records import recordfile
from harness.vocabulary.status import GOOD_STATUSES, STATUSES

SCHEMA = 1


@dataclass
class Check:
    name: str
    kind: str
    ok: bool
    message: str | None = None
    numel: int | None = None
    mismatched: int | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    ratio: float | None = None
    bound_at_worst: float | None = None
    index: list[int] | None = None
    expected: Any = None
    actual: Any = None
    #: a failing value check's error/bound ratio under each defect model that applies to it
    #: (``harness.vocabulary.defects``; what a ledger's model symptom matches); None: none computed
    models: dict[str, float] | None = None

    def serialize(self) -> dict[str, Any]:
        # shallow on purpose: dataclasses.asdict deep-copies and costs ~40 µs per check
        return {k: v for k in _CHECK_FIELDS if (v := getattr(self, k)) is not None or k == "ok"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Check":
        return cls(**d)


_CHECK_FIELDS = tuple(f.name for f in dataclasses.fields(Check))

#: significant digits of a margin in the record (the HTML report shows 4)
MARGIN_DIGITS = 6
#: what a passing cell's checks leave out of the record: where the worst element was and the
#: numbers the margin was computed from (``repro`` recomputes them)
_DETAIL = ("max_rel", "bound_at_worst", "index")


def margin(check: Check) -> dict[str, Any]:
    """A check of a passing cell as the record keeps it: its verdict and margin.

    Why: a ``full`` sweep's checks are ~99% passing, and their float evidence is what gzip
    cannot compress; the record keeps every check's name, verdict and margin (``ratio``,
    else ``max_abs``: a twin's distance), so the report, ``diff`` and ``merge`` read the same
    record, and the run folder stays small. A failing cell keeps everything.
    """
    out = check.serialize()
    for k in _DETAIL:
        out.pop(k, None)
    if out.get("mismatched") == 0:
        del out["mismatched"]
    if out.get("ratio") is not None:
        out.pop("max_abs", None)
        out["ratio"] = significant(out["ratio"])
    elif out.get("max_abs") is not None:
        out["max_abs"] = significant(out["max_abs"])
    return out


def significant(x: float | None, digits: int = MARGIN_DIGITS) -> float | None:
    """``x`` to ``digits`` significant digits (None and non-finite values unchanged)."""
    return x if x is None or x != x or x in (float("inf"), float("-inf")) else float(f"{x:.{digits}g}")


@dataclass
class RankResult:
    rank: int
    status: str
    comparisons: list[Check] = field(default_factory=list)
    error: dict[str, str] | None = None
    #: the backend's path evidence (te-cpu: extension function -> calls), None if it has none
    path: dict[str, int] | None = None
    #: TE's own record of the execution path it chose (``harness.cell.te_path.Choice.serialize()``:
    #: path, node, flags, inputs, and the reason when it is not the cell's), None: none recorded
    choice: dict[str, Any] | None = None
    #: the low-precision recipe the cell ran under (``harness.cell.lowp.describe``: recipe,
    #: te_class, device), None without one (absent from the record)
    recipe: dict[str, Any] | None = None
    #: what the cell's saved-tensor hooks packed (``harness.cell.hooks.Packs.serialize``: mode,
    #: installer, packs, packs that received a DistributedWeight), None with hooks off (absent)
    hooks: dict[str, Any] | None = None
    #: this rank's failure is its peers' doing, not its own: a collective it waited in broke or
    #: timed out because a peer never came, or the launch was ended under it while a peer had
    #: failed (``harness.records.fold.decisive``: such a rank never decides its cell's status)
    by_peer: bool = False

    def serialize(self, margins: bool = False) -> dict[str, Any]:
        """``margins``: keep each check's verdict and margin only (``margin``)."""
        extra = {"path": self.path} if self.path is not None else {}
        if self.choice is not None:
            extra["choice"] = self.choice
        if self.recipe is not None:
            extra["recipe"] = self.recipe
        if self.hooks is not None:
            extra["hooks"] = self.hooks
        if self.by_peer:
            extra["by_peer"] = True
        return {
            "rank": self.rank,
            "status": self.status,
            "comparisons": [margin(c) if margins else c.serialize() for c in self.comparisons],
            "error": self.error,
            **extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RankResult":
        return cls(
            rank=d["rank"],
            status=d["status"],
            comparisons=[Check.from_dict(c) for c in d.get("comparisons", [])],
            error=d.get("error"),
            path=d.get("path"),
            choice=d.get("choice"),
            recipe=d.get("recipe"),
            hooks=d.get("hooks"),
            by_peer=bool(d.get("by_peer", False)),
        )


#: the oracle's value checks per tensor kind (``harness.cell.runner`` names them)
TENSOR_KINDS: dict[str, tuple[str, ...]] = {
    "output": ("mb*.output",),
    "input_grad": ("mb*.input_grad",),
    "weight_grad": ("weight*.main_grad", "weight*.grad"),
    "bias_grad": ("bias*.main_grad", "bias*.grad"),
}


def tensor_kind(check_name: str) -> str | None:
    """The tensor kind a value check is about (None: not a value check of the oracle)."""
    for kind, globs in TENSOR_KINDS.items():
        if any(fnmatch.fnmatchcase(check_name, g) for g in globs):
            return kind
    return None


def kind_ratios(ranks: "list[RankResult]") -> dict[str, float]:
    """The largest error/bound ratio of each tensor kind over every rank's value checks."""
    out: dict[str, float] = {}
    for r in ranks:
        for c in r.comparisons:
            kind = tensor_kind(c.name) if c.ratio is not None else None
            if kind:
                out[kind] = max(out.get(kind, 0.0), c.ratio)
    return out


@dataclass
class CellResult:
    id: str
    axes: dict[str, Any]
    expect: str
    status: str
    duration_s: float = 0.0
    worst_ratio: float | None = None
    first_failure: str | None = None
    repro: str = ""
    ranks: list[RankResult] = field(default_factory=list)
    example: dict[str, Any] | None = None
    #: the ledger entries that explain every failure of a ``known`` cell (``harness.judging.ledger``)
    known: list[str] | None = None
    #: the backend's own verdict of a ``known`` cell (``fail``, ``error`` or ``timeout``)
    raw_status: str | None = None
    #: worst error/bound per tensor kind over every example the cell ran (``--examples``);
    #: None: only the checks kept in ``ranks`` (see :meth:`ratios`)
    example_ratios: dict[str, float] | None = None

    def ratios(self) -> dict[str, float]:
        """Worst error/bound per tensor kind: over all examples when they ran, else the checks."""
        return dict(self.example_ratios) if self.example_ratios is not None else kind_ratios(self.ranks)

    def serialize(self, lean: bool = False) -> dict[str, Any]:
        """``lean``: a passing cell keeps its checks' verdicts and margins only (``margin``);
        the result stream and every other cell keep all the evidence."""
        margins = lean and self.status == "pass"
        extra = {"known": self.known, "raw_status": self.raw_status} if self.known else {}
        if self.example_ratios is not None:
            extra["example_ratios"] = self.example_ratios
        return {**extra, **{
            "id": self.id,
            "axes": self.axes,
            "expect": self.expect,
            "status": self.status,
            "duration_s": self.duration_s,
            "worst_ratio": significant(self.worst_ratio) if margins else self.worst_ratio,
            "first_failure": self.first_failure,
            "repro": self.repro,
            "ranks": [r.serialize(margins) for r in self.ranks],
            "example": self.example,
        }}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CellResult":
        return cls(
            id=d["id"],
            axes=d["axes"],
            expect=d["expect"],
            status=d["status"],
            duration_s=d.get("duration_s", 0.0),
            worst_ratio=d.get("worst_ratio"),
            first_failure=d.get("first_failure"),
            repro=d.get("repro", ""),
            ranks=[RankResult.from_dict(r) for r in d.get("ranks", [])],
            example=d.get("example"),
            known=d.get("known"),
            raw_status=d.get("raw_status"),
            example_ratios=d.get("example_ratios"),
        )

    def __bool__(self) -> bool:
        """True when the cell met its expectation (as nox's ``Result``)."""
        return self.status in GOOD_STATUSES


@dataclass
class LaunchRecord:
    world_size: int
    #: the ids of the cells it was given, kept compressed (``recordfile.PackedStrings``: a
    #: large sweep's launch lists were the largest part of its parent's memory); any sequence
    #: of ids is packed when the record is made
    cells: Sequence[str]
    exit_code: int | None
    duration_s: float
    log_dir: str
    attempt: int = 0
    note: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cells, recordfile.PackedStrings):
            self.cells = recordfile.PackedStrings(self.cells)

    def serialize(self, packed: bool = False) -> dict[str, Any]:
        """The launch as JSON values; ``packed``: its cells left packed, for ``recordfile.write``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {
            "cells": self.cells if packed else list(self.cells)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LaunchRecord":
        return cls(**d)


@dataclass
class RunRecord:
    status: str
    started: str
    finished: str | None
    duration_s: float
    command: str
    argv: list[str]
    backend: str
    environment: dict[str, Any]
    selection: dict[str, Any]
    tolerance: dict[str, Any]
    world_sizes: list[int]
    launches: list[LaunchRecord] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    schema: int = SCHEMA
    #: why the run ended early without a verdict on every cell (a launch failure), or None
    failure: str | None = None
    #: the known-defects ledger applied and its outcome per entry (``harness.judging.ledger.apply``)
    ledger: dict[str, Any] | None = None

    @property
    def stale_entries(self) -> list[str]:
        """Ledger entries that reproduce in none of the cells they select (the gate fails)."""
        return list((self.ledger or {}).get("stale", []))

    @property
    def unfixed_entries(self) -> list[str]:
        """Under review (``sweep --fixes``): the entries the change must fix that it does not."""
        return list((self.ledger or {}).get("unfixed", []))

    @property
    def counts(self) -> dict[str, int]:
        return status_counts(c.status for c in self.cells)

    def serialize(self) -> dict[str, Any]:
        return {**self._head(), "cells": [c.serialize(lean=True) for c in self.cells]}

    def _head(self, counts: dict[str, int] | None = None, packed: bool = False) -> dict[str, Any]:
        """Everything but the cells (``serialize``'s keys in its order, ``cells`` last);
        ``counts``: the cells' counts when they are not in ``self.cells``; ``packed``: the
        launches' cell lists left packed (``recordfile.write`` writes them a piece at a time)."""
        return {
            "schema": self.schema,
            "status": self.status,
            "started": self.started,
            "finished": self.finished,
            "duration_s": self.duration_s,
            "command": self.command,
            "argv": self.argv,
            "backend": self.backend,
            "environment": self.environment,
            "selection": self.selection,
            "tolerance": self.tolerance,
            "world_sizes": self.world_sizes,
            "launches": [l.serialize(packed) for l in self.launches],
            "counts": self.counts if counts is None else counts,
            "failure": self.failure,
            "ledger": self.ledger,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"unsupported run record schema={d.get('schema')!r} (expected {SCHEMA})")
        return cls(
            status=d["status"],
            started=d["started"],
            finished=d.get("finished"),
            duration_s=d.get("duration_s", 0.0),
            command=d.get("command", ""),
            argv=d.get("argv", []),
            backend=d["backend"],
            environment=d.get("environment", {}),
            selection=d.get("selection", {}),
            tolerance=d.get("tolerance", {}),
            world_sizes=d.get("world_sizes", []),
            launches=[LaunchRecord.from_dict(l) for l in d.get("launches", [])],
            cells=[CellResult.from_dict(c) for c in d.get("cells", [])],
            failure=d.get("failure"),
            ledger=d.get("ledger"),
        )

    def write(self, path: str | Path) -> Path:
        """Write atomically (``harness.records.recordfile``): into a run folder's ``results.json.gz``,
        or to a file (plain JSON unless its name ends in ``.gz``). The cells are serialized
        one at a time as they are written (never the whole record at once). Returns the file."""
        return recordfile.write(self._head(packed=True), path, (c.serialize(lean=True) for c in self.cells))

    def write_with(self, path: str | Path, cells: Iterable[str], counts: dict[str, int]) -> Path:
        """``write`` with the cells from elsewhere, not ``self.cells``: each the compact JSON of
        its ``CellResult.serialize(lean=True)``, in order, and their ``counts``
        (``status_counts``) - the same bytes as ``write`` of those cells (the sweep folds its
        verdicts from disk into the record without holding them)."""
        return recordfile.write(self._head(counts, packed=True), path, cells, encoded=True)


def status_counts(statuses: Iterable[str]) -> dict[str, int]:
    """Cells per status: every status of the vocabulary (0 when none), then any other seen."""
    out = {s: 0 for s in STATUSES}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out


def load(path: str | Path) -> RunRecord:
    """Load a run record from a run folder, its ``results.json.gz`` or an older ``results.json``."""
    return RunRecord.from_dict(recordfile.read(path))

