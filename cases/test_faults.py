"""Runner faults through the real CLI: a rank that raises, hangs, is killed or segfaults, and
a sweep interrupted with Ctrl-C. Each test runs ``python -m harness sweep`` in a subprocess
against ``fixtures/faults.py`` on a 5-cell selection at world size 2 and judges the run record.

What must hold after every fault: the faulty cell is recorded with every rank's evidence and
the rank that failed first named in ``first_failure``; the cells after it still run, in a
fresh launch; every launch keeps its rank logs; no process of the run survives the sweep and
the rendezvous store port torchrun used is closed again. ``DW_FAULT_ONCE`` makes the fault
fire once, so the relaunch runs clean.

After every fault the verdict is in the run's result stream, and ``sweep --resume`` on the
finished run folder runs nothing (no launch, no new verdict). No test asserts a wall-clock
limit (the machine may be loaded); ``benchmarks/`` holds the timing figures.

The fault sweeps run at the same time (one module fixture; they mostly wait out a peer
grace period or a cell timeout); pytest-xdist workers share them through a lock instead of
each running its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.runs import assert_nothing_left, end_survivors, interrupt_when, run_once
from harness.records.stream import ResultStream
from harness.records import recordfile

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["--modules", "linear", "--weights", "distributed", "--world-sizes", "2", "--hooks", "off", "--recipes", "none", "--first-microbatch", "off",
             "--dtypes", "bf16", "--delay-wgrad", "off", "--fused", "on"]
N_CELLS = 5
FAULTY = 1          # DW_FAULT_CELL=2: the second module built in a launch, i.e. the second cell
FAULT_RANK = 1


#: fault mode -> extra sweep options
FAULTS = {"raise": (), "hang": ("--cell-timeout", "10"), "die": (), "segv": ()}
_MODE_OF_TEST = {"test_rank_raises_while_peers_wait_in_a_collective": "raise",
                 "test_rank_hangs_cell_times_out_rest_relaunched": "hang"}


@dataclass
class Run:
    run_dir: Path
    returncode: int
    stderr: str
    record: dict
    resumed: dict


def _env(fired: Path, mode: str, cell: int = FAULTY + 1) -> dict[str, str]:
    return {**os.environ, "DW_FAULT": mode, "DW_FAULT_RANK": str(FAULT_RANK), "DW_FAULT_CELL": str(cell),
            "DW_FAULT_ONCE": str(fired), "PYTHONPATH": str(ROOT)}


def _sweep_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness", "sweep", *SELECTION, "--backend", "fixtures/faults.py",
            "--out", str(run_dir), "--quiet", *extra]


@pytest.fixture(scope="module")
def fault_runs(request, tmp_path_factory) -> dict[str, Run]:
    """One sweep per fault mode the selected tests need, run concurrently (they mostly wait:
    a peer grace period, a cell timeout), each in its own run folder.

    Under pytest-xdist the workers share them through a folder and a lock: the first worker
    runs the sweeps, the others read their records (group scheduling is not relied on).
    """
    here = [item for item in request.session.items if item.module is sys.modules[__name__]]
    wanted = {_MODE_OF_TEST.get(item.originalname) or item.callspec.params.get("mode")
              for item in here if item.originalname in _MODE_OF_TEST or hasattr(item, "callspec")}
    modes = [m for m in FAULTS if m in wanted]
    root = run_once(tmp_path_factory, "faults", lambda root: _run_concurrently(root, modes))
    runs = {}
    for mode in modes:
        meta = json.loads((root / f"{mode}.meta.json").read_text())
        runs[mode] = Run(root / mode, meta["returncode"], meta["stderr"],
                         recordfile.read(root / mode), meta["resumed"])
    yield runs
    for mode in modes:
        end_survivors(root / mode)


def _run_concurrently(root: Path, modes: list[str]) -> None:
    procs = {}
    for mode in modes:
        err = open(root / f"{mode}.stderr", "w")
        procs[mode] = (err, time.monotonic(), subprocess.Popen(
            _sweep_cmd(root / mode, *FAULTS[mode]), cwd=ROOT, env=_env(root / f"{mode}-fired", mode),
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
    finished: set[str] = set()
    try:
        deadline = time.monotonic() + 600  # a hang guard, not a speed limit
        while len(finished) < len(procs) and time.monotonic() < deadline:
            for mode, (err, t0, proc) in procs.items():
                if mode not in finished and proc.poll() is not None:
                    err.close()
                    finished.add(mode)
                    meta = {"returncode": proc.returncode, "stderr": (root / f"{mode}.stderr").read_text()}
                    meta["resumed"] = _resume(root / mode, _env(root / f"{mode}-fired", mode))
                    (root / f"{mode}.meta.json").write_text(json.dumps(meta))
            time.sleep(0.1)
    finally:
        for mode, (err, _, proc) in procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                end_survivors(root / mode)
            err.close()
    assert finished == set(procs), f"fault sweeps still running after 600 s: {set(procs) - finished}"


def _resume(run_dir: Path, env: dict[str, str]) -> dict:
    """``sweep --resume`` on a finished run folder: what it ran and how it exited."""
    before = len(ResultStream(run_dir).read())
    launches = len(recordfile.read(run_dir)["launches"])
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(run_dir), "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    record = recordfile.read(run_dir)
    return {"returncode": proc.returncode, "new_verdicts": len(ResultStream(run_dir).read()) - before,
            "new_launches": len(record["launches"]) - launches, "status": record["status"],
            "stderr": proc.stderr[-2000:]}


def assert_in_stream_and_resume_runs_nothing(run: Run) -> None:
    """Every cell's verdict is in the result stream, and --resume runs nothing twice."""
    latest = ResultStream(run.run_dir).latest()
    assert {c["id"]: c["status"] for c in run.record["cells"]} == {i: r.status for i, r in latest.items()}
    assert run.resumed["new_verdicts"] == 0 and run.resumed["new_launches"] == 0, run.resumed
    assert run.resumed["returncode"] == run.returncode and run.resumed["status"] == "complete", run.resumed


