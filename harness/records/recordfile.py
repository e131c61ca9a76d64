"""Where and how a run record is stored: gzip-compressed JSON, ``results.json.gz``.

The record of a ``full`` sweep is ~150 MB of JSON (every check of every rank of every
cell); its keys and numbers repeat so much that gzip shrinks it ~10x (measured: docs/performance.md),
and gzip + JSON stays readable with the standard library and ``zcat ... | jq``. The reader
still takes a plain ``results.json`` (records written before the switch, or by hand), so
``report``, ``diff``, ``merge`` and ``--resume`` accept both.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

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


#: cells encoded per write when a record's cells are streamed
_BATCH = 512


def write(data: dict[str, Any], path: str | Path, cells: Iterable[Any] | None = None) -> Path:
    """Write ``data`` atomically (a reader or a crash never sees half a record).

    ``path`` is a run folder (its ``results.json.gz``) or a file; a file whose name does not
    end in ``.gz`` is written as plain JSON. ``cells``: the record's ``cells``, each a JSON
    value, encoded a few at a time and written last - so a record of a few hundred thousand
    cells is never one string in memory (a ``full`` sweep's record is gigabytes of JSON before
    gzip). Returns the file written.
    """
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as raw:
        if p.suffix == ".gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_LEVEL, mtime=0) as f:
                for chunk in _encoded(data, cells):
                    f.write(chunk)
        else:
            for chunk in _encoded(data, cells):
                raw.write(chunk)
    os.replace(tmp, p)
    return p


def _encoded(data: dict[str, Any], cells: Iterable[Any] | None) -> Iterator[bytes]:
    """The record's JSON in pieces: ``data``, then ``"cells": [...]`` as its last key."""
    head = json.dumps(data, separators=(",", ":"))
    if cells is None:
        yield head.encode()
        return
    if "cells" in data:
        raise ValueError("streamed cells go after the other keys: leave 'cells' out of data")
    yield (head[:-1] + ("," if len(head) > 2 else "") + '"cells":[').encode()
    batch: list[str] = []
    first = True
    for cell in cells:
        batch.append(json.dumps(cell, separators=(",", ":")))
        if len(batch) == _BATCH:
            yield (("" if first else ",") + ",".join(batch)).encode()
            batch, first = [], False
    if batch:
        yield (("" if first else ",") + ",".join(batch)).encode()
    yield b"]}"


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
