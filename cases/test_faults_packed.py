"""Runner faults inside one sub-group of a packed launch, while the other sub-group runs.

A 16-cell selection at world sizes 4 and 2 packs into one launch of 4 ranks: the ws4 cells
on every rank, then the ws2 cells on two lanes, ranks {0, 1} and {2, 3}, side by side.
``fixtures/faults.py`` makes launch rank 3 raise, hang or die in its second ws2 cell (the
module it builds after the 8 ws4 ones and one ws2 one), once - and only after launch ranks 0
and 1 (the other lane) have built their second ws2 module too, so that lane's first ws2 cell
is known to have finished beside the fault, however loaded the machine.

What must hold: the faulty cell (read from the first launch's plan) is recorded with its
own ranks (0 and 1 of the cell) and the culprit named by its rank in the cell; every other
cell passes; no cell has two verdicts (the other lane's verdicts from the faulty launch are
kept, not rerun); the cells left run in a fresh launch; nothing of the run survives. And a
SIGTERM to the sweep (a CI cancel) ends it as Ctrl-C does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.runs import assert_nothing_left, end_survivors, interrupt_when, run_once
from harness.records import recordfile, runfolder
from harness.vocabulary.plan import LaunchPlan
from harness.records.stream import ResultStream

ROOT = Path(__file__).resolve().parents[1]
# hooks off: a hooked cell also builds its hooks-off twin's module, which would shift the
# module count the faults are armed by
SELECTION = ["--preset", "full", "--modules", "linear", "--weights", "distributed", "--world-sizes", "2,4", "--recipes", "none", "--first-microbatch", "off",
             "--hooks", "off", "--consumers", "ddp", "--microbatches", "2", "--bias", "on,off", "--input-grad", "on",
             "--dtypes", "bf16,fp32", "--fused", "on,off", "--delay-wgrad", "off"]
N_CELLS = 16
WS4_CELLS = 8
FAULT_RANK = 3       # launch rank; rank 1 of the cell on lane (2, 3)
FAULTS = {"raise": (), "hang": ("--cell-timeout", "10"), "die": ()}


def _sweep(root: Path, mode: str) -> subprocess.Popen:
    sync = root / f"{mode}-sync"
    sync.mkdir()
    env = {**os.environ, "DW_FAULT": mode, "DW_FAULT_RANK": str(FAULT_RANK),
           "DW_FAULT_SYNC": str(sync), "DW_FAULT_PEERS": "0,1",
           "DW_FAULT_CELL": str(WS4_CELLS + 2), "DW_FAULT_ONCE": str(root / f"{mode}-fired"),
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "harness", "sweep", *SELECTION, "--backend", "fixtures/faults.py",
           "--out", str(root / mode), "--quiet", *FAULTS[mode]]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(root / f"{mode}.stderr", "w"), start_new_session=True)


@pytest.fixture(scope="module")
def packed_runs(tmp_path_factory) -> dict[str, dict]:
    """The three fault sweeps, run side by side once (shared by xdist workers)."""
    def run_all(root: Path) -> None:
        procs = {mode: _sweep(root, mode) for mode in FAULTS}
        try:
            for mode, proc in procs.items():
                (root / f"{mode}.rc").write_text(str(proc.wait(timeout=600)))  # a hang guard
        finally:
            for mode, proc in procs.items():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    end_survivors(root / mode)

    root = run_once(tmp_path_factory, "faults-packed", run_all)
    yield {mode: {"dir": root / mode, "rc": int((root / f"{mode}.rc").read_text()),
                  "stderr": (root / f"{mode}.stderr").read_text()} for mode in FAULTS}
    for mode in FAULTS:
        end_survivors(root / mode)


def _faulty_cell(run_dir: Path) -> tuple[str, list[str]]:
    """The cell the fault hit (second task of the lane of launch rank 3 at world size 2) and
    the cells of the other ws2 lane, from the first launch's plan."""
    plan = LaunchPlan.from_dict(json.loads(runfolder.read_text(run_dir / "plans" / "ws4-0.json")))
    lanes = [l for l in plan.lanes_for(4) if len(l.ranks) == 2]
    assert [l.ranks for l in lanes] == [(0, 1), (2, 3)], plan.lanes
    cell = plan.tasks[lanes[1].tasks[1]].cell
    return cell, [plan.tasks[i].cell for i in lanes[0].tasks]


