"""Launching the worker under torchrun: few launches (sub-group packing), never a hang.

Each launch runs in its own process session so that a timeout or an interrupt can end the
whole tree (torchrun and every rank) with one ``killpg``; each launch binds a free loopback
port for its rendezvous (``harness.rank.agent``), so parallel launches (pytest-xdist) cannot
collide and nothing listens beyond loopback.

The launcher watches three things while a launch runs: the run's result stream (verdicts:
progress), each rank's own reports in ``ranks/`` (``ready``, a start-up error, a rank that
failed while its peers may be stuck in a collective), and the process itself (a dead rank
ends torchrun). When a launch stops making progress - a peer stuck after a failure, a cell
past its timeout, a dead rank - the launcher ends the tree (SIGTERM first: each rank's
faulthandler writes its stacks into its log), appends the cell in flight to the result
stream with every rank's evidence (read from the logs and reports by ``harness.launcher.forensics``),
and starts a fresh launch for the cells left. A launch of W ranks runs its cells on lanes
(``harness.vocabulary.packing``: disjoint sub-groups, one cell in flight each); all of this is tracked
per lane, so a fault is blamed on its lane's cell and the other lanes' verdicts stand.

A launch that ends before every rank is ready ran no cell: it is a launch failure, retried
once (``LaunchOptions.start_attempts``); then ``LaunchFailure`` ends the run, naming the first
failing rank's error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.vocabulary.errors import LaunchFailure
from harness.launcher import forensics, served, warm
from harness.vocabulary import packing
from harness.vocabulary.plan import agent_command
from harness.vocabulary.matrix import Cell
from harness.vocabulary.plan import Lane
from harness.vocabulary.plan import LaunchPlan, PlanTask
from harness.records.record import CellResult, LaunchRecord, RankResult
from harness.records.stream import LineTail, ResultStream
from harness.records.fold import cell_status, merge, repro_command

ResultCallback = Callable[[str, CellResult], None]


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


def torchrun_args(world_size: int, plan_path: Path) -> list[str]:
    """torchrun's options and script for one launch (the rendezvous is ``harness.rank.agent``'s)."""
    return ["--monitor-interval", "0.1", "--nproc-per-node", str(world_size),
            "-m", "harness.rank.worker", "--plan", str(plan_path)]


def torchrun_command(world_size: int, plan_path: Path) -> list[str]:
    """torchrun on this machine, every listening socket on loopback (``harness.rank.agent``)."""
    return agent_command(*torchrun_args(world_size, plan_path))


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


@dataclass
class _LaneState:
    """A lane of a launch (``harness.vocabulary.packing``) and how far it got."""

    lane: Lane
    done: int = 0

    @property
    def finished(self) -> bool:
        return self.done >= len(self.lane.tasks)

    @property
    def current(self) -> int:
        """The launch's index of the task in flight."""
        return self.lane.tasks[self.done]


