"""The known-defects ledger as a fold over verdicts (CONTRACTS §7), without launching.

What must hold: a cell is ``known`` only when every failing item on every rank matches the
signature of an entry reproducing in it - one unexplained check, a value off by more than the
entry's band, another exception, a consequence without its cause: each keeps it ``fail``; a
harness error is never ``known``; an entry selecting cells that reproduces in none is stale
and fails the gate (but not in a shard); the fold is idempotent; a malformed ledger, or an
entry broader than a signature, is one clear line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from harness.vocabulary import errors as exitcodes, matrix
from harness.judging import ledger
from harness.records.record import Check, CellResult, RankResult
from harness.judging.gate import statuses_exit_code

CELL = matrix.Cell(module="grouped_linear", weight="distributed", hooks="offload", fused=False, dtype="bf16",
                   world_size=2, consumer="ddp", microbatches=2, num_gemms=4, bias=True, input_grad=True,
                   delay_wgrad=False)
OTHER = matrix.Cell(**{**CELL.serialize(), "module": "linear", "num_gemms": 1})


def _entry(id: str = "dtype", cells: str = 'module == "grouped_linear"', checks=("finalize_dtypes",),
           error: tuple[str, str] | None = None, upstream: str = "TE PR #3397 (open)",
           also: tuple[ledger.Symptom, ...] = ()) -> ledger.Entry:
    """An entry whose checks fail with ``_result``'s message and whose exception is ``error``."""
    fails = tuple(ledger.Symptom(check=c, message="expected True, got False$") for c in checks)
    if error:
        fails += (ledger.Symptom(exception=error[0], message=error[1]),)
    return ledger.Entry(id=id, title=id, upstream=upstream, row="unfused wgrad", kind="defect", cells=cells,
                        fails=fails + also)


def _ledger(*entries: ledger.Entry) -> ledger.Ledger:
    return ledger.Ledger("test", "test.toml", "transformer_engine", ">=2.20.2,<2.21", tuple(entries))


def _result(cell: matrix.Cell, failed: tuple[str, ...] = (), error: tuple[str, str] | None = None,
            status: str | None = None, ranks: int = 2) -> CellResult:
    out = []
    for r in range(ranks):
        checks = [Check("mb0.output", "tensor", True)] + [
            Check(n, "flag", False, message=f"{n}: expected True, got False") for n in failed]
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
    assert outcome["stale"] == [] and statuses_exit_code(c.status for c in cells) == exitcodes.OK


def test_one_unexplained_check_keeps_the_cell_failing():
    """A cell with one ledger-explained and one unexplained failing check is ``fail``."""
    cells, outcome = ledger.apply([_result(CELL, ("finalize_dtypes", "leader.finalize_calls"))], _ledger(_entry()))
    assert cells[0].status == "fail" and not cells[0].known
    # the entry still reproduced there: it is not stale
    assert outcome["entries"][0]["reproduced"] == [CELL.id] and outcome["stale"] == []
    assert statuses_exit_code(c.status for c in cells) == exitcodes.MISMATCH


def test_exception_explained_only_by_its_type_and_text():
    err = ("AssertionError", "weight was removed while fuse_wgrad_accumulation=True")
    by_checks = ledger.apply([_result(CELL, error=err)], _ledger(_entry(checks=("weight*.main_grad",))))[0]
    assert by_checks[0].status == "error"
    by_error = ledger.apply([_result(CELL, error=err)], _ledger(_entry(checks=(), error=("AssertionError",
                                                                                         "weight was removed"))))[0]
    assert by_error[0].status == "known" and by_error[0].raw_status == "error"
    other_type = ledger.apply([_result(CELL, error=err)], _ledger(_entry(checks=(), error=("RuntimeError",
                                                                                           "weight was removed"))))[0]
    assert other_type[0].status == "error"


