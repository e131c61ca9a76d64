"""Runner faults through pytest: a cell that crashes, one that hangs and one that raises
each fail their test with every rank's traceback and the first failing rank named, and
their verdicts are in the batch's result stream (the plugin reads nothing else).

Each fault runs ``python -m pytest cases/test_cells.py`` in a subprocess against
``fixtures/faults.py`` (the same 5-cell selection as ``test_faults.py``); the three run
at the same time and pytest-xdist workers share them through a lock.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.runs import run_once
from harness.vocabulary import matrix
from harness.records.stream import ResultStream

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["--modules", "linear", "--weights", "distributed", "--world-sizes", "2", "--hooks", "off",
             "--dtypes", "bf16", "--delay-wgrad", "off", "--fused", "on"]
FAULT_RANK = 1
#: fault -> (extra pytest options, what the failure text must show of the first failing rank)
FAULTS = {
    "raise": ((), r"\[rank 1\] RuntimeError: injected fault"),
    "hang": (("--cell-timeout", "10"), r"\[rank 1\]"),
    "die": ((), r"\[rank 1\].*SIGKILL"),
}


def _cells() -> list[matrix.Cell]:
    return matrix.select("ci", {"module": ("linear",), "weight": ("distributed",), "world_size": (2,),
                                "hooks": ("off",), "dtype": ("bf16",), "delay_wgrad": (False,),
                                "fused": (True,)})


@pytest.fixture(scope="module")
def pytest_runs(tmp_path_factory) -> dict[str, dict]:
    root = run_once(tmp_path_factory, "pytest-faults",
                    lambda root: (root / "runs.json").write_text(json.dumps(_run_all(root))))
    return json.loads((root / "runs.json").read_text())


def _run_all(root: Path) -> dict[str, dict]:
    procs = {}
    for mode, (extra, _) in FAULTS.items():
        env = {**os.environ, "DW_FAULT": mode, "DW_FAULT_RANK": str(FAULT_RANK), "DW_FAULT_CELL": "2",
               "DW_FAULT_ONCE": str(root / f"{mode}-fired"), "PYTHONPATH": str(ROOT)}
        env.pop("PYTEST_XDIST_TESTRUNUID", None)
        out = open(root / f"{mode}.out", "w")
        cmd = [sys.executable, "-m", "pytest", "cases/test_cells.py", "-p", "no:randomly", "-q",
               "-p", "no:xdist", "--backend", "fixtures/faults.py", *SELECTION, *extra,
               "--harness-out", str(root / mode)]
        procs[mode] = (out, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True))
    result = {}
    deadline = time.monotonic() + 600  # a hang guard, not a speed limit
    for mode, (out, proc) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        out.close()
        result[mode] = {"rc": rc, "out": (root / f"{mode}.out").read_text(), "dir": str(root / mode)}
    return result


@pytest.mark.parametrize("mode", list(FAULTS))
def test_faulty_cell_fails_its_test_with_every_rank_and_the_first_failing_rank(pytest_runs, mode):
    run = pytest_runs[mode]
    cells = _cells()
    faulty = cells[1]
    out = run["out"]
    assert run["rc"] == 1, out[-4000:]
    failed = re.findall(r"FAILED cases/test_cells.py::test_cell\[([^\]]+)\]", out)
    assert failed == [faulty.id], out[-4000:]
    assert f"{len(cells) - 1} passed" in out, out[-2000:]
    # the failure text: the first failing rank named, then every rank's error and traceback
    section = out.split(f"test_cell[{faulty.id}]", 1)[1]
    first = re.search(r"first failure: (.*)", section).group(1)
    assert re.search(FAULTS[mode][1], first), first
    assert "first rank to fail" in first, first
    for rank in (0, 1):
        assert f"[rank {rank}] " in section, (rank, section[:3000])
    assert "File " in section, "a traceback or stack dump"
    if mode != "die":  # a SIGKILLed rank leaves no stack; its death is what is named
        assert "faults.py" in section, "the faulty rank's traceback or stack names the fault's source"
    # the verdict is in the batch's result stream, with every rank
    stream_dirs = list(Path(run["dir"]).glob("pytest-*/ws2"))
    assert len(stream_dirs) == 1, stream_dirs
    latest = ResultStream(stream_dirs[0]).latest()
    assert set(latest) == {c.id for c in cells}
    verdict = latest[faulty.id]
    assert verdict.status in ("error", "timeout") and verdict.first_failure == first
    assert sorted(r.rank for r in verdict.ranks) == [0, 1]
