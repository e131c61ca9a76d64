"""Selections already made, kept in a folder the processes of one run share
(``DW_SELECTION_CACHE``).

Why: every process that selects cells builds the same covering design again - each sweep's
parent, each pytest process of the suite (its plugin parametrizes ``test_cell``), the
self-test's rounds. ``ci``'s design is a search (:mod:`harness.vocabulary.matrix`) of about
0.5 CPU-s in a new process, and the suite and the gates beside it start a few hundred such
processes. With the folder set, the first process to make a selection writes its cells, and
the others read them back (a few ms).

What makes a saved selection the same as a new one: its key is a digest of the arguments
``select`` resolved (the preset, each axis's domain after the preset's defaults, the filter,
the sample) and of the source of this package, which the matrix is built from alone (it is
the lowest layer: it imports nothing else of the harness). An edit of any module here is a new
key, never a stale selection. ``full`` is never saved: it is a stream (its whole product
would be held and written), and a run of it selects once.

Unset (the default outside the suite and ``.ci/run``): nothing is read or written. The folder
is the caller's: ``conftest.py`` and ``.ci/run`` make one per run and remove it after.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from harness.vocabulary import atomic

ENV = "DW_SELECTION_CACHE"


def folder() -> Path | None:
    """The folder ``DW_SELECTION_CACHE`` names (None: unset or empty)."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """A digest of this package's sources (the matrix, its axes' vocabularies)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def key(arguments: Any) -> str:
    """The file name of a selection made from ``arguments`` (JSON-serializable)."""
    text = json.dumps([_source_digest(), arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32] + ".json"


def load(where: Path, name: str, axes: tuple[str, ...]) -> list[list[Any]] | None:
    """The cells saved under ``name``, each its values in ``axes``' order (None: not saved,
    unreadable, or saved for other axes)."""
    try:
        saved = json.loads((where / name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("axes") != list(axes):
        return None
    return saved.get("cells")


def save(where: Path, name: str, axes: tuple[str, ...], rows: list[list[Any]]) -> None:
    """Save the cells atomically (``atomic.write_text``: a reader sees all of them or none); a
    folder that is not there or cannot be written is left alone - the next process selects
    anew, as without it."""
    atomic.write_text(where / name, json.dumps({"axes": list(axes), "cells": rows}, separators=(",", ":")))
