"""The result stream: the one durable, append-only source of truth of a run's verdicts.

Whoever has a verdict appends it the moment it exists: rank 0 of a launch (the ranks'
merged verdict of a cell), the launcher (a cell whose launch crashed or hung, with every
rank's evidence), the worker (a harness error). ``sweep``, the pytest plugin, ``--resume``,
the external-launcher mode and the run record read only this stream.

Each append is one JSON line written under a file lock (``flock`` on ``cells.jsonl.lock``:
rank 0 of every lane and the launcher may append at the same moment and must never interleave
a line) and fsync'ed before the lock is released, so a crash loses nothing that was appended.
A blocking ``flock`` sleeps in the kernel until the lock is free; a polling lock
(``filelock``'s, before) spent about 5% of a te-cpu ``ci`` sweep's samples retrying while the
lanes' rank 0s waited on each other's fsync (docs/performance.md). A torn last line
(a machine that died mid-write) is skipped by the readers.

The on-disk format is private to this module (today ``cells.jsonl``, one
``{"backend", "launch", "result"}`` object a line); callers use ``ResultStream``'s methods
only (``append``; ``read``, ``latest``, ``read_since`` from a ``size``; ``lines`` and ``at``
to index a large stream a line at a time; ``retire``, ``compress``), never the file, so the format can change without touching them. The ranks'
own report files are JSON lines appended the same way; ``LineTail`` follows one with the same
reading (complete lines only) as ``read_since``.

Once a sweep is complete its run record (``harness.records.recordfile``) holds every verdict, and
the stream is *retired* (``retire``): deleted, with a marker left, so a finished run folder
costs no more than its record. Reading a retired stream (``read``, ``latest``) reads the
record's verdict of every cell - one per cell - then whatever was appended since (a later
``--resume``); ``read_since`` reads only what is appended live.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator


from harness.records import recordfile, runfolder
from harness.records.record import CellResult

FILENAME = "cells.jsonl"
#: left in a run folder whose stream was folded into its final record
RETIRED = "cells.retired"


@dataclass(frozen=True)
class Appended:
    """One line of the stream: a cell's result against one backend, from one launch."""

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
        self._lock = self.run_dir / f"{FILENAME}.lock"

    def append(self, result: CellResult, backend: str, launch: str | None = None) -> None:
        """Append one verdict durably (fsync'ed before this returns)."""
        line = json.dumps({"backend": backend, "launch": launch, "result": result.serialize()}) + "\n"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self._lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def size(self) -> int:
        """How far the stream reaches now (0 before the first append): ``read_since(size())``
        later returns only what was appended after this call."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self) -> list[Appended]:
        """Every verdict appended so far, in order (a retired stream: see the module docstring)."""
        live = self.read_since(0)[0]
        if not (self.run_dir / RETIRED).exists():
            return live
        rerun = {v.key for v in live}
        return [v for v in self._archived() if v.key not in rerun] + live

    def retire(self) -> None:
        """Drop the stream of a complete run whose record is final (it holds every verdict)."""
        (self.run_dir / RETIRED).write_text(
            f"the verdicts of {FILENAME} are in {recordfile.FILENAME} (the run is complete)\n")
        self.path.unlink(missing_ok=True)

    def _archived(self) -> list[Appended]:
        """The record's verdicts (a cell never reached has none), each with the last launch
        whose cells name it - the one its verdict came from."""
        try:
            record = recordfile.read(self.run_dir)
        except (OSError, ValueError):
            return []
        launch_of: dict[str, str] = {}
        for launch in record.get("launches", ()):
            name = Path(launch.get("log_dir") or "").name or None
            launch_of.update((cell_id, name) for cell_id in launch.get("cells", ()))
        return [Appended(record["backend"], CellResult.from_dict(c), launch_of.get(c["id"]))
                for c in record.get("cells", ()) if c.get("status") != "skipped"]

    def read_since(self, offset: int) -> tuple[list[Appended], int]:
        """The verdicts appended after ``offset``; returns them and the offset to read on from.

        A line still being written (no newline yet) is left for the next call.
        """
        lines, offset = _lines_since(self.path, offset)
        return [v for line in lines if (v := _parse(line)) is not None], offset

    def lines(self, offset: int = 0) -> Iterator[tuple[int, int, dict[str, Any] | None]]:
        """Each complete line after ``offset`` as ``(its offset, the offset after it, its
        object)`` (None: a torn or unparsable line), read a line at a time: what indexes a
        large stream without holding its verdicts; ``at`` reads one back."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(offset)
            for line in f:
                if not line.endswith(b"\n"):
                    return  # still being written
                try:
                    d = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    d = None
                # the test ``at`` will make: a line it cannot read back is no verdict here either
                yield offset, offset + len(line), d if _appended(d) is not None else None
                offset += len(line)

    def at(self, offset: int, f: IO[bytes] | None = None) -> Appended:
        """The verdict of the line at ``offset`` (one ``lines`` gave); ``f``: the stream's file,
        open for reading (``open``), for many reads in a row."""
        if f is None:
            with self.open() as f:
                return self.at(offset, f)
        f.seek(offset)
        v = _parse(f.readline().decode("utf-8", errors="replace"))
        if v is None:
            raise ValueError(f"{self.path}: no verdict at offset {offset}")
        return v

    def open(self) -> IO[bytes]:
        """The stream's file, for ``at``."""
        return open(self.path, "rb")

    def compress(self) -> None:
        """Gzip the stream in place (``cells.jsonl.gz``, every line kept): a finished
        self-test keeps its mutants' verdicts, which its record does not hold, at a fraction
        of the size. Nothing reads the stream of that folder afterwards."""
        if self.path.exists():
            runfolder.gzip_in_place(self.path)

    def latest(self, backend: str | None = None) -> dict[str, CellResult]:
        """The last verdict of every cell id (of ``backend`` when given), in first-seen order."""
        out: dict[str, CellResult] = {}
        for v in self.read():
            if backend is None or v.backend == backend:
                out[v.result.id] = v.result
        return out


class LineTail:
    """Follows a file of JSON lines from its size when the tail is made: each ``read``
    returns the objects of the lines completed since the last one (a torn or unparsable
    line is skipped, a line still being written waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.offset = path.stat().st_size
        except FileNotFoundError:
            self.offset = 0

    def read(self) -> list[dict]:
        lines, self.offset = _lines_since(self.path, self.offset)
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def _lines_since(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines of ``path`` after byte ``offset``, and the offset after the last of
    them (unchanged while the file is missing or its next line has no newline yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    complete, sep, _ = chunk.rpartition(b"\n")
    if not sep:
        return [], offset
    return complete.decode("utf-8", errors="replace").splitlines(), offset + len(complete) + 1


def _parse(line: str) -> Appended | None:
    try:
        d = json.loads(line)
    except json.JSONDecodeError:
        return None  # a torn line of a crashed writer: that cell has no verdict
    return _appended(d)


def _appended(d: Any) -> Appended | None:
    """The verdict a stream line's object holds (None: not a verdict)."""
    try:
        return Appended(d["backend"], CellResult.from_dict(d["result"]), d.get("launch"))
    except (KeyError, TypeError, AttributeError):
        return None
