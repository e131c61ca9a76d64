"""A GREEN is always earned, and no result is lost: each way a review could be green without
judging the code, or a run could lose or misstate its verdicts, built and shown to come out red
or refused (docs/reviewing-te.md, "When a review is not GREEN").

The reviews here judge the reference backend under a ledger whose one entry it fixes (the
follower-materialize fault of a mutant, which the reference does not have): GREEN on a whole
run, never on a shard or an unfinished one. TE's own code under review is
``cases/test_review_te.py``'s; a tree's commit across ``--resume`` is ``cases/test_te_tree.py``'s.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.vocabulary import errors as exitcodes
from harness.judging import gate
from harness.records import recordfile
from harness.cell import rejection
from harness.vocabulary.matrix import Cell
from harness.records.record import RankResult
from harness.judging.review import review
from harness.vocabulary.status import BY_NAME, SEVERITY, STATUSES
from harness.records.fold import cell_status

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ('[[entry]]\nid = "followers-forward"\ntitle = "followers materialize"\nupstream = "unreported"\n'
         'row = "planted"\nkind = "defect"\ncells = \'module == "grouped_linear"\'\n'
         'fails = [{ check = "followers.materialize_forward_calls", message = "expected 0, got [1-9]" }]\n'
         'where = "harness/backends/reference/mutants.py"\ncontract = "CONTRACTS §2: on the leader only"\n')
#: four grouped cells the reference passes (two world sizes so that two shards hold two each)
SELECTION = ["--preset", "full", "--modules", "grouped_linear", "--weights", "distributed", "--hooks", "off",
             "--fused", "on", "--dtypes", "fp32,bf16", "--world-sizes", "1,2", "--consumers", "ddp",
             "--microbatches", "1", "--num-gemms", "2", "--bias", "on", "--input-grad", "on", "--delay-wgrad", "off",
             "--recipes", "none", "--first-microbatch", "off"]
ONE_CELL = "grouped_linear-distributed-hooks_off-fused-fp32-ws1-ddp-mb1-g2-bias-igrad-nodelay"
ONE = [*SELECTION, "--cells", ONE_CELL]


def _harness(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("earned") / "ledger.toml"
    path.write_text(ENTRY)
    return path


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, ledger_file: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The whole selection reviewed: GREEN (the control every hollow case is measured against)."""
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = _harness("sweep", *SELECTION, "--ledger", str(ledger_file), "--fixes", "followers-forward",
                    "--out", str(out), "--quiet")
    return out, proc


def test_the_whole_selection_reviewed_is_green(whole):
    out, proc = whole
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "review GREEN: 1 of 1 required entries fixed here, 0 regression(s)" in proc.stdout


# ---- a tree that never runs -------------------------------------------------------------------
def test_a_tree_the_backend_never_imports_is_refused_before_any_run(tmp_path: Path):
    """``--te-tree`` with the reference backend: the tree's code would never run (here it raises
    on import, and nothing notices): exit 2, one line naming the fix, no run folder."""
    tree = tmp_path / "te"
    (tree / "transformer_engine" / "pytorch").mkdir(parents=True)
    (tree / "transformer_engine" / "__init__.py").write_text("")
    (tree / "transformer_engine" / "pytorch" / "__init__.py").write_text("raise RuntimeError('broken tree')\n")
    out = tmp_path / "run"
    proc = _harness("sweep", "--te-tree", str(tree), "--ledger", str(ROOT / "harness/judging/ledgers/transformer_engine-2.20.toml"),
                    "--fixes", "hooks-strip-distributed-weight",
                    "--cells", "linear-distributed-hooks_identity-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay",
                    "--out", str(out))
    assert proc.returncode == exitcodes.BAD_INPUT, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not import TransformerEngine" in lines[0], proc.stderr
    assert "--backend te-cpu" in lines[0] and "GREEN" not in proc.stdout
    assert not out.exists()