def _value(cell: matrix.Cell, ratio: float, name: str = "weight0.main_grad", modelled: float = 0.05) -> CellResult:
    """A cell whose finalize ran in bf16 and whose ``name`` is off by ``ratio`` times its bound,
    ``modelled`` times its bound from the oracle with the wgrad rounded to bf16."""
    checks = [Check("finalize_dtypes", "dtype", False, message="finalize_dtypes: expected ['float32'], got ['bfloat16']"),
              Check(name, "tensor", False, message="Tensors are not close!", ratio=ratio,
                    models={"wgrad_in_activation_dtype": modelled, "no_gradient": 9e5})]
    return CellResult(cell.id, cell.serialize(), cell.expect, "fail", ranks=[RankResult(0, "fail", checks)])


BF16_WGRAD = _entry(checks=(), also=(
    ledger.Symptom(check="finalize_dtypes", message="got \\['bfloat16'"),
    ledger.Symptom(check="weight*.main_grad", model="wgrad_in_activation_dtype", also=True)))


def test_a_value_failure_is_known_only_as_its_model_predicts():
    """A wgrad rounded to bf16 is the defect; the same wgrad with more damage than that rounding
    (its ratio under the model above 1, e.g. a planted x(1 + 2**-6)) is a regression, and the
    cell's first failure names it with the entry's form."""
    assert ledger.apply([_value(CELL, 2000.0)], _ledger(BF16_WGRAD))[0][0].status == "known"
    far = ledger.apply([_value(CELL, 2000.0, modelled=37.0)], _ledger(BF16_WGRAD))[0][0]
    assert far.status == "fail"
    assert [i.name for i in ledger.unexplained(far, [BF16_WGRAD])] == ["weight0.main_grad"]
    assert far.first_failure.startswith("unexplained by the ledger: rank 0: weight0.main_grad: ")
    assert "wgrad_in_activation_dtype 37" in far.first_failure
    assert 'nearest: dtype { check = "weight*.main_grad", model = "wgrad_in_activation_dtype"' in far.first_failure
    # judged again without the ledger: the backend's own first failure is back
    assert ledger.apply([far], None)[0][0].first_failure == "[rank 0] finalize_dtypes: expected ['float32'], got ['bfloat16']"


def test_a_consequence_alone_is_no_evidence():
    """``also`` symptoms are explained only where the entry reproduces by its evidence."""
    res = _value(CELL, 2000.0)
    res.ranks[0].comparisons[0] = Check("finalize_dtypes", "dtype", True)
    cells, outcome = ledger.apply([res], _ledger(BF16_WGRAD))
    assert cells[0].status == "fail" and outcome["entries"][0]["reproduced"] == []


def test_an_entry_masked_by_another_is_not_stale():
    """Every cell it selects fails earlier (another entry's exception): nothing says it is fixed."""
    err = ("RuntimeError", "GEMM requested the columnwise representation")
    hooks = _entry("hooks", checks=(), error=err)
    cells, outcome = ledger.apply([_result(CELL, error=err)], _ledger(_entry(), hooks))
    assert cells[0].status == "known" and outcome["stale"] == []
    assert [e["verdict"] for e in outcome["entries"]] == [ledger.NOT_EXERCISED, ledger.FAILING]


def test_when_narrows_a_form_to_some_cells():
    fp16_only = _entry(checks=(), also=(ledger.Symptom(check="finalize_dtypes", message="got \\['bfloat16'",
                                                       when='dtype == "fp16"'),))
    assert ledger.apply([_value(CELL, 2000.0)], _ledger(fp16_only))[0][0].status == "fail"


def test_an_exception_with_generic_text_is_pinned_by_its_frame():
    err = {"type": "AttributeError", "message": "'NoneType' object has no attribute 'size'",
           "traceback": 'Traceback (most recent call last):\n  File "/x/transformer_engine/pytorch/module/'
                        'grouped_linear.py", line 1413, in backward\n    *weights[0].size(),\n'}
    res = CellResult(CELL.id, CELL.serialize(), CELL.expect, "error", ranks=[RankResult(
        0, "error", [Check("exception", "exception", False, message=f"AttributeError: {err['message']}")], err)])
    pinned = _entry(checks=(), also=(ledger.Symptom(exception="AttributeError", message=err["message"],
                                                    at="module/grouped_linear.py:backward"),))
    assert ledger.apply([res], _ledger(pinned))[0][0].status == "known"
    elsewhere = _entry(checks=(), also=(ledger.Symptom(exception="AttributeError", message=err["message"],
                                                       at="module/linear.py:backward"),))
    assert ledger.apply([res], _ledger(elsewhere))[0][0].status == "error"
    with pytest.raises(ledger.LedgerError, match="text is Python's, not TE's: pin the frame"):
        _entry(checks=(), error=("AttributeError", "'NoneType' object has no attribute"))


