"""Failure classes (``harness_reports.classes``) and the backend facts the reports show."""

from __future__ import annotations

from typing import Any

from harness_reports import classes
from harness_reports._common import backend_facts
from harness_reports.markdown import render_markdown

TB = ('Traceback (most recent call last):\n'
      '  File "/x/harness/runner.py", line 1, in run_cell\n'
      '  File "/venv/site-packages/transformer_engine/pytorch/module/grouped_linear.py", line 9, in backward\n'
      '  File "/venv/site-packages/torch/autograd/function.py", line 3, in apply\n')


def _cell(cid: str, status: str, failed: list[str], error: str | None = None, module: str = "linear",
          ranks: int = 1) -> dict[str, Any]:
    comps = [{"name": n, "kind": "tensor", "ok": False} for n in failed] + [{"name": "ok", "kind": "flag", "ok": True}]
    err = {"type": "AssertionError", "message": error, "traceback": TB} if error else None
    return {"id": cid, "status": status, "axes": {"module": module, "world_size": 2},
            "ranks": [{"rank": r, "status": status, "comparisons": comps, "error": err} for r in range(ranks)]}


def test_every_failing_cell_in_exactly_one_class() -> None:
    record = {"cells": [
        _cell("a", "fail", ["weight.main_grad", "finalize_dtypes"]),
        _cell("b", "fail", ["weight3.main_grad", "weight0.main_grad", "finalize_dtypes"], module="grouped_linear"),
        _cell("c", "error", [], "weight was removed while fuse_wgrad_accumulation=True", ranks=2),
        _cell("d", "error", [], "attempting to assign a gradient of size '[30, 24]'"),
        _cell("e", "error", [], "attempting to assign a gradient of size '[12, 7]'"),
        _cell("f", "pass", []),
        _cell("g", "fail", ["mb1.output"]),
    ]}
    found = classes.failure_classes(record)
    members = [c for fc in found for c in fc.cells]
    assert sorted(members) == ["a", "b", "c", "d", "e", "g"] and len(set(members)) == len(members)
    by_cells = {tuple(fc.cells): fc.signature for fc in found}
    # weight / weightN folded; numbers in messages folded; the raising TE frame located
    assert by_cells[("a", "b")].checks == ("finalize_dtypes", "weight*.main_grad")
    assert by_cells[("d", "e")].exception.startswith("AssertionError: attempting to assign")
    assert by_cells[("c",)].raised_at == "transformer_engine/pytorch/module/grouped_linear.py:backward"
    assert by_cells[("g",)].checks == ("mb*.output",)
    table = classes.markdown(record)
    assert table.count("\n") == 1 + len(found)


def test_reports_show_the_backend_info() -> None:
    record = {"status": "complete", "backend": "te-cpu", "cells": [],
              "environment": {"torch": "2.13.0", "backend_info": {
                  "upstream": "transformer_engine", "version": "2.20.2", "fp32_gemm": "tf32",
                  "upstream_origin": "/venv/site-packages/transformer_engine"}}}
    facts = dict(backend_facts(record))
    assert facts == {"upstream": "transformer_engine 2.20.2", "imported from": "/venv/site-packages/transformer_engine",
                     "fp32 GEMMs": "TF32, u = 2^-11"}
    md = render_markdown(record)
    assert "`transformer_engine 2.20.2`" in md and "TF32, u = 2^-11" in md
    assert dict(backend_facts({"environment": {}})) == {"upstream": None, "imported from": None, "fp32 GEMMs": None}
