"""Launching the worker under torchrun: one launch per world size, never a hang.

Each launch runs in its own process session so that a timeout or an interrupt can kill the
whole tree (torchrun and every rank) with one ``killpg``; rendezvous uses ``--standalone``,
which binds a free port per launch, so parallel launches (pytest-xdist) cannot collide.
Results are read back from ``cells.jsonl`` as the worker appends them. When a launch dies
or stops making progress, the cell in flight is recorded (``error`` / ``timeout``, with
every rank's log tail) and the remaining cells go to a fresh launch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.matrix import Cell
from harness.record import CellResult, LaunchRecord, RankResult
from harness.verdict import repro_command

ResultCallback = Callable[[str, CellResult], None]


@dataclass(frozen=True)
class Task:
    """One cell against one backend; a launch runs a list of them in order."""

    backend: str
    cell: Cell

    @property
    def key(self) -> tuple[str, str]:
        return (self.backend, self.cell.id)


@dataclass
class LaunchOptions:
    backend: str
    run_dir: Path
    cell_timeout: float = 120.0
    startup_timeout: float = 120.0
    device: str = "auto"
    threads_per_rank: int = 1
    example: dict | None = None
    examples: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)


def torchrun_command(world_size: int, plan_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--monitor-interval", "0.1",
        "--nproc-per-node", str(world_size), "-m", "harness.worker", "--plan", str(plan_path),
    ]


class _ResultTail:
    """Reads the lines the worker appends to ``cells.jsonl``, from where it left off."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[tuple[str, CellResult]]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return []
        self.offset += len(complete) + 1
        out = []
        for line in complete.splitlines():
            try:
                d = json.loads(line)
                out.append((d.get("backend", ""), CellResult.from_dict(d)))
            except (json.JSONDecodeError, KeyError):
                continue
        return out


def kill_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """End torchrun and every rank: SIGTERM the process group, then SIGKILL it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # ranks may outlive torchrun by a moment; make sure the group is empty
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _lost_cell(task: Task, status: str, why: str, world_size: int, log_dir: Path,
               duration: float) -> CellResult:
    """A cell whose launch died or hung: every rank's log tail is the evidence."""
    cell = task.cell
    ranks = []
    for r in range(world_size):
        tail = _log_tail(log_dir / f"rank{r}.log")
        ranks.append(RankResult(r, status, [], {"type": "Timeout" if status == "timeout" else "LaunchFailure",
                                                 "message": why, "traceback": tail}))
    first = _first_failed_rank(log_dir, world_size)
    return CellResult(cell.id, cell.serialize(), cell.expect, status, round(duration, 3), None,
                      f"[rank {first}] {why}" if first is not None else why,
                      repro_command(cell.id, task.backend), ranks)


def _first_failed_rank(log_dir: Path, world_size: int) -> int | None:
    """The rank whose log shows a traceback earliest (by file modification order)."""
    stamped = []
    for r in range(world_size):
        p = log_dir / f"rank{r}.log"
        if p.exists() and ("Traceback" in _log_tail(p, 200) or "Fatal Python error" in _log_tail(p, 200)):
            stamped.append((p.stat().st_mtime, r))
    return min(stamped)[1] if stamped else None


def launch_cells(world_size: int, cells: list[Cell], opts: LaunchOptions,
                 on_result: Callable[[CellResult], None]) -> list[LaunchRecord]:
    """Run ``cells`` against ``opts.backend``; see ``launch_tasks``."""
    return launch_tasks(world_size, [Task(opts.backend, c) for c in cells], opts,
                        lambda backend, res: on_result(res))


def launch_tasks(world_size: int, tasks: list[Task], opts: LaunchOptions,
                 on_result: ResultCallback) -> list[LaunchRecord]:
    """Run ``tasks`` (all of one world size) until each has a result; relaunch as needed.

    Several backends can share one launch: the process group does not depend on them.
    """
    remaining = list(tasks)
    launches: list[LaunchRecord] = []
    attempt = 0
    (opts.run_dir / "plans").mkdir(parents=True, exist_ok=True)
    while remaining:
        name = f"ws{world_size}-{attempt}"
        log_dir = opts.run_dir / "logs" / name
        plan = {
            "run_dir": str(opts.run_dir), "launch": name,
            "tasks": [{"backend": t.backend, "cell": t.cell.id} for t in remaining], "device": opts.device,
            "threads_per_rank": opts.threads_per_rank, "example": opts.example,
            "examples": opts.examples,
            "collective_timeout": max(opts.cell_timeout, 10.0),
        }
        plan_path = opts.run_dir / "plans" / f"{name}.json"
        plan_path.write_text(json.dumps(plan, indent=1))
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads_per_rank), "PYTHONUNBUFFERED": "1",
               **opts.extra_env}
        tail = _ResultTail(opts.run_dir / "cells.jsonl")
        t0 = time.monotonic()
        last = t0
        launched = list(remaining)
        with open(log_dir / "torchrun.log", "w") as launcher_log:
            proc = subprocess.Popen(torchrun_command(world_size, plan_path), stdout=launcher_log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
            note = None
            try:
                while True:
                    exited = proc.poll() is not None
                    for backend, res in tail.read():
                        if remaining and (backend, res.id) == remaining[0].key:
                            on_result(backend, res)
                            remaining.pop(0)
                            last = time.monotonic()
                    if exited or not remaining:
                        break
                    limit = opts.cell_timeout + (opts.startup_timeout if last == t0 else 0.0)
                    if time.monotonic() - last > limit:
                        note = f"cell timed out after {opts.cell_timeout:g}s; launch killed"
                        kill_tree(proc)
                        lost = remaining.pop(0)
                        on_result(lost.backend, _lost_cell(
                            lost, "timeout", f"no result within {opts.cell_timeout:g}s (per-cell timeout); "
                            "the launch was killed", world_size, log_dir, time.monotonic() - last))
                        break
                    time.sleep(0.05)
                if remaining and proc.poll() is not None and note is None:
                    code = proc.returncode
                    note = f"launch exited with code {code} before finishing"
                    lost = remaining.pop(0)
                    on_result(lost.backend, _lost_cell(
                        lost, "error", f"launch exited with code {code} while this cell ran "
                        f"(see the rank logs; torchrun: {_torchrun_reason(log_dir)})",
                        world_size, log_dir, time.monotonic() - last))
                elif not remaining:
                    # Every result is on disk; give the ranks a moment to tear down cleanly,
                    # then end the tree rather than wait out torchrun's shutdown.
                    try:
                        proc.wait(timeout=2.0)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                kill_tree(proc)
        launches.append(LaunchRecord(world_size, [t.cell.id for t in launched], proc.returncode,
                                     round(time.monotonic() - t0, 3), str(log_dir.relative_to(opts.run_dir)),
                                     attempt, note))
        attempt += 1
    return launches


def _torchrun_reason(log_dir: Path) -> str:
    """The failing rank and exit code/signal torchrun reported, if it said."""
    text = _log_tail(log_dir / "torchrun.log", 60)
    picks = [ln.strip() for ln in text.splitlines() if "exitcode" in ln or "Signal" in ln or "rank" in ln.lower() and "fail" in ln.lower()]
    return "; ".join(picks[:3]) or "no reason given"