class _Launch:
    """One torchrun launch of ``width`` ranks, its lanes, and what is known about the
    tasks in flight (one per lane)."""

    def __init__(self, width: int, tasks: list[Task], opts: LaunchOptions, name: str, lanes: list[Lane]) -> None:
        self.world_size = width
        self.tasks = tasks
        self.opts = opts
        self.name = name
        self.lanes = [_LaneState(lane) for lane in lanes]
        self.log_dir = opts.run_dir / "logs" / name
        self.done: set[int] = set()                      # task indices with a verdict in the stream
        self.reports: dict[int, dict[int, dict]] = {}   # task index -> global rank -> own report
        self.ready: set[int] = set()                     # ranks able to run cells
        self.startup_errors: dict[int, dict] = {}       # rank -> its startup_error report
        self.stream = ResultStream(opts.run_dir)
        self.offset = self.stream.size()
        self.rank_tails = [LineTail(opts.run_dir / "ranks" / f"{name}.rank{r}.jsonl")
                           for r in range(width)]
        self.t0 = time.monotonic()
        #: when each rank last saw one of its lanes' verdicts (its next cell started then)
        self.rank_last = [self.t0] * width

    @property
    def started(self) -> bool:
        """Every rank got as far as running cells (or a cell already has a verdict)."""
        return len(self.ready) == self.world_size or bool(self.done)

    @property
    def finished(self) -> bool:
        return all(ls.finished for ls in self.lanes)

    def active(self) -> list[_LaneState]:
        """Lanes running a cell now: unfinished, and every earlier lane sharing a rank finished."""
        out = []
        for j, ls in enumerate(self.lanes):
            if not ls.finished and all(p.finished for p in self.lanes[:j] if set(p.lane.ranks) & set(ls.lane.ranks)):
                out.append(ls)
        return out

    def since(self, ls: _LaneState) -> float:
        """When the lane's cell in flight started (as the launcher can tell)."""
        return max(self.rank_last[r] for r in ls.lane.ranks)

    def start(self) -> subprocess.Popen:
        run_dir = self.opts.run_dir
        for sub in ("plans", "ranks"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        plan = LaunchPlan(
            run_dir, self.name,
            [PlanTask(t.backend, t.cell.id, self.opts.examples if t.examples is None else t.examples)
             for t in self.tasks],
            [ls.lane for ls in self.lanes], exit_when_done=True,
            device=self.opts.device, threads_per_rank=self.opts.threads_per_rank,
            example=self.opts.example, examples=self.opts.examples,
            # shorter than the cell timeout, so a peer of a hung rank reports a
            # communication error (and is seen as a victim) before the launch is ended
            collective_timeout=max(5.0, 0.75 * self.opts.cell_timeout))
        plan_path = run_dir / "plans" / f"{self.name}.json"
        plan.write(plan_path)
        env = warm.agent_env(self.opts.threads_per_rank, self.opts.extra_env)
        self._log = open(self.log_dir / "torchrun.log", "w")
        # the backend probe's warm agent, if it preloaded what these ranks need (harness.launcher.warm)
        taken = warm.take({t.backend for t in self.tasks}, torchrun_args(self.world_size, plan_path), env,
                          self.log_dir / "torchrun.log")
        if taken is not None:
            return taken
        return served.start_agent(torchrun_args(self.world_size, plan_path), stdout=self._log,
                                  stderr=served.STDOUT, stdin=served.DEVNULL, env=env)

    def poll_results(self) -> list[tuple[str, CellResult]]:
        """New verdicts of this launch's tasks (with their backend), each lane in task order;
        fresh per-rank reports and start-up events."""
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
            if v.launch != self.name:
                continue
            ls = next((ls for ls in self.lanes if not ls.finished and self.tasks[ls.current].key == v.key), None)
            if ls is not None:
                out.append((v.backend, v.result))
                self._advance(ls)
        return out

    def _advance(self, ls: _LaneState) -> None:
        self.done.add(ls.current)
        ls.done += 1
        now = time.monotonic()
        for r in ls.lane.ranks:
            self.rank_last[r] = now

    def first_error_report(self, ls: _LaneState) -> float | None:
        """When a rank first reported a failure for the lane's task in flight (None: none did)."""
        times = [rep["t"] for rep in self.reports.get(ls.current, {}).values()
                 if rep["result"]["status"] in forensics.FAILED]
        return min(times) if times else None

    def startup_cause(self, why: str) -> str:
        """Why the launch never started, from its ranks' reports and logs (``harness.launcher.forensics``)."""
        return forensics.startup_cause(self.startup_errors, self.log_dir, why)

    def settle(self, ls: _LaneState) -> list[tuple[str, CellResult]]:
        """Verdicts the lane's first rank never appended although every rank of the lane had
        reported a good result (the launch ended between the ranks' exchange and the
        append): the launcher merges the reports itself, so that a fault in the lane's
        *next* cell is blamed on that cell."""
        out = []
        while not ls.finished:
            i = ls.current
            task = self.tasks[i]
            reps = self.reports.get(i, {})
            examples = self.opts.examples if task.examples is None else task.examples
            if examples or any(g not in reps or reps[g]["result"]["status"] in forensics.FAILED for g in ls.lane.ranks):
                break
            res = merge(task.cell, [RankResult.from_dict(reps[g]["result"]) for g in ls.lane.ranks],
                        time.monotonic() - self.since(ls), task.backend, self.opts.example)
            self._advance(ls)
            self.stream.append(res, task.backend, self.name)
            out.append((task.backend, res))
        return out

    def lost(self, ls: _LaneState, status: str, why: str, dead_rank: int | None) -> list[tuple[str, CellResult]]:
        """The verdict of the lane's task in flight from what each of its ranks reported or
        left in its log (after ``settle``: a cell every rank finished is not lost), appended
        to the result stream at once (the launcher is one of its writers). Ranks are the
        cell's own (0 .. k-1); ``dead_rank`` is a launch rank."""
        settled = self.settle(ls)
        if ls.finished:
            return settled
        i = ls.current
        task = self.tasks[i]
        cell = task.cell
        members = ls.lane.ranks
        reported = {members.index(g): rep for g, rep in self.reports.get(i, {}).items() if g in members}
        ranks = []
        for r, g in enumerate(members):
            if r in reported:
                ranks.append(RankResult.from_dict(reported[r]["result"]))
                continue
            evidence = forensics.cell_log(self.log_dir, g, i, len(self.tasks))
            ranks.append(RankResult(r, status, [], {
                "type": {"timeout": "Timeout", "error": "NoReport"}[status],
                "message": f"this rank never reported a result ({why})", "traceback": evidence}))
        dead = members.index(dead_rank) if dead_rank in members else None
        first_rank = forensics.first_to_fail(reported, dead, len(members))
        verdict = cell_status(ranks)
        first = why
        where = "" if len(members) == self.world_size else f", launch rank {members[first_rank if first_rank is not None else 0]}"
        if first_rank is not None:
            rr = next(x for x in ranks if x.rank == first_rank)
            if first_rank in reported and rr.error:
                first = (f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} "
                         f"(first rank to fail{where}; {why})")
            elif rr.error:
                first = f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} (first rank to fail{where})"
        duration = time.monotonic() - self.since(ls)
        self._advance(ls)
        res = CellResult(cell.id, cell.serialize(), cell.expect, verdict, round(duration, 3), None,
                         first, repro_command(cell.id, task.backend), ranks, self.opts.example)
        self.stream.append(res, task.backend, self.name)
        return [*settled, (task.backend, res)]

    def close(self) -> None:
        self._log.close()


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


