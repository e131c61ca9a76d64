"""One test per matrix cell: the backend's gradients on every rank vs the float64 oracle.

Select with the harness options (``--backend``, ``--preset``, ``--world-sizes``, ...) and
``-k``; cells of one world size run in a single torchrun launch.
"""

from harness.plugin import assert_cell_ok


def test_cell(cell, cell_result):
    assert_cell_ok(cell_result)
