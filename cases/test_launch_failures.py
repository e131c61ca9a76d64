"""Runs that cannot run, and harness bugs told apart from backend faults (real torchrun).

- A rank that cannot start (a dependency missing in the ranks only): the launcher's circuit
  breaker ends the run after at most two launches, exit 3, the first failing rank's error
  named; no cell gets a verdict (``--resume`` runs them once the cause is fixed).
- ``--device cuda`` without CUDA: bad input in the parent (exit 2), nothing launched.
- A planted harness bug (an oracle that raises): exit 3, every cell ``harness_error`` with
  the traceback, none recorded as a backend failure.
- A backend whose constructor raises: a verdict on the backend (``error``, phase
  ``constructor``), exit 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.vocabulary.status import HARNESS_ERROR
from harness.records.stream import ResultStream
from harness.records import recordfile

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--modules", "linear", "--weights", "distributed", "--world-sizes", "2", "--hooks", "off",
         "--dtypes", "bf16", "--delay-wgrad", "off", "--fused", "on"]


def _sweep(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "sweep", *args, "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, start_new_session=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_rank_that_cannot_start_ends_the_run_after_two_launches(tmp_path):
    out = tmp_path / "run"
    proc = _sweep(out, *SMALL, "--backend", "fixtures/rank_import_error.py")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("dw-harness: error: no cell could start: 2 launch(es)"), err
    assert "[rank 0] BackendError" in err[-1] or "[rank 1] BackendError" in err[-1], err[-1]
    assert "dw_harness_dependency_missing_in_the_ranks" in err[-1], err[-1]
    record = recordfile.read(out)
    assert len(record["launches"]) == 2, record["launches"]
    assert all(l["note"].startswith("could not start: ") for l in record["launches"])
    assert record["status"] == "incomplete" and record["failure"] == err[-1][len("dw-harness: error: "):]
    assert {c["status"] for c in record["cells"]} == {"skipped"}, "no cell ran, so no cell has a verdict"
    assert ResultStream(out).read() == []


def test_device_cuda_without_cuda_is_bad_input(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "run"
    proc = _sweep(out, *SMALL, "--device", "cuda")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("dw-harness: error: --device cuda: CUDA is not available")
    assert not (out / "logs").exists()


def test_planted_harness_bug_exits_3_and_is_never_a_backend_verdict(tmp_path):
    out = tmp_path / "run"
    proc = _sweep(out, *SMALL, "--backend", "fixtures/harness_bug.py")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "harness bug" in proc.stderr
    record = recordfile.read(out)
    assert record["status"] == "complete"
    assert {c["status"] for c in record["cells"]} == {HARNESS_ERROR}
    for cell in record["cells"]:
        assert cell["first_failure"].startswith("[rank 0] HarnessBug: the harness failed in its checks phase")
        for r in cell["ranks"]:
            assert r["status"] == HARNESS_ERROR
            assert "ZeroDivisionError: planted harness bug" in r["error"]["traceback"]
    assert {v.result.status for v in ResultStream(out).read()} == {HARNESS_ERROR}


def test_backend_constructor_that_raises_gets_a_backend_verdict(tmp_path):
    out = tmp_path / "run"
    env = {"DW_FAULT": "constructor", "DW_FAULT_RANK": "0", "DW_FAULT_CELL": "2",
           "DW_FAULT_ONCE": str(tmp_path / "fired")}  # its peer waits in the forward: relaunched
    proc = _sweep(out, *SMALL, "--backend", "fixtures/faults.py", env=env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = recordfile.read(out)
    statuses = [c["status"] for c in record["cells"]]
    assert statuses[1] == "error" and statuses.count("pass") == len(statuses) - 1, statuses
    rank0 = record["cells"][1]["ranks"][0]
    assert rank0["status"] == "error" and rank0["error"]["phase"] == "constructor", rank0
    assert "injected fault: the backend's constructor raises" in rank0["error"]["message"]


_DUMPER = """
import faulthandler, signal, sys, time
log = open(sys.argv[1], "w")
faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
def hung_here():
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
hung_here()
"""


def test_a_ranks_stacks_are_written_before_the_launch_ends(tmp_path):
    """``kill_tree`` has every rank write its stacks (SIGUSR1) and waits until each has, before
    the SIGTERM whose handler lets a second SIGTERM end the rank mid-dump: when the wait
    returns, the dump is whole - its innermost frame is where the process hung."""
    import time

    from harness.launcher import launch

    log = tmp_path / "rank.log"
    proc = subprocess.Popen([sys.executable, "-c", _DUMPER, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        launch._dump_stacks([proc.pid], time.monotonic() + 30)
        text = log.read_text()
        assert "most recent call first" in text and "in hung_here" in text and text.endswith("\n"), text
        assert proc.poll() is None  # the dump alone: the process goes on until it is ended
    finally:
        proc.kill()
        proc.wait()
