"""A backend's crash or hang in ``ci`` is the backend's, never a harness error: one sweep per
fault of the whole ``sweep --preset ci --recipes none``, and one per fault under one recipe
(``RECIPE``), against ``fixtures/faults.py``, whose forward faults in the fp16 cells at world
size >= 2 with a plain, a distributed or an in-place GTP weight (``FAULTED``, ``DW_FAULT_CELLS``:
each kind of step below among them), a hooked cell's hooks-off twin included: rank
1 raises, rank 1 is SIGKILLed, rank 0 hangs. Each faulted cell costs a launch (a hang, its
bound too), so the fault fires in a cell of each kind, not in every cell of a dtype.

Under the recipe the sweep takes every cell the fault fires in and, of the others, the first of
each consumer x weight x delayed-wgrad x first-microbatch combination (``--cells``): the
quantized paths' twins and packing meet the faults, in a small part of the recipe's ``ci``.

The recipe-free sweep runs every cell of the recipe-free ``ci`` the reference can run (those that need
TE's or Megatron's code are left out, as a sweep leaves them out): the cells the fault fires
in, the cells packed beside them, and every other cell, which must still pass after the
faults ended the launches before them. A faulted cell ends its launch (its peers are stuck or
gone) and a fresh launch takes the cells left: the cost is one launch per faulted cell.

Those cells span the consumers (a plain weight under the ``autograd`` consumer, whose step
has no collective but the harness's own, so the peers of the faulty rank wait in the
harness's code; distributed and GTP weights under ``ddp``, whose peers wait in the weight's
all-gather), delayed wgrad (the expected-error cell among them), ``is_first_microbatch``,
hooked cells whose twin a lane runs and keeps, and lanes of two ranks beside another lane in
a packed launch of four. What must hold for each fault: exit 1; no ``harness_error`` cell;
every cell without the fault passes (or meets its expected error); every faulted cell is
``error`` or ``fail`` (raise, kill) or ``timeout`` (hang), names the faulty rank and the
fault, and counts only that rank against the cell: each other rank met its expectation or
failed by its peer (``RankResult.by_peer``).

No wall-clock limit is asserted (the machine may be loaded). The sweeps run once per pytest
run, shared by xdist workers (``run_once``), three at a time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.runs import assert_nothing_left, end_survivors, run_once
from harness.records import recordfile, runfolder
from harness.records.fold import failed
from harness.records.record import RankResult
from harness.vocabulary import matrix, selection
from harness.vocabulary.matrix import Cell, compile_filter
from harness.vocabulary.plan import LaunchPlan

ROOT = Path(__file__).resolve().parents[1]
#: the cells the faults fire in: of the fp16 cells at world size >= 2 of each sweep's ``ci``,
#: those of the weights that name each kind of step the docstring lists (the test asserts
#: each kind is among them)
FAULTED = 'dtype == "fp16" and world_size >= 2 and weight in ("plain", "distributed", "gtp_inplace")'


#: the recipe of the second sweep per fault: MXFP8, how MoE experts train on Blackwell (its
#: ``ci`` holds the grouped-tensor path, ``grouped_linear_tensor``)
RECIPE = "mxfp8"
#: the combinations of which the recipe's sweep takes one cell each
COMBINATION = ("consumer", "weight", "delay_wgrad", "first_mb")


@functools.cache
def _swept(recipe: str) -> list[str]:
    """The cells the sweeps of ``recipe`` run (sorted ids), made once for the three faults'
    tests: the recipe-free ci, less the cells that need TE or Megatron; under a recipe, of its
    ci, every cell the fault fires in and the first cell of each ``COMBINATION`` of the rest."""
    cells = [c for c in matrix.select("ci", {"recipe": (recipe,)}) if not selection.requires(c)]
    if recipe == "none":
        return sorted(c.id for c in cells)
    faulted = compile_filter(FAULTED)
    first: dict[tuple, str] = {}
    for c in cells:
        if not faulted(c):
            first.setdefault(tuple(getattr(c, a) for a in COMBINATION), c.id)
    return sorted({c.id for c in cells if faulted(c)} | set(first.values()))


@dataclass(frozen=True)
class Fault:
    """One fault of ``fixtures/faults.py`` and what its cells must say."""

    mode: str
    rank: int
    #: the statuses a faulted cell may get
    statuses: tuple[str, ...]
    #: words the faulted cell's first failure must hold (the fault, named)
    names: tuple[str, ...]
    #: seconds the faulty rank waits before the fault fires (``DW_FAULT_DELAY``)
    delay: float = 0.0


FAULTS = {
    # the expected-error cell among them fails: its rank 1 raised the fault, not the rejection
    "raise": Fault("raise", 1, ("error", "fail"), ("injected fault",)),
    # late, so that the peers of a plain weight's cell wait in the harness's own collective
    # when it dies: what broke there is no harness error
    "die": Fault("die", 1, ("error",), ("SIGKILL",), delay=1.0),
    "hang": Fault("hang", 0, ("timeout",), ("Timeout", "hung in the backend's forward phase", "faults.py")),
}


#: each sweep: its name -> (the fault, the recipe)
SWEEPS = {f"{mode}-{recipe}": (fault, recipe) for recipe in ("none", RECIPE) for mode, fault in FAULTS.items()}


def _sweep(root: Path, name: str) -> subprocess.Popen:
    fault, recipe = SWEEPS[name]
    env = {**os.environ, "DW_FAULT": fault.mode, "DW_FAULT_RANK": str(fault.rank), "DW_FAULT_CELLS": FAULTED,
           "DW_FAULT_DELAY": str(fault.delay), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "harness", "sweep", "--preset", "ci", "--recipes", recipe,
           "--backend", "fixtures/faults.py", "--out", str(root / name), "--quiet"]
    if recipe != "none":
        cmd += ["--cells", ",".join(_swept(recipe))]
    with open(root / f"{name}.stderr", "w") as err:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)


@pytest.fixture(scope="module")
def ci_runs(tmp_path_factory) -> dict[str, dict]:
    """The six fault sweeps, three at a time (the two hang sweeps first), once (shared by xdist
    workers)."""
    def run_all(root: Path) -> None:
        # the longest first: a hang sweep waits out a bounded timeout per hung cell (about
        # twice the others' wall), so started last it ran alone at the end
        queue = sorted(SWEEPS, key=lambda name: (SWEEPS[name][0].mode != "hang", SWEEPS[name][1] != "none"))
        procs: dict[str, tuple[float, subprocess.Popen]] = {}
        left: dict[str, tuple[float, subprocess.Popen]] = {}
        deadline = time.monotonic() + 1200  # a hang guard, not a speed limit
        try:
            while (left or queue) and time.monotonic() < deadline:
                while queue and len(left) < len(FAULTS):
                    name = queue.pop(0)
                    procs[name] = left[name] = (time.monotonic(), _sweep(root, name))
                for name, (t0, proc) in list(left.items()):
                    if proc.poll() is not None:  # each sweep's own wall time, for the report
                        (root / f"{name}.json").write_text(json.dumps({"rc": proc.returncode,
                                                                       "wall_s": round(time.monotonic() - t0, 1)}))
                        del left[name]
                time.sleep(0.2)
            assert not left and not queue, f"fault sweeps not done after 1200 s: {sorted(left) + queue}"
        finally:
            for name, (_, proc) in procs.items():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    end_survivors(root / name)

    root = run_once(tmp_path_factory, "faults-ci", run_all)
    yield {name: {"dir": root / name, **json.loads((root / f"{name}.json").read_text()),
                  "stderr": (root / f"{name}.stderr").read_text()} for name in SWEEPS}
    for name in SWEEPS:
        end_survivors(root / name)


def _lanes_of(run_dir: Path, record: dict) -> dict[str, tuple[int, int]]:
    """Each cell's lane in the launch that gave its verdict: (lane width, launch width)."""
    out = {}
    for launch in record["launches"]:
        name = Path(launch["log_dir"]).name
        plan = LaunchPlan.from_dict(json.loads(runfolder.read_text(run_dir / "plans" / f"{name}.json")))
        for lane in plan.lanes_for(launch["world_size"]):
            for i in lane.tasks:
                out[plan.tasks[i].cell] = (len(lane.ranks), launch["world_size"])
    return out


