"""Path evidence: a cell records which TE functions ran, and one that ran another path than
its label names is a harness error - never a pass (a grouped-tensor cell that silently took
the split-quantize path would otherwise pass hollow)."""

from __future__ import annotations

import types

import harness.reference as reference
from harness import modules
from harness.matrix import Cell
from harness.runner import RankContext, run_cell
from harness.status import HARNESS_ERROR

GROUPED = "grouped_linear-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g4-bias-igrad-nodelay"


def _reporting(calls: dict[str, int]) -> types.ModuleType:
    """The reference backend, claiming it called the extension functions ``calls``."""
    backend = types.ModuleType("reporting")
    for name in ("Linear", "GroupedLinear", "LayerNormLinear", "ops"):
        setattr(backend, name, getattr(reference, name))
    resets = []
    backend.reset_path_evidence = lambda: resets.append(1)
    backend.path_evidence = lambda: dict(calls)
    backend.resets = resets
    return backend


def test_the_labelled_path_passes_and_is_recorded():
    backend = _reporting({"te_general_grouped_gemm": 3})
    result = run_cell(backend, Cell.from_id(GROUPED), RankContext())
    assert result.status == "pass" and result.path == {"te_general_grouped_gemm": 3}
    assert backend.resets == [1]
    assert result.serialize()["path"] == {"te_general_grouped_gemm": 3}


def test_another_path_is_a_harness_error_naming_both():
    for calls in ({"generic_gemm": 3}, {"te_general_grouped_gemm": 3, "generic_gemm": 1}, {}):
        result = run_cell(_reporting(calls), Cell.from_id(GROUPED), RankContext())
        assert result.status == HARNESS_ERROR, calls
        assert result.error["type"] == "PathMismatch" and "grouped_linear" in result.error["message"]


def test_a_backend_without_evidence_records_none():
    result = run_cell(reference, Cell.from_id(GROUPED), RankContext())
    assert result.status == "pass" and result.path is None and "path" not in result.serialize()


def test_every_module_kind_names_its_evidence():
    for kind in modules.KINDS.values():
        assert kind.evidence, kind.name
        assert kind.path_mismatch({f: 1 for f in kind.evidence}) is None
        assert kind.path_mismatch({}) is not None
        for foreign in kind.excludes:
            assert "another path" in kind.path_mismatch({**{f: 1 for f in kind.evidence}, foreign: 1})
