"""The compact run record and the sweep's fold of the stream into it, in-process.

- ``results.json.gz`` round-trips to the same objects, an older ``results.json`` still loads;
- an interrupted sweep keeps every verdict it has, failing ones included (a failing
  ``CellResult`` is falsy: a fold written ``latest.get(id) or skipped`` showed them skipped);
- ``--resume`` takes the verdicts of a folder that holds only its record (no stream);
- packing deals cells to lanes of one launch as ``harness.vocabulary.packing`` promises;
- a launch plan (``harness.vocabulary.plan``) round-trips, and a plan written before lanes and per-task
  examples existed still loads.

The sweep's launcher is replaced by a stand-in that appends verdicts to the stream, so no
process is started.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.vocabulary import matrix
from harness.records import recordfile, runfolder
from harness.orchestration import sweep
from harness.vocabulary import hook_modes, packing
from harness.launcher.launch import LaunchOptions
from harness.vocabulary.plan import Lane, LaunchPlan, PlanTask
from harness.records.record import SCHEMA, Check, CellResult, LaunchRecord, RankResult, RunRecord, load
from harness.records.stream import ResultStream

CELLS = [c for c in matrix.select("ci") if c.module == "linear"][:6]
BACKEND = "harness.backends.reference"


def _verdict(cell: matrix.Cell, status: str) -> CellResult:
    return CellResult(cell.id, cell.serialize(), cell.expect, status, ranks=[RankResult(0, status)],
                      first_failure=None if status == "pass" else "[rank 0] boom")


def _spec(run_dir: Path, resume: bool = False) -> sweep.SweepSpec:
    return sweep.SweepSpec(cells=CELLS, backend=BACKEND, run_dir=run_dir, selection={"preset": "ci"},
                           argv=["sweep"], options=LaunchOptions(BACKEND, run_dir), resume=resume)


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


@pytest.mark.parametrize("count", [0, 1, 400])
def test_a_record_streams_its_cells_into_the_same_json(tmp_path, count, monkeypatch):
    """``RunRecord.write`` encodes the cells a few at a time, never the whole record at once,
    and writes exactly the bytes of the record's JSON in one piece: with no cell, one, and
    more than two pieces of cells; gzipped or plain. And the whole record is never encoded at
    once."""
    cells = [_verdict(CELLS[i % len(CELLS)], ("pass", "fail")[i % 2]) for i in range(count)]
    record = RunRecord("complete", "t0", "t1", 1.0, "cmd", [], BACKEND, {}, {}, {}, [1], cells=cells)
    whole = json.dumps(record.serialize(), separators=(",", ":")).encode()
    if count > 1:
        assert len(whole) > 2 * recordfile._PIECE
    real_dumps = json.dumps

    def dumps(value, *args, **kwargs):
        assert not (isinstance(value, dict) and "cells" in value), "the whole record was encoded at once"
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(recordfile.json, "dumps", dumps)
    assert record.write(tmp_path / "r.json").read_bytes() == whole
    assert gzip.decompress(record.write(tmp_path).read_bytes()) == whole


def test_a_record_head_that_names_many_cells_is_written_in_pieces(tmp_path):
    """A record's head names every cell of its launches, so it grows with the cells: it is
    encoded a piece at a time (no piece much over ``_PIECE`` characters), and the bytes are
    ``json.dumps``'s."""
    ids = [f"{CELLS[i % len(CELLS)].id}-{i}" for i in range(5000)]
    head = {"status": "complete", "launches": [{"world_size": 2, "cells": ids[:3000]},
                                               {"world_size": 4, "cells": ids[3000:]}], "after": [1.5, None]}
    cells = [{"id": i} for i in ids[:3]]
    pieces = list(recordfile._encoded(head, cells))
    whole = json.dumps({**head, "cells": cells}, separators=(",", ":")).encode()
    assert b"".join(pieces) == whole
    assert len(pieces) > 4 and max(map(len, pieces)) < 2 * recordfile._PIECE
    assert b"".join(recordfile._encoded(head, None)) == json.dumps(head, separators=(",", ":")).encode()
    assert recordfile.read(recordfile.write(head, tmp_path / "h.json.gz", cells)) == {**head, "cells": cells}


