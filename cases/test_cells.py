"""One test per matrix cell: the backend's gradients on every rank vs the float64 oracle.

Select with the harness options (``--backend``, ``--preset``, ``--world-sizes``, ...) and
``-k``; cells of one world size run in a single torchrun launch. A cell whose failures the
backend's known-defects ledger explains is an xfail naming the entries; a ledger entry that
no longer reproduces fails ``test_ledger_has_no_stale_entry``.
"""

import pytest

from harness.pytest_plugin.plugin import assert_cell_ok, stale_entries


def test_cell(cell, cell_result, harness_ledger):
    assert_cell_ok(cell_result, harness_ledger)


def test_ledger_has_no_stale_entry(harness_batches, request):
    """CONTRACTS §7: every ledger entry that selects collected cells reproduces in one."""
    if harness_batches.ledger is None:
        pytest.skip(f"no known-defects ledger for backend {harness_batches.backend}")
    stale = stale_entries(harness_batches, request.session)
    assert not stale, "\n".join(stale)
