"""The self-test can fail: it judges kills by evidence, and a removed check lets a mutant live.

In-process (world size 1) for the judging logic; one small torchrun launch shows the two
faults that only exist at world size >= 2 are killed there, through the real selftest path.
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness import matrix, runner
from harness.reference import mutants
from harness.runner import RankContext, run_cell
from harness.selftest import _judge


def _cells(module: str) -> list[matrix.Cell]:
    return [c for c in matrix.select("ci", overrides={"world_size": (1,)}) if c.module == module][:12]


def test_selftest_kills_with_evidence_in_process():
    m = mutants.MUTANTS["dgrad-forward-copy"]
    results = [runner_result(m, c) for c in _cells("linear")]
    verdict = _judge(m, results)
    assert verdict.verdict == "killed"
    assert "leader.materialize_backward_calls" in verdict.first_check


def test_removing_the_check_lets_the_mutant_survive(monkeypatch):
    """Drop the checks about dgrad-forward-copy's fault (the backward-materialize count and
    the liveness of forward-gathered weights): the mutant must then survive."""
    real = runner._protocol_checks

    def without_backward_count(cell, gtp):
        return [c for c in real(cell, gtp) if c.name != "leader.materialize_backward_calls"]

    monkeypatch.setattr(runner, "_protocol_checks", without_backward_count)
    monkeypatch.setattr(runner.GTPGroup, "live_forward_gathers", lambda self: 0)
    m = mutants.MUTANTS["dgrad-forward-copy"]
    verdict = _judge(m, [runner_result(m, c) for c in _cells("linear")])
    assert verdict.verdict == "survived", verdict


def test_kill_by_unrelated_check_is_not_counted(monkeypatch):
    """A mutant killed only by checks outside its evidence is reported as 'unrelated'."""
    m = mutants.MUTANTS["per-member-materialize"]
    real = runner._protocol_checks

    def no_follower_counts(cell, gtp):
        out = real(cell, gtp)
        for c in out:
            if c.name.startswith("leader.") and c.kind == "count":
                c.ok, c.message = False, "planted unrelated failure"
        return [c for c in out if not c.name.startswith("followers.")]

    monkeypatch.setattr(runner, "_protocol_checks", no_follower_counts)
    verdict = _judge(m, [runner_result(m, c) for c in _cells("grouped_linear")])
    assert verdict.verdict == "unrelated"


def runner_result(m, cell):
    from harness.verdict import merge

    return merge(cell, [run_cell(m.backend, cell, RankContext())], 0.0, "mutant")


def test_selftest_multirank(tmp_path):
    """Through the CLI at world size 2: the ws>=2 faults die, nothing else is disturbed."""
    cmd = [sys.executable, "-m", "harness", "selftest", "--world-sizes", "2", "--modules", "linear",
           "--hooks", "off", "--dtypes", "bf16", "--out", str(tmp_path / "st")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    report = json.loads((tmp_path / "st" / "selftest.json").read_text())
    verdicts = {m["name"]: m["verdict"] for m in report["mutants"]}
    assert verdicts["full-shape-dummy"] == "killed", proc.stdout[-2000:]
    assert verdicts["unfused-finalize-dropped"] == "killed", proc.stdout[-2000:]
    assert report["false_alarms"] == 0
    # every selected cell has exactly one clean verdict (results are attributed per backend
    # even when several arrive in one read of cells.jsonl)
    selected = matrix.select("ci", {"world_size": (2,), "module": ("linear",), "hooks": ("off",),
                                    "dtype": ("bf16",)})
    assert report["clean_cells"] == len(selected)
    # grouped-only mutants have no cell in a linear-only selection: they must survive,
    # and the self-test must then fail (exit 1), not pass vacuously
    assert verdicts["shared-grad-buffer"] == "survived"
    assert proc.returncode == 1
    # the measured detection threshold: every bf16 tensor kind caught, bracketed by two
    # measured values, printed and recorded
    rows = {r["kind"]: r for r in report["sensitivity"]}
    assert set(rows) == {"output", "input_grad", "weight_grad", "bias_grad"}, rows
    for r in rows.values():
        assert r["dtype"] == "bf16" and r["smallest_caught"] in r["tried"], r
        assert r["largest_missed"] is None or r["largest_missed"] == r["smallest_caught"] / 2, r
        assert 0 < r["worst_clean_ratio"] <= 1, r
    assert report["sensitivity_anomalies"] == []
    assert "smallest k caught" in proc.stdout