def test_packed_strings_are_the_list_they_stand_for(tmp_path):
    """A launch's cell ids are kept compressed (``recordfile.PackedStrings``) and written as the
    JSON list they stand for, a piece at a time: the record's bytes are ``json.dumps``'s of the
    plain lists, and a record read back and written again is the same record."""
    ids = [f"{CELLS[i % len(CELLS)].id}-{i}" for i in range(20000)] + ['quote"back\\slash', "\u00e9t\u00e9", ""]
    packed = recordfile.PackedStrings(ids)
    assert list(packed) == ids and len(packed) == len(ids) and packed == ids and packed[3] == ids[3]
    assert len(packed._data) < sum(map(len, ids)) / 5  # cell ids repeat their axis values
    assert list(recordfile.PackedStrings([])) == [] and recordfile.PackedStrings(["a"]) != ["b"]
    with pytest.raises(ValueError, match="newline"):
        recordfile.PackedStrings(["a\nb"])
    head = {"launches": [{"cells": packed, "n": 1}, {"cells": recordfile.PackedStrings([])}], "after": None}
    plain = {"launches": [{"cells": ids, "n": 1}, {"cells": []}], "after": None}
    pieces = list(recordfile._pieces(head))
    assert "".join(pieces) == json.dumps(plain, separators=(",", ":"))
    assert max(map(len, pieces)) < 2 * recordfile._PIECE
    launch = LaunchRecord(2, ids[:5], 0, 1.5, "logs/ws2-0", note="n")
    assert isinstance(launch.cells, recordfile.PackedStrings)
    assert launch.serialize() == {"world_size": 2, "cells": ids[:5], "exit_code": 0, "duration_s": 1.5,
                                  "log_dir": "logs/ws2-0", "attempt": 0, "note": "n"}
    assert LaunchRecord.from_dict(launch.serialize()) == launch
    record = RunRecord.from_dict({"schema": SCHEMA, "status": "complete", "started": "t", "backend": "b",
                                  "launches": [launch.serialize()], "cells": []})
    path = record.write(tmp_path / "r.json")
    assert path.read_text() == json.dumps(record.serialize(), separators=(",", ":"))
    assert load(path).launches == [launch]


@pytest.mark.parametrize("zipped", [True, False])
def test_a_head_longer_than_a_chunk_is_read_an_item_at_a_time(tmp_path, monkeypatch, zipped):
    """``read_head`` and ``cells_of`` decode a list or object longer than a read chunk an item at
    a time: the values equal ``json.loads``'s, and the text held never grows past a few chunks
    (decoded whole, a launch list of a 100,000-cell sweep was held as one string and decoded
    again with every chunk)."""
    chunk = 4096
    monkeypatch.setattr(recordfile, "_CHUNK", chunk)
    ids = [f"{CELLS[i % len(CELLS)].id}-{i}" for i in range(3000)]
    head = {"status": "complete", "launches": [{"world_size": 2, "cells": ids[:2000], "note": None},
                                               {"world_size": 4, "cells": ids[2000:], "duration_s": 1.25}],
            "selection": {"nested": {"deep": [[1, 2.5, -3e-7], {"k": "v" * 5000}], "big": list(range(2000))}},
            "after": [1.5, None, True]}
    cells = [{"id": i, "ranks": [{"value": 0.1 * n} for n in range(300)]} for i in ids[:20]]
    path = recordfile.write(head, tmp_path / ("r.json.gz" if zipped else "r.json"), cells)
    held = []
    more = recordfile._Values._more

    def watched(self):
        got = more(self)
        held.append(len(self.buf))
        return got

    monkeypatch.setattr(recordfile._Values, "_more", watched)
    assert recordfile.read_head(path) == head
    assert held and max(held) <= 3 * chunk
    got_head: dict = {}
    assert list(recordfile.cells_of(path, got_head)) == cells and got_head == head
    assert recordfile.read(path) == {**head, "cells": cells}


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
    # the record's cells are on disk only: the sweep never holds them
    assert not record.cells and [c.status for c in load(tmp_path).cells] == ["fail"] + ["pass"] * (len(CELLS) - 1)


