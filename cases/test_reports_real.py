"""Reports rendered from REAL run records: a small sweep of the reference and of the pre-fix backend.

The synthetic records of ``test_reports.py`` exercise sizes and hostile text; these tests make
sure the reports tell the truth about what a real sweep recorded. The two sweeps run once per
test session (concurrently, in subprocesses, ~25 s each on two cores): every test in this
module shares one xdist group, so under ``-n`` they land on one worker, and the sweeps are
also guarded by a marker folder shared by the workers of one run, in case the tests are ever
spread out (``--dist load`` without the project's plugin).

The selection: world sizes 1 and 2, modules ``linear`` and ``grouped_linear``, hooks ``off``
and ``identity`` (48 cells of the ``ci`` preset). The pre-fix backend must fail exactly the
hooked distributed-weight cells.
"""

from __future__ import annotations

import json
import re
from collections import Counter
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from fixtures.ledgers import PREFIX_HOOKS_FAILS

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ("--world-sizes", "1,2", "--modules", "linear,grouped_linear", "--hooks", "off,identity", "--recipes", "none", "--first-microbatch", "off")
BACKENDS = {"ref": "harness.backends.reference", "prefix": "harness.backends.reference.prefix"}
EXPECTED_RC = {"ref": 0, "prefix": 1}
SWEEP_TIMEOUT = 400
GOOD = ("pass", "xfail", "known")  # known: every failure explained by the ledger (CONTRACTS §7)
BAD = ("fail", "error", "timeout")

pytestmark = pytest.mark.xdist_group("real_reports")


from fixtures import report_records as H  # noqa: E402

from harness_reports import _common  # noqa: E402
from harness_reports._pack import SCRIPT_TYPE, decode, unpack  # noqa: E402
from harness_reports.html import ALWAYS_COUNTED  # noqa: E402
from harness_reports.diff import diff_records  # noqa: E402
from harness.vocabulary import modules
from harness.records import recordfile


