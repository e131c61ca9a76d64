"""The TransformerEngine 2.20 ledger against TE's real code (``--backend te-cpu``).

What must hold (issue 10's acceptance): ``sweep --backend te-cpu --preset ci`` exits 0 with
every non-passing cell ``known`` and no stale entry; every entry reproduces (in the ``ci``
sweep, or - the entries ``ci`` selects no cell of (``TARGETED``) - in a targeted sweep: the
seed's input-needs-no-grad variant, delayed wgrad on the grouped-tensor path); removing any one entry
turns the cells only it explains red (exit 1, each named); an entry that cannot reproduce
is stale (exit 1, "delete it"). Re-judging uses ``sweep --resume`` of a copy of the run
folder with another ``--ledger``: nothing runs again, every verdict is judged anew.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.runs import run_once
from harness import ledger, recordfile
from harness.record import CellResult

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ledger.choose("auto", "transformer_engine", "2.20.2")
NOIGRAD = ["--preset", "full", "--modules", "linear,grouped_linear", "--weights", "distributed",
           "--hooks", "identity,offload", "--input-grad", "off", "--delay-wgrad", "off", "--consumers", "ddp",
           "--world-sizes", "1,2", "--dtypes", "bf16", "--microbatches", "2", "--num-gemms", "1,4", "--bias", "on",
           "--filter", 'module == "linear" or num_gemms == 4']
#: delayed wgrad with a distributed weight on GroupedLinear's grouped-tensor path (ci gives that
#: combination to the class's split-quantize path: the two take turns in one slot)
GT_DELAY = ["--preset", "full", "--modules", "grouped_linear_tensor", "--weights", "distributed",
            "--hooks", "off,identity", "--delay-wgrad", "on", "--consumers", "ddp", "--world-sizes", "2",
            "--dtypes", "bf16", "--microbatches", "2", "--num-gemms", "4", "--bias", "on", "--input-grad", "on"]
SWEEPS = {"ci": ["--preset", "ci"], "noigrad": NOIGRAD, "gt_delay": GT_DELAY}
#: the entries ci selects no cell of, and the targeted sweep each reproduces in
TARGETED = {"hooks-strip-distributed-weight-noigrad": "noigrad",
            "delayed-wgrad-distributed-not-rejected-grouped-tensor": "gt_delay"}


def _harness(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def te_runs(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """The TE sweeps under the shipped ledger, run once per pytest run."""
    def run_all(root: Path) -> None:
        for name, selection in SWEEPS.items():
            proc = _harness("sweep", "--backend", "te-cpu", *selection, "--out", str(root / name), "--quiet")
            (root / f"{name}.rc").write_text(str(proc.returncode))
            (root / f"{name}.out").write_text(proc.stdout + proc.stderr)

    root = run_once(tmp_path_factory, "ledger-te", run_all)
    return {n: (root / n, int((root / f"{n}.rc").read_text()), (root / f"{n}.out").read_text()) for n in SWEEPS}


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


def test_every_entry_reproduces(te_runs):
    """Nothing in the ledger that does not reproduce, nothing failing that it does not name."""
    reproduced: dict[str, int] = {}
    for name, (run, rc, out) in te_runs.items():
        assert rc == 0, (name, out[-4000:])
        for e in recordfile.read(run)["ledger"]["entries"]:
            reproduced[e["id"]] = reproduced.get(e["id"], 0) + len(e["reproduced"])
    assert reproduced == {e.id: reproduced[e.id] for e in SHIPPED.entries}
    assert all(reproduced.values()), {i: n for i, n in reproduced.items() if not n}


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


@pytest.mark.parametrize("entry_id", [e.id for e in SHIPPED.entries])
def test_removing_an_entry_turns_its_cells_red(te_runs, tmp_path, entry_id):
    name = TARGETED.get(entry_id, "ci")
    run, _, _ = te_runs[name]
    before = {c["id"]: c for c in recordfile.read(run)["cells"]}
    others = [e for e in SHIPPED.entries if e.id != entry_id]
    # the cells with a failure only this entry explains (others may explain the rest of a cell)
    mine = {i for i, c in before.items() if entry_id in (c.get("known") or [])
            and ledger.judge(CellResult.from_dict(c), others)[0].status != "known"}
    assert mine, f"{entry_id} alone explains no failure of the {name} sweep"
    proc, record = _rejudge(run, tmp_path, _without(entry_id))
    assert proc.returncode == 1, proc.stdout[-3000:]
    bad = {c["id"] for c in record["cells"] if c["status"] not in ("pass", "xfail", "known")}
    assert mine <= bad and all(entry_id in (before[i].get("known") or []) for i in bad), (mine ^ bad)
    named = [i for i in bad if i in proc.stdout]
    assert len(named) == min(len(bad), 20), "the sweep's summary does not name the cells"
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
