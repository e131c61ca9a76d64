"""The measured detection threshold: perturbation faults, the bisection, and its verdicts.

A perturbation backend plants ``k * u`` in exactly one tensor kind (the others stay the
reference's, bit for bit); the search narrows ``k`` to a measured bracket (largest missed,
smallest caught); a kind that nothing catches makes the self-test fail; and a run's margins
per dtype and tensor kind cover every hypothesis example it ran.
"""

from __future__ import annotations

import json

import pytest

import harness.backends.reference as reference
from harness import cli
from harness.vocabulary import matrix, recipes
from harness.orchestration import sensitivity
from harness.records.record import Check, CellResult, RankResult, RunRecord, kind_ratios, tensor_kind
from harness.backends.reference import perturb
from harness.cell.runner import RankContext, run_cell
from harness.orchestration.selftest import SelftestResult

CELL = matrix.Cell.from_id("grouped_linear-plain-hooks_off-fused-bf16-ws1-ddp-mb2-g4-bias-igrad-nodelay")


def test_spec_round_trips_and_bad_specs_are_refused():
    spec = "fp32.weight_grad=16,bf16.output=4,current.bf16.input_grad=2"
    assert perturb.parse(spec) == {("none", "fp32", "weight_grad"): 16.0, ("none", "bf16", "output"): 4.0,
                                   ("current", "bf16", "input_grad"): 2.0}
    assert perturb.format_spec(perturb.parse(spec)) == "current.bf16.input_grad=2,bf16.output=4,fp32.weight_grad=16"
    for bad in ("bf16.output", "fp8.output=2", "bf16.loss=2", "bf16.output=0", "output=2",
                "fp4.bf16.output=2", "current.bf16.output.x=2"):
        with pytest.raises(ValueError, match="bad perturbation"):
            perturb.parse(bad)


@pytest.mark.parametrize("kind", perturb.KINDS)
def test_a_planted_kind_fails_its_checks_and_leaves_the_others_bitwise(kind):
    clean = run_cell(reference, CELL, RankContext())
    planted = run_cell(perturb.get(f"bf16.{kind}=1024"), CELL, RankContext())
    failed = {tensor_kind(c.name) for c in planted.comparisons if not c.ok}
    assert failed == {kind}, [(c.name, c.ratio) for c in planted.comparisons if not c.ok]
    before = {c.name: c.max_abs for c in clean.comparisons if tensor_kind(c.name) not in (None, kind)}
    after = {c.name: c.max_abs for c in planted.comparisons if tensor_kind(c.name) not in (None, kind)}
    assert before == after


RECIPE_CELL = matrix.Cell.from_id("linear-distributed-hooks_off-fused-bf16-ws1-ddp-mb2-g1-bias-igrad-nodelay-rcurrent")


@pytest.mark.parametrize("kind", ["output", "input_grad", "weight_grad"])
def test_a_planted_kind_under_a_recipe_fails_its_checks_there_only(kind):
    """Under a recipe the entry names the recipe: it fails that kind's checks and no other;
    the same entry without the recipe (cells without one) leaves the recipe cell passing."""
    planted = run_cell(perturb.get(f"current.bf16.{kind}=1024"), RECIPE_CELL, RankContext())
    failed = {tensor_kind(c.name) for c in planted.comparisons if not c.ok}
    assert failed == {kind}, [(c.name, c.ratio) for c in planted.comparisons if not c.ok]
    assert run_cell(perturb.get(f"bf16.{kind}=1024,delayed.bf16.{kind}=1024"), RECIPE_CELL, RankContext()).status == "pass"


def test_another_dtype_is_untouched():
    planted = run_cell(perturb.get("fp32.output=1024,fp16.input_grad=1024"), CELL, RankContext())
    assert planted.status == "pass"


def _result(cell: matrix.Cell, failed_kinds: set[str]) -> CellResult:
    checks = [Check(f"mb0.{k}" if k in ("output", "input_grad") else f"{k.split('_')[0]}0.main_grad",
                    "tensor", k not in failed_kinds, ratio=2.0 if k in failed_kinds else 0.5)
              for k in perturb.KINDS]
    return CellResult(cell.id, cell.serialize(), cell.expect, "fail" if failed_kinds else "pass",
                      ranks=[RankResult(0, "fail" if failed_kinds else "pass", checks)])


def _bisect(cells: list[matrix.Cell], caught_from: dict[str, float]) -> sensitivity.Search:
    """Drive a search whose (bf16) kinds are caught from the given k up, by a fake launcher."""
    search = sensitivity.Search(cells)
    tasks = search.tasks()
    while tasks:
        round_k = perturb.parse(search.backend().removeprefix(sensitivity.BACKEND_PREFIX))
        results = {}
        for t in tasks:
            failed = {kind for (r, d, kind), k in round_k.items()
                      if (r, d) == (t.cell.recipe, t.cell.dtype) and k >= caught_from.get(kind, float("inf"))}
            results[t.key] = _result(t.cell, failed)
        search.observe(results)
        tasks = search.tasks()
    return search


