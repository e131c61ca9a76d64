"""Reports rendered from a run record (``results.json``) alone: HTML, JUnit XML, markdown, diff.

Every renderer is a pure function of the parsed JSON (``RunRecord.serialize()``): no torch,
no access to the run folder, so a report can be re-rendered anywhere from the one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .diff import CellChange, RunDiff, diff_records, render_diff_html, render_diff_text
from .html import render_html
from .junit import render_junit
from .markdown import render_markdown

__all__ = [
    "CellChange",
    "RunDiff",
    "diff_records",
    "render_diff_html",
    "render_diff_text",
    "render_html",
    "render_junit",
    "render_markdown",
    "write_all",
]


def write_all(record: dict[str, Any], run_dir: Path, *, selftest: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write ``report.html``, ``junit.xml`` and ``summary.md`` into ``run_dir``.

    Returns:
        ``{"html": path, "junit": path, "markdown": path}``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": run_dir / "report.html", "junit": run_dir / "junit.xml", "markdown": run_dir / "summary.md"}
    texts = {
        "html": render_html(record, selftest=selftest),
        "junit": render_junit(record),
        "markdown": render_markdown(record, html_path=str(paths["html"])),
    }
    for key, text in texts.items():
        tmp = paths[key].with_name(paths[key].name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(paths[key])
    return paths
