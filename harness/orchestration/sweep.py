"""A sweep: cells -> launch plan (packed: one launch for every world size dividing the
largest, ``harness.vocabulary.packing``) -> result stream -> run record.

The run record is a fold of the run folder's result stream (``harness.records.stream``), refreshed
while the sweep runs and written at the end, so an interrupted sweep leaves a valid record
marked ``incomplete``; ``resume`` reruns exactly the cells without a verdict in the stream
(and, with ``rerun_failed``, the cells whose verdict missed their expectation).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.judging import ledger as ledgers
from harness.judging import assemble
from harness.vocabulary import matrix
from harness.records import runfolder, runinfo
from harness.vocabulary import packing
from harness.launcher.launch import LaunchFailure, LaunchOptions, launch_cells
from harness.records.record import CellResult, RunRecord, load
from harness.records.stream import ResultStream


@dataclass
class SweepSpec:
    cells: list[matrix.Cell]
    backend: str
    run_dir: Path
    selection: dict[str, Any]
    argv: list[str]
    options: LaunchOptions
    resume: bool = False
    rerun_failed: bool = False
    on_result: Callable[[CellResult, int, int], None] = field(default=lambda r, i, n: None)
    #: ``harness.vocabulary.backend_specs.BackendInfo.serialize()``: recorded in the environment
    backend_info: dict[str, Any] | None = None
    #: sub-group packing (False: one launch per world size)
    packing: bool = True
    #: ranks a launch may use beyond the largest world size (the GPUs of a CUDA node; 0: none)
    slots: int = 0
    #: the known-defects ledger the verdicts are judged under (None: no ledger)
    ledger: ledgers.Ledger | None = None
    #: on resume, before anything runs: the verdicts the folder already has, and how many cells will run
    on_resume: Callable[[list[CellResult], int], None] = field(default=lambda before, todo: None)


def to_run(spec: SweepSpec, verdicts: dict[str, CellResult]) -> list[matrix.Cell]:
    """The cells this sweep launches: all of them, or on resume the ones without a verdict in
    ``verdicts`` (cell id -> last verdict), plus those that missed their expectation with
    ``rerun_failed``."""
    if not spec.resume:
        return list(spec.cells)
    return [c for c in spec.cells
            if c.id not in verdicts or (spec.rerun_failed and not verdicts[c.id])]


def known_verdicts(run_dir: Path, backend: str, stream: ResultStream) -> dict[str, CellResult]:
    """A run folder's verdicts: its record's (a folder may hold only the record, e.g. a CI
    artifact), then its result stream's, the later winning. Skipped cells have none."""
    out: dict[str, CellResult] = {}
    try:
        previous = load(run_dir)
        if previous.backend == backend:
            out.update((c.id, c) for c in previous.cells if c.status != "skipped")
    except (OSError, ValueError):
        pass
    out.update(stream.latest(backend))
    return out


def run_sweep(spec: SweepSpec) -> RunRecord:
    """Run every cell of ``spec`` and return the (already written) run record.

    Raises:
        LaunchFailure: no cell could start (the record is written first, ``incomplete``).
    """
    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    stream = ResultStream(run_dir)
    # a fresh sweep counts only what it appends; a resumed one continues the folder's verdicts
    since = stream.size()
    before = known_verdicts(run_dir, spec.backend, stream) if spec.resume else {}
    todo = to_run(spec, before)
    if spec.resume:
        rerun = {c.id for c in todo}
        kept = [r for r in before.values() if r.id not in rerun]
        spec.on_resume([ledgers.judge(r, spec.ledger.entries if spec.ledger else ())[0] for r in kept], len(todo))
    record = assemble.start(backend=spec.backend, argv=spec.argv, selection=spec.selection,
                            device=spec.options.device, backend_info=spec.backend_info,
                            world_sizes=[c.world_size for c in spec.cells])
    if spec.resume:  # the launches so far stay on the record
        try:
            record.launches = load(run_dir).launches
        except (OSError, ValueError):
            pass
    t0 = time.monotonic()
    total = len(spec.cells)
    order = {c.id for c in spec.cells}
    done = [total - len(todo)]

    def fold(final: bool) -> int:
        """The record's cells from the stream (unrun cells as skipped once the sweep ends);
        returns how many cells have no verdict yet."""
        verdicts, _ = stream.read_since(since)
        latest = {**before, **{v.result.id: v.result for v in verdicts if v.backend == spec.backend}}
        cells = [latest[c.id] for c in spec.cells if c.id in latest]
        if final and len(cells) < total:
            # not ``latest.get(c.id) or ...``: a failing CellResult is falsy (``__bool__``)
            cells = [latest[c.id] if c.id in latest else
                     assemble.unrun(c, "not run: the sweep ended before this cell (sweep --resume runs it)")
                     for c in spec.cells]
        assemble.judge(record, cells, spec.ledger)
        record.duration_s = round(time.monotonic() - t0, 3)
        record.write(run_dir)
        return total - len(latest.keys() & order)

    next_write = [time.monotonic() + 5.0]

    entries = spec.ledger.entries if spec.ledger else ()

    def collect(res: CellResult) -> None:
        done[0] += 1
        spec.on_result(ledgers.judge(res, entries)[0], done[0], total)
        # the stream holds every verdict; refresh the record now and then so a reader sees
        # progress - at most 10% of the time, however large the record grows
        if time.monotonic() > next_write[0]:
            started = time.monotonic()
            fold(final=False)
            next_write[0] = time.monotonic() + max(5.0, 10 * (time.monotonic() - started))

    fold(final=False)
    try:
        for width, members in packing.launch_groups(todo, spec.packing, spec.slots):
            record.launches.extend(launch_cells(width, [todo[i] for i in members], spec.options, collect))
        record.status = "complete" if fold(final=False) == 0 else "incomplete"
    except LaunchFailure as exc:
        record.launches.extend(exc.launches)
        record.failure = str(exc)
        raise
    finally:
        record.finished = runinfo.now()
        fold(final=True)
    if record.status == "complete":
        retire(run_dir, stream)
    return record


def retire(run_dir: Path, stream: ResultStream) -> None:
    """A complete run keeps only what it needs: its record holds every verdict with every
    rank's checks and errors, so the result stream and the ranks' event reports (the
    launcher's live view, folded into the verdicts) go; the launch logs and plans are
    gzipped (``harness.records.runfolder``); the reports stay. An interrupted run keeps everything
    ``--resume`` reads."""
    stream.retire()
    shutil.rmtree(run_dir / "ranks", ignore_errors=True)
    runfolder.fold_launch_files(run_dir)