def _cells(record: dict) -> list[dict]:
    cells = record["cells"]
    assert len(cells) == N_CELLS, [c["id"] for c in cells]
    return cells


def assert_relaunched_after(record: dict, faulty_id: str) -> None:
    """The cells after the faulty one ran (and passed) in a second, fresh launch."""
    cells = _cells(record)
    ids = [c["id"] for c in cells]
    assert [c["status"] for i, c in enumerate(cells) if i != FAULTY] == ["pass"] * (N_CELLS - 1), \
        [(c["id"], c["status"], c["first_failure"]) for c in cells]
    launches = record["launches"]
    assert len(launches) == 2, launches
    assert launches[0]["cells"] == ids and launches[0]["note"], launches[0]
    assert launches[1]["cells"] == ids[ids.index(faulty_id) + 1:], launches[1]
    assert launches[1]["log_dir"] != launches[0]["log_dir"]


def test_rank_raises_while_peers_wait_in_a_collective(fault_runs):
    run = fault_runs["raise"]
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.record["status"] == "complete"
    cell = _cells(run.record)[FAULTY]
    assert cell["status"] == "error", cell["first_failure"]
    assert cell["first_failure"].startswith(f"[rank {FAULT_RANK}] RuntimeError: injected fault"), cell["first_failure"]
    ranks = {r["rank"]: r for r in cell["ranks"]}
    assert sorted(ranks) == [0, 1]
    own = ranks[FAULT_RANK]["error"]
    assert own["type"] == "RuntimeError" and "injected fault" in own["message"]
    assert "RuntimeError: injected fault" in own["traceback"] and "faults.py" in own["traceback"]
    # the peer sat in the weight all-gather: its evidence is its stack (its own report of a
    # timed-out collective, or the dump its faulthandler wrote when the launch was ended)
    peer = ranks[0]
    assert peer["status"] == "error" and peer["error"]["traceback"], peer
    assert "File " in peer["error"]["traceback"] and "gather" in peer["error"]["traceback"], peer["error"]
    assert_relaunched_after(run.record, cell["id"])
    assert_in_stream_and_resume_runs_nothing(run)
    assert_nothing_left(run.run_dir, run.record)


