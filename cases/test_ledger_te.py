"""The TransformerEngine 2.20 ledger against TE's real code (``--backend te-cpu``).

What must hold: ``sweep --backend te-cpu --preset ci`` exits 0 with
every non-passing cell ``known`` and no stale entry, and so does a fixed-seed sample of
``full`` (the ledger holds on other selections: its numeric entries are predictions, not
bands measured on ``ci``); every entry reproduces in the ``ci`` sweep (``ci`` selects a cell
of each: ``cases/test_ledger.py``); removing any one entry turns the cells only it explains
red (exit 1, each named); without the ledger the wheel is red; an entry that cannot
reproduce is stale (exit 1, "delete it"). Re-judging uses ``sweep --resume`` of a copy of the
run folder with another ``--ledger``: nothing runs again, every verdict is judged anew.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.te_runs import SHIPPED, harness as _harness, te_runs  # noqa: F401 (a fixture)
from harness.vocabulary import errors as exitcodes
from harness.judging import ledger
from harness.records import recordfile
from harness.records.record import CellResult, status_counts
from harness.judging.gate import statuses_exit_code


def test_te_ci_sweep_is_green_with_every_failure_known(te_runs):
    run, rc, out = te_runs["ci"]
    assert rc == 0, out[-4000:]
    record = recordfile.read(run)
    assert record["ledger"]["path"] == SHIPPED.path and record["ledger"]["stale"] == []
    statuses = {c["status"] for c in record["cells"]}
    assert statuses <= {"pass", "xfail", "known"} and "known" in statuses, statuses
    for c in record["cells"]:
        if c["status"] == "known":
            assert c["known"] and c["raw_status"] in ("fail", "error"), c["id"]
    summary = (run / "summary.md").read_text()
    for e in SHIPPED.entries:
        assert e.id in summary and e.upstream in summary, e.id


def test_the_ledger_holds_on_a_sample_of_full(te_runs):
    """The same wheel and ledger on cells ``ci`` does not draw: still exit 0, every failure known."""
    run, rc, out = te_runs["sample"]
    assert rc == 0, out[-4000:]
    record = recordfile.read(run)
    assert record["selection"]["sample"] == {"count": 60, "seed": 2598} and len(record["cells"]) == 60
    assert record["ledger"]["stale"] == [] and {c["status"] for c in record["cells"]} <= {"pass", "xfail", "known"}


#: entries that select only cells of a weight ``ci`` holds only when it is named: they reproduce
#: in that sweep instead (Megatron's native FP8 shards: ``--weights megatron_fp8``; Megatron's
#: expert GTP with a bias: ``--weights megatron``)
ELSEWHERE = {"native-fp8-shards-gathered-under-local-scale": "megatron_fp8",
             "megatron-native-fp8-padding-unsupported": "megatron_fp8",
             "native-fp8-prefetch-reads-unwritten-buffer": "megatron_fp8",
             "megatron-expert-gtp-bias-not-gathered": "megatron"}


def test_every_entry_reproduces_on_ci(te_runs):
    """Nothing in the ledger that does not reproduce in the gate's own selection, nothing
    failing that it does not name (the native-FP8 entries: in ``ci`` with that weight)."""
    run, rc, out = te_runs["ci"]
    assert rc == 0, out[-4000:]
    reproduced = {e["id"]: len(e["reproduced"]) for e in recordfile.read(run)["ledger"]["entries"]}
    assert list(reproduced) == [e.id for e in SHIPPED.entries]
    there = {name: {e["id"]: len(e["reproduced"]) for e in recordfile.read(te_runs[name][0])["ledger"]["entries"]}
             for name in set(ELSEWHERE.values())}
    assert all(there[name][i] and not reproduced[i] for i, name in ELSEWHERE.items()), \
        {i: (reproduced[i], there[name][i]) for i, name in ELSEWHERE.items()}
    assert all(n for i, n in reproduced.items() if i not in ELSEWHERE), {i: n for i, n in reproduced.items() if not n}


def test_without_the_ledger_the_wheel_is_red(te_runs, tmp_path):
    run, _, _ = te_runs["ci"]
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    proc = _harness("sweep", "--resume", str(copy), "--quiet", "--ledger", "none")
    assert proc.returncode == 1, proc.stdout[-3000:]
    statuses = {c["status"] for c in recordfile.read(copy)["cells"]}
    assert "known" not in statuses and {"fail", "error"} <= statuses


def _rejudge(run: Path, tmp_path: Path, text: str) -> tuple[subprocess.CompletedProcess, dict]:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = tmp_path / "ledger.toml"
    path.write_text(text)
    proc = _harness("sweep", "--resume", str(copy), "--quiet", "--ledger", str(path))
    return proc, recordfile.read(copy)


def _without(entry_id: str) -> str:
    """The shipped ledger's text less one ``[[entry]]`` block."""
    text = Path(SHIPPED.path).read_text()
    blocks = text.split("[[entry]]")
    kept = [b for b in blocks[1:] if f'id = "{entry_id}"' not in b]
    assert len(kept) == len(blocks) - 2, entry_id
    return blocks[0] + "".join("[[entry]]" + b for b in kept)