def test_packing_lanes_cover_every_cell_once_in_phases():
    everything = matrix.select("ci")
    # a cell whose installer gathers over every rank of the job (Megatron's offloading) runs
    # in a launch of its own world size, with the others of that size, unless it is the width
    spans = [c for c in everything if hook_modes.KINDS[c.hooks].spans_world]
    assert {c.world_size for c in spans} == {1, 2, 4}
    groups = packing.launch_groups(everything)
    assert [(w, {everything[i].world_size for i in g}) for w, g in groups] == [(4, {1, 2, 4}), (2, {2}), (1, {1})]
    assert {everything[i] for _, g in groups[1:] for i in g} == {c for c in spans if c.world_size != 4}
    cells = [c for c in everything if not hook_modes.KINDS[c.hooks].spans_world]
    groups = packing.launch_groups(cells)
    assert [w for w, _ in groups] == [4] and sorted(groups[0][1]) == list(range(len(cells)))
    lanes = packing.pack(cells, 4)
    assert sorted(i for lane in lanes for i in lane.tasks) == list(range(len(cells)))
    assert [len(l.ranks) for l in lanes] == sorted((len(l.ranks) for l in lanes), reverse=True)
    lane_of = {i: n for n, lane in enumerate(lanes) for i in lane.tasks}
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault(c.twin_id, []).append(i)
    assert any(len(g) > 1 for g in groups.values())
    for members in groups.values():  # the cells that share a hooks-off twin share a lane
        assert len({lane_of[i] for i in members}) == 1, [cells[i].id for i in members]
    for lane in lanes:
        assert {cells[i].world_size for i in lane.tasks} == {len(lane.ranks)}
        assert lane.ranks[0] % len(lane.ranks) == 0
        # selection order by group; in a group the hooks-off cell first, then the hooked ones
        first = {i: groups[cells[i].twin_id][0] for i in lane.tasks}
        assert lane.tasks == sorted(lane.tasks, key=lambda i: (first[i], cells[i].hooks != "off", i))
    assert {len(l.ranks) for l in lanes} == {1, 2, 4} and len(lanes) == 1 + 2 + 4
    # off: one launch per world size; a size that does not divide the largest gets its own
    assert [w for w, _ in packing.launch_groups(cells, packing=False)] == [1, 2, 4]
    three = [c for c in matrix.select("ci", {"world_size": (1, 2, 3, 4)}) if not hook_modes.KINDS[c.hooks].spans_world]
    assert [w for w, _ in packing.launch_groups(three)] == [4, 3]
    assert [w for w, _ in packing.launch_groups(cells, slots=8)] == [8]


def test_launch_plan_round_trips_and_an_older_plan_loads(tmp_path):
    cells = [c for c in matrix.select("ci") if c.world_size in (1, 2)][:5]
    plan = LaunchPlan(tmp_path, "ws2-0", [PlanTask(BACKEND, c.id, 2 if i == 1 else None) for i, c in enumerate(cells)],
                      packing.pack(cells, 2), exit_when_done=True, example={"batch": 3}, examples=1,
                      collective_timeout=7.5)
    plan.write(tmp_path / "plan.json")
    again = LaunchPlan.read(tmp_path / "plan.json")
    assert again == plan and again.serialize() == plan.serialize()
    assert [again.examples_of(t) for t in again.tasks] == [1, 2, 1, 1, 1]
    assert again.lanes_for(2) == packing.pack(cells, 2)
    # what the worker read before the plan had lanes or per-task examples, and without the
    # set-up keys (defaults as the worker always took them)
    old = LaunchPlan.from_dict({"run_dir": str(tmp_path), "launch": "ws2-0",
                                "tasks": [{"backend": BACKEND, "cell": c.id} for c in cells[:2]]})
    assert old.lanes_for(2) == [Lane((0, 1), [0, 1])] and not old.exit_when_done
    assert (old.device, old.threads_per_rank, old.example, old.collective_timeout) == ("auto", 1, None, 120.0)
    assert [old.examples_of(t) for t in old.tasks] == [0, 0]


