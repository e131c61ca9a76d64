"""A file written whole and renamed into place, for the caches processes share (a reader sees
all of it or nothing: ``harness.vocabulary.selection_cache``, ``harness.te_tree.scan``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to a private name in ``path``'s folder, then rename it to ``path``. A
    folder that is not there or cannot take it keeps nothing (never made here: a cache folder
    its owner removed stays removed)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
