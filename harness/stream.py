"""The result stream: the one durable, append-only source of truth of a run's verdicts.

Whoever has a verdict appends it the moment it exists: rank 0 of a launch (the ranks'
merged verdict of a cell), the launcher (a cell whose launch crashed or hung, with every
rank's evidence), the worker (a harness error). ``sweep``, the pytest plugin, ``--resume``,
the external-launcher mode and the run record read only this stream.

Each append is one JSON line written under a file lock (``filelock``: rank 0 and the
launcher may append at the same moment and must never interleave a line) and fsync'ed
before the lock is released, so a crash loses nothing that was appended. A torn last line
(a machine that died mid-write) is skipped by the readers.

The on-disk format is private to this module (today ``cells.jsonl``, one
``{"backend", "launch", "result"}`` object a line); callers use ``append``, ``read`` and
``read_since`` only, so the format can change without touching them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness.record import CellResult

FILENAME = "cells.jsonl"


@dataclass(frozen=True)
class Verdict:
    """One appended verdict: a cell's result against one backend, from one launch."""

    backend: str
    result: CellResult
    launch: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.backend, self.result.id)


class ResultStream:
    """The verdicts of one run folder."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / FILENAME
        self._lock = FileLock(str(self.run_dir / f"{FILENAME}.lock"))

    def append(self, result: CellResult, backend: str, launch: str | None = None) -> None:
        """Append one verdict durably (fsync'ed before this returns)."""
        line = json.dumps({"backend": backend, "launch": launch, "result": result.serialize()}) + "\n"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def read(self) -> list[Verdict]:
        """Every verdict appended so far, in order."""
        return self.read_since(0)[0]

    def read_since(self, offset: int) -> tuple[list[Verdict], int]:
        """The verdicts appended after ``offset``; returns them and the offset to read on from.

        A line still being written (no newline yet) is left for the next call.
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            return [], offset
        complete, sep, _ = chunk.rpartition(b"\n")
        if not sep:
            return [], offset
        out = []
        for line in complete.decode("utf-8", errors="replace").splitlines():
            verdict = _parse(line)
            if verdict is not None:
                out.append(verdict)
        return out, offset + len(complete) + 1

    def latest(self, backend: str | None = None) -> dict[str, CellResult]:
        """The last verdict of every cell id (of ``backend`` when given), in first-seen order."""
        out: dict[str, CellResult] = {}
        for v in self.read():
            if backend is None or v.backend == backend:
                out[v.result.id] = v.result
        return out


def _parse(line: str) -> Verdict | None:
    try:
        d = json.loads(line)
        return Verdict(d["backend"], CellResult.from_dict(d["result"]), d.get("launch"))
    except (json.JSONDecodeError, KeyError, TypeError):
        return None  # a torn line of a crashed writer: that cell has no verdict