def launch_tasks(width: int, tasks: list[Task], opts: LaunchOptions,
                 on_result: ResultCallback = lambda backend, res: None) -> list[LaunchRecord]:
    """Run ``tasks`` in launches of ``width`` ranks until each has a verdict in the result stream.

    Every task's world size must divide ``width``: a task of world size k runs on one of the
    launch's lanes of k ranks (``harness.vocabulary.packing``), beside the other lanes. A launch that
    loses a cell (crash, hang) is replaced by a fresh one for the cells left: the verdicts
    already in the stream are kept, the cells in flight on other lanes run again. A launch
    that ends before any cell started is a launch failure: retried, and after
    ``opts.start_attempts`` such launches in a row ``LaunchFailure`` ends the run. Several
    backends can share one launch: the process groups do not depend on them.
    ``on_result`` is told of each verdict as it arrives (progress only: the stream has it).

    Raises:
        LaunchFailure: launches kept ending before any cell started.
    """
    remaining = list(tasks)
    records: list[LaunchRecord] = []
    attempt = 0
    failed_starts = 0
    while remaining:
        lanes = packing.pack([t.cell for t in remaining], width, [t.backend for t in remaining])
        launch = _Launch(width, remaining, opts, _free_launch_name(opts.run_dir, width), lanes)
        proc = launch.start()
        outcome = _Outcome()
        try:
            outcome = _watch(launch, proc, opts, on_result)
        finally:
            kill_tree(proc)
            launch.close()
        note = outcome.note if outcome.startup is None else f"could not start: {outcome.startup}"
        records.append(LaunchRecord(width, [t.cell.id for t in remaining], proc.returncode,
                                    round(time.monotonic() - launch.t0, 3),
                                    str(launch.log_dir.relative_to(opts.run_dir)), attempt, note))
        attempt += 1
        if outcome.startup is not None:
            failed_starts += 1
            if failed_starts >= opts.start_attempts:
                raise LaunchFailure(
                    f"no cell could start: {failed_starts} launch(es) of {width} rank(s) in a row ended "
                    f"before the first cell; first failing rank: {outcome.startup} "
                    f"(rank logs: {launch.log_dir})", records)
            continue
        failed_starts = 0
        remaining = [t for i, t in enumerate(remaining) if i not in launch.done]
    return records


