"""The CI step summary (``$GITHUB_STEP_SUMMARY``): verdict, counts, and what to rerun.

GitHub rejects a summary over 1 MiB, and a broken backend can fail 20k cells, so the list of
failing cells is cut to fit ``limit_bytes`` with a pointer to the HTML report, which has all.
Text from the record is escaped (GitHub renders inline HTML in markdown) and code spans use
a fence longer than any backtick run inside them.
"""

from __future__ import annotations

import re
from typing import Any

from ._common import (BAD_STATUSES, backend_facts, STATUS_LABELS, STATUSES, clean_text, counts_of, fmt_duration,
                      fmt_ratio, ratio_key, verdict)

ICONS = {"PASS": "✅", "FAIL": "❌", "INCOMPLETE": "⚠️"}
LINE_LIMIT = 600  # characters of one first_failure line


def _md_text(s: Any) -> str:
    """Plain text safe for a markdown paragraph or table cell (no HTML, no table breaks)."""
    s = clean_text(s).replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", s)


def _code(s: Any) -> str:
    """An inline code span holding ``s`` verbatim, however many backticks it contains."""
    s = clean_text(s).replace("\r", " ").replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _cell_entry(c: dict[str, Any]) -> str:
    ff = c.get("first_failure") or "(no message recorded)"
    if len(ff) > LINE_LIMIT:
        ff = ff[:LINE_LIMIT] + "…"
    ratio = f" · ratio {fmt_ratio(c['worst_ratio'])}" if c.get("worst_ratio") is not None else ""
    return (f"- **{_md_text(c.get('status'))}** {_code(c.get('id', ''))}{ratio}  \n"
            f"  {_md_text(ff)}  \n"
            f"  repro: {_code(c.get('repro', ''))}\n")


def render_markdown(record: dict[str, Any], *, html_path: str | None = None, limit_bytes: int = 1_000_000) -> str:
    """Render the step summary; the UTF-8 encoding of the result is at most ``limit_bytes``.

    Args:
        record: the parsed ``results.json``.
        html_path: where the HTML report is (a path or URL), linked when given.
        limit_bytes: size cap; the failing-cell list is truncated to honour it.

    Raises:
        ValueError: when ``limit_bytes`` cannot even hold the summary's head.
    """
    counts = counts_of(record)
    env = record.get("environment") or {}
    v = verdict(record)
    n = sum(counts.values())
    bad = [c for c in record.get("cells") or [] if c.get("status") in BAD_STATUSES
           or c.get("status") not in STATUSES]
    head: list[str] = [f"## {ICONS[v]} dw-harness: {v} — {len(bad):,} of {n:,} cells failed\n\n"]
    if record.get("status") == "incomplete":
        head.append("> [!WARNING]\n> **INCOMPLETE**: the sweep did not finish; counts cover the cells recorded so far.\n\n")
    head.append("| " + " | ".join(_md_text(STATUS_LABELS.get(s, s)) for s in counts) + " | total |\n")
    head.append("|" + "---:|" * (len(counts) + 1) + "\n")
    head.append("| " + " | ".join(f"{x:,}" for x in counts.values()) + f" | {n:,} |\n")
    facts = [("backend", record.get("backend")), *backend_facts(record), ("torch", env.get("torch")),
             ("device", " / ".join(str(x) for x in (env.get("device"), env.get("pg_backend")) if x) or None),
             ("world sizes", ", ".join(map(str, record.get("world_sizes") or [])) or None),
             ("commit", env.get("git_commit")), ("duration", fmt_duration(record.get("duration_s")))]
    head.append("\n" + " · ".join(f"**{k}** {_code(val)}" for k, val in facts if val not in (None, "")) + "\n")
    if record.get("command"):
        head.append(f"\nsweep: {_code(record['command'])}\n")
    if html_path:
        link = html_path if re.match(r"^[a-z]+://", html_path) else None
        head.append(f"\nFull report: [{_md_text(html_path)}](<{link}>)\n" if link else f"\nFull report: {_code(html_path)}\n")
    passing = [c for c in record.get("cells") or [] if c.get("status") == "pass" and c.get("worst_ratio") is not None]
    if passing:
        top = max(passing, key=lambda c: ratio_key(c["worst_ratio"]))
        head.append(f"\nClosest passing cell: {_code(top['id'])} at ratio {fmt_ratio(top['worst_ratio'])} of its bound.\n")

    out = "".join(head)
    size = len(out.encode())
    if size > limit_bytes:
        raise ValueError(f"Cannot fit the summary head ({size} bytes) in limit_bytes={limit_bytes!r}")
    if not bad:
        return out
    section = f"\n### Failing cells ({len(bad):,})\n\n"
    where = _md_text(f"see the HTML report{f': {html_path}' if html_path else ''}")

    def tail(more: int) -> str:
        return f"\n... and {more:,} more ({where})\n"

    tail_room = len(tail(len(bad)).encode())
    if size + len(section.encode()) + tail_room > limit_bytes:
        return out
    parts = [out, section]
    size += len(section.encode())
    shown = 0
    for c in bad:
        entry = _cell_entry(c)
        b = len(entry.encode())
        if size + b + tail_room > limit_bytes:
            break
        parts.append(entry)
        size += b
        shown += 1
    if shown < len(bad):
        parts.append(tail(len(bad) - shown))
    return "".join(parts)
