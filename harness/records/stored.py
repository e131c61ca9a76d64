"""A run record's cells set aside on disk and read back one at a time, on every pass.

Why: the reports and the end-of-run text are pure functions of the record, written as
several passes over its cells; a sweep of a few hundred thousand cells held them as one list
of dicts (gigabytes). ``StoredCells`` reads the record once and writes each cell to an unnamed
file as two parts - its light fields, and its ranks (every check: most of its bytes) as text -
so a pass reads the light part, and a cell's ``ranks`` are parsed only when a reader asks for
them (``StoredCell``). A reader that keeps cells across a pass keeps what it kept, no more
(docs/performance.md, "the parent's memory").
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import weakref
from typing import Any, Iterable, Iterator

#: ``ranks`` of a ``StoredCell`` not parsed yet (JSON cannot encode it: a dump of an unread cell fails loudly)
_UNREAD = object()


class StoredCell(dict):
    """A cell of a stored record: a dict whose ``ranks`` are parsed when first read (by
    ``c["ranks"]``, ``c.get("ranks")`` or anything that reads every value)."""

    __slots__ = ("_ranks",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ranks: bytes | None = None

    def _read(self) -> None:
        if dict.get(self, "ranks") is _UNREAD:
            dict.__setitem__(self, "ranks", json.loads(self._ranks))
            self._ranks = None

    def __getitem__(self, key: str) -> Any:
        if key == "ranks":
            self._read()
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        if key == "ranks":
            self._read()
        return dict.get(self, key, default)

    def __iter__(self) -> Iterator[str]:  # not dict's own: a copy (``{**c}``, ``dict(c)``) reads through __getitem__
        return iter(dict.keys(self))

    def items(self) -> Any:
        self._read()
        return dict.items(self)

    def values(self) -> Any:
        self._read()
        return dict.values(self)

    def copy(self) -> dict[str, Any]:
        self._read()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._read()
        if isinstance(other, StoredCell):
            other._read()
        return dict.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        self._read()
        return dict.__repr__(self)


class StoredCells:
    """The cells ``cells`` yields, set aside on disk in one pass; each pass over this reads
    them back in order as ``StoredCell``s (passes may interleave: each has its own reader).
    ``len`` is known once they are set aside; the file goes with this object.

    The file is this process's own scratch, written and read by it alone: each cell a pickle
    of its light fields (a tenth of the time of parsing their JSON, which a pass over a large
    record pays per cell) and the JSON text of its ranks."""

    def __init__(self, cells: Iterable[dict[str, Any]]) -> None:
        fd, self._path = tempfile.mkstemp(prefix="dw-cells-")
        weakref.finalize(self, os.unlink, self._path)
        self._count = 0
        with os.fdopen(fd, "wb") as f:
            for c in cells:
                ranks = json.dumps(c["ranks"], separators=(",", ":")).encode() if "ranks" in c else None
                data = pickle.dumps(({k: (None if k == "ranks" else v) for k, v in c.items()}, ranks),
                                    protocol=pickle.HIGHEST_PROTOCOL)
                f.write(len(data).to_bytes(8, "little") + data)  # one pickle each: no memo across cells
                self._count += 1

    def __iter__(self) -> Iterator[StoredCell]:
        with open(self._path, "rb") as f:
            for _ in range(self._count):
                light, ranks = pickle.loads(f.read(int.from_bytes(f.read(8), "little")))
                cell = StoredCell(light)
                if ranks is not None:
                    dict.__setitem__(cell, "ranks", _UNREAD)
                    cell._ranks = ranks
                yield cell

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0
