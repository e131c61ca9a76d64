"""Owner-tagged phases, in-process (world size 1): what the backend raises is a verdict on
the backend, with the phase named; what the harness raises is a ``compare.HarnessBug``
(status ``harness_error``), never a backend verdict."""

from __future__ import annotations

import types

import pytest
import torch

import harness.backends.reference as reference
from harness.vocabulary import matrix
from harness.cell import compare, oracle
from harness.cell.runner import RankContext, run_cell
from harness.vocabulary.status import HARNESS_ERROR

CELL = matrix.Cell(module="linear", weight="distributed", hooks="off", fused=True, dtype="fp32", world_size=1,
                   consumer="ddp", microbatches=1, num_gemms=1, bias=True, input_grad=True, delay_wgrad=False)


def _backend(**overrides) -> types.SimpleNamespace:
    return types.SimpleNamespace(Linear=overrides.get("Linear", reference.Linear),
                                 GroupedLinear=reference.GroupedLinear, ops=reference.ops)


def _raising(phase: str) -> type:
    class Broken(reference.Linear):
        def __init__(self, *a, **k):
            if phase == "constructor":
                raise RuntimeError("backend constructor broke")
            super().__init__(*a, **k)

        def register_wgrad_accumulation_and_reduce_hooks(self, hook):
            if phase == "register_wgrad_accumulation_and_reduce_hooks":
                raise RuntimeError("backend hook registration broke")
            return super().register_wgrad_accumulation_and_reduce_hooks(hook)

        def forward(self, *a, **k):
            if phase == "forward":
                raise RuntimeError("backend forward broke")
            return super().forward(*a, **k)

    return Broken


@pytest.mark.parametrize("phase", ["constructor", "register_wgrad_accumulation_and_reduce_hooks", "forward"])
def test_backend_exception_is_a_backend_verdict_with_its_phase(phase):
    res = run_cell(_backend(Linear=_raising(phase)), CELL, RankContext())
    assert res.status == "error"
    assert res.error["phase"] == phase and res.error["type"] == "RuntimeError"
    assert "broke" in res.error["message"]


def test_oracle_that_raises_is_a_harness_bug(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("oracle bug")

    monkeypatch.setattr(oracle, "compute", broken)
    res = run_cell(reference, CELL, RankContext())
    assert res.status == HARNESS_ERROR and res.comparisons == []
    assert res.error["type"] == "HarnessBug"
    assert res.error["message"].startswith(f"the harness failed in its checks phase of {CELL.id}: ZeroDivisionError")
    assert "ZeroDivisionError: oracle bug" in res.error["traceback"] and "phase" not in res.error


def test_harness_set_up_that_raises_is_a_harness_bug(monkeypatch):
    import harness.cell.runner as runner

    def broken(*args, **kwargs):
        raise KeyError("inputs bug")

    monkeypatch.setattr(runner, "make_inputs", broken)
    res = run_cell(reference, CELL, RankContext())
    assert res.status == HARNESS_ERROR and "inputs phase" in res.error["message"]


def test_compare_is_a_harness_bug_class_and_rejects_non_tensors():
    assert issubclass(compare.HarnessBug, RuntimeError)
    ref = oracle.Reference(torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 1, 1)
    check = compare.compare_tensor("w.main_grad", [0.0, 0.0], ref, "fp32")
    assert not check.ok and "is a list, not a tensor" in check.message
