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

import shlex
from typing import Any, Sequence

from harness.judging import ledger as ledgers
from harness.vocabulary import matrix, tolerance
from harness.records import runinfo
from harness.records.record import CellResult, RunRecord


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


def unrun(cell: matrix.Cell, why: str) -> CellResult:
    """A cell the run never reached (interrupted, a shard's missing part): shown as skipped,
    rerun by ``sweep --resume``."""
    return CellResult(cell.id, cell.serialize(), cell.expect, "skipped", first_failure=why)
