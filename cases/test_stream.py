"""The result stream: concurrent writers never interleave a line, a torn line is skipped,
readers continue from an offset; and the sweep's progress line says counts and an ETA."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from harness.commands.sweep_cmd import Progress
from harness.records.record import CellResult, RankResult
from harness.records.stream import LineTail, ResultStream

BIG = "x" * 100_000  # far beyond an atomic write: only the lock keeps lines whole


def _result(i: int, status: str = "pass", tb: str = "") -> CellResult:
    err = {"type": "E", "message": "m", "traceback": tb} if tb else None
    return CellResult(f"cell-{i}", {"module": "linear"}, "pass", status, ranks=[RankResult(0, status, [], err)])


def _writer(run_dir: str, who: int, n: int) -> None:
    stream = ResultStream(run_dir)
    for i in range(n):
        stream.append(_result(who * 1000 + i, "error", BIG), backend=f"writer{who}", launch="ws1-0")


def test_concurrent_writers_never_interleave_a_line(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 10)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    verdicts = ResultStream(tmp_path).read()
    assert len(verdicts) == 40
    assert all(v.result.ranks[0].error["traceback"] == BIG for v in verdicts)
    assert len(tmp_path.joinpath("cells.jsonl").read_text().splitlines()) == 40
    for w in range(4):  # each writer's verdicts in its own order
        mine = [v.result.id for v in verdicts if v.backend == f"writer{w}"]
        assert mine == [f"cell-{w * 1000 + i}" for i in range(10)]


def test_torn_line_is_skipped_and_read_since_continues(tmp_path: Path) -> None:
    stream = ResultStream(tmp_path)
    stream.append(_result(1), "b")
    first, offset = stream.read_since(0)
    assert [v.result.id for v in first] == ["cell-1"]
    with open(stream.path, "a") as f:
        f.write('{"backend": "b", "result": {"id": "cell-2"')  # a writer died mid-line
    assert stream.read_since(offset) == ([], offset)
    with open(stream.path, "a") as f:
        f.write("\n")
    stream.append(_result(3, "fail"), "b")
    more, _ = stream.read_since(offset)
    assert [v.result.id for v in more] == ["cell-3"]
    stream.append(_result(1, "fail"), "b")
    latest = stream.latest("b")
    assert list(latest) == ["cell-1", "cell-3"] and latest["cell-1"].status == "fail"
    assert stream.latest("other") == {}


def test_size_marks_where_a_reader_starts(tmp_path: Path) -> None:
    """``size`` is the offset after everything appended so far (0 before the first append):
    a sweep, a self-test, the launcher and each rank read only the verdicts after it."""
    stream = ResultStream(tmp_path)
    assert stream.size() == 0
    stream.append(_result(1), "b")
    since = stream.size()
    assert since > 0 and stream.read_since(since) == ([], since)
    stream.append(_result(2), "b")
    assert [v.result.id for v in stream.read_since(since)[0]] == ["cell-2"]


def test_line_tail_reads_complete_lines_appended_after_it_was_made(tmp_path: Path) -> None:
    """The launcher follows each rank's report file with ``LineTail``: what was there before
    is not read, a line still being written waits, an unparsable one is skipped."""
    path = tmp_path / "ws2-0.rank0.jsonl"
    assert LineTail(path).read() == []  # no file yet
    path.write_text('{"event": "old"}\n')
    tail = LineTail(path)
    assert tail.read() == []
    with open(path, "a") as f:
        f.write('{"event": "ready"}\nnot json\n{"event": "res')
    assert tail.read() == [{"event": "ready"}]
    with open(path, "a") as f:
        f.write('ult", "i": 0}\n')
    assert tail.read() == [{"event": "result", "i": 0}] and tail.read() == []


def test_progress_line_has_counts_rate_and_eta(capsys) -> None:
    progress = Progress(quiet=False)
    progress.tty = False
    for i, status in enumerate(["pass"] * 24 + ["fail"], start=1):
        progress(_result(i, status), i, 100)
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("[   25/100]")][-1]
    assert "24 pass, 1 fail" in line and "cells/s" in line and "ETA" in line, line
    progress.waiting("launch ws2-0: starting 2 rank(s) (0 ready after 10 s)")
    assert "starting 2 rank(s)" in capsys.readouterr().out


def test_a_retired_stream_reads_its_record_then_what_was_appended_since(tmp_path: Path) -> None:
    """A complete run's stream is folded into its record and deleted (a finished folder costs
    no more than its record); reading it gives the record's verdict per cell, then any
    verdict appended later (a ``--resume``), the later one winning."""
    from harness.records import recordfile

    stream = ResultStream(tmp_path)
    for i in (1, 2):
        stream.append(_result(i, "fail"), "b")
    recordfile.write({"backend": "b", "cells": [_result(1, "fail").serialize(), _result(2, "fail").serialize(),
                                                 CellResult("cell-3", {}, "pass", "skipped").serialize()]}, tmp_path)
    stream.retire()
    assert not stream.path.exists() and (tmp_path / "cells.retired").exists()
    assert [(v.result.id, v.result.status) for v in stream.read()] == [("cell-1", "fail"), ("cell-2", "fail")]
    assert stream.read_since(0) == ([], 0)  # live readers see only live appends
    stream.append(_result(2, "pass"), "b")
    assert [(v.result.id, v.result.status) for v in stream.read()] == [("cell-1", "fail"), ("cell-2", "pass")]
    assert {i: r.status for i, r in stream.latest("b").items()} == {"cell-1": "fail", "cell-2": "pass"}
