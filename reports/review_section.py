"""The review verdict at the top of the markdown summary and the HTML report: which tree was
judged, GREEN or RED, per ledger entry fixed here / still failing / not exercised, and every
regression (``harness.judging.review``). Shown when the run reviews a change (``sweep --fixes``) or
judged a TE source tree (``--te-tree``). Also the cells where TE ran another path than they
name (``path_not_taken``), grouped by the reason TE gave, which every report shows."""

from __future__ import annotations

from html import escape
from typing import Any

from harness.records import provenance
from harness.te_tree import tree as te_tree
from harness.judging import review as reviews
from harness.vocabulary.status import PATH_NOT_TAKEN

ICON = {reviews.FIXED: "✅", reviews.FAILING: "❌", reviews.NOT_EXERCISED: "⚪"}


def of(record: dict[str, Any]) -> reviews.Review | None:
    """The record's review, when it is one (a required list, or a tree under review)."""
    if (record.get("ledger") or {}).get("required") is None and not provenance.tree(record):
        return None
    return reviews.review(record)


def headline(rev: reviews.Review) -> str:
    """``GREEN: 2 of 2 required entries fixed here, 0 regression(s)`` (or RED, INCOMPLETE)."""
    if not (rev.required or rev.regressions or rev.harness_errors):
        return "no entry required (sweep --fixes names them)"
    fixed = sum(e.required and e.verdict == reviews.FIXED for e in rev.entries)
    return (f"{rev.word}: {fixed} of {len(rev.required)} required entries fixed here, "
            f"{len(rev.regressions)} regression(s)" + (f", {rev.harness_errors} harness error(s)"
                                                       if rev.harness_errors else ""))


def tree_line(rev: reviews.Review) -> str | None:
    """The tree under review in one line (``harness.te_tree.tree.describe``), None without one."""
    return te_tree.describe(rev.tree) if rev.tree else None


def code_facts(record: dict[str, Any]) -> list[tuple[str, str]]:
    """What code the run judged beyond the backend's name, as ``(label, value)``: the tree,
    where the compiled part came from, and the warning a tree run with another install's
    build must carry (``harness.records.provenance``)."""
    tree = provenance.tree(record)
    facts = [("TE tree under review", te_tree.describe(tree))] if tree else []
    for label, value in (("compiled part", provenance.compiled_text(record)),
                         ("warning", provenance.foreign_build_warning(record))):
        if value:
            facts.append((label, value))
    return facts


def code_lines(record: dict[str, Any]) -> list[str]:
    """``code_facts`` as plain lines (the terminal)."""
    return [f"{label}: {value}" for label, value in code_facts(record)]


def paths_not_taken(record: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``[(reason, [cell id, ...]), ...]`` of the ``path_not_taken`` cells, most cells first."""
    groups: dict[str, list[str]] = {}
    for c in record.get("cells") or []:
        if c.get("status") == PATH_NOT_TAKEN:
            groups.setdefault(reviews.path_reason(c), []).append(str(c.get("id")))
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def verdict_text(e: reviews.EntryVerdict) -> str:
    """``not exercised (3 cells took another TE path)``: an entry's verdict, and why when its
    cells ran another path."""
    return e.verdict + (f" ({e.path_not_taken} cell(s) took another TE path)"
                        if e.verdict == reviews.NOT_EXERCISED and e.path_not_taken else "")


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_facts(record: dict[str, Any]) -> list[str]:
    return [f"**{label}**: {_md(value)}\n\n" if label == "warning" else f"{label}: `{value}`\n\n"
            for label, value in code_facts(record)]


def _html_facts(record: dict[str, Any]) -> str:
    return "".join(f'<p class="{"t-fail" if label == "warning" else ""}">{escape(label)}: '
                   f'<span class="mono">{escape(value)}</span></p>' for label, value in code_facts(record))


def markdown(record: dict[str, Any]) -> str:
    """The review section of ``summary.md`` (a run without a review: only what code it judged)."""
    rev = of(record)
    if rev is None:
        return "".join(["\n"] + _md_facts(record)) if code_facts(record) else ""
    out = [f"\n### Review: {headline(rev)}\n\n"] + _md_facts(record)
    if not rev.green:
        out += [f"- {_md(line)}\n" for line in rev.reasons(regressions=False)] + ["\n"]
    out.append("| entry | upstream | required | verdict | selected | reproduced in |\n|---|---|:-:|---|---:|---:|\n")
    for e in rev.entries:
        out.append(f"| `{e.id}` | {_md(e.upstream)} | {'yes' if e.required else ''} | {ICON[e.verdict]} "
                   f"{verdict_text(e)} | {e.selected} | {e.reproduced} |\n")
    unfixed = rev.reasons()[:len(rev.unfixed)]  # reasons() names the unfixed entries first
    if unfixed:
        out.append("\n" + "".join(f"- {_md(line)}\n" for line in unfixed))
    if rev.regressions:
        out.append(f"\n**Regressions** ({len(rev.regressions)}): cells that fail without a ledger entry\n\n")
        for r in rev.regressions[:30]:
            out.append(f"- `{r.cell}` ({r.status}): {_md(r.failures[0] if r.failures else '')} — repro `{r.repro}`\n")
        if len(rev.regressions) > 30:
            out.append(f"- ... and {len(rev.regressions) - 30} more\n")
    out.append("\n")  # a table that follows must not continue this one
    return "".join(out)


def html(record: dict[str, Any]) -> str:
    """The review section of the HTML report (without a review: only what code it judged)."""
    rev = of(record)
    if rev is None:
        facts = _html_facts(record)
        return f'<section class="card" id="code"><h2>Code judged</h2>{facts}</section>' if facts else ""
    e_ = escape
    cls = "t-pass" if rev.green else "t-fail"
    rows = "".join(
        f'<tr><td><a class="mono" href="#ledger-{e_(e.id)}">{e_(e.id)}</a></td><td>{e_(e.upstream)}</td>'
        f'<td>{"required" if e.required else ""}</td>'
        f'<td class="{"t-pass" if e.verdict == reviews.FIXED else "t-fail" if e.required else ""}">'
        f'{ICON[e.verdict]} {e_(verdict_text(e))}</td><td>{e.selected}</td><td>{e.reproduced}</td></tr>'
        for e in rev.entries)
    why = "".join(f"<li>{e_(line)}</li>" for line in rev.reasons()[:len(rev.unfixed)])
    regs = "".join(f'<li><span class="mono">{e_(r.cell)}</span> ({e_(r.status)}): '
                   f'{e_(r.failures[0] if r.failures else "")}</li>' for r in rev.regressions[:50])
    tree = _html_facts(record)
    if not rev.green:
        tree += "<ul>" + "".join(f"<li>{e_(line)}</li>" for line in rev.reasons(regressions=False)) + "</ul>"
    return ('<section class="card" id="review"><h2>Review</h2>'
            f'<p class="{cls}"><b>{e_(headline(rev))}</b></p>{tree}'
            '<table class="plain"><tr><th>entry</th><th>upstream</th><th></th><th>verdict</th><th>selected</th>'
            f'<th>reproduced in</th></tr>{rows}</table>'
            + (f'<ul class="why">{why}</ul>' if why else "")
            + (f'<h3>Regressions ({len(rev.regressions)})</h3><ul>{regs}</ul>' if regs else "")
            + '</section>')
