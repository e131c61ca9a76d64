"""Reports rendered from a run record (``results.json``) alone: HTML, JUnit XML, markdown, diff.

Every renderer is a pure function of the parsed JSON (``RunRecord.serialize()``): no torch,
no access to the run folder, so a report can be re-rendered anywhere from the one file. A
renderer only iterates the record's ``cells`` (never indexes them, never keeps them all), so
they may be a list or a stream (``harness.records.recordfile.read_streamed``: what the
commands pass, whatever the run's size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TextIO

from .diff import CellChange, RunDiff, diff_records, render_diff_html, render_diff_text
from .html import html_pieces, render_html
from .junit import render_junit, write_junit
from .markdown import render_markdown

__all__ = [
    "CellChange",
    "RunDiff",
    "diff_records",
    "render_diff_html",
    "render_diff_text",
    "html_pieces",
    "render_html",
    "render_junit",
    "render_markdown",
    "write_all",
    "write_junit",
]


def write_all(record: dict[str, Any], run_dir: Path, *, selftest: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write ``report.html``, ``junit.xml`` and ``summary.md`` into ``run_dir``.

    Returns:
        ``{"html": path, "junit": path, "markdown": path}``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": run_dir / "report.html", "junit": run_dir / "junit.xml", "markdown": run_dir / "summary.md"}
    writers: dict[str, Callable[[TextIO], Any]] = {
        "html": lambda f: f.writelines(html_pieces(record, selftest=selftest)),  # the summary blob a piece at a time
        "junit": lambda f: write_junit(record, f),  # a testcase at a time: its tree would be O(cells)
        "markdown": lambda f: f.write(render_markdown(record, html_path=str(paths["html"]))),
    }
    # all three written beside their places first, then put in place: a render that fails
    # leaves the earlier reports as they were and no partial file behind
    tmps = {key: path.with_name(path.name + ".tmp") for key, path in paths.items()}
    try:
        for key, write in writers.items():
            with open(tmps[key], "w", encoding="utf-8") as f:
                write(f)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise
    for key, tmp in tmps.items():
        tmp.replace(paths[key])
    return paths