def test_search_brackets_the_threshold_with_two_measured_values():
    cells = [c for c in matrix.select("ci", {"recipe": ["none"]}) if c.dtype == "bf16" and c.hooks == "off"][:6]
    search = _bisect(cells, {"output": 8, "input_grad": 1, "weight_grad": 1024, "bias_grad": 64})
    rows = {r.kind: r for r in search.thresholds([])}
    assert (rows["output"].largest_missed, rows["output"].smallest_caught) == (4, 8)
    assert (rows["input_grad"].largest_missed, rows["input_grad"].smallest_caught) == (None, 1)
    assert (rows["weight_grad"].largest_missed, rows["weight_grad"].smallest_caught) == (512, 1024)
    assert (rows["bias_grad"].largest_missed, rows["bias_grad"].smallest_caught) == (32, 64)
    for r in rows.values():   # both ends of every bracket were measured, not inferred
        assert {r.largest_missed, r.smallest_caught} - {None} <= set(r.tried)
        assert len(r.tried) <= 4


def test_a_probe_below_a_miss_runs_only_the_cells_that_may_catch():
    """Each cell catches ``output`` from its own k up (monotone, as planted errors are): the
    search finds the smallest over the cells, and a probe below a round that caught runs only
    the cells that caught there - the others missed at a larger k, so they miss below it."""
    cells = [c for c in matrix.select("ci", {"recipe": ["none"]}) if c.dtype == "bf16" and c.hooks == "off"][:6]
    own = {c.id: 2.0 ** (3 + i) for i, c in enumerate(cells)}      # 8, 16, 32, 64, 128, 256
    search = sensitivity.Search(cells)
    key = ("none", "bf16", "output")
    ran: list[tuple[float, set[str]]] = []
    tasks = search.tasks()
    while tasks:
        round_k = perturb.parse(search.backend().removeprefix(sensitivity.BACKEND_PREFIX))
        if key in round_k:
            ran.append((round_k[key], {c.id for c in search.candidates(key)}))
        results = {t.key: _result(t.cell, {"output"} if round_k.get(key, 0) >= own[t.cell.id] else set())
                   for t in tasks}
        search.observe(results)
        tasks = search.tasks()
    row = next(r for r in search.thresholds([]) if (r.recipe, r.dtype, r.kind) == key)
    assert (row.largest_missed, row.smallest_caught, row.catching_cell) == (4, 8, cells[0].id)
    assert [k for k, _ in ran] == [32, 4, 8]
    # at 32 every cell ran and the first three caught; at 4 and 8 only those three may catch
    # (the others missed at 32): no other is run for ``output`` below 32
    three = {c.id for c in cells[:3]}
    assert [ids for _, ids in ran] == [set(own), three, three]


def test_a_kind_nothing_catches_fails_the_selftest():
    cells = [c for c in matrix.select("ci", {"recipe": ["none"]}) if c.dtype == "bf16" and c.hooks == "off"][:3]
    search = _bisect(cells, {"output": 2, "input_grad": 2, "weight_grad": 2})   # bias: never
    rows = search.thresholds([])
    blind = [r.kind for r in rows if r.smallest_caught is None]
    assert blind == ["bias_grad"]
    result = SelftestResult([], [], 0.0, {}, rows)
    assert not result.ok and [t.kind for t in result.blind] == ["bias_grad"]
    assert "> 1024" in sensitivity.table(rows)


def test_hooked_cells_only_where_no_hooks_off_cell_has_the_kind_and_never_raising_ones():
    search = sensitivity.Search(matrix.select("ci"))
    assert search.cells and all(c.expect != "error" for c in search.cells)
    for (recipe, dtype, kind), cells in search.cells_for.items():
        hooked = {c.hooks != "off" for c in cells}
        assert len(hooked) == 1 and {(c.recipe, c.dtype) for c in cells} == {(recipe, dtype)}, (recipe, dtype, kind)
        if hooked == {True}:   # ci: fp32 input gradients only under hooks
            assert not any(c.hooks == "off" and c.dtype == dtype and c.recipe == recipe
                           and (kind != "input_grad" or c.input_grad)
                           and (kind != "bias_grad" or c.bias) and c.expect != "error"
                           for c in matrix.select("ci"))
    assert ("none", "fp32", "input_grad") in search.cells_for
    # under a recipe: no bias_grad row (the bias gradient is the unquantized one)
    assert {k for k in search.cells_for if k[0] != "none"} == {
        (r, d, k) for r in recipes.QUANTIZED for d in ("fp32", "bf16", "fp16")
        if not (r in recipes.NO_FP16 and d == "fp16")  # no nvfp4 fp16 cell: TE refuses it
        for k in ("output", "input_grad", "weight_grad")}


def test_margins_cover_every_example(tmp_path, capsys):
    """``report --margins``: the worst ratio per dtype and kind, over the examples a cell ran;
    exit 1 when one is above 1."""
    cell = CELL
    res = _result(cell, set())
    res.example_ratios = {**kind_ratios(res.ranks), "output": 0.93}
    record = RunRecord(status="complete", started="", finished="", duration_s=0.0, command="", argv=[],
                       backend="harness.backends.reference", environment={}, selection={"examples": 4},
                       tolerance={}, world_sizes=[1], cells=[res])
    record.write(tmp_path)
    assert cli.main(["report", str(tmp_path), "--margins"]) == 0
    out = capsys.readouterr().out
    assert "bf16   output              0.93         5" in out and "5 examples over 1 cells" in out
    res.example_ratios["weight_grad"] = 1.5
    record.write(tmp_path)
    assert cli.main(["report", str(tmp_path), "--margins"]) == 1
    assert json.loads(json.dumps(res.serialize()))["example_ratios"]["weight_grad"] == 1.5
