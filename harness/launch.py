"""Launching the worker under torchrun: one launch per world size, never a hang.

Each launch runs in its own process session so that a timeout or an interrupt can end the
whole tree (torchrun and every rank) with one ``killpg``; each launch binds a free loopback
port for its rendezvous (``harness.loopback``), so parallel launches (pytest-xdist) cannot
collide and nothing listens beyond loopback.

The launcher watches three things while a launch runs: the run's result stream (verdicts:
progress), each rank's own reports in ``ranks/`` (``ready``, a start-up error, a rank that
failed while its peers may be stuck in a collective), and the process itself (a dead rank
ends torchrun). When a launch stops making progress - a peer stuck after a failure, a cell
past its timeout, a dead rank - the launcher ends the tree (SIGTERM first: each rank's
faulthandler writes its stacks into its log), appends the cell in flight to the result
stream with every rank's evidence, and starts a fresh launch for the cells left.

A launch that ends before every rank is ready ran no cell: it is a launch failure, retried
once (``LaunchOptions.start_attempts``); then ``LaunchFailure`` ends the run, naming the first
failing rank's error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness import loopback
from harness.matrix import Cell
from harness.record import CellResult, LaunchRecord, RankResult
from harness.status import HARNESS_ERROR
from harness.stream import ResultStream
from harness.verdict import cell_status, repro_command

ResultCallback = Callable[[str, CellResult], None]
#: rank statuses that mean "this rank failed the cell in flight"
_FAILED = ("error", HARNESS_ERROR)


class LaunchFailure(RuntimeError):
    """Launches that ended before any cell started, twice in a row: nothing can run.

    Not a verdict on any cell (none ran); the run ends with exit 3 and this message, which
    names the first failing rank's error.
    """

    def __init__(self, message: str, launches: list[LaunchRecord]) -> None:
        super().__init__(message)
        self.launches = launches


@dataclass(frozen=True)
class Task:
    """One cell against one backend; a launch runs a list of them in order."""

    backend: str
    cell: Cell
    #: hypothesis-drawn extra examples for this task (None: the launch's default)
    examples: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.backend, self.cell.id)


@dataclass
class LaunchOptions:
    backend: str
    run_dir: Path
    cell_timeout: float = 120.0
    startup_timeout: float = 120.0
    #: how long peers may take to report once one rank has reported an error
    peer_grace: float = 15.0
    device: str = "auto"
    threads_per_rank: int = 1
    example: dict | None = None
    examples: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    #: launches in a row that may end before any cell starts before the run gives up
    start_attempts: int = 2
    #: called with one line while nothing new happens (torchrun starting, a slow cell)
    on_wait: Callable[[str], None] | None = None
    wait_interval: float = 10.0


def torchrun_command(world_size: int, plan_path: Path) -> list[str]:
    """torchrun on this machine, every listening socket on loopback (``harness.loopback``)."""
    return loopback.command("--monitor-interval", "0.1", "--nproc-per-node", str(world_size),
                            "-m", "harness.worker", "--plan", str(plan_path))


class _LineTail:
    """Reads the JSON lines appended to a file, from where it left off; torn lines wait."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return []
        self.offset += len(complete) + 1
        out = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
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
        except subprocess.TimeoutExpired:
            continue
    # ranks may outlive torchrun by a moment; make sure the group is empty
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _log_since(path: Path, marker: str, lines: int = 80) -> str:
    """The rank's log from the start of the cell in flight: its traceback or stack dump."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    at = text.rfind(marker)
    part = text[at:] if at >= 0 else text
    return "\n".join(part.splitlines()[-lines:])


_TORCHRUN_ROOT = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_SIGNAL = re.compile(r"Signal (\d+) \((\w+)\)")


def torchrun_failure(log_dir: Path) -> tuple[int | None, str]:
    """The first failed rank and how it ended, as torchrun's summary reports them."""
    text = _log_tail(log_dir / "torchrun.log", 200)
    root = text.split("Root Cause", 1)[1] if "Root Cause" in text else text
    m = _TORCHRUN_ROOT.search(root)
    if not m:
        return None, "torchrun gave no failure summary"
    rank, code = int(m.group(1)), int(m.group(2))
    sig = _SIGNAL.search(root)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        return rank, f"rank {rank} died: exit code {code} ({name})"
    if sig:
        return rank, f"rank {rank} died: {sig.group(2)}"
    return rank, f"rank {rank} exited with code {code}"


