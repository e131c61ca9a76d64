"""Why a launch ended, read from what it left behind: rank logs, torchrun's log, reports.

The launcher (``harness.launcher.launch``) decides *when* to end a launch; this module says *why* it
failed and *who* failed first, from the evidence: torchrun's failure summary (the first
failed rank and its exit code or signal), each rank's log from the start of the cell in
flight (its traceback, or the stacks faulthandler dumped on SIGTERM: a rank waiting in a
collective was waiting for a peer), the last ``SomethingError:`` line of a log, each rank's
phase board (``ranks/<launch>.rank<N>.phase``: whose code it was running), and the ranks' own
reports (``ranks/*.jsonl``), in which a peer that merely saw its collective break
("connection closed", flagged ``by_peer`` by the rank) is told apart from the rank that failed
first. Pure text work: the standard library only, no torch.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

from harness.records.fold import failed, peer_loss_text
from harness.records.record import RankResult
from harness.vocabulary.status import HARNESS_ERROR

#: rank statuses that mean "this rank failed the cell in flight"
FAILED = ("error", HARNESS_ERROR)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cell_log(log_dir: Path, rank: int, index: int, count: int, lines: int = 80) -> str:
    """A rank's log from the start of the launch's task ``index`` of ``count`` (the worker's
    ``start i/n`` line): its traceback or stack dump."""
    try:
        text = (log_dir / f"rank{rank}.log").read_text(errors="replace")
    except OSError:
        return ""
    at = text.rfind(f"start {index + 1}/{count} ")
    part = text[at:] if at >= 0 else text
    return "\n".join(part.splitlines()[-lines:])


_TORCHRUN_ROOT = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_SIGNAL = re.compile(r"Signal (\d+) \((\w+)\)")


def torchrun_failure(log_dir: Path) -> tuple[int | None, str]:
    """The first failed rank and how it ended, as torchrun's summary reports them."""
    text = log_tail(log_dir / "torchrun.log", 200)
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


def last_error_line(text: str) -> str | None:
    """The last ``SomethingError: ...`` line of a log (a traceback's verdict line)."""
    found = _ERROR_LINE.findall(text)
    return found[-1].strip() if found else None


def startup_cause(startup_errors: dict[int, dict], log_dir: Path, why: str) -> str:
    """Why a launch never started: the first rank's own start-up error (its ``startup_error``
    report), else the last error line a rank or torchrun left in its log, else ``why``."""
    if startup_errors:
        r, rep = min(startup_errors.items(), key=lambda kv: kv[1]["t"])
        err = rep["error"]
        return f"[rank {r}] {err['type']}: {err['message']}"
    rank, how = torchrun_failure(log_dir)
    logs = ([log_dir / f"rank{rank}.log"] if rank is not None else []) + [log_dir / "torchrun.log"]
    for log in logs:
        line = last_error_line(log_tail(log, 200))
        if line:
            return f"{line} ({how})" if rank is not None else line
    return f"{why} ({how})"


@dataclass(frozen=True)
class SilentRank:
    """Where to read what a rank that never reported a cell left behind."""

    log_dir: Path
    #: its launch rank
    rank: int
    #: the launch's task index of the cell, and the launch's task count
    index: int
    count: int
    #: its phase board (``harness.cell.faults.PhaseBoard``)
    board: Path


def innermost_frame(log: str) -> str | None:
    """The innermost frame of the cell's thread - the one running the worker's lanes and the
    cell's runner - in the last stack dump a rank's faulthandler wrote into ``log`` (on the
    SIGTERM that ended its launch); None without such a dump.

    A dump is written innermost frame first, and under load the SIGKILL that follows the
    SIGTERM's grace can cut it anywhere: a thread is the cell's by a frame of the runner
    (``harness/cell/runner.py``) as well as by the worker's ``_run_lane`` further out, so a dump
    cut between the two still names where the cell hung."""
    found = None
    for block in _THREAD.findall(log):
        if "in _run_lane" in block or _RUNNER.search(block):
            found = block.splitlines()[0].strip()
    return found


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):\n((?:  File .*\n?)+)", re.M)
#: the cell's runner, which runs in the cell's thread only
_RUNNER = re.compile(r"[/\\]harness[/\\]cell[/\\]runner\.py\"")
#: where torch's collectives live (``torch/distributed``; its launcher, ``elastic``, is no collective)
_COLLECTIVE = re.compile(r"[/\\]torch[/\\]distributed[/\\](?!elastic)")


def in_collective(frame: str | None) -> bool:
    """The frame is inside one of torch's collectives: the rank was waiting for its peers."""
    return frame is not None and bool(_COLLECTIVE.search(frame))


def read_board(path: Path) -> tuple[str, str] | None:
    """The owner and phase a rank's phase board last showed (None: it has none)."""
    try:
        owner, _, phase = path.read_text(errors="replace").strip("\0 \n").partition("\t")
    except OSError:
        return None
    return (owner, phase.strip()) if owner else None


