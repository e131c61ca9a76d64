"""Launching the worker under torchrun: few launches (sub-group packing), never a hang.

Each launch runs in its own process session so that a timeout or an interrupt can end the
whole tree (torchrun and every rank) with one ``killpg``; each launch binds a free loopback
port for its rendezvous (``harness.rank.agent``), so parallel launches (pytest-xdist) cannot
collide and nothing listens beyond loopback.

The launcher watches three things while a launch runs: the run's result stream (verdicts:
progress), each rank's own reports in ``ranks/`` (``ready``, a start-up error, a rank's result
of each run of a cell - a rank that failed while its peers may be stuck in a collective),
and the process itself (a dead rank ends torchrun). When a launch stops making progress - a
peer stuck after a failure, a cell past its bound, a dead rank - the launcher ends the tree
(SIGTERM first: each rank's faulthandler writes its stacks into its log), appends the cell in
flight to the result stream with every rank's evidence (read from the logs, reports and
phase boards by ``harness.launcher.forensics``; whose failure it was is folded by
``harness.records.fold.decisive``), and starts a fresh launch for the cells left.

How long a cell may go without progress is bounded by what it costs
(``harness.vocabulary.cost.hang_bound``), unless the user gave ``--cell-timeout``. How long a
failed rank's peers may take to report is measured on the launch itself (``peer_grace``: a
multiple of the longest cell it ran, or of the failed rank's own time in the cell). A rank
seen using the CPU (``/proc``, where there is one) is working, not hung: that is progress too,
up to ``HANG_CAP_FACTOR`` times the bound. A launch of W ranks runs its cells on lanes
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
from typing import Callable, Iterable

from harness.vocabulary.errors import LaunchFailure
from harness.launcher import forensics, served, warm
from harness.vocabulary import cost, packing
from harness.vocabulary.plan import agent_command
from harness.vocabulary.matrix import Cell
from harness.vocabulary.shape import DRAWN_MAX, Example
from harness.vocabulary.plan import Lane
from harness.vocabulary.plan import LaunchPlan, PlanTask
from harness.records.record import CellResult, LaunchRecord, RankResult
from harness.records.stream import LineTail, ResultStream
from harness.records.fold import cell_status, failed, merge, repro_command

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


#: ``--cell-timeout``'s help (``sweep``, ``repro``, ``selftest`` and the pytest plugin)
CELL_TIMEOUT_HELP = ("seconds a cell may go without progress before its launch is ended (default: each "
                     "cell's bound from its predicted cost, 5 s and up: docs/runner-faults.md)")

#: the shortest timeout of the ranks' collectives: a rank's process groups are built while its
#: peers may still be importing the backends (``harness.rank.worker``), which takes seconds
MIN_COLLECTIVE_TIMEOUT_S = 90.0
#: how long the launcher waits for torchrun to exit once it saw a rank's process end: torchrun
#: reaps it, ends the others (waiting up to 30 s for one that ignores SIGTERM) and says how
#: the first one ended
DEATH_WAIT_S = 45.0
#: a failed rank's peers get this many times the longest cell the launch measured (or the
#: failed rank's own time in its cell, if longer) to report, once none of them uses the CPU ...
PEER_GRACE_FACTOR = 4.0
#: ... and never less than this: two of the launcher's CPU samples (once a second), so that a
#: peer still working is seen working before it is taken for one stuck in a collective
PEER_GRACE_FLOOR_S = 2.0


@dataclass
class LaunchOptions:
    backend: str
    run_dir: Path
    #: seconds one run of a cell may take without progress (the user's ``--cell-timeout``);
    #: None: each cell's own bound from its predicted cost (``cost.hang_bound``)
    cell_timeout: float | None = None
    startup_timeout: float = 120.0
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


def cell_bound(opts: LaunchOptions, cell: Cell, examples: int = 0) -> float:
    """Seconds one run of ``cell`` may go without progress before it has hung: the user's
    ``--cell-timeout``, else the cell's own bound from its predicted cost at the shapes it
    runs: the example the options name, else with ``examples`` drawn ones the largest drawable."""
    if opts.cell_timeout is not None:
        return opts.cell_timeout
    example = (Example.from_dict(opts.example) if opts.example else DRAWN_MAX if examples else None)
    return cost.hang_bound(cell, example, sees_cpu=SEES_CPU)


# ---- the ranks' processes as /proc shows them (Linux; elsewhere nothing is known of them)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 100


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (which may hold spaces), the
    state first; None where there is no ``/proc`` or no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


#: the launcher can read its ranks' CPU time here (a working rank is progress: ``cost.BUSY_SHARE``)
SEES_CPU = Path("/proc/self/stat").exists()


def cpu_sample(pid: int) -> tuple[str, float] | None:
    """A process's state letter (``R`` runnable, ``D`` waiting on a disk, ``S`` asleep, ...)
    and its CPU time, user and system, from one read of ``/proc`` (None: none, or it is gone)."""
    fields = _proc_stat(pid)
    return None if fields is None else (fields[0], (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)


#: states in which a process waits on the machine, not on a peer: runnable (its turn on a
#: loaded CPU) and uninterruptible sleep (a disk: a verdict's fsync, an import's pages read
#: back). A rank stuck in a collective or asleep is ``S``.
WAITING_ON_MACHINE = ("R", "D")


def seen_working(state: str, used: float, elapsed: float) -> bool:
    """Whether a rank sampled in ``state`` that used ``used`` CPU-seconds over the last
    ``elapsed`` seconds is working: more than ``cost.BUSY_SHARE`` of a core, or waiting on the
    machine right now (``WAITING_ON_MACHINE``)."""
    return state in WAITING_ON_MACHINE or used > cost.BUSY_SHARE * elapsed


def process_end(pid: int) -> str | None:
    """How the process ended, if it has: ``"signal N"`` or ``"exit N"`` while it is a zombie
    (its parent, torchrun's agent, has not reaped it yet), ``"gone"`` once reaped; None while it
    runs, or where there is no ``/proc`` to tell."""
    if not SEES_CPU:
        return None
    fields = _proc_stat(pid)
    if fields is None:
        return "gone"
    if fields[0] not in ("Z", "X"):
        return None
    status = int(fields[49]) if len(fields) > 49 else 0  # field 52, exit_code: waitpid's form
    return f"signal {status & 0x7F}" if status & 0x7F else f"exit {status >> 8}"



def torchrun_args(world_size: int, plan_path: Path) -> list[str]:
    """torchrun's options and script for one launch (the rendezvous is ``harness.rank.agent``'s)."""
    return ["--monitor-interval", "0.1", "--nproc-per-node", str(world_size),
            "-m", "harness.rank.worker", "--plan", str(plan_path)]


def torchrun_command(world_size: int, plan_path: Path) -> list[str]:
    """torchrun on this machine, every listening socket on loopback (``harness.rank.agent``)."""
    return agent_command(*torchrun_args(world_size, plan_path))


#: the longest a launch's ranks are given to write their stack dumps (``_dump_stacks``) and then
#: to end after the SIGTERM that ends the launch (``kill_tree``): each wait ends as soon as they
#: have, so this is paid only by a rank that does neither (one the machine's load keeps from
#: running; a gate's load on the 2-core machine reaches 13)
KILL_GRACE_S = 10.0


def kill_tree(proc: subprocess.Popen, grace: float = KILL_GRACE_S, ranks: Iterable[int] = ()) -> None:
    """End torchrun and every rank: the ``ranks`` (their process ids) write their stacks into
    their logs first (``_dump_stacks``), then SIGTERM the process group, and once torchrun and
    the ranks have ended, or ``grace`` is over, SIGKILL whatever is left (a SIGKILL right after
    torchrun's exit cut a loaded rank's stack dump short, and with it the evidence of where it
    hung)."""
    ranks = list(ranks)
    deadline = time.monotonic() + grace
    _dump_stacks(ranks, deadline)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    while time.monotonic() < deadline and (proc.poll() is None or any(process_end(p) is None for p in ranks)):
        time.sleep(0.02)
    # ranks may outlive torchrun by a moment; make sure the group is empty
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        pass


def _dump_stacks(ranks: list[int], deadline: float) -> None:
    """Have each rank write its stacks into its log (SIGUSR1: ``harness.rank.worker``'s
    faulthandler) and wait until every one has, or ``deadline``.

    Why before the SIGTERM, whose handler dumps the stacks too: that handler passes the signal
    on (the rank must end), and lets a second SIGTERM in while it writes - which torchrun's
    agent sends its ranks as it ends on the first - so the rank ended in the middle of its dump,
    sometimes after its first line, and with it went where it hung. SIGUSR1's handler is the
    dump alone, and the kernel holds the signal blocked in the thread running it: a rank is
    done once no thread has SIGUSR1 pending or newly blocked (``/proc``; without it, this waits
    for nothing)."""
    before = {pid: _sigusr1_threads(pid) for pid in ranks}
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            before.pop(pid, None)
    while time.monotonic() < deadline:
        busy = [pid for pid, blocked in before.items() if _sigusr1_threads(pid, pending=True) - blocked]
        if not busy:
            return
        time.sleep(0.005)


#: SIGUSR1's bit in ``/proc``'s signal masks
_SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


def _sigusr1_threads(pid: int, pending: bool = False) -> set[str]:
    """The threads of ``pid`` that block SIGUSR1 (with ``pending``: or have it pending, the
    process too, as ``"process"``); empty once the process is gone or without ``/proc``."""
    found: set[str] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        masks = ["SigBlk", *(("SigPnd", "ShdPnd") if pending else ())]
        for name in masks:
            if int(fields.get(name, "0").strip() or "0", 16) & _SIGUSR1_BIT:
                found.add("process" if name == "ShdPnd" else tid)
    return found


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
        #: when each rank last made progress: said it was ready, reported a run of its lane's
        #: cell, or saw one of its lanes' verdicts (its next cell started then)
        self.rank_last = [self.t0] * width
        #: each rank's process (from its ``ready`` report) and its last CPU sample (when, seconds)
        self.pids: dict[int, int] = {}
        self._cpu: dict[int, tuple[float, float]] = {}
        #: when each rank was last seen working (using more than ``cost.BUSY_SHARE`` of a core)
        self.busy_at = [self.t0] * width
        self._sampled = self.t0
        #: ranks whose process was seen ended before torchrun exited: when, and how (``process_end``)
        self.ended_at: dict[int, tuple[float, str]] = {}
        #: the longest a cell of this launch took, from its start to its verdict, as measured here
        self.longest_cell = 0.0

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

    def starting(self, ls: _LaneState) -> bool:
        """Whether a rank of the lane has not said it is ready yet: the launch may have
        started (other lanes' ranks run cells) while this one still imports its backend, its
        process unknown to the CPU samples (its pid comes with ``ready``), so its cell's
        clock has not started (on a loaded machine a rank's first imports took longer than a
        cell's bound while its peers had run cells)."""
        return not set(ls.lane.ranks) <= self.ready

    def since(self, ls: _LaneState) -> float:
        """When the lane last made progress (as the launcher can tell): its ranks were all
        ready, its last verdict arrived, or a rank reported a run of the cell in flight."""
        return max(self.rank_last[r] for r in ls.lane.ranks)

    def ended(self, ls: _LaneState, now: float) -> int | None:
        """The lane rank whose process ended first while torchrun has not exited yet (torchrun
        reaps its ranks, then exits naming how the first one ended - under load, seconds
        later): the first seen ended, among those seen at once one a signal killed; None while
        every one lives (``ended_at``: when each was seen ended, and how)."""
        for r in ls.lane.ranks:
            if r in self.pids and r not in self.ended_at and (how := process_end(self.pids[r])) is not None:
                self.ended_at[r] = (now, how)
        seen = [r for r in ls.lane.ranks if r in self.ended_at]
        return min(seen, key=lambda r: (self.ended_at[r][0], not self.ended_at[r][1].startswith("signal")),
                   default=None)

    def progress(self, ls: _LaneState) -> float:
        """When the lane last made progress or one of its ranks was last seen working."""
        return max(self.since(ls), *(self.busy_at[r] for r in ls.lane.ranks))

    def sample_cpu(self, now: float, every: float = 1.0) -> None:
        """Every ``every`` seconds, note which ranks are working (``seen_working``: more than
        ``cost.BUSY_SHARE`` of a core since the last sample, or waiting on the CPU or a disk
        now) in ``busy_at``."""
        if now - self._sampled < every:
            return
        self._sampled = now
        for r, pid in self.pids.items():
            seen = cpu_sample(pid)
            if seen is None:
                continue
            state, used = seen
            last = self._cpu.get(r)
            if last is not None and seen_working(state, used - last[1], now - last[0]):
                self.busy_at[r] = now
            self._cpu[r] = (now, used)

    def bound(self, ls: _LaneState) -> float:
        """How long the lane's cell in flight may go without progress (``cell_bound``)."""
        return cell_bound(self.opts, self.tasks[ls.current].cell, self.examples(ls.current))

    def examples(self, i: int) -> int:
        """The hypothesis-drawn examples task ``i`` runs."""
        task = self.tasks[i]
        return self.opts.examples if task.examples is None else task.examples

    def start(self) -> subprocess.Popen:
        run_dir = self.opts.run_dir
        for sub in ("plans", "ranks"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        plan = LaunchPlan(
            run_dir, self.name,
            [PlanTask(t.backend, t.cell.id, self.examples(i)) for i, t in enumerate(self.tasks)],
            [ls.lane for ls in self.lanes], exit_when_done=True,
            device=self.opts.device, threads_per_rank=self.opts.threads_per_rank,
            example=self.opts.example, examples=self.opts.examples,
            collective_timeout=self.collective_timeout())
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

    def collective_timeout(self) -> float:
        """How long the ranks' collectives wait for a peer: three quarters of the longest bound
        of the launch's cells, so that with a long ``--cell-timeout`` the peers of a hung rank
        report their broken collective (a failure by a peer) before the launch is ended, and
        never less than ``MIN_COLLECTIVE_TIMEOUT_S``: the launcher, which knows each cell's
        bound, ends a hung launch; a collective's own timeout is the last resort."""
        longest = max(cell_bound(self.opts, t.cell, self.examples(i)) for i, t in enumerate(self.tasks))
        return max(MIN_COLLECTIVE_TIMEOUT_S, 0.75 * longest)

    def poll_results(self) -> list[tuple[str, CellResult]]:
        """New verdicts of this launch's tasks (with their backend), each lane in task order;
        fresh per-rank reports and start-up events."""
        now = time.monotonic()
        for r, tail in enumerate(self.rank_tails):
            for rep in tail.read():
                event = rep.get("event")
                if event == "ready":
                    self.ready.add(r)
                    self.rank_last[r] = now
                    if isinstance(rep.get("pid"), int):
                        self.pids[r] = rep["pid"]
                elif event == "startup_error":
                    self.startup_errors[r] = rep
                elif event == "result":
                    rep["seen"] = now  # the launcher's clock, not the rank's
                    self.reports.setdefault(rep["i"], {})[r] = rep
                    self.rank_last[r] = now  # one run of its cell (an example) is done
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
        now = time.monotonic()
        self.longest_cell = max(self.longest_cell, now - self.since(ls))
        self.done.add(ls.current)
        ls.done += 1
        for r in ls.lane.ranks:
            self.rank_last[r] = now

    def first_error_report(self, ls: _LaneState) -> float | None:
        """When the launcher saw a rank's first report of a failure for the lane's task in
        flight (None: none did)."""
        times = [rep["seen"] for rep in self.reports.get(ls.current, {}).values()
                 if rep["result"]["status"] in forensics.FAILED]
        return min(times) if times else None

    def peer_grace(self, ls: _LaneState, failed_at: float) -> float:
        """How long the peers of a rank that failed the lane's cell at ``failed_at`` may go
        without reporting and without using the CPU before they are taken for stuck in a
        collective: ``PEER_GRACE_FACTOR`` times what this launch measured - the longest cell it
        ran, or the failed rank's own time in this one, whichever is longer (a loaded machine,
        a first cell's imports: both make it longer) - at least ``PEER_GRACE_FLOOR_S`` and at
        most the cell's bound."""
        measured = max(self.longest_cell, failed_at - self.since(ls))
        return min(self.bound(ls), max(PEER_GRACE_FLOOR_S, PEER_GRACE_FACTOR * measured))

    def quiet_since(self, ls: _LaneState, failed_at: float) -> float:
        """Since when the lane's ranks that have not reported its cell in flight have been idle
        (not using the CPU), counted from ``failed_at`` at the earliest."""
        reported = self.reports.get(ls.current, {})
        return max([failed_at, *(self.busy_at[r] for r in ls.lane.ranks if r not in reported)])

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
            if self.examples(i) or any(g not in reps or reps[g]["result"]["status"] in forensics.FAILED
                                       for g in ls.lane.ranks):
                break
            res = merge(task.cell, [RankResult.from_dict(reps[g]["result"]) for g in ls.lane.ranks],
                        time.monotonic() - self.since(ls), task.backend, self.opts.example)
            self._advance(ls)
            self.stream.append(res, task.backend, self.name)
            out.append((task.backend, res))
        return out

    def lost(self, ls: _LaneState, why: str, culprit: int | None = None) -> list[tuple[str, CellResult]]:
        """The verdict of the lane's task in flight from what each of its ranks reported or
        left behind (after ``settle``: a cell every rank finished is not lost), appended to the
        result stream at once (the launcher is one of its writers).

        ``why`` says how the launch ended; ``culprit`` is the launch rank whose process ended
        first (torchrun named it, or the launcher saw it end), None when the launcher ended
        the launch itself (a failed rank's peers did not report, or no progress within the
        cell's bound). A rank that reported keeps its report; a silent one is judged by what
        happened to it (``forensics.silent_rank``), and ``harness.records.fold`` decides whose
        failure the cell's is."""
        settled = self.settle(ls)
        if ls.finished:
            return settled
        i = ls.current
        task = self.tasks[i]
        cell = task.cell
        members = ls.lane.ranks
        reported = {members.index(g): rep for g, rep in self.reports.get(i, {}).items() if g in members}
        results = {r: RankResult.from_dict(rep["result"]) for r, rep in reported.items()}
        named = members.index(culprit) if culprit in members else None
        if named in results and not (failed(results[named]) and not results[named].by_peer):
            named = None  # it had reported no failure of its own: a collective broke under it later
        # a rank failed on its own (its report says so, or torchrun saw it go first): the
        # silent others were ended because of it
        after_peer = named is not None or any(failed(x) and not x.by_peer for x in results.values())
        silent = {r: forensics.SilentRank(self.log_dir, g, i, len(self.tasks),
                                          self.opts.run_dir / "ranks" / f"{self.name}.rank{g}.phase")
                  for r, g in enumerate(members) if r not in results}
        in_backend = {r for r, w in silent.items() if forensics.hung_in_backend(w)}
        seen_hung = {r for r, w in silent.items() if forensics.seen_hung_in_backend(w)}
        for r, w in silent.items():
            results[r] = forensics.silent_rank(r, w, why, named=r == named, after_peer=after_peer and r != named,
                                               peer_in_backend=bool(in_backend - {r}),
                                               peer_seen_hung=bool(seen_hung - {r}))
        ranks = [results[r] for r in range(len(members))]
        first_rank = forensics.first_to_fail(reported, ranks, named)
        first = why
        where = "" if len(members) == self.world_size else f", launch rank {members[first_rank if first_rank is not None else 0]}"
        if first_rank is not None:
            rr = ranks[first_rank]
            if first_rank in reported and rr.error:
                first = (f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} "
                         f"(first rank to fail{where}; {why})")
            elif rr.error:
                first = f"[rank {first_rank}] {rr.error['type']}: {rr.error['message']} (first rank to fail{where})"
        duration = time.monotonic() - self.since(ls)
        self._advance(ls)
        res = CellResult(cell.id, cell.serialize(), cell.expect, cell_status(ranks), round(duration, 3), None,
                         first, repro_command(cell.id, task.backend), ranks, self.opts.example)
        self.stream.append(res, task.backend, self.name)
        return [*settled, (task.backend, res)]

    def end(self, proc: subprocess.Popen) -> None:
        """End the launch's whole tree, its ranks' stack dumps written first (``kill_tree``)."""
        kill_tree(proc, ranks=self.pids.values())

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
            launch.end(proc)
            launch.close()
        note = outcome.note if outcome.startup is None else f"could not start: {outcome.startup}"
        records.append(LaunchRecord(width, (t.cell.id for t in remaining), proc.returncode,
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
            # a rank that was ready may have failed in its first cell while a peer still built
            # its lanes' groups: that launch did start, and its cell failed
            if exited and forensics.torchrun_failure(launch.log_dir)[0] not in launch.ready:
                return _Outcome(startup=launch.startup_cause(f"torchrun exited with code {proc.returncode}"))
            if now - t0 > opts.startup_timeout:
                launch.end(proc)
                launch.poll_results()
                return _Outcome(startup=launch.startup_cause(
                    f"not every rank was ready within the start-up timeout of {opts.startup_timeout:g}s"))
        if exited and (launch.started or launch.ready):
            for backend, res in launch.poll_results():  # verdicts appended just before the end
                on_result(backend, res)
            # the rank torchrun saw fail first (a forked rank that fails exits 0.5 s late, so
            # that a peer whose collective then broke is not named instead: harness.rank.worker)
            rank, why = forensics.torchrun_failure(launch.log_dir)
            active = launch.active()
            blamed = [ls for ls in active if rank in ls.lane.ranks] or active
            for ls in blamed:
                for backend, res in launch.lost(ls, f"launch exited with code {proc.returncode}: {why}", rank):
                    on_result(backend, res)
            return _Outcome(f"launch ended early: {why}")
        if launch.started:
            ended = _judge_lanes(launch, proc, opts, on_result, now)
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
                             f"{now - launch.since(ls):.0f} s (its bound {launch.bound(ls):.0f} s)")
        time.sleep(0.05)
    # Every verdict is on disk and the ranks exit at once (``exit_when_done``): torchrun
    # needs a moment to notice; then the tree is ended anyway.
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return _Outcome("all cells done; the launch was ended by the harness after 2 s of teardown")
    return _Outcome()


def _judge_lanes(launch: _Launch, proc: subprocess.Popen, opts: LaunchOptions, on_result: ResultCallback,
                 now: float) -> _Outcome | None:
    """Once the launch has started: each lane running a cell is judged by its cell's bound
    (``_lane_failed``); a lane whose ranks are not all ready yet has no cell running, and the
    start-up timeout bounds it. None while every lane is fine."""
    launch.sample_cpu(now)
    for ls in launch.active():
        if not launch.starting(ls):
            ended = _lane_failed(launch, ls, proc, opts, on_result, now)
            if ended is not None:
                return ended
        elif now - launch.t0 > opts.startup_timeout:
            launch.end(proc)
            if _drained(launch, ls, on_result):  # other lanes' verdicts that arrived meanwhile are kept
                return _Outcome("ended at the start-up timeout; the cell's verdict arrived meanwhile")
            late = sorted(set(ls.lane.ranks) - launch.ready)
            for backend, res in launch.lost(ls, f"rank(s) {late} not ready within the start-up timeout "
                                            f"of {opts.startup_timeout:g}s; launch ended"):
                on_result(backend, res)
            return _Outcome(f"ended after rank(s) {late} did not start")
    return None


def _lane_failed(launch: _Launch, ls: _LaneState, proc: subprocess.Popen, opts: LaunchOptions,
                 on_result: ResultCallback, now: float) -> _Outcome | None:
    """End the launch when the lane's cell in flight failed on a rank whose peers did not
    report within their grace (``_Launch.peer_grace``), or made no progress within its bound;
    None while it is fine."""
    bound = launch.bound(ls)
    dead = launch.ended(ls, now)
    if dead is not None:
        # torchrun will exit and say how the rank ended (``_watch`` then blames it); if it does
        # not in time, the rank is blamed with what the launcher saw itself
        seen, how = launch.ended_at[dead]
        if now - seen < DEATH_WAIT_S:
            return None
        launch.end(proc)
        died = f"rank {dead} died: {how}" if how.startswith("signal") else f"rank {dead}'s process ended ({how})"
        for backend, res in launch.lost(ls, f"{died} without a result; torchrun did not exit within "
                                        f"{DEATH_WAIT_S:g}s; launch ended", dead):
            on_result(backend, res)
        return _Outcome(f"ended after rank {dead}'s process ended")
    failed_at = launch.first_error_report(ls)
    cap = cost.HANG_CAP_FACTOR * bound
    if failed_at is not None:
        grace = launch.peer_grace(ls, failed_at)
        if now - launch.quiet_since(ls, failed_at) > grace or now - failed_at > cap:
            launch.end(proc)  # SIGTERM first: every rank dumps its stacks into its log
            if _drained(launch, ls, on_result):
                return _Outcome("ended after a rank failed; the cell's verdict arrived meanwhile")
            for backend, res in launch.lost(ls, f"peers did not report within {grace:.1f}s of a rank's failure, "
                                            "idle (stuck in a collective); launch ended"):
                on_result(backend, res)
            return _Outcome("ended after a rank failed and its peers hung")
    if opts.cell_timeout is not None:
        why = f"no progress within --cell-timeout {bound:g}s" if now - launch.since(ls) > bound else None
    elif now - launch.progress(ls) > bound:
        why = f"no progress within the cell's bound of {bound:.0f}s (from its predicted cost)"
    elif now - launch.since(ls) > cap:  # working ranks get time, up to the cap: past it one spins
        why = f"no result within {cap:.0f}s, {cost.HANG_CAP_FACTOR:g} times the cell's bound, its ranks still busy"
    else:
        why = None
    if why is not None:
        launch.end(proc)
        if _drained(launch, ls, on_result):
            return _Outcome("ended at the cell's bound; the cell's verdict arrived meanwhile")
        for backend, res in launch.lost(ls, f"{why}; launch ended"):
            on_result(backend, res)
        return _Outcome("ended after a cell hung")
    return None


def _drained(launch: _Launch, ls: _LaneState, on_result: ResultCallback) -> bool:
    """After ending a launch: True when the lane's cell in flight got its verdict after all
    (its first rank appended it between the last poll and the kill), so it is not recorded
    as lost. Verdicts of other lanes that arrived meanwhile are kept too."""
    before = ls.done
    for backend, res in launch.poll_results():
        on_result(backend, res)
    return ls.done > before
