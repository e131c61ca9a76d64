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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.judging import ledger as ledgers
from harness.judging import assemble
from harness.vocabulary import matrix
from harness.records import recordfile, runfolder, runinfo
from harness.vocabulary import packing
from harness.launcher.launch import LaunchFailure, LaunchOptions, launch_cells
from harness.records.record import CellResult, RunRecord
from harness.records.stream import ResultStream
from harness.records.verdicts import Verdicts


#: seconds between two refreshes of a running sweep's record, at least: a refresh judges every
#: verdict so far under the ledger and writes the record again, so it costs more the further
#: the sweep is (every 5 s, it was a tenth of a te-cpu ``ci`` sweep's parent). The stream holds
#: every verdict whatever the interval; the record is written again at the end, interrupted
#: or not (docs/cli.md, "While it runs").
REFRESH_S = 30.0


@dataclass
class SweepSpec:
    cells: Sequence[matrix.Cell]
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
    #: on resume, before anything runs: the statuses (judged under the ledger) of the verdicts
    #: the folder already has and keeps, and how many cells will run
    on_resume: Callable[[Counter, int], None] = field(default=lambda kept, todo: None)


def to_run(spec: SweepSpec, verdicts: Verdicts | None) -> list[matrix.Cell]:
    """The cells this sweep launches: all of them, or on resume the ones without a verdict in
    ``verdicts``, plus those that missed their expectation with ``rerun_failed``."""
    if not spec.resume or verdicts is None:
        return list(spec.cells)
    return [c for c in spec.cells
            if c.id not in verdicts or (spec.rerun_failed and not verdicts.met(c.id))]


def run_sweep(spec: SweepSpec) -> RunRecord:
    """Run every cell of ``spec`` and return the (already written) run record: its head, its
    cells on disk only (``harness.records.recordfile.read_streamed`` reads them back).

    The record is a fold of the folder's verdicts, never a list of them: ``Verdicts`` knows
    where each cell's latest verdict is (the stream's line, else the earlier record's), and each
    write reads them back one at a time in selection order and judges them as they come
    (``assemble.write_judged``), so the parent's memory does not grow with the cells.

    Raises:
        LaunchFailure: no cell could start (the record is written first, ``incomplete``).
    """
    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    stream = ResultStream(run_dir)
    record = assemble.start(backend=spec.backend, argv=spec.argv, selection=spec.selection,
                            device=spec.options.device, backend_info=spec.backend_info,
                            world_sizes=[c.world_size for c in spec.cells])
    # on resume the launches so far stay on the record; read before the verdicts are indexed,
    # since a launch's list of ids is held whole while it is read, until it is packed
    if spec.resume:
        try:
            record.launches = load_head(run_dir).launches
        except (OSError, ValueError):
            pass
    # a fresh sweep counts only what it appends; a resumed one continues the folder's verdicts
    verdicts = Verdicts(run_dir, spec.backend, since=0 if spec.resume else stream.size(), earlier=spec.resume)
    todo = to_run(spec, verdicts)
    t0 = time.monotonic()
    total = len(spec.cells)
    done = [total - len(todo)]

    def fold(final: bool, seen: Callable[[CellResult], None] = lambda judged: None) -> None:
        """Write the record: its cells from the folder's verdicts, read back one at a time
        (unrun cells as skipped once the sweep ends)."""
        verdicts.refresh()

        def cells() -> Iterator[CellResult]:
            for c in spec.cells:
                v = verdicts.get(c.id)
                if v is None:
                    if not final:
                        continue
                    # not ``verdicts.get(c.id) or ...``: a failing CellResult is falsy (``__bool__``)
                    v = assemble.unrun(c, "not run: the sweep ended before this cell (sweep --resume runs it)")
                yield v

        record.duration_s = round(time.monotonic() - t0, 3)
        try:
            assemble.write_judged(record, cells(), spec.ledger, run_dir, seen)
        finally:
            verdicts.rewind()

    next_write = [time.monotonic() + REFRESH_S]

    entries = spec.ledger.entries if spec.ledger else ()

    def collect(res: CellResult) -> None:
        done[0] += 1
        spec.on_result(ledgers.judge(res, entries)[0], done[0], total)
        # the stream holds every verdict; refresh the record now and then so a reader sees
        # progress - at most 5% of the time, however large the record grows
        if time.monotonic() > next_write[0]:
            started = time.monotonic()
            fold(final=False)
            next_write[0] = time.monotonic() + max(REFRESH_S, 20 * (time.monotonic() - started))

    # on resume: the statuses (judged) of the verdicts the folder keeps, counted by the first
    # write (it sees only cells with a verdict; those that missed rerun with rerun_failed)
    kept: Counter = Counter()

    def keep(judged: CellResult) -> None:
        if not (spec.rerun_failed and not verdicts.met(judged.id)):
            kept[judged.status] += 1

    if todo:  # the record before the first launch: an interrupted run leaves one
        fold(final=False, seen=keep if spec.resume else lambda judged: None)
        if spec.resume:
            spec.on_resume(kept, len(todo))
    try:
        for width, members in packing.launch_groups(todo, spec.packing, spec.slots):
            record.launches.extend(launch_cells(width, [todo[i] for i in members], spec.options, collect))
        verdicts.refresh()
        record.status = "complete" if all(c.id in verdicts for c in spec.cells) else "incomplete"
    except LaunchFailure as exc:
        record.launches.extend(exc.launches)
        record.failure = str(exc)
        raise
    finally:
        record.finished = runinfo.now()
        fold(final=True, seen=keep if spec.resume and not todo else lambda judged: None)
    if spec.resume and not todo:  # nothing ran: the one write counted them
        spec.on_resume(kept, 0)
    if record.status == "complete":
        retire(run_dir, stream)
    return record


def load_head(run_dir: Path) -> RunRecord:
    """A run folder's record without its cells (its launches, its selection)."""
    return RunRecord.from_dict({**recordfile.read_head(run_dir), "cells": []})


def retire(run_dir: Path, stream: ResultStream) -> None:
    """A complete run keeps only what it needs: its record holds every verdict with every
    rank's checks and errors, so the result stream and the ranks' event reports (the
    launcher's live view, folded into the verdicts) go; the launch logs and plans are
    gzipped (``harness.records.runfolder``); the reports stay. An interrupted run keeps everything
    ``--resume`` reads."""
    stream.retire()
    shutil.rmtree(run_dir / "ranks", ignore_errors=True)
    runfolder.fold_launch_files(run_dir)
