"""The HTML report in a real browser (headless Chromium via Selenium and the system chromedriver).

These tests *fail* when Chromium, chromedriver or selenium is missing (``python -m harness
install`` installs them, as the README's test command does), so a run cannot pass without them; ``DW_ALLOW_NO_BROWSER=1`` makes them skip
instead. Screenshots and timings go to ``$DW_ARTIFACT_DIR`` when set (CI uploads it), else to
the test's tmp_path. The same checks on reports of real sweeps are in ``test_reports_real.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness_reports import render_html
from harness_reports.browser import chromium, measure_render, open_and_click_failing

from fixtures import report_records as H  # noqa: E402


@pytest.fixture(autouse=True)
def _browser() -> None:
    H.require_browser()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    d = Path(os.environ["DW_ARTIFACT_DIR"]) if os.environ.get("DW_ARTIFACT_DIR") else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    # failures are errors and timeouts only, so the first failing chip has a traceback
    return H.make_record(150, seed=7, mix={"error": 0.06, "timeout": 0.02, "skipped": 0.03},
                         force={0: "error", 1: "timeout", 2: "skipped"})


def _cell(record: dict[str, Any], cid: str) -> dict[str, Any]:
    return next(c for c in record["cells"] if c["id"] == cid)


def test_click_failing_cell_shows_traceback_and_repro(record: dict[str, Any], artifacts: Path) -> None:
    page = artifacts / "report-small.html"
    page.write_text(render_html(record))
    shot = artifacts / "report-small-detail.png"
    seen = open_and_click_failing(page, shot)
    cell = _cell(record, seen["cell_id"])
    assert seen["status"] == cell["status"] == "error"
    assert seen["detail_visible"] and seen["traceback_visible"] and seen["repro_visible"]
    tb = cell["ranks"][0]["error"]["traceback"]
    assert seen["traceback_text"].strip() == tb.strip(), "the traceback, <script> and all, shown as text"
    assert H.EVIL in seen["detail_text"]
    assert seen["repro_text"] == cell["repro"]
    assert seen["hash"] == cell["id"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print(f"\nsmall report: first render {seen['rendered_ms']:.0f} ms, click->detail "
          f"{seen['click_to_detail_ms']:.0f} ms, screenshot {shot}")


def test_click_mismatch_cell_shows_failed_check(artifacts: Path) -> None:
    rec = H.make_record(60, seed=8, force={0: "fail"})
    page = artifacts / "report-fail.html"
    page.write_text(render_html(rec))
    seen = open_and_click_failing(page, artifacts / "report-fail-detail.png", statuses=("fail",))
    cell = _cell(rec, seen["cell_id"])
    assert seen["repro_visible"] and seen["repro_text"] == cell["repro"]
    assert "FAILED CHECKS" in seen["detail_text"].upper() and "Gradients are not close!" in seen["detail_text"]
    assert cell["first_failure"].splitlines()[0] in seen["detail_text"]


def test_anchor_and_filters(record: dict[str, Any], artifacts: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = artifacts / "report-small.html"
    page.write_text(render_html(record))
    target = next(c for c in record["cells"] if c["status"] == "timeout")
    with chromium() as d:
        d.get(page.resolve().as_uri() + "#" + target["id"])
        WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "detail").is_displayed())
        assert d.find_element(By.CSS_SELECTOR, "#detail .dh .id").text == target["id"]
        assert target["repro"] in d.find_element(By.ID, "detail").text
        d.find_element(By.ID, "dclose").click()
        assert not d.find_element(By.ID, "detail").is_displayed()
        visible = "return document.querySelectorAll('#grid .chip:not(.h)').length"
        assert d.execute_script(visible) == len(record["cells"])
        d.find_element(By.CSS_SELECTOR, '.tog[data-st="pass"]').click()
        n_pass = sum(c["status"] == "pass" for c in record["cells"])
        assert d.execute_script(visible) == len(record["cells"]) - n_pass
        # regroup: move 'consumer' onto the grid rows; every cell stays reachable
        d.execute_script("var s = document.querySelector('select.role[data-ax=\"consumer\"]');"
                         "s.value = 'row'; s.dispatchEvent(new Event('change', {bubbles: true}));")
        assert d.execute_script("return document.querySelectorAll('#grid .chip').length") == len(record["cells"])
        assert d.execute_script(visible) == len(record["cells"]) - n_pass
        assert not d.get_log("browser"), "no console errors"


@pytest.mark.parametrize("kind", ["10k-failing", "full-realistic"])
def test_large_report_first_render(kind: str, artifacts: Path) -> None:
    """Time to first render of big reports: 10k cells with 15% failing (the size worst case),
    and a ``full``-preset-sized run (21,600 cells x 4 ranks x ~30 checks, 97% passing)."""
    if kind == "10k-failing":
        rec = H.make_big_record(10_000, n_ranks=4)
    else:
        rec = H.make_realistic_record(21_600, n_ranks=4)
    n = len(rec["cells"])
    page = artifacts / f"report-{kind}.html"
    page.write_text(render_html(rec))
    timing = measure_render(page, repeats=3)
    seen = open_and_click_failing(page, artifacts / f"report-{kind}-detail.png")
    assert seen["repro_visible"] and timing["chips"] == n and not seen["console_errors"]
    assert seen["repro_text"] == next(c["repro"] for c in rec["cells"] if c["id"] == seen["cell_id"])
    timing["click_to_detail_ms"] = seen["click_to_detail_ms"]
    (artifacts / f"render-timing-{kind}.json").write_text(json.dumps(timing, indent=1))
    print(f"\n{kind}: {n:,} cells x 4 ranks, {timing['bytes'] / 1e6:.2f} MB; first render (ms since navigation) "
          f"{[round(x) for x in timing['rendered_ms']]} (cold {timing['cold_ms']:.0f}, best {timing['best_ms']:.0f}); "
          f"whole grid {[round(x) for x in timing['complete_ms']]}; click->detail {seen['click_to_detail_ms']:.0f} ms")
    assert timing["bytes"] < 9_000_000
    # every load rendered the whole grid; how fast is benchmarks/bench_timings.py's job
    assert all(ms is not None and ms > 0 for ms in timing["rendered_ms"] + timing["complete_ms"])


def _rgb(css: str) -> tuple[int, ...]:
    """The first colour in a CSS value (``#rrggbb``, ``rgb(...)`` or ``rgba(...)``) as (r, g, b)."""
    import re

    if css.startswith("#"):
        return tuple(int(css[i:i + 2], 16) for i in (1, 3, 5))
    m = re.search(r"rgba?\((\d+), (\d+), (\d+)", css)
    assert m, css
    return tuple(int(x) for x in m.groups())


def test_known_cells_and_the_ledger(artifacts: Path) -> None:
    """A known cell: its chip wears the vocabulary's colour, its detail names the entries (with
    their upstream references) and the backend's verdict; the ledger's "show in grid" shows
    exactly an entry's known cells, and its cell links open the cell."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    import harness.vocabulary.status as hs

    rec = H.make_ledger_record()
    page = artifacts / "report-ledger.html"
    page.write_text(render_html(rec))
    seen = open_and_click_failing(page, artifacts / "report-ledger-known.png", statuses=("known",))
    cell = _cell(rec, seen["cell_id"])
    assert seen["status"] == cell["status"] == "known" and not seen["console_errors"]
    upstream = {e["id"]: e["upstream"] for e in rec["ledger"]["entries"]}
    text = seen["detail_text"]
    assert f"the backend's verdict is {hs.BY_NAME[cell['raw_status']].label}" in text
    for eid in cell["known"]:
        assert f"{eid} ({upstream[eid]})" in text
    seed = next(e for e in rec["ledger"]["entries"] if e["id"] == "seed-hooks")
    with chromium() as d:
        d.get(page.resolve().as_uri())
        WebDriverWait(d, 30).until(lambda d: d.execute_script("return window.__gridCompleteAt !== undefined"))
        rgb = d.execute_script("return getComputedStyle(document.querySelector('#grid .chip.s-known')).backgroundColor")
        assert _rgb(rgb) == _rgb(hs.BY_NAME["known"].color)
        fail = _rgb(hs.BY_NAME["fail"].color)  # a stale entry wears the fail red
        assert _rgb(d.find_element(By.CSS_SELECTOR, "#ledger-fixed-ops td").value_of_css_property("box-shadow")) == fail
        assert _rgb(d.find_element(By.CSS_SELECTOR, "#ledger-fixed-ops td.t-fail").value_of_css_property("color")) == fail
        assert _rgb(d.find_element(By.ID, "stale").value_of_css_property("color")) == fail
        visible = "return Array.prototype.map.call(document.querySelectorAll('#grid .chip:not(.h)'), "\
                  "function (c) { c.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); return c.title.split('\\n')[0]; })"
        d.find_element(By.CSS_SELECTOR, 'button[data-entry="seed-hooks"]').click()
        assert sorted(d.execute_script(visible)) == sorted(seed["known_cells"])
        assert "seed-hooks" in d.find_element(By.ID, "entry-on").text
        d.find_element(By.ID, "entry-on").click()
        assert len(d.execute_script(visible)) == len(rec["cells"])
        d.find_element(By.CSS_SELECTOR, f'#ledger-seed-hooks a[href="#{seed["known_cells"][-1]}"]').click()
        WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "detail").is_displayed())
        assert d.find_element(By.CSS_SELECTOR, "#detail .dh .id").text == seed["known_cells"][-1]
        assert not d.get_log("browser"), "no console errors"
