"""A sweep: cells -> launch plan (one per world size) -> results on disk -> run record.

The run record is rewritten after every cell result, so an interrupted sweep leaves a valid
record marked ``incomplete``; ``resume`` reruns only the cells without a result.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness import matrix
from harness.launch import LaunchOptions, launch_cells
from harness.record import CellResult, RunRecord, read_cell_lines


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict[str, Any]:
    import torch

    cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "device": f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu",
        "pg_backend": "nccl" if cuda else "gloo",
        "git_commit": git_commit(),
        "cpus": os.cpu_count(),
    }


@dataclass
class SweepSpec:
    cells: list[matrix.Cell]
    backend: str
    run_dir: Path
    selection: dict[str, Any]
    tolerance: dict[str, Any]
    argv: list[str]
    options: LaunchOptions
    resume: bool = False
    on_result: Callable[[CellResult, int, int], None] = field(default=lambda r, i, n: None)
    #: ``harness.backends.BackendInfo.serialize()``: recorded in the environment
    backend_info: dict[str, Any] | None = None


def run_sweep(spec: SweepSpec) -> RunRecord:
    """Run every cell of ``spec`` and return the (already written) run record."""
    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, CellResult] = {}
    if spec.resume:
        results = {r.id: r for r in read_cell_lines(run_dir / "cells.jsonl")}
    record = RunRecord(
        status="incomplete", started=_now(), finished=None, duration_s=0.0,
        command=shlex.join(["python", "-m", "harness", *spec.argv]), argv=list(spec.argv),
        backend=spec.backend,
        environment={**environment(spec.options.device),
                     **({"backend_info": spec.backend_info} if spec.backend_info else {})},
        selection=spec.selection, tolerance=spec.tolerance,
        world_sizes=sorted({c.world_size for c in spec.cells}),
    )
    t0 = time.monotonic()
    order = {c.id: i for i, c in enumerate(spec.cells)}
    total = len(spec.cells)

    def write() -> None:
        record.cells = sorted(results.values(), key=lambda r: order.get(r.id, len(order)))
        record.duration_s = round(time.monotonic() - t0, 3)
        record.write(run_dir / "results.json")

    def write_with_unrun() -> None:
        write()
        if record.status == "incomplete":
            unrun = [_unrun(c, "not run: the sweep was interrupted (sweep --resume runs it)")
                     for c in spec.cells if c.id not in results]
            record.cells = sorted(record.cells + unrun, key=lambda r: order.get(r.id, len(order)))
            record.write(run_dir / "results.json")

    next_write = [time.monotonic() + 5.0]

    def collect(res: CellResult) -> None:
        results[res.id] = res
        spec.on_result(res, len(results), total)
        # cells.jsonl already holds every result; refresh the record now and then so a
        # reader sees progress - at most 10% of the time, however large the record grows
        if time.monotonic() > next_write[0]:
            started = time.monotonic()
            write()
            next_write[0] = time.monotonic() + max(5.0, 10 * (time.monotonic() - started))

    lines = run_dir / "cells.jsonl"
    lines_at_start = lines.stat().st_size if lines.exists() else 0
    write()
    try:
        for ws, cells in matrix.plan(spec.cells).items():
            todo = [c for c in cells if c.id not in results]
            if todo:
                record.launches.extend(launch_cells(ws, todo, spec.options, collect))
                write()
        record.status = "complete" if all(c.id in results for c in spec.cells) else "incomplete"
    finally:
        # a verdict the ranks wrote that the launcher had not picked up yet (an interrupt
        # between two polls) is a result all the same: cells.jsonl is the truth
        for res in _lines_since(lines, lines_at_start):
            if res.id in order:
                results.setdefault(res.id, res)
        record.finished = _now()
        write_with_unrun()
    return record


def _lines_since(path: Path, offset: int) -> list[CellResult]:
    """The complete result lines appended to ``cells.jsonl`` after ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return []
    out = []
    for line in chunk.decode(errors="replace").splitlines(keepends=True):
        try:
            out.append(CellResult.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError):
            continue  # a torn last line: the cell reruns on --resume
    return out


def _unrun(cell: matrix.Cell, why: str) -> CellResult:
    """A cell the sweep never reached (interrupted): shown as skipped, rerun by --resume."""
    return CellResult(cell.id, cell.serialize(), cell.expect, "skipped", first_failure=why)