@pytest.mark.parametrize("name", list(SWEEPS))
def test_backend_fault_over_ci_is_the_backends(ci_runs, name):
    run, (fault, recipe) = ci_runs[name], SWEEPS[name]
    assert run["rc"] == 1, run["stderr"][-3000:]
    record = recordfile.read(run["dir"])
    assert record["status"] == "complete"
    cells = {c["id"]: c for c in record["cells"]}
    assert sorted(cells) == _swept(recipe), f"the sweep did not run the cells of recipe {recipe} it should"
    assert not [i for i, c in cells.items() if c["status"] == "harness_error"], \
        [(i, c["first_failure"]) for i, c in cells.items() if c["status"] == "harness_error"]
    selects = compile_filter(FAULTED)
    faulted = {i for i in cells if selects(Cell.from_id(i))}
    # the ci cells the filter selects, among them each kind of step named in the docstring
    axes = [cells[i]["axes"] for i in faulted]
    assert {a["consumer"] for a in axes} == {"ddp", "autograd"} and {a["weight"] for a in axes} >= {"plain", "distributed"}
    assert any(a["delay_wgrad"] for a in axes) and any(a["first_mb"] for a in axes)
    assert any(cells[i]["expect"] == "error" for i in faulted), "no expected-error cell among the faulted"
    assert any(a["hooks"] != "off" for a in axes if a["weight"] == "plain")
    assert {a["world_size"] for a in axes} == {2, 4}
    others = {i: (c["status"], c["first_failure"]) for i, c in cells.items()
              if i not in faulted and c["status"] not in ("pass", "xfail")}
    assert not others, others
    for i in sorted(faulted):
        cell = cells[i]
        assert cell["status"] in fault.statuses, (i, cell["status"], cell["first_failure"])
        first = cell["first_failure"] or ""
        assert first.startswith(f"[rank {fault.rank}]"), (i, first)
        assert all(word in first for word in fault.names), (i, first)
        # only the faulty rank counts against the cell: the others met their expectation, or
        # failed because of it (a collective it never joined, a launch ended under them)
        ranks = [RankResult.from_dict(r) for r in cell["ranks"]]
        assert [r.rank for r in ranks if failed(r) and not r.by_peer] == [fault.rank], (i, cell["ranks"])
    # the packed path: a faulted cell ran on a lane of two ranks beside another in a launch of four
    lanes = _lanes_of(run["dir"], record)
    assert any(lanes[i] == (2, 4) for i in faulted), {i: lanes[i] for i in faulted}
    assert_nothing_left(run["dir"], record)