_ERROR_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Interrupt)\b.*$", re.M)


def _last_error_line(text: str) -> str | None:
    """The last ``SomethingError: ...`` line of a log (a traceback's verdict line)."""
    found = _ERROR_LINE.findall(text)
    return found[-1].strip() if found else None


class _Launch:
    """One torchrun launch and what is known about the task in flight."""

    def __init__(self, world_size: int, tasks: list[Task], opts: LaunchOptions, name: str) -> None:
        self.world_size = world_size
        self.tasks = tasks
        self.opts = opts
        self.name = name
        self.log_dir = opts.run_dir / "logs" / name
        self.done = 0                      # tasks with a verdict in the stream
        self.reports: dict[int, dict[int, dict]] = {}   # task index -> rank -> own report
        self.ready: set[int] = set()                     # ranks able to run cells
        self.startup_errors: dict[int, dict] = {}       # rank -> its startup_error report
        self.stream = ResultStream(opts.run_dir)
        self.offset = self.stream.path.stat().st_size if self.stream.path.exists() else 0
        self.rank_tails = [_LineTail(opts.run_dir / "ranks" / f"{name}.rank{r}.jsonl")
                           for r in range(world_size)]

    @property
    def started(self) -> bool:
        """Every rank got as far as running cells (or a cell already has a verdict)."""
        return len(self.ready) == self.world_size or self.done > 0

    def start(self) -> subprocess.Popen:
        run_dir = self.opts.run_dir
        for sub in ("plans", "ranks"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        plan = {
            "run_dir": str(run_dir), "launch": self.name,
            "tasks": [{"backend": t.backend, "cell": t.cell.id,
                       "examples": self.opts.examples if t.examples is None else t.examples}
                      for t in self.tasks],
            "device": self.opts.device, "threads_per_rank": self.opts.threads_per_rank,
            "example": self.opts.example, "examples": self.opts.examples,
            # shorter than the cell timeout, so a peer of a hung rank reports a
            # communication error (and is seen as a victim) before the launch is ended
            "collective_timeout": max(5.0, 0.75 * self.opts.cell_timeout),
        }
        plan_path = run_dir / "plans" / f"{self.name}.json"
        plan_path.write_text(json.dumps(plan, indent=1))
        env = {**os.environ, "OMP_NUM_THREADS": str(self.opts.threads_per_rank), "PYTHONUNBUFFERED": "1",
               **self.opts.extra_env}
        self._log = open(self.log_dir / "torchrun.log", "w")
        return subprocess.Popen(torchrun_command(self.world_size, plan_path), stdout=self._log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)

    def poll_results(self) -> list[tuple[str, CellResult]]:
        """New verdicts of this launch's tasks (with their backend) in task order; fresh
        per-rank reports and start-up events."""
        for r, tail in enumerate(self.rank_tails):
            for rep in tail.read():
                event = rep.get("event")
                if event == "ready":
                    self.ready.add(r)
                elif event == "startup_error":
                    self.startup_errors[r] = rep
                elif event == "result":
                    self.reports.setdefault(rep["i"], {})[r] = rep
        verdicts, self.offset = self.stream.read_since(self.offset)
        out = []
        for v in verdicts:
            if v.launch == self.name and self.done < len(self.tasks) and v.key == self.tasks[self.done].key:
                out.append((v.backend, v.result))
                self.done += 1
        return out

    def first_error_report(self) -> float | None:
        """When a rank first reported a failure for the task in flight (None: none did)."""
        times = [rep["t"] for rep in self.reports.get(self.done, {}).values()
                 if rep["result"]["status"] in _FAILED]
        return min(times) if times else None

    def startup_cause(self, why: str) -> str:
        """Why the launch never started: the first rank's own start-up error, else the last
        error line a rank or torchrun left in its log."""
        if self.startup_errors:
            r, rep = min(self.startup_errors.items(), key=lambda kv: kv[1]["t"])
            err = rep["error"]
            return f"[rank {r}] {err['type']}: {err['message']}"
        rank, how = torchrun_failure(self.log_dir)
        logs = ([self.log_dir / f"rank{rank}.log"] if rank is not None else []) + [self.log_dir / "torchrun.log"]
        for log in logs:
            line = _last_error_line(_log_tail(log, 200))
            if line:
                return f"{line} ({how})" if rank is not None else line
        return f"{why} ({how})"

    def lost(self, status: str, why: str, first_rank: int | None, duration: float) -> tuple[str, CellResult]:
        """The in-flight task's verdict from what each rank reported or left in its log,
        appended to the result stream at once (the launcher is one of its writers)."""
        task = self.tasks[self.done]
        cell = task.cell
        marker = f"start {self.done + 1}/{len(self.tasks)} "
        reported = self.reports.get(self.done, {})
        ranks = []
        for r in range(self.world_size):
            if r in reported:
                ranks.append(RankResult.from_dict(reported[r]["result"]))
                continue
            evidence = _log_since(self.log_dir / f"rank{r}.log", marker)
            ranks.append(RankResult(r, status, [], {
                "type": {"timeout": "Timeout", "error": "NoReport"}[status],
                "message": f"this rank never reported a result ({why})", "traceback": evidence}))
        first_rank = _first_to_fail(reported, first_rank, self.world_size)
        verdict = cell_status(ranks)
        first = why
        if first_rank is not None:
            rr = next(x for x in ranks if x.rank == first_rank)
            if first_rank in reported and rr.error:
                first = f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} (first rank to fail; {why})"
            elif rr.error:
                first = f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} (first rank to fail)"
        self.done += 1
        res = CellResult(cell.id, cell.serialize(), cell.expect, verdict, round(duration, 3), None,
                         first, repro_command(cell.id, task.backend), ranks, self.opts.example)
        self.stream.append(res, task.backend, self.name)
        return task.backend, res

    def close(self) -> None:
        self._log.close()


