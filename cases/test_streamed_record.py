"""A run record read and written a cell at a time (the parent's memory does not grow with
its cells, docs/performance.md): the same cells, the same record bytes, the same reports.

- ``recordfile.read_streamed``/``cells_of`` give the cells and keys ``read`` gives, whatever
  the chunk the text is read in (a value cut by a chunk's end, a number cut in two);
- a ``StoredCell`` is the cell dict, its ranks read when asked for;
- ``assemble.write_judged`` (the sweep's fold: verdicts judged as they come) writes the bytes
  ``judge`` and ``write`` of the list write, under a ledger with known and stale entries;
- every report written from the streamed record is the one written from the list;
- a stream line that is no verdict (a torn write, a foreign writer) hides no earlier verdict;
- a report that fails to render leaves the earlier reports and no partial file;
- ``report`` refuses a record of another schema, as ``load`` does;
- the HTML report's summary blob, written a piece at a time, is ``encode`` of its object, and
  its size is ``_size``'s;
- ``matrix.select`` with a sample draws the cells ``sample`` of the whole selection draws.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures import report_records as H
from harness.judging import assemble
from harness.judging import ledger as ledgers
from harness.records import recordfile
from harness.records.record import CellResult, Check, RankResult, RunRecord
from harness.records.stream import ResultStream
from harness.records.verdicts import Verdicts
from harness.vocabulary import matrix
from harness_reports import _pack, write_all


#: a part of ``full`` small enough to select in a moment
SMALL = {"module": ("linear", "grouped_linear"), "world_size": (1, 2), "weight": ("plain", "distributed"),
         "dtype": ("fp32",), "recipe": ("none",), "shape": ("base",), "layers": (1,)}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    record = H.make_ledger_record()
    folder = tmp_path_factory.mktemp("run")
    RunRecord.from_dict(record).write(folder)
    return recordfile.read(folder), folder


@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_a_streamed_record_reads_as_the_whole(stored, chunk, monkeypatch) -> None:
    whole, folder = stored
    monkeypatch.setattr(recordfile, "_CHUNK", chunk)
    streamed = recordfile.read_streamed(folder)
    cells = list(streamed.pop("cells"))
    assert cells == whole["cells"] and streamed == {k: v for k, v in whole.items() if k != "cells"}
    assert recordfile.read_head(folder) == streamed  # the writer puts the cells last
    assert [json.dumps({**c}) for c in cells] == [json.dumps(c) for c in whole["cells"]]  # key order kept


def test_a_stored_cell_reads_its_ranks_when_asked(stored) -> None:
    whole, folder = stored
    first = next(iter(recordfile.read_streamed(folder)["cells"]))
    assert first.get("ranks") == whole["cells"][0]["ranks"] and first.copy() == whole["cells"][0]


def _verdicts() -> list[CellResult]:
    """Verdicts of real cells (a ledger selects by their axes), every third one failing."""
    out = []
    for n, cell in enumerate(matrix.select("full", SMALL)[:90]):
        status = "fail" if n % 3 == 0 else "pass"
        check = Check("weight0.main_grad", "tensor", status == "pass", None if status == "pass" else "too far",
                      numel=4, ratio=0.5 if status == "pass" else 40.0, max_abs=1e-3)
        out.append(CellResult(cell.id, cell.serialize(), cell.expect, status, worst_ratio=check.ratio,
                              ranks=[RankResult(0, status, [check])],
                              first_failure=None if status == "pass" else "[rank 0] too far"))
    return out


@pytest.mark.parametrize("ledger", [None, "shipped"])
def test_the_fold_writes_the_bytes_of_the_list(ledger, tmp_path) -> None:
    led = ledgers.shipped()[0] if ledger else None
    head = assemble.start(backend="b", argv=["sweep"], selection={"preset": "ci"}, device="cpu", backend_info=None,
                          world_sizes=[1], started="2026-01-01T00:00:00+00:00")
    listed, folded = (RunRecord.from_dict({**head.serialize(), "cells": []}) for _ in range(2))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assemble.judge(listed, _verdicts(), led).write(tmp_path / "a")
    assemble.write_judged(folded, iter(_verdicts()), led, tmp_path / "b")
    a, b = ((tmp_path / d / recordfile.FILENAME).read_bytes() for d in "ab")
    assert a == b and recordfile.read(tmp_path / "a")["counts"]["fail"] == 30
    assert not [p for p in (tmp_path / "b").iterdir() if p.name != recordfile.FILENAME]  # no spill left


def test_reports_from_the_stream_are_the_reports_of_the_list(stored, tmp_path) -> None:
    whole, folder = stored
    (tmp_path / "list").mkdir(), (tmp_path / "stream").mkdir()
    # the same folder name in both: the markdown names the HTML report's path
    write_all(whole, tmp_path / "list")
    listed = {p.name: p.read_bytes() for p in (tmp_path / "list").iterdir()}
    write_all(recordfile.read_streamed(folder), tmp_path / "list")
    assert {p.name: p.read_bytes() for p in (tmp_path / "list").iterdir()} == listed


def test_a_stream_line_that_is_no_verdict_hides_no_verdict(tmp_path) -> None:
    verdict = _verdicts()[1]
    stream = ResultStream(tmp_path)
    stream.append(verdict, "b")
    with open(stream.path, "a") as f:  # an id, but not a verdict: no status, axes or expectation
        f.write(json.dumps({"backend": "b", "result": {"id": verdict.id}}) + "\n")
    found = Verdicts(tmp_path, "b")
    assert verdict.id in found and found.get(verdict.id).serialize() == verdict.serialize()


def test_a_report_that_fails_leaves_the_earlier_reports_and_no_partial_file(stored, tmp_path, monkeypatch) -> None:
    whole, _ = stored
    write_all(whole, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(record, f):
        f.write("<testsuites>")
        raise RuntimeError("planted")

    monkeypatch.setattr("harness_reports.write_junit", broken)
    with pytest.raises(RuntimeError, match="planted"):
        write_all({**whole, "backend": "another"}, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_report_refuses_a_record_of_another_schema(stored, tmp_path, capsys) -> None:
    from harness.cli import main
    from harness.vocabulary.errors import BAD_INPUT

    whole, _ = stored
    recordfile.write({k: v for k, v in whole.items() if k != "cells"} | {"schema": 99}, tmp_path, whole["cells"])
    assert main(["report", str(tmp_path)]) == BAD_INPUT
    assert "unsupported run record schema=99" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_the_summary_blob_in_pieces_is_encode_of_its_object(chunk, monkeypatch) -> None:
    monkeypatch.setattr(_pack, "_BLOB_CHUNK", chunk)  # 7: many pieces, base64 carrying bytes over
    record = H.make_ledger_record()
    # UTF-8 sizes of 2, 4 and 3 bytes, and DEL, which only ``ensure_ascii`` escapes
    record["cells"][0]["first_failure"] = "na\u00efve \U0001d6fc \u2028 \x7f </script>"
    blob, _, _ = _pack.pack(record)
    text = "".join(blob.encoded())
    summary = _pack.decode(text)
    assert text == _pack.encode(summary) and blob.size() == _pack._size(summary)
    assert summary["n"] == len(record["cells"]) and summary["id"] == [c["id"] for c in record["cells"]]
    assert _pack.decode(text)["S"][summary["ff"]["0"]] == record["cells"][0]["first_failure"]


def test_a_sample_drawn_while_selecting_is_the_sample_of_the_selection() -> None:
    whole = matrix.select("full", SMALL)
    assert 50 < len(whole) < 10_000
    for count in (1, 37, len(whole), len(whole) + 5):
        assert matrix.select("full", SMALL, sample=(count, 3)) == matrix.sample(whole, count, 3)
