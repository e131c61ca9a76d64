"""Where and how a run record is stored: gzip-compressed JSON, ``results.json.gz``.

The record of a ``full`` sweep is ~150 MB of JSON (every check of every rank of every
cell); its keys and numbers repeat so much that gzip shrinks it ~10x (measured: docs/performance.md),
and gzip + JSON stays readable with the standard library and ``zcat ... | jq``. The reader
still takes a plain ``results.json`` (records written before the switch, or by hand), so
``report``, ``diff``, ``merge`` and ``--resume`` accept both.

A record is also read a cell at a time (``cells_of``, ``read_head``; ``read_streamed``: its
``cells`` a ``harness.records.stored.StoredCells``): a sweep of a few hundred thousand cells holds gigabytes of Python
objects as a list, and its reports and its resumed fold need one cell at a time
(docs/performance.md, "the parent's memory").
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

FILENAME = "results.json.gz"
#: the uncompressed name records had before (still read)
LEGACY = "results.json"
#: zlib level 6: within 5% of level 9's size at a third of its time
_LEVEL = 6


def path_in(run_dir: str | Path) -> Path:
    """The record of a run folder: ``results.json.gz``, or an older ``results.json``."""
    d = Path(run_dir)
    if not (d / FILENAME).exists() and (d / LEGACY).exists():
        return d / LEGACY
    return d / FILENAME


#: characters encoded per piece of a record: its head (``_pieces``), then its cells, a few at
#: a time (a cell with every rank's checks is tens of kilobytes of JSON)
_PIECE = 1 << 16
#: ``json.dumps``'s compact text of one value (a packed list's items, its placeholder)
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def write(data: dict[str, Any], path: str | Path, cells: Iterable[Any] | None = None, *,
          encoded: bool = False) -> Path:
    """Write ``data`` atomically (a reader or a crash never sees half a record).

    ``path`` is a run folder (its ``results.json.gz``) or a file; a file whose name does not
    end in ``.gz`` is written as plain JSON. ``cells``: the record's ``cells``, each a JSON
    value (``encoded``: each already its compact JSON text), encoded a few at a time and
    written last - so a record of a few hundred thousand cells is never one string in memory
    (a ``full`` sweep's record is gigabytes of JSON before gzip). Returns the file written.
    """
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as raw:
        if p.suffix == ".gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_LEVEL, mtime=0) as f:
                for chunk in _encoded(data, cells, encoded):
                    f.write(chunk)
        else:
            for chunk in _encoded(data, cells, encoded):
                raw.write(chunk)
    os.replace(tmp, p)
    return p


def _encoded(data: dict[str, Any], cells: Iterable[Any] | None, encoded: bool = False) -> Iterator[bytes]:
    """The record's JSON in pieces: ``data``, then ``"cells": [...]`` as its last key."""
    pieces = _pieces(data)
    if cells is None:
        yield from (piece.encode() for piece in pieces)
        return
    if "cells" in data:
        raise ValueError("streamed cells go after the other keys: leave 'cells' out of data")
    last = next(pieces)
    for piece in pieces:
        yield last.encode()
        last = piece
    # ``last`` ends with the object's closing brace: the cells go before it
    yield (last[:-1] + ("," if data else "") + '"cells":[').encode()
    batch: list[str] = []
    size = 0
    first = True
    for cell in cells:
        text = cell if encoded else json.dumps(cell, separators=(",", ":"))
        batch.append(text)
        size += len(text)
        if size >= _PIECE:
            yield (("" if first else ",") + ",".join(batch)).encode()
            batch, size, first = [], 0, False
    if batch:
        yield (("" if first else ",") + ",".join(batch)).encode()
    yield b"]}"


class PackedStrings(Sequence[str]):
    """A list of strings (none holding a newline) kept compressed, written by ``write`` as the
    JSON list it stands for, a piece at a time.

    Why: a record's head names every cell of each launch; held as strings, a large sweep's
    launch lists were as large as the rest of its parent's memory together (docs/performance.md,
    "the parent's memory"). Cell ids repeat their axis values, so they compress about tenfold.
    """

    def __init__(self, items: Iterable[str] = ()) -> None:
        packer, parts, count = zlib.compressobj(1), [], 0
        for item in items:
            if "\n" in item:
                raise ValueError(f"a packed string holds a newline: {item!r}")
            parts.append(packer.compress(item.encode() + b"\n"))
            count += 1
        parts.append(packer.flush())
        self._data, self._count = b"".join(parts), count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        unpacker, rest = zlib.decompressobj(), b""
        for start in range(0, len(self._data), _PIECE):
            rest += unpacker.decompress(self._data[start:start + _PIECE])
            *lines, rest = rest.split(b"\n")
            yield from (line.decode() for line in lines)
        rest += unpacker.flush()
        yield from (line.decode() for line in rest.split(b"\n")[:-1])

    def __getitem__(self, index):  # type: ignore[override]
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"PackedStrings({list(self)!r})"

    def json_pieces(self) -> Iterator[str]:
        """``json.dumps(list(self), separators=(",", ":"))`` in pieces of about ``_PIECE`` characters."""
        buf, size, sep = ["["], 1, ""
        for item in self:
            buf.append(sep + _ENCODER.encode(item))
            size += len(buf[-1])
            sep = ","
            if size >= _PIECE:
                yield "".join(buf)
                buf, size = [], 0
        buf.append("]")
        yield "".join(buf)


def _pieces(value: Any) -> Iterator[str]:
    """``json.dumps(value, separators=(",", ":"))`` in pieces of about ``_PIECE`` characters,
    none empty, a ``PackedStrings`` written as its list. Why not the one string: a record's
    head names every cell of its launches, so it grows with the cells; held whole - and copied
    to add the cells, then to bytes - it was the largest thing a large sweep's parent held
    (docs/performance.md, "the parent's memory")."""
    packed: dict[str, PackedStrings] = {}

    def placeholder(o: Any) -> str:
        """A ``PackedStrings`` stands in the encoder's output as a string of its own (a chunk of
        its own: the encoder yields a value it had to convert apart from what precedes it)."""
        if not isinstance(o, PackedStrings):
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
        token = f"\0packed {len(packed)}\0"
        packed[_ENCODER.encode(token)] = o
        return token

    buf: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(separators=(",", ":"), default=placeholder).iterencode(value):
        parts = packed.pop(chunk).json_pieces() if chunk in packed else (chunk,)
        for part in parts:
            buf.append(part)
            size += len(part)
            if size >= _PIECE:
                yield "".join(buf)
                buf, size = [], 0
    if buf:
        yield "".join(buf)


def read(path: str | Path) -> dict[str, Any]:
    """The record in ``path`` (a run folder, a ``.json.gz`` or a ``.json`` file) as a dict.

    Raises:
        OSError: no record there. ValueError: not a record's JSON (or a broken gzip file).
    """
    p = Path(path)
    if p.is_dir():
        p = path_in(p)
    raw = p.read_bytes()
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        return json.loads(text)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: not a readable run record ({exc})") from exc


#: characters decoded per read when a record is streamed
_CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
#: a value that ends this close to the chunk's end may be a number cut short ("10." of "10.5")
_NUMBER_TAIL = 40


def _open_text(path: str | Path) -> IO[str]:
    """The record's JSON text, decompressed as it is read (gzip told by its magic bytes)."""
    p = Path(path)
    if p.is_dir():
        p = path_in(p)
    with open(p, "rb") as raw:
        zipped = raw.read(2) == b"\x1f\x8b"
    # gzip.open owns the file it opens (a GzipFile given a file object never closes it)
    return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8") if zipped else open(p, encoding="utf-8")


class _Values:
    """JSON text read a chunk at a time: punctuation and whole values taken one by one."""

    def __init__(self, f: IO[str]) -> None:
        self.f, self.buf, self.pos, self.eof = f, "", 0, False

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return True

    def char(self) -> str:
        """The next character that is not white space (consumed)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                self.pos += 1
                return self.buf[self.pos - 1]
            if not self._more():
                raise ValueError("the record's JSON ends early")

    def value(self) -> Any:
        """The next whole JSON value (read on while it is cut by the chunk's end). A list or
        object longer than a chunk is decoded an item at a time (``_items``): decoded whole, it
        was held as one string and decoded again from its start with every chunk added - a
        record's head names every cell of its launches, megabytes for a large sweep."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            try:
                v, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if len(self.buf) - self.pos > _CHUNK and self.buf[self.pos] in "[{":
                    return self._items()
                if self._more():
                    continue
                raise ValueError("the record's JSON is malformed or ends early") from None
            if end + _NUMBER_TAIL > len(self.buf) and self._more():  # a number may go on in the next chunk
                continue
            self.pos = end
            return v

    def _items(self) -> list[Any] | dict[str, Any]:
        """The list or object that starts here, its items decoded one by one (each by ``value``)."""
        opener = self.char()
        closer, out = ("]", []) if opener == "[" else ("}", {})
        if self.char() == closer:
            return out
        self.pos -= 1
        while True:
            if isinstance(out, list):
                out.append(self.value())
            else:
                key = self.value()
                if not isinstance(key, str) or self.char() != ":":
                    raise ValueError("malformed JSON object")
                out[key] = self.value()
            c = self.char()
            if c == closer:
                return out
            if c != ",":
                raise ValueError("the record's JSON is malformed")


def _walk(path: str | Path, head: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """The record's cells one at a time; its other keys go into ``head`` when given."""
    try:
        with _open_text(path) as f:
            r = _Values(f)
            if r.char() != "{":
                raise ValueError("a run record is a JSON object")
            if r.char() == "}":
                return
            r.pos -= 1
            while True:
                key = r.value()
                if r.char() != ":":
                    raise ValueError("malformed JSON object")
                if key == "cells":
                    if r.char() != "[":
                        raise ValueError("cells is not a list")
                    if r.char() != "]":
                        r.pos -= 1
                        while True:
                            yield r.value()
                            c = r.char()
                            if c == "]":
                                break
                            if c != ",":
                                raise ValueError("malformed cells list")
                elif head is not None:
                    head[key] = r.value()
                else:
                    r.value()
                c = r.char()
                if c == "}":
                    return
                if c != ",":
                    raise ValueError("malformed JSON object")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{path}: not a readable run record ({exc})") from exc


def cells_of(path: str | Path, head: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The cells of the record in ``path`` (a run folder or a record file), read one at a time;
    its other keys go into ``head`` when given (those before ``cells`` as soon as the first
    cell comes: the writer puts ``cells`` last).

    Raises:
        OSError: no record there. ValueError: not a record's JSON (or a broken gzip file).
    """
    return _walk(path, head)


def read_head(path: str | Path) -> dict[str, Any]:
    """The record's keys before its ``cells`` - every key but the cells in a record this module
    wrote (it puts them last) - read without reading a cell: what ``--resume`` needs of a
    record of any size (its selection, backend, launches).

    Raises:
        OSError: no record there. ValueError: not a record's JSON (or a broken gzip file).
    """
    head: dict[str, Any] = {}
    for _ in _walk(path, head):
        break
    return head


def read_streamed(path: str | Path) -> dict[str, Any]:
    """The record in ``path`` (as ``read``) with its ``cells`` a ``harness.records.stored.StoredCells``:
    one pass reads its other keys and sets its cells aside on disk; every later pass over
    ``cells`` reads them from there, one at a time.

    Raises:
        OSError: no record there. ValueError: not a record's JSON (or a broken gzip file).
    """
    from harness.records.stored import StoredCells

    head: dict[str, Any] = {}
    head["cells"] = StoredCells(_walk(path, head))
    return head
