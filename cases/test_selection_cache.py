"""A selection read back from the run's selection cache (``DW_SELECTION_CACHE``,
``harness/vocabulary/selection_cache.py``) is the selection made anew, in order; its key
follows every argument and the matrix's own source; ``full`` is never saved; a file that
cannot be read is made again. In-process: ``select`` is pure Python."""

from __future__ import annotations

import json

import pytest

from harness.vocabulary import matrix, selection_cache

#: a few small selections of different presets, overrides, filters and samples
ARGUMENTS = [
    ("ci", {"module": ["linear", "grouped_linear"], "recipe": ["none", "mxfp8"]}, None, None),
    ("ci", {"module": ["linear"]}, "world_size >= 2 and not fused", None),
    ("ci", {"module": ["layernorm_linear"]}, None, (5, 11)),
    ("smoke", None, None, None),
    ("seed", None, None, None),
]


def _made(arguments):
    preset, overrides, expr, sample = arguments
    return matrix.select(preset, overrides, expr, sample)


@pytest.fixture
def saved_in(tmp_path, monkeypatch):
    (tmp_path / "selections").mkdir()
    monkeypatch.setenv(selection_cache.ENV, str(tmp_path / "selections"))
    return tmp_path / "selections"


def test_a_saved_selection_is_the_selection_made_anew(saved_in, monkeypatch):
    first = [_made(a) for a in ARGUMENTS]
    files = sorted(p.name for p in saved_in.iterdir())
    assert len(files) == len(ARGUMENTS)  # one per selection: the keys differ
    again = [_made(a) for a in ARGUMENTS]  # read back
    assert sorted(p.name for p in saved_in.iterdir()) == files
    monkeypatch.delenv(selection_cache.ENV)
    anew = [_made(a) for a in ARGUMENTS]
    assert first == again == anew
    assert all(cells for cells in anew)
    assert [[c.id for c in cells] for cells in again] == [[c.id for c in cells] for cells in anew]


def test_what_is_saved_is_what_is_read(saved_in):
    """The cells come from the file, not from this process's memory: a file edited to hold
    other cells is read as such (this is how a saved selection reaches another process)."""
    arguments = ARGUMENTS[0]
    made = _made(arguments)
    (path,) = saved_in.iterdir()
    other = matrix.select("smoke")
    selection_cache.save(saved_in, path.name, matrix.AXIS_NAMES,
                         [[getattr(c, a) for a in matrix.AXIS_NAMES] for c in other])
    assert _made(arguments) == other != made


@pytest.mark.parametrize("content", ["", "{not json", '{"axes": ["module"], "cells": []}',
                                     '{"axes": %s, "cells": [["linear"]]}', '{"axes": %s, "cells": 7}',
                                     '{"axes": %s, "cells": [["no-such-module", 1]]}'])
def test_an_unreadable_or_foreign_file_is_made_again(saved_in, content):
    made = _made(ARGUMENTS[1])
    (path,) = saved_in.iterdir()
    if "%s" in content:  # the right axes, damaged cells
        content = content % json.dumps(list(matrix.AXIS_NAMES))
    path.write_text(content)
    assert _made(ARGUMENTS[1]) == made
    assert path.read_text() != content  # and saved again


def test_an_edit_of_the_matrix_is_a_new_key(saved_in, monkeypatch):
    _made(ARGUMENTS[3])
    monkeypatch.setattr(selection_cache, "_source_digest", lambda: "an edited matrix")
    _made(ARGUMENTS[3])
    assert len(list(saved_in.iterdir())) == 2


def test_full_is_never_saved(saved_in):
    cells = matrix.select("full", {"module": ["linear"], "world_size": [2], "dtype": ["bf16"]})
    assert cells and not list(saved_in.iterdir())


def test_a_folder_that_is_not_there_is_not_made(tmp_path, monkeypatch):
    """The folder is its owner's (conftest.py, .ci/run): one removed at the end of a run is not
    brought back by a process still selecting."""
    monkeypatch.setenv(selection_cache.ENV, str(tmp_path / "gone"))
    assert _made(ARGUMENTS[3]) and not (tmp_path / "gone").exists()