@dataclass
class _Outcome:
    """How one launch ended: a note for the record, or why it never started."""

    note: str | None = None
    startup: str | None = None


def _watch(launch: _Launch, proc: subprocess.Popen, opts: LaunchOptions,
           on_result: ResultCallback) -> _Outcome:
    """Follow one launch until its tasks are done or it must be ended (a lane failed)."""
    t0 = said = launch.t0
    while not launch.finished:
        exited = proc.poll() is not None
        for backend, res in launch.poll_results():
            on_result(backend, res)
        if launch.finished:
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
            for backend, res in launch.poll_results():  # verdicts appended just before the end
                on_result(backend, res)
            rank, why = forensics.torchrun_failure(launch.log_dir)
            # only a rank killed by a signal is a culprit; exit code 1 is usually a peer
            # whose collective broke because of someone else
            culprit = rank if "died" in why else None
            active = launch.active()
            blamed = [ls for ls in active if rank in ls.lane.ranks] or active
            for ls in blamed:
                for backend, res in launch.lost(ls, "error", f"launch exited with code {proc.returncode}: {why}",
                                                culprit):
                    on_result(backend, res)
            return _Outcome(f"launch ended early: {why}")
        else:
            for ls in launch.active():
                ended = _lane_failed(launch, ls, proc, opts, on_result, now)
                if ended is not None:
                    return ended
        if opts.on_wait is not None and now - max(max(launch.rank_last), said) >= opts.wait_interval:
            said = now
            if not launch.started:
                opts.on_wait(f"launch {launch.name}: starting {launch.world_size} rank(s) "
                             f"({len(launch.ready)} ready after {now - t0:.0f} s)")
            else:
                ls = min(launch.active(), key=launch.since)
                opts.on_wait(f"launch {launch.name}: {launch.tasks[ls.current].cell.id} running for "
                             f"{now - launch.since(ls):.0f} s (cell timeout {opts.cell_timeout:g} s)")
        time.sleep(0.05)
    # Every verdict is on disk and the ranks exit at once (``exit_when_done``): torchrun
    # needs a moment to notice; then the tree is ended anyway.
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return _Outcome("all cells done; the launch was ended by the harness after 2 s of teardown")
    return _Outcome()


def _lane_failed(launch: _Launch, ls: _LaneState, proc: subprocess.Popen, opts: LaunchOptions,
                 on_result: ResultCallback, now: float) -> _Outcome | None:
    """End the launch when the lane's cell in flight failed on a rank whose peers did not
    finish within the grace period, or ran past the cell timeout; None while it is fine."""
    failed_at = launch.first_error_report(ls)
    since = launch.since(ls)
    if failed_at is not None and time.time() - failed_at > opts.peer_grace:
        kill_tree(proc)  # SIGTERM first: every rank dumps its stacks into its log
        if _drained(launch, ls, on_result):
            return _Outcome("ended after a rank failed; the cell's verdict arrived meanwhile")
        for backend, res in launch.lost(ls, "error", f"peers did not finish within {opts.peer_grace:g}s of a "
                                        "rank's failure (stuck in a collective); launch ended", None):
            on_result(backend, res)
        return _Outcome("ended after a rank failed and its peers hung")
    if now - since > opts.cell_timeout + (opts.startup_timeout if since == launch.t0 else 0.0):
        kill_tree(proc)
        if _drained(launch, ls, on_result):
            return _Outcome("ended at the cell timeout; the cell's verdict arrived meanwhile")
        for backend, res in launch.lost(ls, "timeout", f"no result within the per-cell timeout of "
                                        f"{opts.cell_timeout:g}s; launch ended", None):
            on_result(backend, res)
        return _Outcome("ended after a cell timed out")
    return None


def _drained(launch: _Launch, ls: _LaneState, on_result: ResultCallback) -> bool:
    """After ending a launch: True when the lane's cell in flight got its verdict after all
    (its first rank appended it between the last poll and the kill), so it is not recorded
    as lost. Verdicts of other lanes that arrived meanwhile are kept too."""
    before = ls.done
    for backend, res in launch.poll_results():
        on_result(backend, res)
    return ls.done > before
