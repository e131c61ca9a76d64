"""The CI step summary (``$GITHUB_STEP_SUMMARY``): verdict, counts, and what to rerun.

GitHub rejects a summary over 1 MiB, and a broken backend can fail 20k cells, so the list of
failing cells is cut to fit ``limit_bytes`` with a pointer to the HTML report, which has all.
Text from the record is escaped (GitHub renders inline HTML in markdown) and code spans use
a fence longer than any backtick run inside them.

A run judged under a known-defects ledger (CONTRACTS §7) gets a ledger section: one table row
per entry, a warning per stale entry (it fails the run), and the ``known`` cells grouped by
the entries that explain them - a few example ids per group, since a real backend can have
thousands of known cells and the HTML report lists them all. The cells where TE ran another
path than they name (``path_not_taken``) are listed by the reason TE gave.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from .review_section import markdown as review_markdown
from .review_section import paths_not_taken
from ._common import (BAD_STATUSES, installers_line, PATH_NOT_TAKEN, backend_facts, STATUS_LABELS, STATUSES, clean_text, counts_of,
                      counts_text, fmt_duration, fmt_ratio, ledger_entries, ratio_key, stale_entries, verdict)

ICONS = {"PASS": "✅", "FAIL": "❌", "INCOMPLETE": "⚠️"}
LINE_LIMIT = 600  # characters of one first_failure line
KNOWN_GROUPS = 10  # groups of known cells listed (by the set of entries explaining them)
KNOWN_EXAMPLES = 3  # example cell ids per group


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


def _state(e: dict[str, Any], judged: bool) -> str:
    if e.get("stale"):
        return "**STALE**"
    if not e.get("selected"):
        return "selects no cell"
    other = len(e.get("path_not_taken") or [])
    if other and not e.get("reproduced"):
        return f"{other:,} cell(s) took another TE path"
    return "reproduces" if e.get("reproduced") else "not judged (a shard)" if not judged else "does not reproduce"


#: one line on what "known" and each entry kind mean (every summary with a ledger says it)
KNOWN_MEANS = ("*Known defect*: the cell fails, and every failure on every rank is one an entry below states "
               "precisely for this cell (an exception's type and text, a check's form, a value the entry's model "
               "predicts); any other failure keeps it red. Kind *defect*: the upstream code loses or corrupts a "
               "gradient, or fails, under a supported use; kind *difference*: a choice upstream may keep.")


def _ledger(record: dict[str, Any]) -> str:
    """The ledger section: the file, a warning per stale entry, the entries, the known cells."""
    led = record.get("ledger")
    if not led:
        return ""
    judged = led.get("judged_stale", True)
    about = [("ledger", led.get("path")), ("package", led.get("package")), ("versions", led.get("versions"))]
    out = ["\n### Known-defects ledger\n\n" + " · ".join(f"{k} {_code(v)}" for k, v in about if v) + "\n"]
    for e in stale_entries(record):  # upstream refs in code spans: GitHub would link "#3545" to this repo
        out.append(f"\n> [!CAUTION]\n> **stale**: ledger entry {_code(e.get('id'))} ({_code(e.get('upstream'))}) no "
                   f"longer reproduces in any of the {len(e.get('selected') or []):,} cell(s) it selects: delete it "
                   f"from {_code(led.get('path') or 'the ledger')}\n")
    entries = ledger_entries(record)
    if entries:
        out.append(f"\n{KNOWN_MEANS}\n")
        out.append("\n| entry | title | upstream | kind | known cells | reproduced / selected | state |\n"
                   "|---|---|---|---|---:|---:|---|\n")
        out += [f"| {_code(e.get('id'))} | {_md_text(e.get('title'))} | {_code(e.get('upstream'))} | "
                f"{_md_text(e.get('kind'))} | {len(e.get('known_cells') or []):,} | {len(e.get('reproduced') or []):,} / "
                f"{len(e.get('selected') or []):,} | {_state(e, judged)} |\n" for e in entries]
        shared = sum(len(c.get("known") or []) > 1 for c in record.get("cells") or [] if c.get("status") == "known")
        if shared:
            out.append(f"\n{shared:,} known cell(s) fail the ways of two or more entries at once: each such cell "
                       "counts in the *known cells* of every entry that explains part of it, so that column adds up to "
                       "more than the known cells.\n")
    groups: dict[tuple[str, ...], list[str]] = {}
    for c in record.get("cells") or []:
        if c.get("status") == "known":
            groups.setdefault(tuple(c.get("known") or ()), []).append(str(c.get("id")))
    if groups:
        n = sum(len(ids) for ids in groups.values())
        out.append(f"\nKnown cells ({n:,}), by the entries that explain them:\n\n")
        ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        for ids, cells in ranked[:KNOWN_GROUPS]:
            eg = ", ".join(_code(c) for c in cells[:KNOWN_EXAMPLES]) + (", …" if len(cells) > KNOWN_EXAMPLES else "")
            out.append(f"- {', '.join(_code(i) for i in ids) or '(no entry named)'}: {len(cells):,} "
                       f"cell{'s' if len(cells) != 1 else ''}, e.g. {eg}\n")
        if len(ranked) > KNOWN_GROUPS:
            out.append(f"- … and {len(ranked) - KNOWN_GROUPS:,} more groups (see the HTML report)\n")
    return "".join(out)


def _not_taken(record: dict[str, Any]) -> str:
    """The ``path_not_taken`` cells by the reason TE gave: no verdict on the path they name."""
    groups = paths_not_taken(record)
    if not groups:
        return ""
    n = sum(len(ids) for _, ids in groups)
    out = [f"\n### {STATUS_LABELS[PATH_NOT_TAKEN].capitalize()} ({n:,})\n\nTE ran another execution path in "
           "these cells than their module value names: they say nothing about the named path, and count "
           "toward no ledger entry.\n\n"]
    for reason, ids in groups[:KNOWN_GROUPS]:
        eg = ", ".join(_code(c) for c in ids[:KNOWN_EXAMPLES]) + (", …" if len(ids) > KNOWN_EXAMPLES else "")
        out.append(f"- {_md_text(reason)}: {len(ids):,} cell{'s' if len(ids) != 1 else ''}, e.g. {eg}\n")
    if len(groups) > KNOWN_GROUPS:
        out.append(f"- … and {len(groups) - KNOWN_GROUPS:,} more reasons (see the HTML report)\n")
    return "".join(out)


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
    def missed(c: dict[str, Any]) -> bool:
        return c.get("status") in BAD_STATUSES or c.get("status") not in STATUSES

    # what the head needs of the failing cells: their statuses (the list is read again below)
    missed_counts = Counter(c.get("status") for c in record.get("cells") or [] if missed(c))
    n_bad = sum(missed_counts.values())
    extra = [f"{counts.get('known', 0):,} known defect{'s' if counts.get('known', 0) != 1 else ''}"
             if counts.get("known") else "",
             f"{len(stale_entries(record)):,} stale ledger entr{'ies' if len(stale_entries(record)) != 1 else 'y'}"
             if stale_entries(record) else "",
             f"{counts[PATH_NOT_TAKEN]:,} {STATUS_LABELS[PATH_NOT_TAKEN]}" if counts.get(PATH_NOT_TAKEN) else ""]
    what = f" ({counts_text(missed_counts)})" if n_bad else ""
    head: list[str] = [f"## {ICONS[v]} dw-harness: {v} — {n_bad:,} of {n:,} cells missed their expectation{what}"
                       + "".join(f", {x}" for x in extra if x) + "\n\n"]
    if record.get("status") == "incomplete":
        head.append("> [!WARNING]\n> **INCOMPLETE**: the sweep did not finish; counts cover the cells recorded so far.\n\n")
    head.append(review_markdown(record))
    head.append("| " + " | ".join(_md_text(STATUS_LABELS.get(s, s)) for s in counts) + " | total |\n")
    head.append("|" + "---:|" * (len(counts) + 1) + "\n")
    head.append("| " + " | ".join(f"{x:,}" for x in counts.values()) + f" | {n:,} |\n")
    facts = [("backend", record.get("backend")), *backend_facts(record), ("torch", env.get("torch")),
             ("device", " / ".join(str(x) for x in (env.get("device"), env.get("pg_backend")) if x) or None),
             ("world sizes", ", ".join(map(str, record.get("world_sizes") or [])) or None),
             ("commit", env.get("git_commit")), ("duration", fmt_duration(record.get("duration_s")))]
    head.append("\n" + " · ".join(f"**{k}** {_code(val)}" for k, val in facts if val not in (None, "")) + "\n")
    installers = installers_line(record)
    if installers:
        head.append(f"\n{_md_text(installers)}\n")
    if record.get("command"):
        head.append(f"\nsweep: {_code(record['command'])}\n")
    if html_path:
        link = html_path if re.match(r"^[a-z]+://", html_path) else None
        head.append(f"\nFull report: [{_md_text(html_path)}](<{link}>)\n" if link else f"\nFull report: {_code(html_path)}\n")
    top = max((c for c in record.get("cells") or [] if c.get("status") == "pass" and c.get("worst_ratio") is not None),
              key=lambda c: ratio_key(c["worst_ratio"]), default=None)
    if top is not None:
        head.append(f"\nClosest passing cell: {_code(top['id'])} at ratio {fmt_ratio(top['worst_ratio'])} of its bound.\n")
    head.append(_ledger(record))
    head.append(_not_taken(record))

    out = "".join(head)
    size = len(out.encode())
    if size > limit_bytes:
        raise ValueError(f"Cannot fit the summary head ({size} bytes) in limit_bytes={limit_bytes!r}")
    if not n_bad:
        return out
    section = f"\n### Failing cells ({n_bad:,})\n\n"
    where = _md_text(f"see the HTML report{f': {html_path}' if html_path else ''}")

    def tail(more: int) -> str:
        return f"\n... and {more:,} more ({where})\n"

    tail_room = len(tail(n_bad).encode())
    if size + len(section.encode()) + tail_room > limit_bytes:
        return out
    parts = [out, section]
    size += len(section.encode())
    shown = 0
    for c in (c for c in record.get("cells") or [] if missed(c)):
        entry = _cell_entry(c)
        b = len(entry.encode())
        if size + b + tail_room > limit_bytes:
            break
        parts.append(entry)
        size += b
        shown += 1
    if shown < n_bad:
        parts.append(tail(n_bad - shown))
    return "".join(parts)
