"""Timing figures that tests must not assert (a loaded machine would fail them): how fast
the matrix selects, and how large and how fast the HTML report is - with today's codec
(gzip + base64, inflated by the browser's DecompressionStream) and, for comparison, with the
custom base-62 codec it replaced (rendered by that commit's code, ``--baseline``).

    python benchmarks/bench_timings.py [--baseline 26224ee] [--repeats 3]

Needs Chromium + chromedriver (``python -m harness install browser``). Prints a markdown
table and stores the figures in ``benchmarks/results-<date>.json`` (key ``timings``).
Budgets (reported, not enforced): ``select("ci")`` < 0.5 s; first render < 2 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from _common import ROOT, machine, save, table

sys.path.insert(0, str(ROOT))

from fixtures import report_records as H  # noqa: E402
from harness.vocabulary import matrix  # noqa: E402
from harness_reports import render_html  # noqa: E402
from harness_reports.browser import measure_render  # noqa: E402

SELECT_BUDGET_S = 0.5
RENDER_BUDGET_MS = 2_000


def _baseline_html(commit: str, record: dict, out: Path) -> None:
    """Render ``record`` with the report code of ``commit`` (its top-level ``reports`` package)."""
    tree = Path(tempfile.mkdtemp(prefix="dw-baseline-"))
    data = subprocess.run(["git", "archive", commit, "reports"], cwd=ROOT, capture_output=True, check=True).stdout
    tarfile.open(fileobj=BytesIO(data)).extractall(tree)
    rec_path = tree / "record.json"
    rec_path.write_text(json.dumps(record))
    code = ("import json, sys; from harness_reports import render_html; "
            f"open({str(out)!r}, 'w').write(render_html(json.load(open({str(rec_path)!r}))))")
    subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, env={"PYTHONPATH": str(tree)})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="26224ee", help="commit with the base-62 codec ('' to skip)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    t = time.perf_counter()
    matrix.select("ci")
    select_s = time.perf_counter() - t
    rows, figures = [], {"select_ci_s": select_s, "reports": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, make in (("10k-failing", lambda: H.make_big_record(10_000, n_ranks=4)),
                           ("full-realistic", lambda: H.make_realistic_record(21_600, n_ranks=4))):
            rec = make()
            pages = {}
            t = time.perf_counter()
            pages["gzip+base64"] = Path(tmp) / f"{kind}.html"
            pages["gzip+base64"].write_text(render_html(rec))
            render_s = {"gzip+base64": time.perf_counter() - t}
            if args.baseline:
                pages["base-62 (baseline)"] = Path(tmp) / f"{kind}-baseline.html"
                t = time.perf_counter()
                _baseline_html(args.baseline, rec, pages["base-62 (baseline)"])
                render_s["base-62 (baseline)"] = time.perf_counter() - t
            for codec, page in pages.items():
                m = measure_render(page, repeats=args.repeats)
                figures["reports"][f"{kind} {codec}"] = {**m, "render_s": render_s[codec]}
                rows.append([kind, codec, f"{m['bytes'] / 1e6:.2f} MB", render_s[codec], m["cold_ms"], m["best_ms"],
                             "ok" if m["best_ms"] < RENDER_BUDGET_MS else "OVER BUDGET"])
    print(f"matrix.select('ci'): {select_s:.3f} s ({'ok' if select_s < SELECT_BUDGET_S else 'OVER BUDGET'})\n")
    print(table(["report", "codec", "file", "render (s, python)", "first render cold (ms)",
                 "first render best (ms)", f"< {RENDER_BUDGET_MS} ms"], rows))
    print(f"\nsaved: {save('timings', {'machine': machine(), **figures})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
