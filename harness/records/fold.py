"""Folding every rank's result of a cell into the cell's: its status, first failure, worst
ratio and repro line.

Whose failure a cell's is, stated once (``decisive``; docs/runner-faults.md): a cell's status
is decided by what its ranks did *themselves*. A rank whose failure is its peers' doing
(``RankResult.by_peer``: a collective it waited in broke or timed out because a peer never
came, or the launch was ended under it after a peer failed) does not count while another
rank of the cell failed on its own. So a rank that raised, died or hung in the backend's
code makes the cell ``error`` or ``timeout``, whatever its peers then saw in the harness's
collectives; ``harness_error`` is left to a rank that failed on its own in the harness's code,
and - when every failure is by a peer, so that nobody failed on their own - to the harness's
collectives contradicting themselves.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Sequence

from harness.vocabulary.matrix import Cell
from harness.records.record import CellResult, RankResult
from harness.vocabulary.status import BY_NAME, HARNESS_ERROR, PATH_NOT_TAKEN, SEVERITY

#: what a collective raises when a peer went away or never came (gloo's transport errors,
#: NCCL's watchdog and aborts, a c10d store timeout): the words of torch's and gloo's messages
PEER_LOSS = re.compile(
    r"Connection (closed|reset) by peer|Timed out waiting|timed out|Read error|Socket Timeout|"
    r"NCCL (error|communicator)|watchdog|ProcessGroup\w* (is )?abort|Broken pipe", re.I)


def peer_loss_text(message: str) -> bool:
    """A collective's error message says that a peer went away or never came."""
    return bool(PEER_LOSS.search(message))


def failed(rank: RankResult) -> bool:
    """The rank missed its expectation (anything but pass, expected error met, known; a path
    not taken is no failure either: TE's choice, not a rank's)."""
    status = BY_NAME.get(rank.status)
    return status is None or not (status.met or status.good)


def decisive(ranks: Sequence[RankResult]) -> list[RankResult]:
    """The ranks whose results decide the cell: every rank but those whose failure is a
    peer's doing, once some rank failed on its own; all of them when none did."""
    if any(failed(r) and not r.by_peer for r in ranks):
        return [r for r in ranks if not r.by_peer]
    return list(ranks)


def cell_status(ranks: Sequence[RankResult]) -> str:
    """The cell's status from its ranks' (``decisive``): all ranks agreeing give their status;
    otherwise the first not-met one by ``harness.vocabulary.status.SEVERITY`` (harness_error >
    path_not_taken > timeout > error > fail: a harness error on any rank that failed on its
    own means what the others saw is no verdict on the backend, nor is it on the cell's path
    when TE ran another one); ranks that disagree only between met statuses (pass and
    xfail) make a ``fail``."""
    statuses = {r.status for r in decisive(ranks)}
    if len(statuses) == 1 and next(iter(statuses)) in BY_NAME:
        return next(iter(statuses))
    return next((s for s in SEVERITY if s in statuses and not BY_NAME[s].met and s != "skipped"), "fail")


def first_failure(ranks: Sequence[RankResult]) -> str | None:
    """One line naming the rank and the first failed check or exception of the ranks that
    decide the cell (``decisive``): a harness error first, then the reason TE gave for taking
    another path."""
    for r in sorted(decisive(ranks), key=lambda r: (r.status != HARNESS_ERROR, r.status != PATH_NOT_TAKEN)):
        if r.status == PATH_NOT_TAKEN and r.choice and r.choice.get("reason"):
            return f"[rank {r.rank}] {r.choice['reason']}"
        if r.error and r.status in (HARNESS_ERROR, "error", "timeout"):
            return f"[rank {r.rank}] {r.error['type']}: {r.error['message']}"
        for c in r.comparisons:
            if not c.ok:
                return f"[rank {r.rank}] {(c.message or c.name).splitlines()[0]}"
    return None


def worst_ratio(ranks: Sequence[RankResult]) -> float | None:
    ratios = [c.ratio for r in ranks for c in r.comparisons if c.kind == "tensor" and c.ratio is not None]
    return max(ratios) if ratios else None


def repro_command(cell_id: str, backend: str, example: dict[str, Any] | None = None) -> str:
    parts = ["python", "-m", "harness", "repro", cell_id, "--backend", backend]
    if example:
        parts += ["--example", ",".join(f"{k}={v}" for k, v in sorted(example.items()) if k != "shrunk")]
    return shlex.join(parts)


def merge(cell: Cell, ranks: Sequence[RankResult], duration_s: float, backend: str,
          example: dict[str, Any] | None = None) -> CellResult:
    ranks = sorted(ranks, key=lambda r: r.rank)
    return CellResult(
        id=cell.id, axes=cell.serialize(), expect=cell.expect, status=cell_status(ranks),
        duration_s=round(duration_s, 4), worst_ratio=worst_ratio(ranks),
        first_failure=first_failure(ranks), repro=repro_command(cell.id, backend, example),
        ranks=list(ranks), example=example,
    )
