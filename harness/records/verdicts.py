"""Where the latest verdict of each cell of a run folder is - a line of its result stream,
else its earlier record - and never the verdicts themselves.

Why: a sweep's record is a fold of every verdict of its folder, refreshed while it runs and
written at its end; a resumed sweep of a few hundred thousand cells held them all as objects
(gigabytes). This index holds one integer per cell id (where, and whether it met its
expectation); a verdict is read back from disk when the record is written, one at a time, in
the selection's order (docs/performance.md, "the parent's memory").
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Iterator

from harness.records import recordfile
from harness.records.record import CellResult
from harness.records.stream import ResultStream
from harness.vocabulary.status import GOOD_STATUSES

#: a verdict held by the earlier record, not the stream (``_where``'s value, plus 1 if good)
_IN_RECORD = -2


class Verdicts:
    """The latest verdict of each cell id of ``backend`` in ``run_dir``: its result stream's
    lines from ``since`` on (``refresh`` reads the lines appended since the last call), over
    the earlier record's verdicts when ``earlier`` (a resumed run; a skipped cell has none)."""

    def __init__(self, run_dir: Path, backend: str, since: int = 0, earlier: bool = False) -> None:
        self.stream = ResultStream(run_dir)
        self.backend = backend
        self.offset = since
        self._record = recordfile.path_in(run_dir)
        #: cell id -> 2 * the offset of its stream line (or ``_IN_RECORD``), + 1 when it met its expectation
        self._where: dict[str, int] = {}
        self._walk: Iterator[dict] | None = None
        self._file: IO[bytes] | None = None
        if earlier:
            self._index_record()
        self.refresh()

    def _index_record(self) -> None:
        head: dict = {}
        try:
            for c in recordfile.cells_of(self._record, head):
                if c.get("status") != "skipped":
                    self._where[c["id"]] = _IN_RECORD + (c.get("status") in GOOD_STATUSES)
        except (OSError, ValueError, KeyError, TypeError):
            self._where.clear()
            return
        if head.get("backend") != self.backend:
            self._where.clear()

    def refresh(self) -> None:
        """Index the stream's lines appended since the last call."""
        for offset, end, d in self.stream.lines(self.offset):
            self.offset = end
            if d is not None and d.get("backend") == self.backend:
                self._where[d["result"]["id"]] = 2 * offset + (d["result"].get("status") in GOOD_STATUSES)

    def __contains__(self, cell_id: str) -> bool:
        return cell_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def met(self, cell_id: str) -> bool:
        """Whether the cell's latest verdict met its expectation (False: none, or it missed)."""
        return self._where.get(cell_id, 0) % 2 == 1

    def get(self, cell_id: str) -> CellResult | None:
        """The cell's latest verdict, read from disk (None: it has none)."""
        where = self._where.get(cell_id)
        if where is None:
            return None
        if where >= 0:
            if self._file is None:
                self._file = self.stream.open()
            return self.stream.at(where // 2, self._file).result
        found = self._from_record(cell_id)
        return None if found is None else CellResult.from_dict(found)

    def _from_record(self, cell_id: str) -> dict | None:
        """The earlier record's verdict of ``cell_id``: its cells are read on in order (the
        order the record and the selection share), from the start again when it lies behind."""
        for restart in (False, True):
            if restart or self._walk is None:
                self._walk = recordfile.cells_of(self._record)
            for c in self._walk:
                if c.get("id") == cell_id:
                    return c
        return None

    def rewind(self) -> None:
        """Forget the read positions (the record's file is replaced each time it is written)."""
        self._walk = None
        if self._file is not None:
            self._file.close()
            self._file = None