def _sweep_all(root: Path) -> dict[str, Any]:
    """Run both sweeps at once; returns {name: {"dir", "rc", "seconds", "out"}}."""
    procs, started = {}, time.monotonic()
    for name, backend in BACKENDS.items():
        out = root / name
        log = open(root / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(
            [sys.executable, "-m", "harness", "sweep", "--backend", backend, *SELECTION, "--out", str(out), "--quiet"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True), log)
    result = {}
    for name, (proc, log) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, SWEEP_TIMEOUT - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        result[name] = {"dir": str(root / name), "rc": rc, "seconds": round(time.monotonic() - started, 1),
                        "out": (root / f"{name}.log").read_text()[-4000:]}
    return result


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two real run folders (swept once per test run, whatever the number of workers)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if uid:  # workers of one run share the parent of their basetemps
        root = tmp_path_factory.getbasetemp().parent / f"dw-real-reports-{uid[:12]}"
    else:
        root = tmp_path_factory.getbasetemp() / "dw-real-reports"
    root.mkdir(parents=True, exist_ok=True)
    done = root / "sweeps.json"
    with FileLock(str(root / "lock")):  # exactly one process sweeps; the others wait, then read
        if done.exists():
            return json.loads(done.read_text())
        result = _sweep_all(root)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(done)
    print("\nreal sweeps: " + ", ".join(f"{k} rc={v['rc']} in {v['seconds']} s" for k, v in result.items()))
    return result


def _dir(runs: dict[str, Any], name: str) -> Path:
    return Path(runs[name]["dir"])


def _record(runs: dict[str, Any], name: str) -> dict[str, Any]:
    path = recordfile.path_in(_dir(runs, name))
    assert path.exists(), f"the {name} sweep wrote no run record (rc {runs[name]['rc']}):\n{runs[name]['out']}"
    return recordfile.read(path)


def _bad(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in record["cells"] if c["status"] not in GOOD + ("skipped",)]


def _hooked_distributed(record: dict[str, Any]) -> set[str]:
    """The cells the pre-fix backend breaks: hooked, distributed weight, expected to pass."""
    return {c["id"] for c in record["cells"]
            if c["axes"]["weight"] != "plain" and c["axes"]["hooks"] != "off"
            and not modules.KINDS[c["axes"]["module"]].ops
            and c["expect"] == "pass"}


def _blobs(html_text: str) -> list[dict[str, Any]]:
    def blob(name: str) -> dict[str, Any]:
        tag = f'<script type="{SCRIPT_TYPE}" id="{name}">'
        start = html_text.index(tag) + len(tag)
        return decode(html_text[start:html_text.index("</script>", start)])
    return unpack(blob("dw-data"), blob("dw-detail"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _artifacts() -> Path | None:
    if not os.environ.get("DW_ARTIFACT_DIR"):
        return None
    d = Path(os.environ["DW_ARTIFACT_DIR"])
    d.mkdir(parents=True, exist_ok=True)
    return d


# --------------------------------------------------------------------------- the sweeps


@pytest.mark.parametrize("name", list(BACKENDS))
def test_sweep_exit_code_and_files(runs: dict[str, Any], name: str) -> None:
    run = runs[name]
    record = _record(runs, name)
    bad = [f"{c['status']} {c['id']}: {c['first_failure']}" for c in _bad(record)]
    assert run["rc"] == EXPECTED_RC[name], (
        f"{BACKENDS[name]} sweep exited {run['rc']}, expected {EXPECTED_RC[name]}; bad cells:\n"
        + "\n".join(bad) + f"\n--- output tail ---\n{run['out']}")
    assert record["status"] == "complete" and len(record["cells"]) > 20
    assert record["backend"] == BACKENDS[name]
    for f in ("report.html", "junit.xml", "summary.md"):
        assert (_dir(runs, name) / f).stat().st_size > 0, f
    assert (run["rc"] == 0) == (not bad)


def test_prefix_fails_exactly_the_hooked_distributed_cells(runs: dict[str, Any]) -> None:
    ref, prefix = _record(runs, "ref"), _record(runs, "prefix")
    target = _hooked_distributed(prefix)
    assert len(target) >= 8 and {c["axes"]["world_size"] for c in prefix["cells"] if c["id"] in target} == {1, 2}
    assert {c["id"] for c in _bad(prefix)} - {c["id"] for c in _bad(ref)} == target
    assert not _bad(ref), [c["id"] for c in _bad(ref)]


# --------------------------------------------------------------------------- HTML / JUnit / markdown


@pytest.mark.parametrize("name", list(BACKENDS))
def test_html_statuses_and_counts_match_the_record(runs: dict[str, Any], name: str) -> None:
    record = _record(runs, name)
    text = (_dir(runs, name) / "report.html").read_text()
    counts = _common.counts_of(record)
    assert counts == {s: n for s, n in record["counts"].items()}
    for s, n in counts.items():
        shown = f"{_common.STATUS_LABELS[s]} <b>{n:,}</b>" in text
        assert shown == bool(n or s in ALWAYS_COUNTED), s
    verdict = "FAIL" if _bad(record) else "PASS"
    assert f'class="verdict v-{verdict}">{verdict}<' in text
    assert f"{len(record['cells']):,} cells" in text
    cells = _blobs(text)
    assert [c["id"] for c in cells] == [c["id"] for c in record["cells"]]
    for got, cell in zip(cells, record["cells"]):
        assert (got["status"], got["repro"], got["axes"], got["first_failure"]) == (
            cell["status"], cell["repro"], cell["axes"], cell["first_failure"]), cell["id"]
        assert [g["rank"] for g in got["ranks"]] == [r["rank"] for r in cell["ranks"]]
        for g, r in zip(got["ranks"], cell["ranks"]):  # small run: nothing thinned
            assert g["error"] == r["error"] and len(g["checks"]) == len(r["comparisons"])
    if name == "prefix":  # failure signatures name real failures, escaped
        assert 'id="signatures"' in text and "mat1 and mat2 shapes cannot be multiplied" in text


@pytest.mark.parametrize("name", list(BACKENDS))
def test_junit_matches_the_record(runs: dict[str, Any], name: str) -> None:
    record = _record(runs, name)
    root = ET.parse(_dir(runs, name) / "junit.xml").getroot()
    counts = _common.counts_of(record)
    suite = root.find("testsuite")
    for el in (root, suite):
        assert el.get("tests") == str(len(record["cells"]))
        assert el.get("failures") == str(counts["fail"])
        assert el.get("errors") == str(counts["error"] + counts["timeout"])
        assert el.get("skipped") == str(counts["skipped"])
    by_id = {c["id"]: c for c in record["cells"]}
    cases = suite.findall("testcase")
    assert sorted(tc.get("name") for tc in cases) == sorted(by_id)
    for tc in cases:
        cell = by_id[tc.get("name")]
        failure, error = tc.find("failure"), tc.find("error")
        assert (failure is not None) == (cell["status"] == "fail"), cell["id"]
        assert (error is not None) == (cell["status"] in ("error", "timeout")), cell["id"]
        body = failure if failure is not None else error
        if body is not None:
            assert f"repro: {cell['repro']}" in body.text
            assert body.get("message") == " ".join(cell["first_failure"].split())[:1000]
            tb = next((r["error"]["traceback"] for r in cell["ranks"] if r.get("error")), None)
            if tb:
                assert tb.strip().splitlines()[-1] in body.text


@pytest.mark.parametrize("name", list(BACKENDS))
def test_markdown_matches_the_record(runs: dict[str, Any], name: str) -> None:
    record = _record(runs, name)
    md = (_dir(runs, name) / "summary.md").read_text()
    counts = _common.counts_of(record)
    bad = _bad(record)
    icon, verdict = ("❌", "FAIL") if bad else ("✅", "PASS")
    what = f" ({_common.counts_text(Counter(c['status'] for c in bad))})" if bad else ""
    assert md.startswith(f"## {icon} dw-harness: {verdict} — {len(bad):,} of {len(record['cells']):,} cells missed "
                         f"their expectation{what}")
    assert "| " + " | ".join(f"{counts[s]:,}" for s in _common.STATUSES) + f" | {len(record['cells']):,} |" in md
    assert f"`{record['backend']}`" in md and str(_dir(runs, name) / "report.html") in md
    for c in bad:
        assert f"`{c['id']}`" in md and f"repro: `{c['repro']}`" in md
    assert ("### Failing cells" in md) == bool(bad)


def test_failing_cells_carry_their_repro_command(runs: dict[str, Any]) -> None:
    record = _record(runs, "prefix")
    html_cells = {c["id"]: c for c in _blobs((_dir(runs, "prefix") / "report.html").read_text())}
    junit = (_dir(runs, "prefix") / "junit.xml").read_text()
    md = (_dir(runs, "prefix") / "summary.md").read_text()
    bad = _bad(record)
    assert bad
    for c in bad:
        want = f"python -m harness repro {c['id']} --backend harness.backends.reference.prefix"
        assert c["repro"] == want
        assert html_cells[c["id"]]["repro"] == want
        assert want in junit and want in md


def test_report_command_rerenders_the_same_pages(runs: dict[str, Any], tmp_path: Path) -> None:
    res = _cli("report", str(_dir(runs, "prefix")), "--to", str(tmp_path))
    assert res.returncode == 0, res.stderr
    for f in ("report.html", "junit.xml"):
        assert (tmp_path / f).read_text() == (_dir(runs, "prefix") / f).read_text(), f


# --------------------------------------------------------------------------- diff


def test_diff_ref_prefix_flags_the_hooked_distributed_cells(runs: dict[str, Any], tmp_path: Path) -> None:
    ref, prefix = _record(runs, "ref"), _record(runs, "prefix")
    target = _hooked_distributed(prefix)
    d = diff_records(ref, prefix)
    assert {c.id for c in d.newly_failing} == target
    assert not d.newly_passing and not d.only_in_base and not d.only_in_new
    page = tmp_path / "diff.html"
    res = _cli("diff", str(_dir(runs, "ref")), str(_dir(runs, "prefix")), "--html", str(page))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION" in res.stdout and f"newly failing: {len(target)}" in res.stdout
    section = res.stdout[res.stdout.index(f"Newly failing ({len(target)}):"):]
    for cid in target:
        cell = next(c for c in prefix["cells"] if c["id"] == cid)
        assert cid in section and f"repro: {cell['repro']}" in section
    html_text = page.read_text()
    assert html_text.startswith("<!DOCTYPE html>") and "REGRESSION" in html_text
    assert f"Newly failing ({len(target)})" in html_text
    assert all(cid in html_text for cid in target)
    art = _artifacts()
    if art:
        shutil.copyfile(page, art / "diff-ref-prefix.html")


def test_diff_ref_ref_is_clean(runs: dict[str, Any], tmp_path: Path) -> None:
    res = _cli("diff", str(_dir(runs, "ref")), str(_dir(runs, "ref")), "--html", str(tmp_path / "same.html"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no new failures" in res.stdout and "newly failing: 0" in res.stdout
    assert "NO NEW FAILURES" in (tmp_path / "same.html").read_text()


# --------------------------------------------------------------------------- a known-defects ledger

LEDGER = """
[ledger]
package = "harness"
versions = ">=0"

[[entry]]
id = "prefix-linear"
title = "pre-fix Linear decides 'distributed?' from the unpacked saved tensor"
upstream = "TE PR #3545 (open)"
row = "`_Linear` / `_GroupedLinear` backward decide"
kind = "defect"
cells = "module == 'linear' and weight != 'plain' and hooks != 'off'"
""" + PREFIX_HOOKS_FAILS + """
[[entry]]
id = "fixed-plain"
title = "a defect of plain weights, fixed meanwhile"
upstream = "TE PR #3397"
row = "unfused wgrad of a distributed weight"
kind = "defect"
cells = "weight == 'plain'"
fails = [{ check = "weight*.main_grad", model = "wgrad_in_activation_dtype" }]

[[entry]]
id = "no-cell"
title = "only at world size 4"
upstream = "unreported"
row = "`backward_dw()` assigns"
kind = "difference"
cells = "world_size == 4"
fails = [{ check = "weight*.grad", model = "grad_assigned_last_microbatch" }]
"""


@pytest.fixture(scope="module")
def ledgered(runs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real pre-fix record judged under a ledger (``harness.judging.ledger.apply``, as the sweep does)."""
    from harness.judging import ledger
    from harness.records.record import CellResult, RunRecord

    path = tmp_path_factory.mktemp("ledger") / "prefix.toml"
    path.write_text(LEDGER)
    rec = RunRecord.from_dict(_record(runs, "prefix"))
    rec.cells, rec.ledger = ledger.apply([CellResult.from_dict(c.serialize()) for c in rec.cells], ledger.load(path))
    return rec.serialize()


def test_reports_of_a_real_run_under_a_ledger(runs: dict[str, Any], ledgered: dict[str, Any], tmp_path: Path) -> None:
    from harness_reports import classes, write_all

    prefix = _record(runs, "prefix")
    target = _hooked_distributed(prefix)
    known = {c["id"] for c in ledgered["cells"] if c["status"] == "known"}
    linear = {cid for cid in target if cid.startswith("linear-")}
    assert known == linear and linear and target - linear, "the entry explains the hooked Linear cells only"
    assert {c["id"] for c in _bad(ledgered)} == target - linear
    assert ledgered["ledger"]["stale"] == ["fixed-plain"]
    paths = write_all(ledgered, tmp_path)
    text = paths["html"].read_text()
    counts = _common.counts_of(ledgered)
    assert f"known defect <b>{counts['known']:,}</b>" in text and 'id="stale"' in text
    assert 'class="verdict v-FAIL">FAIL<' in text
    assert '<tr id="ledger-fixed-plain" class=stale>' in text and "selects no cell of this run" in text
    cells = {c["id"]: c for c in _blobs(text)}
    for cid in known:
        cell = next(c for c in ledgered["cells"] if c["id"] == cid)
        assert cells[cid]["known"] == ["prefix-linear"] and cells[cid]["raw_status"] == cell["raw_status"]
        assert cell["raw_status"] in BAD
    # the ledger section links an entry's first 12 cells (and filters the grid to all of them)
    linked = [cid for cid in known if f'href="#{cid}"' in text]
    assert len(linked) >= min(len(known), 12), (len(linked), len(known))
    root = ET.parse(paths["junit"]).getroot()
    by_name = {tc.get("name"): tc for tc in root.iter("testcase")}
    for cid in known:
        sk = by_name[cid].find("skipped")
        assert sk.get("type") == "pytest.xfail" and sk.get("message") == "known defect: prefix-linear (TE PR #3545 (open))"
    assert "no longer reproduces" in by_name["fixed-plain"].find("failure").get("message")
    md = paths["markdown"].read_text()
    assert re.search(rf"{len(target - linear)} of {len(ledgered['cells'])} cells missed their expectation \([^)]*\), "
                     rf"{len(known)} known defects", md), md[:300]
    assert (f"| `prefix-linear` | pre-fix Linear decides 'distributed?' from the unpacked saved tensor | "
            f"`TE PR #3545 (open)` | defect | {len(known)} |") in md
    assert "> **stale**: ledger entry `fixed-plain`" in md
    for fc in classes.failure_classes(ledgered):
        assert (fc.signature.status == "known") == (fc.signature.known == ("prefix-linear",))
    assert {c for fc in classes.failure_classes(ledgered) if fc.signature.known for c in fc.cells} == known


def test_diff_of_real_runs_under_a_ledger(runs: dict[str, Any], ledgered: dict[str, Any]) -> None:
    """ref -> ledgered: pass -> known is still a regression; ledgered -> ref: known -> pass is a fix;
    prefix -> ledgered: fail -> known still fails, and nothing is new."""
    ref, prefix = _record(runs, "ref"), _record(runs, "prefix")
    known = {c["id"] for c in ledgered["cells"] if c["status"] == "known"}
    d = diff_records(ref, ledgered)
    assert {c.id for c in d.newly_failing} == _hooked_distributed(prefix) and d.exit_code == 1
    back = diff_records(ledgered, ref)
    assert {c.id for c in back.newly_passing} == _hooked_distributed(prefix) and back.exit_code == 0
    same = diff_records(prefix, ledgered)
    assert {c.id for c in same.still_failing} == _hooked_distributed(prefix) and same.exit_code == 0
    assert {c.id for c in same.still_failing if c.new_status == "known"} == known
    assert same.new_stale == ["fixed-plain (TE PR #3397)"]


# --------------------------------------------------------------------------- the real report in a browser


def test_browser_click_failing_cell_of_the_prefix_report(runs: dict[str, Any]) -> None:
    """Headless Chromium opens the real pre-fix report, clicks the first cell that raised, and
    sees its traceback and repro command; the screenshot is kept as a CI artifact."""
    H.require_browser()
    from harness_reports.browser import open_and_click_failing

    record = _record(runs, "prefix")
    run_dir = _dir(runs, "prefix")
    shot = run_dir / "report-prefix-click.png"
    seen = open_and_click_failing(run_dir / "report.html", shot, statuses=("error",), width=1400, height=900,
                                  matrix_at_top=True)
    cell = next(c for c in record["cells"] if c["id"] == seen["cell_id"])
    assert seen["status"] == cell["status"] == "error"
    assert seen["detail_visible"] and seen["traceback_visible"] and seen["repro_visible"]
    tb = next(r["error"]["traceback"] for r in cell["ranks"] if r.get("error"))
    assert seen["traceback_text"].strip() == tb.strip()
    assert seen["repro_text"] == cell["repro"]
    assert cell["first_failure"] in seen["detail_text"]
    assert seen["hash"] == cell["id"]
    assert seen["chips"] == len(record["cells"])
    assert not seen["console_errors"], seen["console_errors"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    art = _artifacts()
    if art:
        shutil.copyfile(shot, art / "report-prefix-click.png")
        shutil.copyfile(run_dir / "report.html", art / "report-prefix.html")
    print(f"\nreal pre-fix report: first render {seen['rendered_ms']:.0f} ms; screenshot {shot}")


def test_browser_failed_check_of_the_prefix_report(runs: dict[str, Any], tmp_path: Path) -> None:
    """A cell that failed a comparison (no exception) shows its failed checks and their messages."""
    H.require_browser()
    from harness_reports.browser import open_and_click_failing

    record = _record(runs, "prefix")
    seen = open_and_click_failing(_dir(runs, "prefix") / "report.html", tmp_path / "fail.png", statuses=("fail",))
    cell = next(c for c in record["cells"] if c["id"] == seen["cell_id"])
    assert cell["status"] == "fail" and seen["repro_text"] == cell["repro"]
    failed = [c for r in cell["ranks"] for c in r["comparisons"] if not c["ok"]]
    assert failed and f"FAILED CHECKS ({len(failed)})" in seen["detail_text"].upper()
    for c in failed:
        assert c["name"] in seen["detail_text"]
        assert (c.get("message") or "").splitlines()[0] in seen["detail_text"]