def test_another_exception_in_a_must_raise_cell_is_not_the_known_one():
    """A must-raise cell whose backend raised something else: exception_names_both quotes it."""
    cell = matrix.Cell(**{**CELL.serialize(), "delay_wgrad": True})
    entry = _entry(cells="delay_wgrad", checks=(), also=(ledger.Symptom(
        check="exception_names_both", message="\\(raised RuntimeError: attempting to assign a gradient"),))

    def raised(text: str) -> CellResult:
        rank = RankResult(0, "fail", [Check("exception_names_both", "exception", False,
                                            message=f"exception_names_both: expected True, got False (raised {text})")],
                          {"type": text.split(":")[0], "message": text.split(": ", 1)[1], "traceback": ""})
        return CellResult(cell.id, cell.serialize(), cell.expect, "fail", ranks=[rank])

    known = raised("RuntimeError: attempting to assign a gradient of size '[30, 24]'")
    assert ledger.apply([known], _ledger(entry))[0][0].status == "known"
    assert ledger.apply([raised("ValueError: planted")], _ledger(entry))[0][0].status == "fail"


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
    assert statuses_exit_code([c.status for c in cells], True) == exitcodes.MISMATCH
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
                                  Check("collectives_before_error", "count", False, expected=0, actual=2,
                                        message="collectives_before_error: expected 0, got 2")],
                      {"type": "AssertionError", "message": "delayed wgrad unsupported", "traceback": ""})
    res = CellResult(cell.id, cell.serialize(), cell.expect, "fail", ranks=[rank])
    assert [i.name for i in ledger.failing_items(res)] == ["collectives_before_error"]
    entry = _entry(cells="delay_wgrad", checks=(), also=(
        ledger.Symptom(check="collectives_before_error", message="expected 0, got [1-9]"),))
    cells, _ = ledger.apply([res], _ledger(entry))
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
fails = [{ check = "finalize_dtypes", message = "got \\\\['bfloat16'" }]
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


FAILS = 'fails = [{ check = "finalize_dtypes", message = "got \\\\[\'bfloat16\'" }]'


def _fails(text: str) -> "Callable[[str], str]":
    return lambda t: t.replace(FAILS, f"fails = [{text}]")


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace('kind = "defect"', 'kind = "bug"'), "kind='bug'"),
    (lambda t: t.replace('upstream = "unreported"', 'upstream = "#3545"'), "upstream='#3545'"),
    (lambda t: t.replace("cells = 'not fused'", "cells = 'modul == 1'"), "Unknown name 'modul'"),
    (lambda t: t.replace(FAILS, ''), "lacks fails"),
    (lambda t: t.replace(FAILS, 'checks = ["finalize_dtypes"]'), "state its signature as fails"),
    (lambda t: t.replace('kind = "defect"', 'kind = "defect"\nseverity = 3'), "unknown key(s) ['severity']"),
    (lambda t: t + t[t.index("[[entry]]"):], "duplicate entry id(s) ['dtype']"),
    (lambda t: t.replace('">=2.20.2,<2.21"', '"two twenty"'), "is no version range"),
    (lambda t: t.replace("[[entry]]", "[[entry]"), "not valid TOML"),
    # broader than a signature
    (_fails('{ check = "*", message = "expected 2, got 0$" }'), "broader than a check name"),
    (_fails('{ check = "exception", message = "boom here, at length" }'), "state its type and message"),
    (_fails('{ exception = "RuntimeError" }'), "needs a message pattern"),
    (_fails('{ check = "weight*.main_grad" }'), "needs exactly one form of its failure"),
    (_fails('{ check = "weight*.main_grad", model = "no_gradient", ratio = [100, 1000] }'),
     "not ratio and model"),
    (_fails('{ check = "finalize_dtypes", message = "got 0$", also = true }'), "no symptom that is evidence"),
    (_fails('{ check = "finalize_dtypes", message = "(unclosed" }'), "message pattern"),
    (_fails('{ check = "finalize_dtypes", message = "got 0$", when = "modul" }'), "when:"),
    (_fails('{ exception = "Bad Type", message = "boom here, at length" }'), "exception type name"),
    (_fails('{ exception = "AttributeError", message = "no attribute named x", at = "linear" }'), "file.py:function"),
    (_fails('{ exception = "RuntimeError", message = "GEMM requested the columnwise", ratio = [10, 100] }'),
     "an exception has no ratio or model"),
    (_fails('{ check = "weight*.main_grad", model = "wgrad_rounded_twice" }'), "is no defect model"),
    (_fails('{ check = "mb*.output", model = "wgrad_in_activation_dtype" }'), "predicts weight*.main_grad, not mb*.output"),
])
def test_a_malformed_ledger_is_one_clear_line(tmp_path, edit, says):
    with pytest.raises(ledger.LedgerError) as e:
        ledger.load(_write(tmp_path, edit(GOOD)))
    assert says in str(e.value) and "\n" not in str(e.value).strip()