_COMM_ERROR = re.compile(
    r"Connection (closed|reset) by peer|Timed out waiting|timed out|Read error|Socket Timeout|"
    r"NCCL (error|communicator)|watchdog|ProcessGroup\w* (is )?abort", re.I)


def _first_to_fail(reported: dict[int, dict], dead_rank: int | None, world_size: int) -> int | None:
    """The rank that failed first, not a peer that then saw "connection closed".

    In order: the earliest rank whose own error is not a communication error; the rank
    torchrun saw die; a rank that never reported (hung); the earliest communication error.
    """
    errors = sorted((rep["t"], r, bool(_COMM_ERROR.search((rep["result"].get("error") or {}).get("message", ""))))
                    for r, rep in reported.items() if rep["result"]["status"] in _FAILED)
    own = [r for _, r, victim in errors if not victim]
    if own:
        return own[0]
    if dead_rank is not None:
        return dead_rank
    silent = [r for r in range(world_size) if r not in reported]
    if silent and errors:
        return silent[0]
    return errors[0][1] if errors else None


def launch_cells(world_size: int, cells: list[Cell], opts: LaunchOptions,
                 on_result: Callable[[CellResult], None] = lambda res: None) -> list[LaunchRecord]:
    """Run ``cells`` against ``opts.backend``; see ``launch_tasks``."""
    return launch_tasks(world_size, [Task(opts.backend, c) for c in cells], opts,
                        lambda backend, res: on_result(res))


def _free_launch_name(run_dir: Path, world_size: int) -> str:
    """``ws<N>-<k>`` with the first k whose logs do not exist yet: a resumed sweep (or a second
    batch in the same folder) must not overwrite the logs and plans of an earlier launch."""
    k = 0
    while (run_dir / "logs" / f"ws{world_size}-{k}").exists():
        k += 1
    return f"ws{world_size}-{k}"


def launch_tasks(world_size: int, tasks: list[Task], opts: LaunchOptions,
                 on_result: ResultCallback = lambda backend, res: None) -> list[LaunchRecord]:
    """Run ``tasks`` (all of one world size) until each has a verdict in the result stream.

    A launch that loses a cell (crash, hang) is replaced by a fresh one for the cells left.
    A launch that ends before any cell started is a launch failure: retried, and after
    ``opts.start_attempts`` such launches in a row ``LaunchFailure`` ends the run. Several
    backends can share one launch: the process group does not depend on them.
    ``on_result`` is told of each verdict as it arrives (progress only: the stream has it).

    Raises:
        LaunchFailure: launches kept ending before any cell started.
    """
    remaining = list(tasks)
    records: list[LaunchRecord] = []
    attempt = 0
    failed_starts = 0
    while remaining:
        launch = _Launch(world_size, remaining, opts, _free_launch_name(opts.run_dir, world_size))
        t0 = time.monotonic()
        proc = launch.start()
        outcome = _Outcome()
        try:
            outcome = _watch(launch, proc, opts, on_result)
        finally:
            kill_tree(proc)
            launch.close()
        note = outcome.note if outcome.startup is None else f"could not start: {outcome.startup}"
        records.append(LaunchRecord(world_size, [t.cell.id for t in remaining], proc.returncode,
                                    round(time.monotonic() - t0, 3),
                                    str(launch.log_dir.relative_to(opts.run_dir)), attempt, note))
        attempt += 1
        if outcome.startup is not None:
            failed_starts += 1
            if failed_starts >= opts.start_attempts:
                raise LaunchFailure(
                    f"no cell could start: {failed_starts} launch(es) of {world_size} rank(s) in a row ended "
                    f"before the first cell; first failing rank: {outcome.startup} "
                    f"(rank logs: {launch.log_dir})", records)
            continue
        failed_starts = 0
        remaining = remaining[launch.done:]
    return records


