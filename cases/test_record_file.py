"""The compact run record and the sweep's fold of the stream into it, in-process.

- ``results.json.gz`` round-trips to the same objects, an older ``results.json`` still loads;
- an interrupted sweep keeps every verdict it has, failing ones included (a failing
  ``CellResult`` is falsy: a fold written ``latest.get(id) or skipped`` showed them skipped);
- ``--resume`` takes the verdicts of a folder that holds only its record (no stream);
- packing deals cells to lanes of one launch as ``harness.packing`` promises.

The sweep's launcher is replaced by a stand-in that appends verdicts to the stream, so no
process is started.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness import matrix, packing, recordfile, sweep
from harness.launch import LaunchOptions
from harness.record import CellResult, RankResult, RunRecord, load
from harness.stream import ResultStream

CELLS = [c for c in matrix.select("ci") if c.module == "linear"][:6]
BACKEND = "harness.reference"


def _verdict(cell: matrix.Cell, status: str) -> CellResult:
    return CellResult(cell.id, cell.serialize(), cell.expect, status, ranks=[RankResult(0, status)],
                      first_failure=None if status == "pass" else "[rank 0] boom")


def _spec(run_dir: Path, resume: bool = False) -> sweep.SweepSpec:
    return sweep.SweepSpec(cells=CELLS, backend=BACKEND, run_dir=run_dir, selection={"preset": "ci"},
                           tolerance={}, argv=["sweep"], options=LaunchOptions(BACKEND, run_dir), resume=resume)


def _fake_launch(statuses: dict[str, str], interrupt_after: int | None = None):
    """A stand-in for ``launch_cells``: appends verdicts, optionally then a Ctrl-C."""
    def launch(width, cells, opts, on_result):
        stream = ResultStream(opts.run_dir)
        for n, c in enumerate(cells):
            if interrupt_after is not None and n == interrupt_after:
                raise KeyboardInterrupt
            res = _verdict(c, statuses.get(c.id, "pass"))
            stream.append(res, opts.backend, f"ws{width}-0")
            on_result(res)
        return []
    return launch


def test_gz_record_round_trips_and_legacy_json_loads(tmp_path):
    record = RunRecord("complete", "t0", "t1", 1.0, "cmd", [], BACKEND, {}, {}, {}, [1],
                       cells=[_verdict(c, "fail") for c in CELLS])
    path = record.write(tmp_path)
    assert path.name == "results.json.gz" and path.read_bytes()[:2] == b"\x1f\x8b"
    assert load(tmp_path).serialize() == record.serialize()
    legacy = tmp_path / "old"
    legacy.mkdir()
    (legacy / "results.json").write_text(json.dumps(record.serialize(), indent=1))
    assert load(legacy).serialize() == record.serialize() == load(legacy / "results.json").serialize()
    assert json.loads(gzip.decompress(path.read_bytes()))["cells"][0]["status"] == "fail"
    with pytest.raises(ValueError):
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "results.json.gz").write_bytes(b"\x1f\x8bnot gzip")
        recordfile.read(tmp_path / "broken")


def test_interrupted_record_keeps_failing_verdicts(tmp_path, monkeypatch):
    statuses = {CELLS[0].id: "fail", CELLS[1].id: "error"}
    monkeypatch.setattr(sweep, "launch_cells", _fake_launch(statuses, interrupt_after=3))
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(_spec(tmp_path))
    record = load(tmp_path)
    assert record.status == "incomplete"
    got = [c.status for c in record.cells]
    assert got[:3] == ["fail", "error", "pass"] and set(got[3:]) == {"skipped"}, got


def test_resume_takes_the_verdicts_of_a_record_without_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "launch_cells", _fake_launch({CELLS[0].id: "fail"}, interrupt_after=2))
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(_spec(tmp_path))
    (tmp_path / "cells.jsonl").unlink()  # e.g. a CI artifact that kept only the record
    ran: list[str] = []

    def launch(width, cells, opts, on_result):
        ran.extend(c.id for c in cells)
        return _fake_launch({})(width, cells, opts, on_result)

    monkeypatch.setattr(sweep, "launch_cells", launch)
    record = sweep.run_sweep(_spec(tmp_path, resume=True))
    assert ran == [c.id for c in CELLS[2:]]
    assert record.status == "complete"
    assert [c.status for c in record.cells] == ["fail"] + ["pass"] * (len(CELLS) - 1)


def test_packing_lanes_cover_every_cell_once_in_phases():
    cells = [c for c in matrix.select("ci") if c.world_size in (1, 2, 4)]
    groups = packing.launch_groups(cells)
    assert [w for w, _ in groups] == [4] and sorted(groups[0][1]) == list(range(len(cells)))
    lanes = packing.pack(cells, 4)
    assert sorted(i for lane in lanes for i in lane.tasks) == list(range(len(cells)))
    assert [len(l.ranks) for l in lanes] == sorted((len(l.ranks) for l in lanes), reverse=True)
    for lane in lanes:
        assert {cells[i].world_size for i in lane.tasks} == {len(lane.ranks)}
        assert lane.ranks[0] % len(lane.ranks) == 0 and lane.tasks == sorted(lane.tasks)
    assert {len(l.ranks) for l in lanes} == {1, 2, 4} and len(lanes) == 1 + 2 + 4
    # off: one launch per world size; a size that does not divide the largest gets its own
    assert [w for w, _ in packing.launch_groups(cells, packing=False)] == [1, 2, 4]
    three = [c for c in matrix.select("ci", {"world_size": (1, 2, 3, 4)})]
    assert [w for w, _ in packing.launch_groups(three)] == [4, 3]
    assert [w for w, _ in packing.launch_groups(cells, slots=8)] == [8]