# ---- the validator's rules (docs/ledgers.md "What the validator refuses"), one test each ----

@pytest.mark.parametrize("symptom, says", [
    # a message pattern carries at least 12 literal characters of the text it matches...
    ('{ check = "finalize_dtypes", message = "the" }', "carries 3 literal character(s)"),
    ('{ exception = "RuntimeError", message = "shape" }', "carries 5 literal character(s)"),
    ('{ exception = "RuntimeError", message = ".{60}" }', "carries 0 literal character(s)"),
    ('{ check = "finalize_dtypes", message = "GEMM requested the columnwise|got" }', "carries 3 literal character(s)"),
    # ... or is an exact form of an exact check name
    ('{ check = "wei*", message = "got" }', "carries 3 literal character(s)"),
    ('{ check = "weight*.grad_buffer_calls", message = "got 0$" }', "carries 5 literal character(s)"),
    # a band starts at least 10x above the bound and spans at most one decade
    ('{ check = "weight*.main_grad", ratio = [1, 1000] }', "must start at least 10x above the bound"),
    ('{ check = "weight*.main_grad", ratio = [300, 30000] }', "span at most one decade"),
    ('{ check = "weight*.main_grad", ratio = [3, 30] }', "must start at least 10x above the bound"),
    # a must-raise check's form states the exception raised: its type and TE's text
    ('{ check = "exception_names_both", message = "expected True, got False" }', "states the exception raised"),
    ('{ check = "exception_names_both", message = "\\\\(raised RuntimeError: \\\\w+" }', "states the exception raised"),
    ('{ check = "expected_exception", message = "must raise before any collective" }', "states the exception raised"),
    # Python's own error types pin their frame
    ('{ exception = "AttributeError", message = "\'NoneType\' object has no attribute \'size\'" }',
     "text is Python's, not TE's"),
    ('{ check = "exception_names_both", message = "\\\\(raised TypeError: unsupported operand type" }',
     "text is Python's, not TE's"),
])
def test_the_validator_refuses_by_rule_with_one_line(tmp_path, symptom, says):
    with pytest.raises(ledger.LedgerError) as e:
        ledger.load(_write(tmp_path, _fails(symptom)(GOOD)))
    assert says in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)


@pytest.mark.parametrize("cells", ["True", "world_size >= 1", "fused or not fused", 'module != "nothing" or bias'])
def test_cells_must_restrict_something(tmp_path, cells):
    text = GOOD.replace("cells = 'not fused'", f"cells = '{cells}'")
    if "nothing" in cells:
        with pytest.raises(ledger.LedgerError, match="Unknown value 'nothing'"):
            ledger.load(_write(tmp_path, text))
        return
    with pytest.raises(ledger.LedgerError, match="selects every cell of the full matrix"):
        ledger.load(_write(tmp_path, text))