def _mine(entry_id: str, cells: dict[str, dict]) -> set[str]:
    """The cells with a failure only ``entry_id`` explains (others may explain the rest of a cell)."""
    others = [e for e in SHIPPED.entries if e.id != entry_id]
    return {i for i, c in cells.items() if entry_id in (c.get("known") or [])
            and ledger.judge(CellResult.from_dict(c), others)[0].status != "known"}


@functools.cache
def _recorded(run: Path) -> tuple[dict, dict[str, dict], tuple[CellResult, ...]]:
    """A sweep's record, its cells by id and as verdicts: read once for the entries' tests
    below (each re-judges the same verdicts under another ledger; ``ledger.judge`` makes new
    verdicts, it never changes one)."""
    record = recordfile.read(run)
    return record, {c["id"]: c for c in record["cells"]}, tuple(CellResult.from_dict(c) for c in record["cells"])


@pytest.mark.parametrize("entry_id", [e.id for e in SHIPPED.entries])
def test_removing_an_entry_turns_its_cells_red(te_runs, entry_id):
    """The fold the sweep applies (``ledger.apply``), run here on the recorded verdicts: the
    cells only this entry explains fail, no other cell changes; the gate's exit code is 1 and
    its summary names them (``sweep --resume`` re-judging end to end: the test below)."""
    from harness_reports.terminal import summary

    name = ELSEWHERE.get(entry_id, "ci")
    run, _, _ = te_runs[name]
    record, before, verdicts = _recorded(run)
    mine = _mine(entry_id, before)
    assert mine, f"{entry_id} alone explains no failure of the {name} sweep"
    without = ledger.Ledger(SHIPPED.name, SHIPPED.path, SHIPPED.package, SHIPPED.versions,
                            tuple(e for e in SHIPPED.entries if e.id != entry_id))
    cells, outcome = ledger.apply(verdicts, without)
    bad = {c.id for c in cells if c.status not in ("pass", "xfail", "known")}
    assert mine <= bad and all(entry_id in (before[i].get("known") or []) for i in bad), (mine ^ bad)
    assert statuses_exit_code((c.status for c in cells), bool(outcome["stale"])) == exitcodes.MISMATCH
    # the record a re-judged run writes (``RunRecord.serialize`` of it gives these values back)
    text = summary({**record, "cells": [c.serialize() for c in cells], "ledger": outcome,
                    "counts": status_counts(c.status for c in cells)})
    assert len([i for i in bad if i in text]) == min(len(bad), 20), "the sweep's summary does not name the cells"


def test_rejudging_a_run_without_an_entry_is_red_and_runs_nothing(te_runs, tmp_path):
    entry_id = SHIPPED.entries[0].id
    run, _, _ = te_runs["ci"]
    mine = _mine(entry_id, {c["id"]: c for c in recordfile.read(run)["cells"]})
    proc, record = _rejudge(run, tmp_path, _without(entry_id))
    assert proc.returncode == 1, proc.stdout[-3000:]
    bad = {c["id"] for c in record["cells"] if c["status"] not in ("pass", "xfail", "known")}
    assert mine <= bad
    assert len([i for i in bad if i in proc.stdout]) == min(len(bad), 20)
    assert len(record["launches"]) == len(recordfile.read(run)["launches"]), "re-judging ran cells again"


def test_an_entry_that_cannot_reproduce_is_stale(te_runs, tmp_path):
    run, _, _ = te_runs["ci"]
    stale = ('\n[[entry]]\nid = "fixed-upstream"\ntitle = "fixed"\nupstream = "TE PR #1 (merged)"\n'
             'row = "a fixed defect"\nkind = "defect"\ncells = \'module == "linear"\'\n'
             'fails = [{ check = "leader.materialize_forward_calls", message = "expected 0, got [1-9]" }]\n')
    proc, record = _rejudge(run, tmp_path, Path(SHIPPED.path).read_text() + stale)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert record["ledger"]["stale"] == ["fixed-upstream"]
    assert "ledger entry fixed-upstream (TE PR #1 (merged)) no longer reproduces" in proc.stderr
    assert "delete it from" in proc.stderr
    assert {c["status"] for c in record["cells"]} <= {"pass", "xfail", "known"}