def _checked(cell: matrix.Cell, status: str) -> CellResult:
    ok = status == "pass"
    checks = [Check("mb0.output", "tensor", ok, None if ok else "mismatch", numel=360, mismatched=0 if ok else 3,
                    max_abs=0.022406101226806640, max_rel=0.030764391318024536, ratio=0.19186055451755030 if ok else 1.5,
                    bound_at_worst=0.10515687839777867, index=[5, 25]),
              Check("mb0.output.twin", "twin", True, numel=360, mismatched=0, max_abs=0.0, index=[0, 0]),
              Check("wgrad_hook_calls", "count", True, expected=0, actual=0)]
    return CellResult(cell.id, cell.serialize(), cell.expect, status, worst_ratio=checks[0].ratio,
                      ranks=[RankResult(0, status, checks)])


def test_a_passing_cell_keeps_each_checks_verdict_and_margin_a_failing_one_everything(tmp_path):
    record = RunRecord("complete", "t0", "t1", 1.0, "cmd", [], BACKEND, {}, {}, {}, [1],
                       cells=[_checked(CELLS[0], "pass"), _checked(CELLS[1], "fail")])
    cells = recordfile.read(record.write(tmp_path))["cells"]
    passing, failing = ([c for r in cell["ranks"] for c in r["comparisons"]] for cell in cells)
    assert passing == [{"name": "mb0.output", "kind": "tensor", "ok": True, "numel": 360, "ratio": 0.191861},
                       {"name": "mb0.output.twin", "kind": "twin", "ok": True, "numel": 360, "max_abs": 0.0},
                       {"name": "wgrad_hook_calls", "kind": "count", "ok": True, "expected": 0, "actual": 0}]
    assert cells[0]["worst_ratio"] == 0.191861
    assert failing == [c.serialize() for c in _checked(CELLS[1], "fail").ranks[0].comparisons]
    assert load(tmp_path).cells[0].ranks[0].comparisons[0].max_abs is None  # loads; the detail is gone


def test_a_complete_sweep_gzips_its_launch_logs_and_plans_an_interrupted_one_keeps_them(tmp_path, monkeypatch):
    def launch_writing_files(interrupt_after):
        inner = _fake_launch({}, interrupt_after)

        def launch(width, cells, opts, on_result):
            (opts.run_dir / "logs" / f"ws{width}-0").mkdir(parents=True, exist_ok=True)
            (opts.run_dir / "logs" / f"ws{width}-0" / "rank0.log").write_text("[rank0] up\n")
            (opts.run_dir / "plans").mkdir(exist_ok=True)
            (opts.run_dir / "plans" / f"ws{width}-0.json").write_text('{"tasks": []}')
            return inner(width, cells, opts, on_result)
        return launch

    monkeypatch.setattr(sweep, "launch_cells", launch_writing_files(2))
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(_spec(tmp_path))
    files = lambda: sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("[lp]*/**/*.*"))  # noqa: E731
    width = packing.launch_groups(CELLS)[0][0]
    assert files() == [f"logs/ws{width}-0/rank0.log", f"plans/ws{width}-0.json"]
    monkeypatch.setattr(sweep, "launch_cells", launch_writing_files(None))
    assert sweep.run_sweep(_spec(tmp_path, resume=True)).status == "complete"
    assert files() == [f"logs/ws{width}-0/rank0.log.gz", f"plans/ws{width}-0.json.gz"]
    assert runfolder.read_text(tmp_path / "logs" / f"ws{width}-0" / "rank0.log") == "[rank0] up\n"