@pytest.mark.parametrize("mode", list(FAULTS))
def test_fault_in_one_sub_group_is_its_cell_only(packed_runs, mode):
    run = packed_runs[mode]
    run_dir = run["dir"]
    assert run["rc"] == 1, run["stderr"][-3000:]
    record = recordfile.read(run_dir)
    assert record["status"] == "complete"
    cells = {c["id"]: c for c in record["cells"]}
    assert len(cells) == N_CELLS
    faulty, other_lane = _faulty_cell(run_dir)
    bad = {i: (c["status"], c["first_failure"]) for i, c in cells.items() if c["status"] != "pass"}
    assert list(bad) == [faulty], bad
    cell = cells[faulty]
    assert cell["status"] == ("timeout" if mode == "hang" else "error"), cell
    # the culprit is named by its rank in the cell (1), and by its launch rank
    assert cell["first_failure"].startswith("[rank 1]"), cell["first_failure"]
    assert f"launch rank {FAULT_RANK}" in cell["first_failure"], cell["first_failure"]
    assert sorted(r["rank"] for r in cell["ranks"]) == [0, 1]
    culprit = next(r for r in cell["ranks"] if r["rank"] == 1)
    assert "faults.py" in culprit["error"]["traceback"] or mode == "die", culprit["error"]
    if mode == "die":
        assert "SIGKILL" in cell["first_failure"], cell["first_failure"]
    # one verdict per cell: nothing that had a verdict ran again
    verdicts = ResultStream(run_dir).read()
    assert sorted(v.result.id for v in verdicts) == sorted(cells), [v.result.id for v in verdicts]
    launch_of = {v.result.id: v.launch for v in verdicts}
    assert launch_of[faulty] == "ws4-0"
    # the other lane ran beside the fault: its verdicts before the fault came from the faulty launch
    assert launch_of[other_lane[0]] == "ws4-0", launch_of
    launches = record["launches"]
    assert len(launches) == 2 and launches[0]["note"], launches
    assert set(launches[1]["cells"]) == {i for i, launch in launch_of.items() if launch != "ws4-0"}
    assert faulty not in launches[1]["cells"]
    assert_nothing_left(run_dir, record)


def test_resume_after_a_packed_fault_runs_nothing(packed_runs, tmp_path):
    # a copy: the shared folder's fixture teardown on another xdist worker kills whatever
    # process names it, and a resume must not touch what the other tests read
    run_dir = tmp_path / "raise"
    shutil.copytree(packed_runs["raise"]["dir"], run_dir)
    before = len(ResultStream(run_dir).read())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(run_dir), "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(ResultStream(run_dir).read()) == before


def test_sigterm_ends_the_sweep_like_ctrl_c(tmp_path):
    """A CI cancel (SIGTERM to the sweep) ends the launch's whole tree and leaves an
    incomplete record, exit 130 - not ranks running on in their own session."""
    gate = tmp_path / "gate"
    gate.mkdir()
    run_dir = tmp_path / "run"
    env = {**os.environ, "DW_FAULT": "gate", "DW_FAULT_GATE": str(gate), "DW_FAULT_CELL": str(WS4_CELLS + 2),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "sweep", *SELECTION, "--backend", "fixtures/faults.py",
                             "--out", str(run_dir), "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    # every rank waits at its second ws2 cell
    err = interrupt_when(proc, lambda: len(list(gate.glob("rank*"))) == 4, signal.SIGTERM, run_dir,
                         "the ranks never reached the gate")
    assert proc.returncode == 130, err[-3000:]
    record = recordfile.read(run_dir)
    assert record["status"] == "incomplete"
    statuses = [c["status"] for c in record["cells"]]
    assert statuses.count("pass") >= WS4_CELLS and "skipped" in statuses, statuses
    assert_nothing_left(run_dir, record)
