"""The report layer: HTML, JUnit, markdown and diff rendered from a run record alone.

Records are synthetic but built with ``harness.records.record`` (see ``fixtures/report_records.py``),
with hostile text (``<script>``, ``&``, quotes, ``</script>``) in ids' neighbours, tracebacks
and messages, and the sizes the ``full`` preset reaches.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
import time
from collections import Counter
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest


from fixtures import report_records as H  # noqa: E402

import harness.records.record as hr  # noqa: E402
from harness_reports import (diff_records, render_diff_html, render_diff_text, render_html, render_junit,  # noqa: E402
                     render_markdown, write_all)
from harness_reports import _common  # noqa: E402
from harness_reports._pack import SCRIPT_TYPE, decode, unpack  # noqa: E402

ALL = ("pass", "xfail", "fail", "error", "timeout", "skipped")


class _Scripts(HTMLParser):
    """Collects the text of each <script> element exactly as a browser's tokenizer splits it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._cur: tuple[dict[str, str | None], list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self._cur = (dict(attrs), [])

    def handle_data(self, data: str) -> None:
        if self._cur is not None:
            self._cur[1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._cur is not None:
            self.scripts.append((self._cur[0], "".join(self._cur[1])))
            self._cur = None


def blobs(html_text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report's two JSON blobs (summary, detail), parsed strictly (NaN/Infinity would be a bug)."""
    p = _Scripts()
    p.feed(html_text)
    found = {attrs.get("id"): text for attrs, text in p.scripts if attrs.get("type") == SCRIPT_TYPE}
    assert set(found) == {"dw-data", "dw-detail"}, [a for a, _ in p.scripts]
    assert len(p.scripts) == 3, "a </script> inside the data would split it into more elements"

    def bad_constant(c: str) -> None:
        raise AssertionError(f"non-JSON constant {c} in the embedded data")

    def strict(text: str) -> dict[str, Any]:
        assert re.fullmatch(r"[A-Za-z0-9+/]*=*", text), "the blobs are base64 text"
        return json.loads(json.dumps(decode(text)), parse_constant=bad_constant)

    return strict(found["dw-data"]), strict(found["dw-detail"])


def embedded(html_text: str) -> list[dict[str, Any]]:
    """Every cell as the page sees it, decoded with the reference decoder (``_pack.unpack``)."""
    return unpack(*blobs(html_text))


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    # positions 0..5 force one cell of every status; the rest follow the default mix
    return H.make_record(120, seed=3, force=dict(enumerate(ALL)))


@pytest.fixture(scope="module")
def html_text(record: dict[str, Any]) -> str:
    return render_html(record)


# --------------------------------------------------------------------------- shared vocabulary


def test_one_status_vocabulary(html_text: str) -> None:
    """The record, the renderers and the page share harness.vocabulary.status's table: the page gets
    it from its embedded data, and neither the program nor the stylesheet restates it."""
    import harness.vocabulary.status as hs
    from harness_reports import _assets

    assert _common.STATUSES is hs.STATUSES and hr.STATUSES is hs.STATUSES
    assert _common.GOOD_STATUSES is hr.GOOD_STATUSES is hs.GOOD_STATUSES
    summary, _ = blobs(html_text)
    assert summary["vocab"] == hs.vocabulary()
    js, css = _assets.asset("report.js"), _assets.asset("report.css")
    assert '"expected error met"' not in js and "harness error" not in js
    for s in hs.TABLE:
        assert f"{s.name}: \"" not in js and f"{s.name}: 1" not in js, f"the program restates status {s.name}"
        assert s.color not in css, s.name
        assert f".s-{s.name}{{" in _assets.css()


def test_reports_import_without_torch() -> None:
    code = ("import sys, harness_reports, harness_reports.html, harness_reports.junit, harness_reports.markdown,"
            " harness_reports.diff, harness_reports.browser;"
            "assert 'torch' not in sys.modules, 'reports imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


# --------------------------------------------------------------------------- HTML


def test_html_header_counts_and_environment(record: dict[str, Any], html_text: str) -> None:
    counts = _common.counts_of(record)
    assert all(counts[s] for s in ALL)
    for s in ALL:
        label = _common.STATUS_LABELS[s]
        assert f"{label} <b>{counts[s]:,}</b>" in html_text, s
    for needle in ("harness.backends.reference", "2.13.0+cpu", "cpu / gloo", "515e9b2",
                   "dw-harness sweep --preset ci", "2025-06-11T08:00:00Z", "42m 17s", "1, 2, 4"):
        assert needle in html_text, needle
    assert 'class="verdict v-FAIL">FAIL<' in html_text
    assert 'id="incomplete"' not in html_text and "<b>INCOMPLETE</b>" not in html_text
    assert "<script src" not in html_text and "<link" not in html_text and "@import" not in html_text
    assert "http://" not in html_text and "https://" not in html_text


def test_html_incomplete_is_prominent() -> None:
    rec = H.make_record(12, seed=4, status="incomplete")
    text = render_html(rec)
    assert 'id="incomplete"' in text and "<b>INCOMPLETE</b>" in text
    assert 'class="verdict v-INCOMPLETE">INCOMPLETE<' in text


def test_html_embeds_every_cell_with_status_and_repro(record: dict[str, Any], html_text: str) -> None:
    cells = embedded(html_text)
    assert [c["id"] for c in cells] == [c["id"] for c in record["cells"]]
    for got, cell in zip(cells, record["cells"]):
        assert got["status"] == cell["status"]
        assert got["repro"] == cell["repro"]
        assert got["axes"] == cell["axes"]
        assert got["first_failure"] == cell["first_failure"]
        assert got["expects_error"] == (cell["expect"] == "error")
    summary, _ = blobs(html_text)
    assert summary["layout"] == {"rows": ["module", "weight", "hooks", "fused"], "cols": ["dtype", "world_size"]}
    assert {a for a, _ in summary["axes"]} == set(H.AXES)


def test_html_summary_blob_is_compact(record: dict[str, Any], html_text: str) -> None:
    """The blob the grid needs at once is columnar and gzip-compressed: far smaller than the ids."""
    summary, detail = blobs(html_text)
    n = len(record["cells"])
    assert summary["n"] == n and len(summary["st"]) == n and len(summary["ax"]) == n * len(summary["axes"])
    encoded = html_text.split('id="dw-data">', 1)[1].split("</script>", 1)[0]
    assert len(encoded) < sum(len(c["id"]) for c in record["cells"]) / 2
    assert not any("Traceback" in s for s in summary["S"]), "tracebacks belong to the lazily parsed detail"
    assert any("Traceback" in s for s in detail["S"])


def test_html_escapes_hostile_text(record: dict[str, Any], html_text: str) -> None:
    assert H.EVIL not in html_text
    head, _, rest = html_text.partition(f'<script type="{SCRIPT_TYPE}" id="dw-data">')
    data_blob, _, rest = rest.partition("</script>")
    _, _, rest = rest.partition(f'<script type="{SCRIPT_TYPE}" id="dw-detail">')
    detail_blob, _, tail = rest.partition("</script>")
    assert "<script>alert" not in head + tail, "server-rendered text must be HTML-escaped"
    # the blobs are base64: nothing in them can end the element or open a comment
    for blob in (data_blob, detail_blob):
        assert re.fullmatch(r"[A-Za-z0-9+/]*=*", blob)
    assert any("</script>" in s for s in decode(detail_blob)["S"])  # the traceback's </script>, intact
    assert html_text.count("</script>") == 3
    summary, detail = blobs(html_text)
    assert any(H.EVIL in s for s in detail["S"]), "the text itself must survive, escaped"
    assert any(H.EVIL in s for s in summary["S"])
    # failure signatures and near-miss lists are server-rendered: escaped there too
    assert "&lt;script&gt;alert(&quot;pwned&quot;)" in html_text


def test_html_keeps_full_detail_of_bad_cells(record: dict[str, Any], html_text: str) -> None:
    for got, cell in zip(embedded(html_text), record["cells"]):
        if cell["status"] not in ("fail", "error", "timeout"):
            continue
        assert got["level"] is None
        assert [g["rank"] for g in got["ranks"]] == [r["rank"] for r in cell["ranks"]]
        for g, r in zip(got["ranks"], cell["ranks"]):
            assert g["status"] == r["status"]
            assert [c["name"] for c in g["checks"]] == [c["name"] for c in r["comparisons"]]
            assert [c["ok"] for c in g["checks"]] == [c["ok"] for c in r["comparisons"]]
            assert [c["message"] for c in g["checks"]] == [c.get("message") for c in r["comparisons"]]
            if r["error"]:
                assert g["error"] == r["error"]


def test_html_round_trips_every_check_when_it_fits(record: dict[str, Any], html_text: str) -> None:
    """Below the budget nothing is thinned: every check's numbers survive (to 4 digits)."""
    def close(a: Any, b: Any) -> bool:
        if isinstance(b, float) and isinstance(a, (int, float)):
            return math.isclose(a, b, rel_tol=1e-3)
        return a == b

    for got, cell in zip(embedded(html_text), record["cells"]):
        assert got["level"] is None and got["dropped"] == 0
        assert got["duration_s"] == pytest.approx(cell["duration_s"], rel=1e-3)
        assert got["example"] == cell["example"]
        for g, r in zip(got["ranks"], cell["ranks"]):
            for a, b in zip(g["checks"], r["comparisons"]):
                for k, v in b.items():
                    if k != "actual" and k != "mismatched":
                        assert close(a[k], v), (cell["id"], b["name"], k, a[k], v)


def test_html_thins_passing_cells_only_when_over_budget() -> None:
    rec = H.make_record(60, seed=5, force=dict(enumerate(ALL)))
    assert all(c["level"] is None for c in embedded(render_html(rec)))
    small = embedded(render_html(rec, budget=20_000))
    levels = {c["level"] for c in small}
    assert levels - {None} and levels <= {"fold", "top8", "top3", "none", None}
    for got, cell in zip(small, rec["cells"]):
        if cell["status"] in ("fail", "error", "timeout", "xfail"):
            assert got["level"] is None, "bad/xfail cells are never thinned"
        elif got["level"] in ("top8", "top3"):
            kept = [c for g in got["ranks"] for c in g["checks"]]
            n = sum(len(r["comparisons"]) for r in cell["ranks"])
            assert len(kept) <= int(got["level"][3:]) and got["dropped"] == n - len(kept)
            worst = max((c for r in cell["ranks"] for c in r["comparisons"] if c.get("ratio") is not None),
                        key=lambda c: c["ratio"], default=None)
            if worst is not None:
                assert worst["name"] in {c["name"] for c in kept}, "the worst check is always kept"
        assert [g["rank"] for g in got["ranks"]] == [r["rank"] for r in cell["ranks"]]


def test_html_survives_nan_and_inf(record: dict[str, Any]) -> None:
    rec = json.loads(json.dumps(record))
    rec["cells"][0]["worst_ratio"] = math.nan
    rec["cells"][1]["worst_ratio"] = math.inf
    for r in rec["cells"][0]["ranks"]:
        for c in r["comparisons"]:
            if c["kind"] == "tensor":
                c["ratio"], c["max_abs"] = math.nan, math.inf
    cells = embedded(render_html(rec))
    assert cells[0]["worst_ratio"] == "nan" and cells[1]["worst_ratio"] == "inf"


def test_html_never_rounds_a_failure_to_the_bound() -> None:
    rec = H.make_record(6, seed=2, force={0: "fail"})
    rec["cells"][0]["worst_ratio"] = 1.00001
    assert embedded(render_html(rec))[0]["worst_ratio"] > 1


def test_html_grid_axes_are_validated(record: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Unknown axis in rows"):
        render_html(record, rows=("module", "nope"))
    with pytest.raises(ValueError, match="both in rows"):
        render_html(record, rows=("dtype",), cols=("dtype",))
    summary, _ = blobs(render_html(record, rows=("consumer",), cols=("microbatches", "bias")))
    assert summary["layout"] == {"rows": ["consumer"], "cols": ["microbatches", "bias"]}


def test_html_near_miss_and_signatures(record: dict[str, Any], html_text: str) -> None:
    assert 'id="near-miss"' in html_text
    for label in ("&lt; 1e-3", "0.5 – 1", "&gt; 1"):
        assert label in html_text
    passing = sorted((c for c in record["cells"] if c["status"] == "pass"),
                     key=lambda c: c["worst_ratio"], reverse=True)[:20]
    section = html_text[html_text.index('id="near-miss"'):]
    positions = [section.index(f'href="#{c["id"]}"') for c in passing]
    assert positions == sorted(positions), "top list is ordered by ratio, highest first"
    assert 'id="signatures"' in html_text


def test_html_selftest_table(record: dict[str, Any]) -> None:
    st = {"mutants": [
        {"name": "hooks-strip-subclass", "description": "decides from the <saved> tensor & co", "killed": True,
         "killing_cells": [c["id"] for c in record["cells"][:5]], "first_check": "weight0.main_grad"},
        {"name": "ops-double-add", "description": "adds twice", "killed": False, "killing_cells": [],
         "first_check": None}], "score": 0.5, "false_alarms": 0}
    text = render_html(record, selftest=st)
    assert 'id="selftest"' in text and "hooks-strip-subclass" in text and "SURVIVED" in text
    assert "decides from the &lt;saved&gt; tensor &amp; co" in text and "50.0%" in text
    assert 'id="selftest"' not in render_html(record)


def test_html_empty_record() -> None:
    rec = H.make_record(1, seed=0)
    rec["cells"] = []
    text = render_html(rec)
    assert embedded(text) == []


def test_html_10k_cells_stays_small() -> None:
    rec = H.make_big_record(10_000, n_ranks=4)
    t = time.perf_counter()
    text = render_html(rec)
    took = time.perf_counter() - t
    size = len(text.encode())
    print(f"\n10k cells x 4 ranks: HTML {size / 1e6:.2f} MB, rendered in {took:.1f} s")
    assert size < 10_000_000
    summary, _ = blobs(text)
    assert summary["n"] == 10_000 and len(summary["id"]) == 10_000


# --------------------------------------------------------------------------- the known-defects ledger


@pytest.fixture(scope="module")
def ledger_record() -> dict[str, Any]:
    return H.make_ledger_record()


@pytest.fixture(scope="module")
def ledger_html(ledger_record: dict[str, Any]) -> str:
    return render_html(ledger_record)


def _entry(record: dict[str, Any], eid: str) -> dict[str, Any]:
    return next(e for e in record["ledger"]["entries"] if e["id"] == eid)


def _known_cells(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in record["cells"] if c["status"] == "known"]


def _section(text: str, start: str, end: str = "</section>") -> str:
    i = text.index(start)
    return text[i:text.index(end, i)]


def test_ledger_fixture_is_what_the_record_holds(ledger_record: dict[str, Any]) -> None:
    """The synthetic ledger record round-trips through ``harness.records.record`` (known keys included)."""
    again = hr.RunRecord.from_dict(json.loads(json.dumps(ledger_record))).serialize()
    assert again == ledger_record
    known = _known_cells(ledger_record)
    assert known and all(c["known"] and c["raw_status"] in ("fail", "error", "timeout") for c in known)
    assert any(len(c["known"]) == 2 for c in known)
    assert {"known", "raw_status"}.isdisjoint(next(c for c in ledger_record["cells"] if c["status"] == "fail"))
    assert ledger_record["ledger"]["stale"] == ["fixed-ops"] and ledger_record["counts"]["known"] == len(known)


def test_html_known_cells_and_the_run_card(ledger_record: dict[str, Any], ledger_html: str, html_text: str) -> None:
    counts = _common.counts_of(ledger_record)
    run = _section(ledger_html, 'id="run"')
    assert f'<i class="dot s-known"></i>known defect <b>{counts["known"]:,}</b>' in run
    assert "<dt>fp32 GEMMs</dt><dd>TF32, u = 2^-11</dd>" in run
    assert "<dt>ledger</dt><dd>transformer_engine-2.20 (4 entries, 1 stale)</dd>" in run
    # a run without a ledger has no known pill, no ledger fact and no ledger section; pass/fail pills always
    assert "known defect <b>" not in html_text and "<dt>ledger</dt>" not in html_text and 'id="ledger"' not in html_text
    rec = H.make_record(6, seed=1, force={i: "pass" for i in range(6)})
    text = render_html(rec)
    assert "fail <b>0</b>" in text and "pass <b>6</b>" in text and "timeout <b>" not in text
    # the chip colour and the legend come from the vocabulary
    assert ".s-known{background:var(--known)}" in text and "--known:#9a6700;" in text
    assert '<i class="s-known"></i>known defect' in text


def test_html_fp32_gemm_precision_from_the_tolerance_policy() -> None:
    """Without backend_info (an older record) the Run card takes the precision from the tolerance."""
    rec = H.make_record(4, seed=2)
    rec["tolerance"] = {"fp32_gemm": "ieee"}
    assert "<dt>fp32 GEMMs</dt><dd>IEEE fp32, u = 2^-24</dd>" in render_html(rec)
    assert "**fp32 GEMMs** `IEEE fp32, u = 2^-24`" in render_markdown(rec)


def test_html_embeds_known_entries_per_cell(ledger_record: dict[str, Any], ledger_html: str) -> None:
    summary, _ = blobs(ledger_html)
    assert [e[0] for e in summary["le"]] == [e["id"] for e in ledger_record["ledger"]["entries"]]
    assert [e[3] for e in summary["le"]] == [e["stale"] for e in ledger_record["ledger"]["entries"]]
    for got, cell in zip(embedded(ledger_html), ledger_record["cells"]):
        assert got["status"] == cell["status"]
        assert (got["known"], got["raw_status"]) == (cell.get("known"), cell.get("raw_status")), cell["id"]
        if cell["status"] == "known":  # failing detail is kept whole, as for a failing cell
            assert got["level"] is None and len(got["ranks"]) == len(cell["ranks"])
    # a known id missing from the ledger (a hand-edited record) still travels
    rec = json.loads(json.dumps(ledger_record))
    rec["ledger"] = None
    cells = embedded(render_html(rec))
    assert [c["known"] for c in cells if c["known"]] == [c["known"] for c in _known_cells(rec)]


def test_html_ledger_section(ledger_record: dict[str, Any], ledger_html: str) -> None:
    section = _section(ledger_html, 'id="ledger"')
    led = ledger_record["ledger"]
    for needle in (led["path"], led["package"], html.escape(led["versions"])):
        assert needle in section, needle
    for e in led["entries"]:
        row = _section(section, f'<tr id="ledger-{e["id"]}"', "</tr>")
        for field in ("title", "upstream", "kind", "row"):
            assert html.escape(e[field]) in row, (e["id"], field)
        assert html.escape(e["cells"]) in row
        for f in e["fails"]:  # every form of the signature is shown
            assert html.escape(f.get("check") or f.get("exception")) in row, (e["id"], f)
        for f in e["fails"]:
            if f.get("message"):
                assert f"/{html.escape(f['message'])}/" in row
        for cid in e["known_cells"]:
            assert f'href="#{cid}"' in row
        assert ('data-entry="' in row) == bool(e["known_cells"])
    seed = _section(section, '<tr id="ledger-seed-hooks"', "</tr>")
    assert "6 known cell(s), reproduced in 10 of 29 selected" in seed and "class=stale" not in seed
    assert "selects no cell of this run" in _section(section, '<tr id="ledger-assigns-grad"', "</tr>")
    stale = _section(section, '<tr id="ledger-fixed-ops"', "</tr>")
    assert stale.startswith('<tr id="ledger-fixed-ops" class=stale>') and "<td class=t-fail>" in stale
    assert "STALE: reproduced in none of its 12 cell(s)" in stale and "delete it from" in stale
    assert all(f'href="#{cid}"' in stale for cid in _entry(ledger_record, "fixed-ops")["selected"][:12])


def test_html_stale_entry_is_prominent(ledger_record: dict[str, Any], ledger_html: str) -> None:
    top = ledger_html[:ledger_html.index('id="run"')]
    assert '<div class="banner stale" id="stale"><b>STALE LEDGER</b>' in top
    assert 'href="#ledger-fixed-ops"' in top and "no longer reproduces in any of the 12 cell(s)" in top
    assert '<a class="pill stale" href="#ledger"><i class="dot s-fail"></i>stale ledger entries <b>1</b></a>' in ledger_html
    from harness_reports import _assets

    css = _assets.css()
    assert ".banner.stale{background:#ffebe9;border-color:var(--fail);color:var(--fail)}" in css
    # a stale entry fails the run even when every cell met its expectation; a known cell does not
    rec = json.loads(json.dumps(ledger_record))
    rec["cells"] = [c for c in rec["cells"] if c["status"] in ("pass", "xfail", "known")]
    assert _common.verdict(rec) == "FAIL" and 'class="verdict v-FAIL">FAIL<' in render_html(rec)
    _entry(rec, "fixed-ops")["stale"], rec["ledger"]["stale"] = False, []
    assert _common.verdict(rec) == "PASS" and 'id="stale"' not in render_html(rec)


def test_html_ledger_of_a_shard_is_not_judged() -> None:
    rec = H.make_ledger_record(judged=False)
    text = render_html(rec)
    section = _section(text, 'id="ledger"')
    assert "not judged (a shard)" in section and "class=stale" not in section and 'id="stale"' not in text
    assert "stale is judged when the shards merge" in _section(section, '<tr id="ledger-fixed-ops"', "</tr>")


def test_junit_known_cells_are_xfail_and_stale_entries_fail(ledger_record: dict[str, Any]) -> None:
    root = ET.fromstring(render_junit(ledger_record))
    suite = root.find("testsuite")
    counts = _common.counts_of(ledger_record)
    entries = ledger_record["ledger"]["entries"]
    for el in (root, suite):
        assert el.get("tests") == str(len(ledger_record["cells"]) + len(entries))
        assert el.get("failures") == str(counts["fail"] + 1)
        assert el.get("errors") == str(counts["error"] + counts["timeout"])
        assert el.get("skipped") == str(counts["skipped"] + counts["known"] + 1)  # + assigns-grad
    cases = {(tc.get("classname"), tc.get("name")): tc for tc in suite.findall("testcase")}
    upstream = {e["id"]: e["upstream"] for e in entries}
    for c in _known_cells(ledger_record):
        tc = cases[(f"dw_harness.{c['axes']['module']}", c["id"])]
        sk = tc.find("skipped")
        assert tc.find("failure") is None and tc.find("error") is None
        assert sk.get("type") == "pytest.xfail"
        assert sk.get("message") == "known defect: " + "; ".join(f"{i} ({upstream[i]})" for i in c["known"])
        assert f"backend verdict: {c['raw_status']}" in sk.text and c["repro"] in sk.text
    assert cases[("dw_harness.linear", _known_cells(ledger_record)[0]["id"])].find("skipped").get("message") == (
        "known defect: seed-hooks (TE PR #3545 (open)); precision (TE PR #3397 (open))")
    stale = cases[("dw_harness.ledger", "fixed-ops")].find("failure")
    assert stale.get("type") == "stale ledger entry"
    assert stale.get("message") == (f"ledger entry fixed-ops (TE PR #3397) no longer reproduces in any of the 12 "
                                    f"cell(s) it selects: delete it from {H.LEDGER_PATH}")
    assert all(cid in stale.text for cid in _entry(ledger_record, "fixed-ops")["selected"])
    assert cases[("dw_harness.ledger", "assigns-grad")].find("skipped").get("message") == "selects no cell of this run"
    seed = cases[("dw_harness.ledger", "seed-hooks")]
    assert seed.find("failure") is None and seed.find("skipped") is None and "6 known cell(s)" in seed.find("system-out").text


def test_markdown_ledger_section(ledger_record: dict[str, Any]) -> None:
    md = render_markdown(ledger_record, html_path="runs/te/report.html")
    counts = _common.counts_of(ledger_record)
    bad = [c for c in ledger_record["cells"] if c["status"] in ("fail", "error", "timeout")]
    missed = _common.counts_text(Counter(c["status"] for c in bad))
    assert md.startswith(f"## ❌ dw-harness: FAIL — {len(bad)} of {len(ledger_record['cells'])} cells missed their "
                         f"expectation ({missed}), "
                         f"{counts['known']} known defects, 1 stale ledger entry\n")
    assert "| known defect |" in md.splitlines()[2] and "| " + " | ".join(f"{counts[s]:,}" for s in _common.STATUSES) in md
    ledger = md[md.index("### Known-defects ledger"):md.index("### Failing cells")]
    assert f"ledger `{H.LEDGER_PATH}` · package `transformer_engine` · versions `>=2.20,<2.21`" in ledger
    assert ("> [!CAUTION]\n> **stale**: ledger entry `fixed-ops` (`TE PR #3397`) no longer reproduces in any of the "
            f"12 cell(s) it selects: delete it from `{H.LEDGER_PATH}`") in ledger
    assert ("| `seed-hooks` | backward decides 'distributed?' from the unpacked saved tensor | `TE PR #3545 (open)` "
            "| defect | 6 | 10 / 29 | reproduces |") in ledger
    # what known and each kind mean, and why the known column adds up to more than the known cells
    assert "*Known defect*: the cell fails, and every failure" in ledger and "kind *difference*" in ledger
    assert "fail the ways of two or more entries at once" in ledger
    assert "| `assigns-grad` | backward\\_dw() assigns .grad | `unreported` | difference | 0 | 0 / 0 | selects no cell |" in ledger
    assert "| `fixed-ops` | ops GroupedLinear never calls grad\\_buffer() | `TE PR #3397` | defect | 0 | 0 / 12 | **STALE** |" \
        in ledger
    assert f"Known cells ({counts['known']}), by the entries that explain them:" in ledger
    assert "- `seed-hooks`, `precision`: 2 cells, e.g. " in ledger and "- `seed-hooks`: 4 cells, e.g. " in ledger
    assert "- **known**" not in md, "known cells are not listed as failing"
    assert 'href' not in ledger and "<script>" not in md


def test_markdown_lists_few_of_many_known_cells(ledger_record: dict[str, Any]) -> None:
    """Thousands of known cells (a real TE run) cost a few lines: example ids per entry group."""
    rec = json.loads(json.dumps(ledger_record))
    template = _known_cells(rec)[0]
    rec["cells"] = [{**template, "id": f"{template['id']}-{i}"} for i in range(5_000)]
    md = render_markdown(rec)
    ledger = md[md.index("### Known-defects ledger"):]
    assert "Known cells (5,000)" in ledger and "- `seed-hooks`, `precision`: 5,000 cells, e.g. " in ledger
    assert ledger.count(template["id"]) == 3 and len(md.encode()) < 6_000


def test_failure_classes_label_known_cells(ledger_record: dict[str, Any]) -> None:
    from harness_reports import classes

    found = classes.failure_classes(ledger_record)
    members = [c for fc in found for c in fc.cells]
    failing = [c["id"] for c in ledger_record["cells"] if c["status"] in ("fail", "error", "timeout", "known")]
    assert sorted(members) == sorted(failing) and len(set(members)) == len(members)
    for fc in found:
        cells = [c for c in ledger_record["cells"] if c["id"] in fc.cells]
        assert {c["status"] for c in cells} == {fc.signature.status}
        assert all(tuple(c.get("known") or ()) == fc.signature.known for c in cells), "no class mixes explanations"
    table = classes.markdown(ledger_record)
    assert "| known (seed-hooks, precision) |" in table and "| known (seed-hooks) |" in table


# --------------------------------------------------------------------------- JUnit


def test_junit_counts_and_cases(record: dict[str, Any]) -> None:
    root = ET.fromstring(render_junit(record))
    counts = _common.counts_of(record)
    suites = root.findall("testsuite")
    assert root.tag == "testsuites" and len(suites) == 1
    for el in (root, suites[0]):
        assert el.get("tests") == str(len(record["cells"]))
        assert el.get("failures") == str(counts["fail"])
        assert el.get("errors") == str(counts["error"] + counts["timeout"])
        assert el.get("skipped") == str(counts["skipped"])
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == [c["id"] for c in record["cells"]]
    by_id = {c["id"]: c for c in record["cells"]}
    for tc in cases:
        cell = by_id[tc.get("name")]
        assert tc.get("classname") == f"dw_harness.{cell['axes']['module']}"
        st = cell["status"]
        assert (tc.find("failure") is not None) == (st == "fail")
        assert (tc.find("error") is not None) == (st in ("error", "timeout"))
        assert (tc.find("skipped") is not None) == (st == "skipped")
        if st == "fail":
            f = tc.find("failure")
            assert f.get("message") == " ".join(cell["first_failure"].split())
            assert cell["repro"] in f.text
        if st in ("error", "timeout"):
            assert cell["repro"] in tc.find("error").text
        if st == "error":
            assert H.EVIL in tc.find("error").text, "the traceback travels, escaped by the XML layer"
        if st == "xfail":
            assert "expected error met" in tc.find("system-out").text


def test_junit_strips_illegal_characters(record: dict[str, Any]) -> None:
    rec = json.loads(json.dumps(record))
    bad = next(c for c in rec["cells"] if c["status"] == "fail")
    bad["first_failure"] = "nul\x00 esc\x1b bell\x07 ok & <tag> \"q\""
    root = ET.fromstring(render_junit(rec))
    msg = next(tc for tc in root.iter("testcase") if tc.get("name") == bad["id"]).find("failure").get("message")
    assert "\x00" not in msg and "\x1b" not in msg and '& <tag> "q"' in msg


# --------------------------------------------------------------------------- markdown


def test_markdown_summary(record: dict[str, Any]) -> None:
    md = render_markdown(record, html_path="runs/ci/report.html")
    counts = _common.counts_of(record)
    bad = [c for c in record["cells"] if c["status"] in ("fail", "error", "timeout")]
    assert md.startswith("## ❌ dw-harness: FAIL")
    assert f"{len(bad):,} of {len(record['cells']):,} cells missed their expectation (" in md
    assert "| " + " | ".join(f"{counts[s]:,}" for s in _common.STATUSES) in md
    assert "`harness.backends.reference`" in md and "`2.13.0+cpu`" in md and "`cpu / gloo`" in md
    assert "`runs/ci/report.html`" in md
    for c in bad:
        assert f"`{c['repro']}`" in md
    assert "<script>" not in md, "GitHub renders inline HTML; record text must be escaped"
    assert "... and" not in md


def test_markdown_pass_and_incomplete() -> None:
    rec = H.make_record(10, seed=9, mix={})
    rec["cells"] = [c for c in rec["cells"] if c["status"] in ("pass", "xfail")]
    assert render_markdown(rec).startswith("## ✅ dw-harness: PASS — 0 of")
    rec["status"] = "incomplete"
    md = render_markdown(rec)
    assert "INCOMPLETE" in md.splitlines()[0] and "[!WARNING]" in md


def test_markdown_code_spans_survive_backticks(record: dict[str, Any]) -> None:
    rec = json.loads(json.dumps(record))
    bad = next(c for c in rec["cells"] if c["status"] == "fail")
    bad["repro"] = "dw-harness repro --cell `x``y`"
    md = render_markdown(rec)
    # fence longer than the longest backtick run; padded because the text ends with a backtick
    assert "``` dw-harness repro --cell `x``y` ```" in md


@pytest.mark.parametrize("limit", [1_000_000, 50_000])
def test_markdown_stays_under_the_cap_with_20k_failures(limit: int) -> None:
    rng = H.random.Random(0)
    cells = [H.make_cell(a, "error", rng, n_ranks=1) for a in H.all_axes()[:20_000]]
    rec = H.RunRecord(status="complete", started="2025-06-11T08:00:00Z", finished=None, duration_s=1.0,
                      command="dw-harness sweep --preset full", argv=[], backend="reference",
                      environment={"torch": "2.13"}, selection={}, tolerance={}, world_sizes=[1, 2, 4],
                      cells=cells).serialize()
    md = render_markdown(rec, html_path="runs/full/report.html", limit_bytes=limit)
    assert len(md.encode()) <= limit
    shown = md.count("\n- **error**")
    assert 0 < shown < 20_000
    assert f"... and {20_000 - shown:,} more (see the HTML report: runs/full/report.html)" in md


# --------------------------------------------------------------------------- diff


def _diff_pair() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    rng = H.random.Random(1)
    space = H.all_axes()
    # (base status, new status, base ratio, new ratio)
    plan = {
        "newly_failing": ("pass", "fail", 0.2, None),
        "newly_failing_xfail": ("xfail", "error", None, None),
        "newly_failing_skip": ("skipped", "timeout", None, None),
        "newly_passing": ("fail", "pass", None, 0.3),
        "still_failing": ("error", "fail", None, None),
        "ratio_grown": ("pass", "pass", 0.05, 0.4),
        "ratio_grown_small": ("pass", "pass", 0.001, 0.05),  # grew 50x but still negligible
        "ratio_steady": ("pass", "pass", 0.3, 0.5),  # not > 2x
        "newly_skipped": ("pass", "skipped", 0.1, None),
        # TE ran another path than the cell names: coverage lost, never a fix of a known cell
        "path_lost": ("known", "path_not_taken", None, None),
        "path_back_failing": ("path_not_taken", "fail", None, None),
        "only_in_base": ("pass", None, 0.1, None),
        "only_in_new": (None, "pass", None, 0.1),
    }
    base_cells, new_cells, ids = [], [], {}
    for i, (name, (bs, ns, br, nr)) in enumerate(plan.items()):
        axes = space[i * 7]
        for status, ratio, out in ((bs, br, base_cells), (ns, nr, new_cells)):
            if status is None:
                continue
            c = H.make_cell(axes, status, rng, n_ranks=1)
            if status == "pass":
                c.worst_ratio = ratio
            out.append(c.serialize())
        ids[name] = H.cell_id(axes)
    base = H.make_record(1, seed=1)
    new = H.make_record(1, seed=2)
    base["cells"], new["cells"] = base_cells, new_cells
    return base, new, ids


def test_diff_classifies_every_class() -> None:
    base, new, ids = _diff_pair()
    d = diff_records(base, new)
    got = {k: [c.id for c in getattr(d, k)] for k in d.CLASSES}
    assert got["newly_failing"] == [ids["newly_failing"], ids["newly_failing_xfail"], ids["newly_failing_skip"],
                                    ids["path_back_failing"]]
    assert got["newly_passing"] == [ids["newly_passing"]]
    assert got["still_failing"] == [ids["still_failing"]]
    assert got["ratio_grown"] == [ids["ratio_grown"]]
    assert got["newly_skipped"] == [ids["newly_skipped"], ids["path_lost"]]
    assert got["only_in_base"] == [ids["only_in_base"]]
    assert got["only_in_new"] == [ids["only_in_new"]]
    assert d.unchanged == 2  # ratio_grown_small, ratio_steady
    assert d.exit_code == 1
    text = render_diff_text(d)
    assert "REGRESSION" in text and "gate fails: 4 cell(s) newly failing" in text and ids["newly_failing"] in text and "repro:" in text
    assert "coverage lost: 2 cell(s) newly skipped, 1 only in base" in text
    page = render_diff_html(d, base, new)
    assert page.startswith("<!DOCTYPE html>") and ids["ratio_grown"] in page and "REGRESSION" in page
    assert H.EVIL not in page


def test_diff_exit_code() -> None:
    base, new, ids = _diff_pair()
    keep = {ids["newly_passing"], ids["ratio_grown"], ids["only_in_new"]}
    base["cells"] = [c for c in base["cells"] if c["id"] in keep]
    new["cells"] = [c for c in new["cells"] if c["id"] in keep]
    d = diff_records(base, new)
    assert d.exit_code == 0 and "no new failures" in render_diff_text(d)
    # a brand-new cell that fails is a new failure
    new["cells"].append(H.make_cell(H.all_axes()[5], "fail", H.random.Random(0), n_ranks=1).serialize())
    assert diff_records(base, new).exit_code == 1
    assert diff_records(new, new).exit_code == 0
    with pytest.raises(ValueError, match="ratio_growth=0.5"):
        diff_records(base, new, ratio_growth=0.5)


def test_diff_says_when_the_backends_differ() -> None:
    base, new, _ = _diff_pair()
    same = render_diff_text(diff_records(base, new))
    assert "different backends" not in same
    new = {**new, "backend": "te-cpu"}
    text = render_diff_text(diff_records(base, new))
    assert f"  note: the runs are of different backends: base {base['backend']}, new te-cpu" in text


def test_diff_fails_an_interrupted_run_and_lost_coverage() -> None:
    """An incomplete new run, a newly skipped cell, a cell only in base: each fails the gate."""
    base, new, ids = _diff_pair()
    ok = {ids["newly_passing"], ids["ratio_grown"]}
    for lost in ("newly_skipped", "only_in_base"):
        b = {**base, "cells": [c for c in base["cells"] if c["id"] in ok | {ids[lost]}]}
        n = {**new, "cells": [c for c in new["cells"] if c["id"] in ok | {ids[lost]}]}
        d = diff_records(b, n)
        assert d.exit_code == 1 and d.problems[0].startswith("coverage lost"), (lost, d.problems)
        assert diff_records(b, n, allow_missing=True).exit_code == 0
    b = {**base, "cells": [c for c in base["cells"] if c["id"] in ok]}
    n = {**new, "cells": [c for c in new["cells"] if c["id"] in ok], "status": "incomplete"}
    d = diff_records(b, n, allow_missing=True)
    assert d.exit_code == 1 and "incomplete" in d.problems[0]


def _known_diff_pair() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Two runs under a ledger: one cell per transition that involves ``known``."""
    rng = H.random.Random(4)
    space = [a for a in H.all_axes() if a["weight"] == "distributed" and not a["delay_wgrad"]]
    seed, both = ["seed-hooks"], ["seed-hooks", "precision"]
    # name: ((base status, base entries), (new status, new entries)); None: the cell is absent
    plan = {
        "fixed": (("known", seed), ("pass", None)),
        "unexplained": (("known", seed), ("fail", None)),
        "newly_known": (("pass", None), ("known", seed)),
        "xfail_known": (("xfail", None), ("known", seed)),
        "skip_known": (("skipped", None), ("known", seed)),
        "now_explained": (("fail", None), ("known", seed)),
        "same_known": (("known", seed), ("known", seed)),
        "other_known": (("known", seed), ("known", both)),
        "known_skipped": (("known", seed), ("skipped", None)),
        "new_known": (None, ("known", seed)),
    }
    base_cells, new_cells, ids = [], [], {}
    for i, (name, sides) in enumerate(plan.items()):
        axes = space[i * 5]
        for side, out in zip(sides, (base_cells, new_cells)):
            if side is None:
                continue
            status, known = side
            c = H.make_cell(axes, "fail" if status == "known" else status, rng, n_ranks=1)
            if status == "known":
                c.known, c.raw_status, c.status = list(known), c.status, "known"
            out.append(c.serialize())
        ids[name] = H.cell_id(axes)
    base, new = H.make_record(1, seed=1), H.make_ledger_record()
    new = {**new, "cells": new_cells}
    base["cells"] = base_cells
    return base, new, ids


def test_diff_known_transitions() -> None:
    base, new, ids = _known_diff_pair()
    d = diff_records(base, new)
    got = {k: [c.id for c in getattr(d, k)] for k in d.CLASSES}
    assert got["newly_passing"] == [ids["fixed"]], "known -> pass is a fix"
    assert got["newly_failing"] == [ids[n] for n in ("unexplained", "newly_known", "xfail_known", "skip_known")]
    assert got["still_failing"] == [ids["now_explained"]]
    assert got["known_changed"] == [ids["other_known"]]
    assert got["newly_skipped"] == [ids["known_skipped"]] and got["only_in_new"] == [ids["new_known"]]
    assert d.unchanged == 1  # same_known
    changed = d.known_changed[0]
    assert (changed.base_known, changed.new_known) == (("seed-hooks",), ("seed-hooks", "precision"))
    assert d.exit_code == 1 and d.problems[0] == "5 cell(s) newly failing"  # + the new cell that is known
    assert d.new_stale == ["fixed-ops (TE PR #3397)"]
    text = render_diff_text(d)
    assert "known defect changed: 1" in text and "Known defect changed (1):" in text
    assert "      known: seed-hooks -> seed-hooks, precision" in text
    assert f"    known -> fail     {ids['unexplained']}" in text and "      known: seed-hooks -> —" in text
    assert "note: ledger entry fixed-ops (TE PR #3397) is stale in new" in text
    page = render_diff_html(d, base, new)
    assert 'id="known_changed"' in page and "known: seed-hooks → seed-hooks, precision" in page
    assert '<span class="badge s-known">known</span>' in page


def test_diff_gate_with_a_ledger() -> None:
    """Fixes and changed explanations pass the gate; a stale entry in new is a note, not a regression."""
    base, new, ids = _known_diff_pair()
    keep = {ids["fixed"], ids["same_known"], ids["other_known"], ids["now_explained"]}
    b = {**base, "cells": [c for c in base["cells"] if c["id"] in keep]}
    n = {**new, "cells": [c for c in new["cells"] if c["id"] in keep]}
    d = diff_records(b, n)
    assert d.exit_code == 0 and d.newly_passing and d.known_changed and d.new_stale
    for name in ("newly_known", "unexplained", "new_known"):
        n2 = {**n, "cells": n["cells"] + [c for c in new["cells"] if c["id"] == ids[name]]}
        b2 = {**b, "cells": b["cells"] + [c for c in base["cells"] if c["id"] == ids[name]]}
        assert diff_records(b2, n2).exit_code == 1, name


def test_diff_command_keeps_known_cells(tmp_path: Path) -> None:
    """``python -m harness diff`` reads both records through ``harness.records.record``: known survives."""
    base, new, ids = _known_diff_pair()
    for name, rec in (("base", base), ("new", new)):
        hr.RunRecord.from_dict(rec).write(tmp_path / name)
    res = subprocess.run([sys.executable, "-m", "harness", "diff", str(tmp_path / "base"), str(tmp_path / "new"),
                          "--allow-missing"], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "gate fails: 5 cell(s) newly failing" in res.stdout and "known defect changed: 1" in res.stdout
    assert f"    known -> pass     {ids['fixed']}" in res.stdout


# --------------------------------------------------------------------------- write_all


def test_write_all(record: dict[str, Any], tmp_path: Path) -> None:
    paths = write_all(record, tmp_path)
    assert set(paths) == {"html", "junit", "markdown"}
    assert [p.name for p in paths.values()] == ["report.html", "junit.xml", "summary.md"]
    assert all(p.exists() and p.stat().st_size for p in paths.values())
    ET.parse(paths["junit"])
    assert str(paths["html"]) in paths["markdown"].read_text()
    assert embedded(paths["html"].read_text())


def test_readme_screenshot_is_a_small_png() -> None:
    """The README shows ``reports/screenshot.png`` (regenerate: see reports/browser.py's ``screenshot``)."""
    import struct

    png = Path(__file__).resolve().parents[1] / "reports" / "screenshot.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 900)
    assert len(data) < 300_000