@dataclass
class _Outcome:
    """How one launch ended: a note for the record, or why it never started."""

    note: str | None = None
    startup: str | None = None


def _watch(launch: _Launch, proc: subprocess.Popen, opts: LaunchOptions,
           on_result: ResultCallback) -> _Outcome:
    """Follow one launch until its tasks are done or it must be ended."""
    t0 = last = said = time.monotonic()
    while launch.done < len(launch.tasks):
        exited = proc.poll() is not None
        for backend, res in launch.poll_results():
            on_result(backend, res)
            last = time.monotonic()
        if launch.done >= len(launch.tasks):
            break
        now = time.monotonic()
        if not launch.started:
            if exited:
                return _Outcome(startup=launch.startup_cause(f"torchrun exited with code {proc.returncode}"))
            if now - t0 > opts.startup_timeout:
                kill_tree(proc)
                launch.poll_results()
                return _Outcome(startup=launch.startup_cause(
                    f"not every rank was ready within the start-up timeout of {opts.startup_timeout:g}s"))
        elif exited:
            rank, why = torchrun_failure(launch.log_dir)
            # only a rank killed by a signal is a culprit; exit code 1 is usually a peer
            # whose collective broke because of someone else
            culprit = rank if "died" in why else None
            on_result(*launch.lost("error", f"launch exited with code {proc.returncode}: {why}", culprit,
                                   now - last))
            return _Outcome(f"launch ended early: {why}")
        else:
            failed_at = launch.first_error_report()
            if failed_at is not None and time.time() - failed_at > opts.peer_grace:
                kill_tree(proc)  # SIGTERM first: every rank dumps its stacks into its log
                if _drained(launch, on_result):
                    return _Outcome("ended after a rank failed; the cell's verdict arrived meanwhile")
                on_result(*launch.lost("error", f"peers did not finish within {opts.peer_grace:g}s of a rank's "
                                       "failure (stuck in a collective); launch ended", None, now - last))
                return _Outcome("ended after a rank failed and its peers hung")
            if now - last > opts.cell_timeout + (opts.startup_timeout if last == t0 else 0.0):
                kill_tree(proc)
                if _drained(launch, on_result):
                    return _Outcome("ended at the cell timeout; the cell's verdict arrived meanwhile")
                on_result(*launch.lost("timeout", f"no result within the per-cell timeout of "
                                       f"{opts.cell_timeout:g}s; launch ended", None, now - last))
                return _Outcome("ended after a cell timed out")
        if opts.on_wait is not None and now - max(last, said) >= opts.wait_interval:
            said = now
            if not launch.started:
                opts.on_wait(f"launch {launch.name}: starting {launch.world_size} rank(s) "
                             f"({len(launch.ready)} ready after {now - t0:.0f} s)")
            else:
                opts.on_wait(f"launch {launch.name}: {launch.tasks[launch.done].cell.id} running for "
                             f"{now - last:.0f} s (cell timeout {opts.cell_timeout:g} s)")
        time.sleep(0.05)
    # Every verdict is on disk: let the ranks tear down briefly, then end the tree.
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return _Outcome("all cells done; the launch was ended by the harness after 2 s of teardown")
    return _Outcome()


def _drained(launch: _Launch, on_result: ResultCallback) -> bool:
    """After ending a launch: True when the cell in flight got its verdict after all (rank 0
    appended it between the last poll and the kill), so it is not recorded as lost."""
    before = launch.done
    for backend, res in launch.poll_results():
        on_result(backend, res)
    return launch.done > before