# ---- a review of part of the selection --------------------------------------------------------
def test_a_shard_is_never_green(tmp_path: Path, ledger_file: Path):
    proc = _harness("sweep", *SELECTION, "--ledger", str(ledger_file), "--fixes", "followers-forward",
                    "--shard", "1/2", "--out", str(tmp_path / "s1"), "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]  # nothing failed in it
    assert "GREEN" not in proc.stdout
    assert "review INCOMPLETE: " in proc.stdout and "merge all 2 shards" in proc.stdout
    summary = (tmp_path / "s1" / "summary.md").read_text()
    assert "Review: INCOMPLETE" in summary and "GREEN" not in summary


def test_an_unfinished_run_is_never_green(whole):
    """An interrupted run's record (cells without a verdict, ``incomplete``): the same review
    that is GREEN on the whole record is not GREEN on it, and says why."""
    out, _ = whole
    record = recordfile.read(out)
    assert review(record).green
    unfinished = {**record, "status": "incomplete",
                  "cells": [record["cells"][0]] + [{**c, "status": "skipped", "ranks": []} for c in record["cells"][1:]]}
    rev = review(unfinished)
    assert not rev.green and rev.word == "INCOMPLETE"
    assert any("3 of 4 cell(s) have no verdict" in r for r in rev.reasons())
    assert gate.word(unfinished) == "INCOMPLETE"


@pytest.mark.parametrize("fixes", ["", ","])
def test_fixes_naming_nothing_is_bad_input(tmp_path: Path, ledger_file: Path, fixes: str):
    proc = _harness("sweep", *ONE, "--ledger", str(ledger_file),
                    "--fixes", fixes, "--out", str(tmp_path / "run"))
    assert proc.returncode == exitcodes.BAD_INPUT, proc.stdout + proc.stderr
    assert "--fixes names no entry" in proc.stderr and not (tmp_path / "run").exists()


def test_a_mistyped_entry_or_backend_gets_a_did_you_mean(tmp_path: Path, ledger_file: Path):
    proc = _harness("sweep", *ONE, "--ledger", str(ledger_file),
                    "--fixes", "followers-froward", "--out", str(tmp_path / "a"))
    assert proc.returncode == exitcodes.BAD_INPUT and "did you mean followers-forward?" in proc.stderr
    proc = _harness("sweep", *ONE, "--backend", "te_cpu", "--out", str(tmp_path / "b"))
    assert proc.returncode == exitcodes.BAD_INPUT and "did you mean --backend te-cpu?" in proc.stderr


# ---- nothing lost -----------------------------------------------------------------------------
def test_out_onto_a_run_is_refused_and_the_old_record_stays(whole, tmp_path: Path):
    out, _ = whole
    before = (out / "results.json.gz").read_bytes()
    proc = _harness("sweep", *ONE, "--out", str(out))
    assert proc.returncode == exitcodes.BAD_INPUT, proc.stdout + proc.stderr
    assert "already holds a run" in proc.stderr and "--resume" in proc.stderr and "--force" in proc.stderr
    assert (out / "results.json.gz").read_bytes() == before
    # --force replaces it: the new record holds only the new selection
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json.gz").write_bytes(before)
    proc = _harness("sweep", *ONE, "--out", str(copy), "--force", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c["id"] for c in recordfile.read(copy)["cells"]] == [ONE_CELL]


def test_resume_with_selection_options_is_refused_naming_them(whole):
    out, _ = whole
    proc = _harness("sweep", "--resume", str(out), "--preset", "smoke", "--dtypes", "bf16")
    assert proc.returncode == exitcodes.BAD_INPUT, proc.stdout + proc.stderr
    assert "drop --preset, --dtypes" in proc.stderr


# ---- what raised in a must-raise cell -------------------------------------------------------
def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 (the test wants whatever it raised)
        return exc
    raise AssertionError("did not raise")


def _deliberate():
    raise RuntimeError("delay_wgrad_compute=True is not supported with a DistributedWeight")


def _asserted():
    assert False, "delayed wgrad unsupported with distributed weights."  # noqa: B011


def _broken_check():
    check_delay_wgrad_distributed()  # noqa: F821 (the planted broken helper)


def _wrong_call():
    sorted(1, 2, 3)  # a TypeError from a call


def test_a_rejection_is_a_raise_or_assert_in_the_backend_s_own_source():
    here = (Path(__file__).resolve().parent,)
    assert rejection.judge(_raised(_deliberate), here) is None
    assert rejection.judge(_raised(_asserted), here) is None
    why = rejection.judge(_raised(_broken_check), here)
    assert why and "NameError" in why and "programming error" in why
    why = rejection.judge(_raised(_wrong_call), here)
    assert why and "TypeError" in why and "from a call" in why
    # the same deliberate raise, but the backend's code lives elsewhere: not its rejection
    why = rejection.judge(_raised(_deliberate), (ROOT / "harness" / "reference",))
    assert why and "outside the backend's own source" in why
    # raised by torch under a call in the backend's code: the calling line is no raise
    import torch

    why = rejection.judge(_raised(lambda: torch.ones(2, 3) @ torch.ones(2, 3)), here)
    assert why and "from a call" in why


# ---- one severity order, one gate -------------------------------------------------------------
def test_a_cell_s_ranks_fold_by_the_status_table_s_severity():
    bad = [s for s in SEVERITY if BY_NAME[s].bad]
    assert bad == ["harness_error", "timeout", "error", "fail"]
    for i, worse in enumerate(bad):
        for better in bad[i:] + ["pass", "xfail"]:
            ranks = [RankResult(0, better), RankResult(1, worse)]
            assert cell_status(ranks) == worse, (worse, better)
    assert cell_status([RankResult(0, "pass"), RankResult(1, "xfail")]) == "fail"
    # TE ran another path than the cell names: no verdict on that path, whatever else a rank saw
    assert cell_status([RankResult(0, "path_not_taken"), RankResult(1, "fail")]) == "path_not_taken"
    assert cell_status([RankResult(0, "path_not_taken"), RankResult(1, "harness_error")]) == "harness_error"
    for s in STATUSES:
        if BY_NAME[s].good:
            assert cell_status([RankResult(0, s), RankResult(1, s)]) == s


def test_the_report_word_and_the_exit_code_are_one_rule():
    cell = Cell.from_id(ONE_CELL)
    for s in STATUSES:
        for stale in (False, True):
            record = {"status": "complete", "cells": [{"id": cell.id, "status": s}],
                      "ledger": {"stale": ["x"] if stale else [], "entries": []}}
            code = gate.exit_code(record)
            assert gate.word(record) == ("PASS" if code == exitcodes.OK else "FAIL"), (s, stale)
            assert (code == exitcodes.HARNESS_BUG) == (s == "harness_error")
            assert (code == exitcodes.OK) == (BY_NAME[s].good and not stale)


# ---- what code ran: a tree's Python with another install's compiled extension ------------------
def test_a_tree_run_with_a_foreign_build_says_its_cpp_did_not_run(tmp_path: Path):
    """A backend importing TE from a tree whose compiled extension comes from elsewhere (a
    wheel's ``transformer_engine_torch`` on the path): the record names the extension and
    every report says the tree's C++ changes were not run; real TE's version is read."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "transformer_engine_torch.py").write_text("# a compiled extension of another install\n")
    tree = tmp_path / "tree"
    (tree / "transformer_engine" / "pytorch").mkdir(parents=True)
    (tree / "transformer_engine" / "__init__.py").write_text("__version__ = '2.99.0'\n")
    (tree / "transformer_engine" / "pytorch" / "__init__.py").write_text("import transformer_engine_torch\n")
    backend = tmp_path / "te_like.py"
    backend.write_text("import transformer_engine.pytorch\n"
                       "from harness.backends.reference import GroupedLinear, LayerNormLinear, Linear, ops\n")
    out = tmp_path / "run"
    proc = _harness("sweep", *ONE, "--backend", str(backend), "--te-tree", str(tree), "--ledger", "none",
                    "--out", str(out), "--quiet", env={"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = recordfile.read(out)["environment"]["backend_info"]
    assert (info["upstream"], info["version"]) == ("transformer_engine", "2.99.0")
    assert info["extra"]["compiled"] == {"kind": "other", "path": str(site / "transformer_engine_torch.py")}
    said = "the tree's C++ changes were not run"
    assert said in proc.stdout
    assert said in (out / "summary.md").read_text() and html.escape(said) in (out / "report.html").read_text()