def _backend_frame(where: SilentRank) -> tuple[bool, str | None]:
    """Whether the silent rank's board shows the backend's phase, and its innermost frame (None:
    no stack dump, or one cut short)."""
    board = read_board(where.board)
    if board is None or board[0] != "backend":
        return False, None
    return True, innermost_frame(cell_log(where.log_dir, where.rank, where.index, where.count, lines=2000))


def hung_in_backend(where: SilentRank) -> bool:
    """The silent rank was in the backend's code, not waiting in one of torch's collectives
    (as far as its board and its stack dump tell: without a dump, its board alone)."""
    in_backend, frame = _backend_frame(where)
    return in_backend and not in_collective(frame)


def seen_hung_in_backend(where: SilentRank) -> bool:
    """The silent rank's stack dump shows it in the backend's code, out of any collective (not
    only its board: a dump that was cut short shows nothing)."""
    in_backend, frame = _backend_frame(where)
    return in_backend and frame is not None and not in_collective(frame)


def silent_rank(rank: int, where: SilentRank, why: str, named: bool, after_peer: bool,
                peer_in_backend: bool = False, peer_seen_hung: bool = False) -> RankResult:
    """The result of cell rank ``rank``, which never reported the cell, from what happened to it.

    - ``named``: torchrun saw it fail first (it died, or exited): its own ``error``, or a
      ``harness_error`` when it exited with a code in a harness phase; by a peer when its
      last error was a collective that a peer broke.
    - ``after_peer``: another rank failed on its own first: this one was ended because of
      that (by a peer), wherever it was.
    - otherwise nobody is known to have failed, and where it was decides: waiting in a
      collective is by a peer; so is the harness's phase while another silent rank of the
      cell hung in the backend's code (``peer_in_backend``: the harness waits for the backend,
      never the other way round - this holds when a stack dump was cut short); so is the
      backend's phase with a dump cut short (no frame) while another silent rank's dump shows it
      hung in the backend's code out of any collective (``peer_seen_hung``: one rank hung, the
      others waited; under load a waiting rank's dump may not finish); anywhere else it hung,
      in the phase its board shows - a ``timeout`` in the backend's phase, a ``harness_error``
      in the harness's.
    """
    tail = cell_log(where.log_dir, where.rank, where.index, where.count)
    board = read_board(where.board)
    owner, phase = board if board is not None else ("backend", "?")
    base = {"type": "NoReport", "traceback": tail, "phase": phase}
    if named:
        line = last_error_line(tail) or ""
        if "died" not in why and line and peer_loss_text(line):
            return RankResult(rank, "error", [], {**base, "message": f"this rank's collective broke ({why})"},
                              by_peer=True)
        status = HARNESS_ERROR if "died" not in why and owner == "harness" else "error"
        return RankResult(rank, status, [], {**base, "message": f"this rank never reported a result ({why})"})
    if after_peer:
        return RankResult(rank, "error", [], {**base, "message": f"this rank never reported a result: it was ended "
                                                                 f"after a peer failed ({why})"}, by_peer=True)
    frame = innermost_frame(cell_log(where.log_dir, where.rank, where.index, where.count, lines=2000))
    if in_collective(frame):
        return RankResult(rank, "timeout", [], {**base, "message": f"this rank was waiting for its peers in a "
                                                                   f"collective ({why})"}, by_peer=True)
    if owner == "harness" and peer_in_backend:
        return RankResult(rank, "timeout", [], {**base, "message": f"this rank waited in the harness's {phase} "
                                                                   f"phase for a peer hung in the backend's code "
                                                                   f"({why})"}, by_peer=True)
    if owner == "backend" and frame is None and peer_seen_hung:
        return RankResult(rank, "timeout", [], {**base, "message": f"this rank's stack showed no frame while a peer "
                                                                   f"was seen hung in the backend's code ({why})"},
                          by_peer=True)
    at = f", at {frame.removeprefix('File ')}" if frame else ""
    status = HARNESS_ERROR if owner == "harness" else "timeout"
    return RankResult(rank, status, [], {**base, "type": "Timeout",
                                         "message": f"this rank hung in the {owner}'s {phase} phase{at} ({why})"})


def first_to_fail(reported: dict[int, dict], ranks: list[RankResult], named: int | None) -> int | None:
    """The rank that failed first, not a peer that then saw its collective break.

    In order: the earliest report of a rank's own failure; the rank torchrun saw fail first;
    a silent rank that failed on its own (it hung); the earliest failure by a peer.
    """
    own = sorted((rep["t"], r) for r, rep in reported.items() if failed(ranks[r]) and not ranks[r].by_peer)
    if own:
        return own[0][1]
    if named is not None:
        return named
    hung = [x.rank for x in ranks if x.rank not in reported and failed(x) and not x.by_peer]
    if hung:
        return hung[0]
    by_peer = sorted((rep["t"], r) for r, rep in reported.items() if failed(ranks[r]))
    if by_peer:
        return by_peer[0][1]
    return next((x.rank for x in ranks if failed(x)), None)