@pytest.mark.parametrize("symptom", [
    '{ check = "leader.finalize_calls", message = "got 0$" }',                     # exact name, exact form
    '{ check = "weight*.grad_buffer_calls", message = "expected \\\\d+, got 0$" }',   # 16 literal characters
    '{ check = "weight*.main_grad", model = "wgrad_in_activation_dtype" }',
    '{ check = "weight*.main_grad", ratio = [3000, 30000] }',
    '{ check = "expected_exception", message = "but the step ran$" }',
    '{ check = "exception_names_both", message = "\\\\(raised RuntimeError: attempting to assign a gradient" }',
    '{ check = "exception_names_both", message = "\\\\(raised AttributeError: \'Tensor\' object has no '
    'attribute \'main_grad\'", at = "module/grouped_linear.py:<lambda>" }',
])
def test_the_validator_accepts_what_the_rules_allow(tmp_path, symptom):
    assert ledger.load(_write(tmp_path, _fails(symptom)(GOOD))).entries


def test_choose_picks_the_shipped_ledger_by_upstream_version(tmp_path):
    te = ledger.choose("auto", "transformer_engine", "2.20.2")
    assert te is not None and Path(te.path).parent == ledger.LEDGER_DIR and te.entries
    assert ledger.choose("auto", "transformer_engine", "2.21.0") is None
    assert ledger.choose("auto", None, None) is None                 # the reference backend
    assert ledger.choose("none", "transformer_engine", "2.20.2") is None
    assert ledger.choose(str(_write(tmp_path, GOOD)), None, None).entries[0].id == "dtype"
    with pytest.raises(ledger.LedgerError, match="cannot read ledger"):
        ledger.choose(str(tmp_path / "missing.toml"), None, None)


def test_a_records_ledger_from_before_the_rules_still_reads_and_judges():
    """A run record keeps the ledger that judged it; one written before a rule (a three-decade
    band, a short pattern) is read back as it was (reports, review, merge), not refused."""
    old = {"id": "dtype", "title": "t", "upstream": "unreported", "row": "r", "kind": "defect",
           "cells": 'module == "grouped_linear"', "fails": [
               {"check": "finalize_dtypes", "message": "got \\['b"},
               {"check": "weight*.main_grad", "ratio": [300, 30000], "also": True}]}
    with pytest.raises(ledger.LedgerError):
        ledger.Entry.from_dict(old)
    led = ledger.Ledger.from_dict({"name": "old", "path": "old.toml", "package": None, "versions": None,
                                   "entries": [old]})
    res = _value(CELL, 2000.0)
    res.ranks[0].comparisons[1].models = None  # an older record: no model ratios
    assert ledger.apply([res], led)[0][0].status == "known"


def test_every_entry_of_a_shipped_ledger_selects_a_ci_cell():
    """The gate (``--preset ci``; Megatron's weight: ``--weights megatron`` and
    ``megatron_fp8``) exercises every entry: a fix that broke an entry's cells cannot pass it
    unseen (matrix.py's (n) and (d) give ``ci`` the interactions beyond pairs that entries name)."""
    ci = [c.serialize() for c in matrix.select("ci") + matrix.select("ci", {"weight": ["megatron"]})
          + matrix.select("ci", {"weight": ["megatron_fp8"]})]
    for led in ledger.shipped():
        idle = [e.id for e in led.entries if not any(e.selects(c) for c in ci)]
        assert idle == [], f"{led.path}: no ci cell selected by {idle}"


def test_every_shipped_ledger_is_well_formed():
    shipped = ledger.shipped()
    assert shipped, "no ledger is shipped"
    for led in shipped:
        assert led.package and led.versions and led.entries, led.path
        for e in led.entries:
            assert e.where and e.contract and e.contract.startswith("CONTRACTS §"), e.id


# ---- a change under review (sweep --fixes) ----------------------------------------------

def _reviewed(cells: list[CellResult], *entries: ledger.Entry, required=("dtype",)) -> "review.Review":
    from harness.judging import review

    judged, outcome = ledger.apply(cells, _ledger(*entries), required=list(required))
    rev = review.review({"ledger": outcome, "cells": [c.serialize() for c in judged]})
    assert rev is not None
    return rev


