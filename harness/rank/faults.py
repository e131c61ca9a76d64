"""Whose fault a failure is: the backend's (a verdict) or the harness's own (a bug, exit 3).

Both exceptions live here, beside each other, because every place that runs a cell must tell
them apart: ``harness.rank.runner`` tags each phase of a cell with its owner and raises one or the
other; ``harness.rank.compare`` raises ``HarnessBug`` from its checks. Pure Python (no torch).
"""

from __future__ import annotations


class BackendFault(Exception):
    """Backend code raised during ``phase``: a verdict on the backend, never a harness bug."""

    def __init__(self, phase: str, exc: BaseException) -> None:
        super().__init__(f"{phase}: {type(exc).__name__}: {exc}")
        self.phase = phase
        self.exc = exc


class HarnessBug(RuntimeError):
    """The harness itself failed (set-up, oracle, checks); never a verdict on the backend.

    ``harness.rank.runner`` raises it for any exception of a harness-owned phase; the cell's
    status is then ``harness_error`` and the run exits 3.
    """