def test_rank_hangs_cell_times_out_rest_relaunched(fault_runs):
    run = fault_runs["hang"]
    assert run.returncode == 1, run.stderr[-3000:]
    cell = _cells(run.record)[FAULTY]
    # a hang is a timeout, the hung rank's; its peer, stuck in the weight's all-gather, is not
    # counted again (docs/runner-faults.md#whose-failure-a-cells-is)
    assert cell["status"] == "timeout", cell
    assert cell["first_failure"].startswith(f"[rank {FAULT_RANK}] Timeout"), cell["first_failure"]
    assert [r["rank"] for r in cell["ranks"] if not r.get("by_peer")] == [FAULT_RANK], cell["ranks"]
    hung = next(r for r in cell["ranks"] if r["rank"] == FAULT_RANK)
    assert "faults.py" in hung["error"]["traceback"], hung["error"]   # its stack, dumped on SIGTERM
    assert_relaunched_after(run.record, cell["id"])
    assert_in_stream_and_resume_runs_nothing(run)
    assert_nothing_left(run.run_dir, run.record)


@pytest.mark.parametrize("mode, signame", [("die", "SIGKILL"), ("segv", "SIGSEGV")])
def test_rank_process_dies(fault_runs, mode, signame):
    run = fault_runs[mode]
    assert run.returncode == 1, run.stderr[-3000:]
    cell = _cells(run.record)[FAULTY]
    assert cell["status"] == "error", cell
    assert cell["first_failure"].startswith(f"[rank {FAULT_RANK}]"), cell["first_failure"]
    assert signame in cell["first_failure"], cell["first_failure"]
    assert_relaunched_after(run.record, cell["id"])
    assert_in_stream_and_resume_runs_nothing(run)
    assert_nothing_left(run.run_dir, run.record)


def test_interrupted_sweep_is_incomplete_and_resumes(tmp_path):
    # rank 1 hangs in the third cell, so the sweep is surely mid-launch when interrupted
    run_dir = tmp_path / "run"
    env = _env(tmp_path / "fired", "hang", cell=3)
    # Ctrl-C reaches a sweep in a terminal's foreground; a shell starts background jobs (a CI
    # script run with `&`) with SIGINT ignored, and the sweep would inherit that: restore it
    proc = subprocess.Popen(_sweep_cmd(run_dir), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # interrupted once the hang has fired (its once-marker exists), not merely after two
    # results: else a loaded machine can interrupt before rank 1 reaches the third cell, and
    # the resumed sweep's third module hangs instead
    fired = tmp_path / "fired"
    err = interrupt_when(proc, lambda: fired.exists() and len(ResultStream(run_dir).read()) >= 2,
                         signal.SIGINT, run_dir, "no two results and a fired hang")
    assert proc.returncode == 130, err[-3000:]
    assert f"continue with: python -m harness sweep --resume {run_dir}" in err, err[-3000:]
    record = recordfile.read(run_dir)
    assert record["status"] == "incomplete"
    done = [c["id"] for c in record["cells"] if c["status"] != "skipped"]
    assert len(done) == 2 and all(c["status"] == "pass" for c in record["cells"] if c["id"] in done)
    html = (run_dir / "report.html").read_text()
    assert "incomplete" in html.lower()
    assert_nothing_left(run_dir, record)

    before = [v.result.id for v in ResultStream(run_dir).read()]
    resumed = subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(run_dir), "--quiet"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=150,
                             start_new_session=True)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"dw-harness: resuming: 2 of {N_CELLS} cells have a verdict (2 pass); {N_CELLS - 2} to run" \
        in resumed.stdout, resumed.stdout[-2000:]
    added = [v.result.id for v in ResultStream(run_dir).read()][len(before):]
    assert len(added) == N_CELLS - 2 and not set(added) & set(done), added
    record = recordfile.read(run_dir)
    assert record["status"] == "complete"
    assert [c["status"] for c in record["cells"]] == ["pass"] * N_CELLS
    assert_nothing_left(run_dir, record)
