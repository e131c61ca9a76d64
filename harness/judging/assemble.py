"""Assembling a run record: the one builder ``sweep``, ``merge``, ``selftest`` and
``harness.rank.external`` share, so their records agree on what they say (no torch).

A record is started (``start``) with what the parent knows before any cell runs - the command,
the selection, the backend's own account of itself (``harness.vocabulary.backend_specs.BackendInfo``: its
upstream version, TE tree, how its fp32 GEMMs compute, hence the tolerance recorded) - and
its verdicts are judged into it (``judge``) under the run's known-defects ledger, as often as
new verdicts arrive. A shard never calls an entry stale (it may reproduce in another shard);
a change under review names the entries it must fix in ``selection["fixes"]``.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from harness.judging import ledger as ledgers
from harness.vocabulary import matrix, tolerance
from harness.records import runinfo
from harness.records.record import CellResult, RunRecord, status_counts


def start(*, backend: str, argv: Sequence[str], selection: dict[str, Any], device: str,
          backend_info: dict[str, Any] | None, world_sizes: Sequence[int], command: str | None = None,
          started: str | None = None) -> RunRecord:
    """An ``incomplete`` record with no verdict yet.

    ``command``: the line that reproduces the run (default ``python -m harness ARGV``);
    ``backend_info``: ``BackendInfo.serialize()`` (None: the backend was not probed; the
    tolerance then assumes IEEE fp32 GEMMs)."""
    info = backend_info or {}
    return RunRecord(
        status="incomplete", started=started or runinfo.now(), finished=None, duration_s=0.0,
        command=command or shlex.join(["python", "-m", "harness", *argv]), argv=list(argv), backend=backend,
        environment={**runinfo.environment(device, info.get("torch")), **({"backend_info": info} if info else {})},
        selection=selection, tolerance=tolerance.policy(info.get("fp32_gemm") or "ieee"),
        world_sizes=sorted(set(world_sizes)))


def judge(record: RunRecord, cells: Sequence[CellResult], ledger: ledgers.Ledger | None) -> RunRecord:
    """``record`` with ``cells`` (in selection order) judged under ``ledger`` (CONTRACTS §7)."""
    record.cells, record.ledger = ledgers.apply(cells, ledger, judge_stale=not record.selection.get("shard"),
                                                required=record.selection.get("fixes"))
    return record


def write_judged(record: RunRecord, verdicts: Iterable[CellResult], ledger: ledgers.Ledger | None, path: Path,
                 seen: Callable[[CellResult], None] = lambda judged: None) -> Path:
    """``judge`` then ``RunRecord.write`` for verdicts that come one at a time (in selection
    order), never held as a list: each is judged under ``ledger`` as it comes (``seen`` is
    shown it), and spilled, lean, to an unnamed file beside the record; the head - the counts,
    the ledger's outcome - is known after the last and is written first. The same bytes as
    ``judge`` and ``write`` of the list (``cases/test_record_file.py``). Returns the file."""
    fold = ledgers.Fold(ledger, judge_stale=not record.selection.get("shard"), required=record.selection.get("fixes"))
    counts: Counter = Counter()
    folder = path if path.is_dir() else path.parent
    with tempfile.TemporaryFile("w+", encoding="utf-8", dir=folder, prefix=".cells-") as spill:
        for cell in verdicts:
            judged = fold.add(cell)
            counts[judged.status] += 1
            seen(judged)
            spill.write(json.dumps(judged.serialize(lean=True), separators=(",", ":")) + "\n")
        spill.seek(0)
        record.cells, record.ledger = [], fold.outcome()
        return record.write_with(path, (line[:-1] for line in spill), status_counts(counts.elements()))


def unrun(cell: matrix.Cell, why: str) -> CellResult:
    """A cell the run never reached (interrupted, a shard's missing part): shown as skipped,
    rerun by ``sweep --resume``."""
    return CellResult(cell.id, cell.serialize(), cell.expect, "skipped", first_failure=why)