def test_review_is_green_when_the_required_entry_is_fixed_and_nothing_regressed():
    from harness.judging import review

    rev = _reviewed([_result(CELL), _result(OTHER)], _entry(), _entry("other", cells='module == "linear"'))
    assert [(e.id, e.verdict, e.required) for e in rev.entries] == [
        ("dtype", review.FIXED, True), ("other", review.FIXED, False)]
    assert rev.green and rev.reasons() == []
    # under review an entry fixed here is the news, never stale
    _, outcome = ledger.apply([_result(CELL)], _ledger(_entry()), required=["dtype"])
    assert outcome["stale"] == [] and outcome["unfixed"] == []


def test_review_is_red_naming_the_entry_still_failing_and_every_regression():
    from harness.judging import review

    rev = _reviewed([_result(CELL, ("finalize_dtypes",)), _result(OTHER, ("leader.finalize_calls",))], _entry())
    assert [e.verdict for e in rev.entries] == [review.FAILING] and not rev.green
    assert rev.unfixed_ids == ["dtype"]
    reasons = rev.reasons()
    assert reasons[0].startswith("ledger entry dtype must be fixed by this change but is still failing")
    assert [r.cell for r in rev.regressions] == [OTHER.id]
    assert "leader.finalize_calls" in rev.regressions[0].failures[0]
    assert statuses_exit_code(["known", "fail"], True) == exitcodes.MISMATCH


def test_a_required_entry_that_no_cell_selects_is_not_proven_fixed():
    from harness.judging import review

    rev = _reviewed([_result(OTHER)], _entry())
    assert rev.entries[0].verdict == review.NOT_EXERCISED and not rev.green


def test_fixes_names_entries_by_id_glob_or_all():
    from harness.judging import review

    led = _ledger(_entry(), _entry("dtype-linear"), _entry("buffer"))
    assert review.required_entries(["dtype*"], led) == ["dtype", "dtype-linear"]
    assert review.required_entries(["all"], led) == ["dtype", "dtype-linear", "buffer"]
    with pytest.raises(review.ReviewError, match="names no entry"):
        review.required_entries(["nope"], led)


def test_a_path_not_taken_cell_is_never_met_known_or_a_regression():
    """TE ran another path than the cell names: its checks say nothing of the entry's path. An
    entry whose cells all did so is not exercised (never fixed here, never stale); a required
    one keeps the review red, quoting TE's reason; the cell itself fails no gate."""
    from harness.judging import review
    from harness.vocabulary.status import PATH_NOT_TAKEN

    why = "TE chose the split-quantize path: cuBLASLt 12.9.1 < 13.3 required for the grouped GEMM"
    other_path = _result(CELL, ("finalize_dtypes",), status=PATH_NOT_TAKEN)  # even with a failure of the entry's form
    other_path.first_failure = f"[rank 0] {why}"
    cells, outcome = ledger.apply([other_path], _ledger(_entry()))
    assert cells[0].status == PATH_NOT_TAKEN and cells[0].known is None
    (e,) = outcome["entries"]
    assert e["verdict"] == ledger.NOT_EXERCISED and e["path_not_taken"] == [CELL.id] and not e["reproduced"]
    assert outcome["stale"] == [] and statuses_exit_code([PATH_NOT_TAKEN]) == exitcodes.OK

    rev = _reviewed([other_path], _entry())
    assert rev.entries[0].verdict == review.NOT_EXERCISED and rev.entries[0].path_not_taken == 1
    assert not rev.green and rev.regressions == []
    assert rev.reasons() == [f"ledger entry dtype must be fixed by this change but is not exercised (its 1 of 1 "
                             f"cell(s) took another TE path than they name: {why})"]
    # one cell of the entry met its expectation elsewhere: fixed here, the other path aside
    rev = _reviewed([other_path, _result(matrix.Cell(**{**CELL.serialize(), "hooks": "off"}))], _entry())
    assert rev.entries[0].verdict == review.FIXED and rev.green
