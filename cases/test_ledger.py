"""The known-defects ledger as a fold over verdicts (CONTRACTS §7), without launching.

What must hold: a cell is ``known`` only when every failing item on every rank is explained
by an entry selecting it - one unexplained check keeps it ``fail``; a harness error is never
``known``; an entry selecting cells that reproduces in none is stale and fails the gate (but
not in a shard); the fold is idempotent; a malformed ledger is one clear line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import exitcodes, ledger, matrix
from harness.record import Check, CellResult, RankResult
from harness.status import run_exit_code

CELL = matrix.Cell(module="grouped_linear", weight="distributed", hooks="offload", fused=False, dtype="bf16",
                   world_size=2, consumer="ddp", microbatches=2, num_gemms=4, bias=True, input_grad=True,
                   delay_wgrad=False)
OTHER = matrix.Cell(**{**CELL.serialize(), "module": "linear", "num_gemms": 1})


def _entry(id: str = "dtype", cells: str = 'module == "grouped_linear"', checks=("finalize_dtypes",),
           error: str | None = None, upstream: str = "TE PR #3397 (open)") -> ledger.Entry:
    return ledger.Entry(id=id, title=id, upstream=upstream, row="unfused wgrad", kind="defect", cells=cells,
                        checks=tuple(checks), error=error)


def _ledger(*entries: ledger.Entry) -> ledger.Ledger:
    return ledger.Ledger("test", "test.toml", "transformer_engine", ">=2.20.2,<2.21", tuple(entries))


def _result(cell: matrix.Cell, failed: tuple[str, ...] = (), error: tuple[str, str] | None = None,
            status: str | None = None, ranks: int = 2) -> CellResult:
    out = []
    for r in range(ranks):
        checks = [Check("mb0.output", "tensor", True)] + [Check(n, "flag", False, message=f"{n} off") for n in failed]
        err = {"type": error[0], "message": error[1], "traceback": ""} if error else None
        if err:
            checks.append(Check("exception", "exception", False, message=f"{error[0]}: {error[1]}"))
        rank_status = status or ("error" if error else "fail" if failed else "pass")
        out.append(RankResult(r, rank_status, checks, err))
    st = status or ("error" if error else "fail" if failed else "pass")
    return CellResult(cell.id, cell.serialize(), cell.expect, st, ranks=out, first_failure="x" if st != "pass" else None)


def test_every_failure_explained_is_known():
    cells, outcome = ledger.apply([_result(CELL, ("finalize_dtypes", "weight0.main_grad"))],
                                  _ledger(_entry(checks=("finalize_dtypes", "weight*.main_grad"))))
    assert cells[0].status == "known" and cells[0].known == ["dtype"] and cells[0].raw_status == "fail"
    e = outcome["entries"][0]
    assert (e["selected"], e["reproduced"], e["known_cells"], e["stale"]) == ([CELL.id], [CELL.id], [CELL.id], False)
    assert outcome["stale"] == [] and run_exit_code(c.status for c in cells) == exitcodes.OK


def test_one_unexplained_check_keeps_the_cell_failing():
    """A cell with one ledger-explained and one unexplained failing check is ``fail``."""
    cells, outcome = ledger.apply([_result(CELL, ("finalize_dtypes", "leader.finalize_calls"))], _ledger(_entry()))
    assert cells[0].status == "fail" and not cells[0].known
    # the entry still reproduced there: it is not stale
    assert outcome["entries"][0]["reproduced"] == [CELL.id] and outcome["stale"] == []
    assert run_exit_code(c.status for c in cells) == exitcodes.MISMATCH


def test_exception_explained_only_by_an_error_pattern():
    err = ("AssertionError", "weight was removed while fuse_wgrad_accumulation=True")
    by_checks = ledger.apply([_result(CELL, error=err)], _ledger(_entry(checks=("weight*.main_grad",))))[0]
    assert by_checks[0].status == "error"
    by_error = ledger.apply([_result(CELL, error=err)], _ledger(_entry(checks=(), error="weight was removed")))[0]
    assert by_error[0].status == "known" and by_error[0].raw_status == "error"


def test_entries_explain_only_the_cells_they_select():
    res = _result(OTHER, ("finalize_dtypes",))
    cells, outcome = ledger.apply([res], _ledger(_entry()))
    assert cells[0].status == "fail"
    assert outcome["entries"][0]["selected"] == []
    assert outcome["stale"] == []          # selecting no cell of a run is not stale


def test_two_entries_together_explain_a_cell():
    res = _result(CELL, ("finalize_dtypes", "weight0.grad_buffer_calls"))
    cells, _ = ledger.apply([res], _ledger(_entry(), _entry("buffer", checks=("weight*.grad_buffer_calls",))))
    assert cells[0].status == "known" and cells[0].known == ["dtype", "buffer"]


def test_stale_entry_fails_the_gate():
    cells, outcome = ledger.apply([_result(CELL)], _ledger(_entry()))
    assert cells[0].status == "pass"
    assert outcome["stale"] == ["dtype"] and outcome["entries"][0]["stale"]
    assert run_exit_code([c.status for c in cells], stale=True) == exitcodes.MISMATCH
    msg = ledger.stale_message("dtype", outcome)
    assert "dtype" in msg and "no longer reproduces" in msg and "delete it" in msg and "test.toml" in msg


def test_a_shard_does_not_judge_staleness():
    _, outcome = ledger.apply([_result(CELL)], _ledger(_entry()), judge_stale=False)
    assert outcome["stale"] == [] and outcome["judged_stale"] is False


def test_harness_errors_and_good_cells_are_never_relabelled():
    bug = _result(CELL, ("finalize_dtypes",), status="harness_error")
    cells, _ = ledger.apply([bug, _result(CELL)], _ledger(_entry()))
    assert [c.status for c in cells] == ["harness_error", "pass"]


def test_the_fold_is_idempotent_and_forgets_a_removed_entry():
    res = _result(CELL, ("finalize_dtypes",))
    once, _ = ledger.apply([res], _ledger(_entry()))
    twice, _ = ledger.apply(once, _ledger(_entry()))
    assert twice[0].status == "known" and twice[0].raw_status == "fail"
    without, _ = ledger.apply(twice, None)
    assert without[0].status == "fail" and without[0].known is None and without[0].raw_status is None
    assert CellResult.from_dict(twice[0].serialize()) == twice[0]


def test_a_must_raise_cell_is_judged_by_its_checks_not_its_exception():
    """Delayed wgrad + distributed weight must raise (§2): the raising itself is no failure."""
    cell = matrix.Cell(**{**CELL.serialize(), "delay_wgrad": True})
    rank = RankResult(0, "fail", [Check("exception_names_both", "exception", True),
                                  Check("collectives_before_error", "count", False, expected=0, actual=2)],
                      {"type": "AssertionError", "message": "delayed wgrad unsupported", "traceback": ""})
    res = CellResult(cell.id, cell.serialize(), cell.expect, "fail", ranks=[rank])
    assert [n for _, n, _ in ledger.failing_items(res)] == ["collectives_before_error"]
    cells, _ = ledger.apply([res], _ledger(_entry(cells="delay_wgrad", checks=("collectives_before_error",))))
    assert cells[0].status == "known"


# ---- files -----------------------------------------------------------------------------

GOOD = '''
[ledger]
package = "transformer_engine"
versions = ">=2.20.2,<2.21"

[[entry]]
id = "dtype"
title = "wgrad in the activation dtype"
upstream = "unreported"
row = "unfused wgrad"
kind = "defect"
cells = 'not fused'
checks = ["finalize_dtypes"]
'''


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ledger.toml"
    path.write_text(text)
    return path


def test_a_ledger_file_loads(tmp_path):
    led = ledger.load(_write(tmp_path, GOOD))
    assert [e.id for e in led.entries] == ["dtype"] and led.covers("transformer_engine", "2.20.2")
    assert not led.covers("transformer_engine", "2.21.0") and not led.covers(None, None)
    assert ledger.Ledger.from_dict(ledger.apply([], led)[1]) == led


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace('kind = "defect"', 'kind = "bug"'), "kind='bug'"),
    (lambda t: t.replace('upstream = "unreported"', 'upstream = "#3545"'), "upstream='#3545'"),
    (lambda t: t.replace("cells = 'not fused'", "cells = 'modul == 1'"), "Unknown name 'modul'"),
    (lambda t: t.replace('checks = ["finalize_dtypes"]', ''), "names neither checks nor an error pattern"),
    (lambda t: t.replace('"finalize_dtypes"', '"exception"'), "give an error pattern"),
    (lambda t: t.replace('kind = "defect"', 'kind = "defect"\nseverity = 3'), "unknown key(s) ['severity']"),
    (lambda t: t + t[t.index("[[entry]]"):], "duplicate entry id(s) ['dtype']"),
    (lambda t: t.replace('">=2.20.2,<2.21"', '"two twenty"'), "is no version range"),
    (lambda t: t.replace("[[entry]]", "[[entry]"), "not valid TOML"),
    (lambda t: t.replace('checks = ["finalize_dtypes"]', "error = '(unclosed'"), "error pattern"),
])
def test_a_malformed_ledger_is_one_clear_line(tmp_path, edit, says):
    with pytest.raises(ledger.LedgerError) as e:
        ledger.load(_write(tmp_path, edit(GOOD)))
    assert says in str(e.value) and "\n" not in str(e.value).strip()


def test_choose_picks_the_shipped_ledger_by_upstream_version(tmp_path):
    te = ledger.choose("auto", "transformer_engine", "2.20.2")
    assert te is not None and Path(te.path).parent == ledger.LEDGER_DIR and te.entries
    assert ledger.choose("auto", "transformer_engine", "2.21.0") is None
    assert ledger.choose("auto", None, None) is None                 # the reference backend
    assert ledger.choose("none", "transformer_engine", "2.20.2") is None
    assert ledger.choose(str(_write(tmp_path, GOOD)), None, None).entries[0].id == "dtype"
    with pytest.raises(ledger.LedgerError, match="cannot read ledger"):
        ledger.choose(str(tmp_path / "missing.toml"), None, None)


def test_every_shipped_ledger_is_well_formed():
    shipped = ledger.shipped()
    assert shipped, "no ledger is shipped"
    for led in shipped:
        assert led.package and led.versions and led.entries, led.path
        for e in led.entries:
            assert e.where and e.contract and e.contract.startswith("CONTRACTS §"), e.id
