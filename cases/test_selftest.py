"""The self-test can fail: it judges kills by evidence, and a removed check lets a mutant live.

In-process (world size 1) for the judging logic. The gate's own self-test - ``selftest
--preset ci`` through the CLI, every mutant killed, no false alarm - runs once per pytest run
and also shows the faults that only exist at world size >= 2 killed there, with the measured
detection thresholds.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.vocabulary import fault_classes, matrix, modules, selection
from harness.cell import runner
from harness.backends.reference import mutants
from harness.cell.runner import RankContext, run_cell
from harness.orchestration.selftest import CLEAN, SelftestResult, _judge
from fixtures.runs import run_once


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
    monkeypatch.setattr(runner.GTPGroup, "live_forward_gathers", lambda self, floor=0: 0)
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
    from harness.records.fold import merge

    return merge(cell, [run_cell(m.backend, cell, RankContext())], 0.0, "mutant")


@pytest.fixture(scope="module")
def ci_selftest(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """``python -m harness selftest --preset ci``, the gate's self-test, run once per pytest run
    (into ``$DW_ARTIFACT_DIR/selftest`` when set, which CI keeps)."""
    def run(root: Path) -> None:
        art = os.environ.get("DW_ARTIFACT_DIR")
        out = Path(art) / "selftest" if art else root / "st"
        proc = subprocess.run([sys.executable, "-m", "harness", "selftest", "--preset", "ci", "--out", str(out)],
                              capture_output=True, text=True, timeout=1800)
        (root / "proc.json").write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                                    "stderr": proc.stderr, "out": str(out)}))

    root = run_once(tmp_path_factory, "ci-selftest", run)
    meta = json.loads((root / "proc.json").read_text())
    proc = subprocess.CompletedProcess([], meta["returncode"], meta["stdout"], meta["stderr"])
    out = Path(meta["out"])
    return proc, json.loads((out / "selftest.json").read_text()), out


def test_ci_selftest_kills_every_mutant_without_a_false_alarm(ci_selftest):
    """The gate's self-test: every planted mutant killed by its own evidence, the clean
    reference silent on every ci cell, exit 0."""
    proc, report, out = ci_selftest
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the reference's mutants and TE's (planted in TE's own code on the patched tree: the suite
    # installs TE and Megatron, so the self-test runs both sides)
    assert {m["name"]: m["verdict"] for m in report["mutants"]} == {n: "killed" for n in fault_classes.CATALOG}
    assert report["false_alarms"] == 0 and report["ok"]
    # a fault of backward_dw()'s fused branch runs only where a wgrad is delayed, fused and not
    # rejected: its first round holds a cell that kills it (it ran every cell of its modules)
    assert next(m for m in report["mutants"] if m["name"] == "dw-fused-hook-skipped")["rounds"] == 1
    ci = matrix.select("ci")
    assert report["clean_cells"] == sum(not selection.requires(c) for c in ci)
    # TE's side: every ci cell that needs TE, on the patched tree, none a false alarm
    assert report["te"]["false_alarms"] == 0 and report["te"]["clean_cells"] >= sum("te" in selection.requires(c) for c in ci)
    # finished, it keeps every mutant cell's verdict - compressed - and no raw stream
    assert not (out / "cells.jsonl").exists() and not (out / "ranks").exists()
    with gzip.open(out / "cells.jsonl.gz", "rt") as fh:
        kept = [json.loads(line) for line in fh]
    clean = [v for v in kept if v["backend"] == CLEAN]
    assert len(clean) == report["clean_cells"] and len(kept) > len(clean)


def test_selftest_multirank(ci_selftest):
    """Through the CLI over ranks: the faults that only exist at world size >= 2 die there,
    and the measured detection threshold of every recipe, dtype and tensor kind is bracketed
    by two measured values, printed and recorded."""
    proc, report, _ = ci_selftest
    verdicts = {m["name"]: m["verdict"] for m in report["mutants"]}
    assert verdicts["full-shape-dummy"] == "killed" and verdicts["unfused-finalize-dropped"] == "killed"
    rows = {(r["recipe"], r["dtype"], r["kind"]): r for r in report["sensitivity"]}
    # a row per recipe of ci (its bias gradient is the unquantized one: no row under a recipe)
    assert set(rows) == {("none", d, k) for d in ("fp32", "bf16", "fp16")
                         for k in ("output", "input_grad", "weight_grad", "bias_grad")} | {
        (r, d, k) for r in ("delayed", "current", "mxfp8", "blockwise", "nvfp4") for d in ("fp32", "bf16", "fp16")
        if not (r == "nvfp4" and d == "fp16")  # TE's FP4 GEMM refuses an fp16 output: no such cell
        for k in ("output", "input_grad", "weight_grad")}, sorted(rows)
    for r in rows.values():
        assert r["smallest_caught"] in r["tried"], r
        assert r["largest_missed"] is None or r["largest_missed"] == r["smallest_caught"] / 2, r
        assert 0 < r["worst_clean_ratio"] <= 1, r
    assert report["sensitivity_anomalies"] == []
    assert "smallest k caught" in proc.stdout


def test_a_mutant_no_selected_cell_can_reach_survives_and_fails_the_selftest():
    """A grouped-only mutant in a linear-only selection runs no cell: it survives, and the
    self-test fails (exit 1) instead of passing vacuously."""
    m = mutants.MUTANTS["shared-grad-buffer"]
    verdict = _judge(m, [])
    assert verdict.verdict == "survived" and not verdict.killed
    result = SelftestResult([verdict], [], 0.0, {})
    assert not result.ok


def test_a_mutant_runs_only_in_cells_that_can_show_its_fault():
    """Below a fault's smallest world size a shard is the whole weight, and a fault of what a
    backend does with a distributed weight cannot show with plain parameters: such cells run
    the clean code path and are no part of the mutant's rounds."""
    ci = matrix.select("ci")
    # Megatron's expert layer: ci's own cells (plain weights) and, as the self-test adds them, with Megatron's
    layers = ci + matrix.select("ci", {"module": modules.LAYERS, "weight": ("megatron",)})
    fc2 = fault_classes.CATALOG["fc2-fix-missing"]
    mine = [c for c in layers if fc2.runs_in(c)]
    assert mine and all(c.distributed and c.world_size >= 2 and c.hooks != "off" for c in mine)
    assert any(not c.distributed and fc2.applies(c.module, c.recipe, c.first_mb, c.hooks, c.shape) for c in layers)
    amax = fault_classes.CATALOG["fp8-per-shard-amax"]
    assert all(c.world_size >= 2 for c in ci if amax.runs_in(c))
    assert any(c.world_size == 1 and amax.applies(c.module, c.recipe, c.first_mb, c.hooks, c.shape) for c in ci)


def test_a_finished_selftest_folds_its_streams(tmp_path):
    """cells.jsonl is gzipped line for line, the ranks' reports go, everything else stays."""
    from harness.commands.selftest_cmd import fold_streams

    lines = ['{"backend": "a", "result": {"id": "x"}}\n', '{"backend": "b", "result": {"id": "y"}}\n']
    (tmp_path / "cells.jsonl").write_text("".join(lines))
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "ws2-0.rank0.jsonl").write_text("{}\n")
    (tmp_path / "selftest.json").write_text("{}")
    fold_streams(tmp_path)
    with gzip.open(tmp_path / "cells.jsonl.gz", "rt") as fh:
        assert fh.read() == "".join(lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.jsonl.gz", "selftest.json"]
    fold_streams(tmp_path)  # again: nothing to fold, nothing lost
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.jsonl.gz", "selftest.json"]
