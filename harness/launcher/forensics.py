"""Why a launch ended, read from what it left behind: rank logs, torchrun's log, reports.

The launcher (``harness.launcher.launch``) decides *when* to end a launch; this module says *why* it
failed and *who* failed first, from the evidence: torchrun's failure summary (the first
failed rank and its exit code or signal), each rank's log from the start of the cell in
flight (its traceback, or the stacks faulthandler dumped on SIGTERM), the last
``SomethingError:`` line of a log, and the ranks' own reports (``ranks/*.jsonl``), in which a
peer that merely saw its collective break ("connection closed") is told apart from the rank
that failed first. Pure text work: the standard library only, no torch.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

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


_COMM_ERROR = re.compile(
    r"Connection (closed|reset) by peer|Timed out waiting|timed out|Read error|Socket Timeout|"
    r"NCCL (error|communicator)|watchdog|ProcessGroup\w* (is )?abort", re.I)


def first_to_fail(reported: dict[int, dict], dead_rank: int | None, world_size: int) -> int | None:
    """The rank that failed first, not a peer that then saw "connection closed".

    In order: the earliest rank whose own error is not a communication error; the rank
    torchrun saw die; a rank that never reported (hung); the earliest communication error.
    """
    errors = sorted((rep["t"], r, bool(_COMM_ERROR.search((rep["result"].get("error") or {}).get("message", ""))))
                    for r, rep in reported.items() if rep["result"]["status"] in FAILED)
    own = [r for _, r, victim in errors if not victim]
    if own:
        return own[0]
    if dead_rank is not None:
        return dead_rank
    silent = [r for r in range(world_size) if r not in reported]
    if silent and errors:
        return silent[0]
    return errors[0][1] if errors else None
