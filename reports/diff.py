"""Compare two run records cell by cell (by id): what broke, what got fixed, what drifted.

A ``known`` cell (every failure explained by the known-defects ledger, CONTRACTS §7) is a
*failing* cell here. The ledger keeps a run's own gate green on defects already reported
upstream; it does not make a change acceptable: comparing two runs, a cell that starts to fail
is a regression whether or not an entry explains the failure (an entry whose cells widen
would otherwise hide it), and a known cell that passes is a fix (its entry may now be stale).
"Failing" below is bad (fail/error/timeout) or known; "good" is pass/xfail.

Classes (a cell lands in at most one):

* ``newly_failing`` - failing in ``new``, and good or skipped in ``base`` (``pass -> known``
  included); or ``known`` in ``base`` and bad in ``new`` (a failure the ledger no longer
  explains). A previously skipped cell that now fails is a new failure too: the gate must not
  let a regression hide behind a skip.
* ``newly_passing`` - failing in ``base`` (``known`` included: a fix), good in ``new``.
* ``still_failing`` - bad in ``base``, bad or ``known`` in ``new`` (a failure the ledger now
  explains still fails).
* ``known_changed`` - ``known`` in both, explained by different entries (reported, not a
  failure of the diff); ``known`` in both with the same entries is unchanged.
* ``newly_skipped`` - not skipped in ``base``, skipped in ``new``, or ``path_not_taken`` in
  ``new`` but not in ``base`` (TE ran another path than the cell names: what ``base`` tested
  ran nowhere, so it is coverage lost, never a fix of a known cell).
* ``ratio_grown`` - good in both, both have a worst_ratio, and
  ``new > ratio_growth * base`` and ``new > 0.1``: the error grew a lot *and* is no longer
  negligible (a ratio of 0.001 tripling is noise; 0.05 -> 0.4 is a backend getting worse).
  NaN counts as larger than any number.
* ``only_in_base`` / ``only_in_new`` - ids present in one record only (the matrix changed).

``exit_code`` is 1 - the gate fails - when:

* any cell newly fails, including a failing (bad or known) cell that exists only in ``new``
  (a newly added cell that fails is a new failure);
* the new run is ``incomplete`` (interrupted, or ended by a launch failure): what it did
  not run cannot pass a gate;
* coverage was lost: a cell newly skipped, or a cell only in ``base`` - unless
  ``allow_missing`` (an intentional change of the matrix or the selection).

Otherwise 0. ``problems`` says why, one line each. A stale ledger entry in ``new`` fails
that run's own gate (its exit code) and is listed in ``new_stale``, but is no regression: it
means a fix landed.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from . import _assets
from ._common import BAD_STATUSES, GOOD_STATUSES, PATH_NOT_TAKEN, fmt_ratio, ratio_key, stale_entries, verdict


@dataclass(frozen=True)
class CellChange:
    """One cell's before/after (``None`` on the side where the cell does not exist)."""

    id: str
    base_status: str | None
    new_status: str | None
    base_ratio: float | None = None
    new_ratio: float | None = None
    first_failure: str | None = None  # from new when it has one, else from base
    repro: str = ""
    #: the ledger entries explaining the cell on each side (empty unless ``known``)
    base_known: tuple[str, ...] = ()
    new_known: tuple[str, ...] = ()


@dataclass
class RunDiff:
    """The result of ``diff_records``; every list keeps the new record's cell order."""

    newly_failing: list[CellChange] = field(default_factory=list)
    newly_passing: list[CellChange] = field(default_factory=list)
    still_failing: list[CellChange] = field(default_factory=list)
    newly_skipped: list[CellChange] = field(default_factory=list)
    ratio_grown: list[CellChange] = field(default_factory=list)
    known_changed: list[CellChange] = field(default_factory=list)
    only_in_base: list[CellChange] = field(default_factory=list)
    only_in_new: list[CellChange] = field(default_factory=list)
    unchanged: int = 0
    ratio_growth: float = 2.0
    #: the new run's record says ``incomplete``
    new_incomplete: bool = False
    #: cells only in base / newly skipped do not fail the gate
    allow_missing: bool = False
    #: the new run's stale ledger entries (``id (upstream)``): its own gate fails, this one not
    new_stale: list[str] = field(default_factory=list)
    #: (base, new) backend specs: a diff across backends compares two implementations, not two versions
    backends: tuple[str | None, str | None] = (None, None)

    CLASSES = ("newly_failing", "newly_passing", "still_failing", "newly_skipped", "ratio_grown",
               "known_changed", "only_in_base", "only_in_new")

    @property
    def new_cells_failing(self) -> list[CellChange]:
        return [c for c in self.only_in_new if _failing(c.new_status)]

    @property
    def problems(self) -> list[str]:
        """Why the gate fails, one line each (empty when it passes)."""
        out = []
        if self.newly_failing or self.new_cells_failing:
            out.append(f"{len(self.newly_failing) + len(self.new_cells_failing)} cell(s) newly failing")
        if self.new_incomplete:
            out.append("the new run is incomplete (interrupted or ended early): its unrun cells cannot pass")
        if not self.allow_missing and (self.newly_skipped or self.only_in_base):
            out.append(f"coverage lost: {len(self.newly_skipped)} cell(s) newly skipped, "
                       f"{len(self.only_in_base)} only in base (--allow-missing accepts that)")
        return out

    @property
    def exit_code(self) -> int:
        """1 when the gate fails (see the module docstring), else 0."""
        return 1 if self.problems else 0


def _bad(status: str | None) -> bool:
    return status is not None and status not in GOOD_STATUSES and status != "skipped"


def _failing(status: str | None) -> bool:
    """Bad, or ``known``: a failure, whether or not the ledger explains it (module docstring)."""
    return _bad(status) or status == "known"


def _known(c: dict[str, Any] | None) -> tuple[str, ...]:
    return tuple(c.get("known") or ()) if c is not None and c.get("status") == "known" else ()


def _change(cid: str, b: dict[str, Any] | None, n: dict[str, Any] | None) -> CellChange:
    src = n if n is not None and n.get("first_failure") else (b or n or {})
    return CellChange(
        id=cid,
        base_status=None if b is None else b.get("status"),
        new_status=None if n is None else n.get("status"),
        base_ratio=None if b is None else b.get("worst_ratio"),
        new_ratio=None if n is None else n.get("worst_ratio"),
        first_failure=src.get("first_failure"),
        repro=(n or b or {}).get("repro", ""),
        base_known=_known(b),
        new_known=_known(n),
    )


def _grown(b: Any, n: Any, growth: float) -> bool:
    if b is None or n is None:
        return False
    bk, nk = ratio_key(b), ratio_key(n)
    return nk > 0.1 and nk > growth * bk


def diff_records(base: dict[str, Any], new: dict[str, Any], *, ratio_growth: float = 2.0,
                 allow_missing: bool = False) -> RunDiff:
    """Classify every cell id of ``base`` and ``new`` (parsed ``results.json`` dicts).

    Raises:
        ValueError: when ``ratio_growth`` is not at least 1.
    """
    if not ratio_growth >= 1.0:
        raise ValueError(f"Cannot have ratio_growth={ratio_growth!r} < 1")
    b_cells = {c["id"]: c for c in base.get("cells") or []}
    n_cells = {c["id"]: c for c in new.get("cells") or []}
    d = RunDiff(ratio_growth=ratio_growth, new_incomplete=new.get("status") == "incomplete",
                allow_missing=allow_missing,
                new_stale=[f"{e.get('id')} ({e.get('upstream')})" for e in stale_entries(new)],
                backends=(base.get("backend"), new.get("backend")))
    for cid, n in n_cells.items():
        b = b_cells.get(cid)
        if b is None:
            d.only_in_new.append(_change(cid, None, n))
            continue
        bs, ns = b.get("status"), n.get("status")
        ch = _change(cid, b, n)
        if bs == ns == "known":
            if ch.base_known == ch.new_known:
                d.unchanged += 1
            else:
                d.known_changed.append(ch)
        elif _failing(ns):  # bad -> known still fails; known -> bad is no longer explained
            (d.still_failing if _bad(bs) else d.newly_failing).append(ch)
        elif ns in ("skipped", PATH_NOT_TAKEN):  # nothing of the cell's path ran in new
            if bs == ns:
                d.unchanged += 1
            else:
                d.newly_skipped.append(ch)
        elif _failing(bs):  # ns is good: fixed (a known cell too)
            d.newly_passing.append(ch)
        elif bs in GOOD_STATUSES and _grown(b.get("worst_ratio"), n.get("worst_ratio"), ratio_growth):
            d.ratio_grown.append(ch)
        else:
            d.unchanged += 1
    d.only_in_base = [_change(cid, b, None) for cid, b in b_cells.items() if cid not in n_cells]
    return d


_TITLES = {
    "newly_failing": "Newly failing",
    "newly_passing": "Newly passing",
    "still_failing": "Still failing",
    "newly_skipped": "Newly skipped",
    "ratio_grown": "Error ratio grown",
    "known_changed": "Known defect changed",
    "only_in_base": "Only in base",
    "only_in_new": "Only in new",
}


def _fmt_status(s: str | None) -> str:
    return s if s is not None else "—"


def _fmt_known(ids: tuple[str, ...]) -> str:
    return ", ".join(ids) if ids else "—"


def render_diff_text(diff: RunDiff, *, limit: int = 50) -> str:
    """Plain-text diff for a terminal or a CI log; each class lists at most ``limit`` cells."""
    lines = [f"dw-harness diff: {'REGRESSION' if diff.exit_code else 'no new failures'}",
             *(f"  gate fails: {p}" for p in diff.problems),
             *(f"  note: ledger entry {s} is stale in new (a fix landed: delete it)" for s in diff.new_stale),
             *([f"  note: the runs are of different backends: base {diff.backends[0]}, new {diff.backends[1]}"]
               if diff.backends[0] != diff.backends[1] else []),
             "  " + ", ".join(f"{_TITLES[k].lower()}: {len(getattr(diff, k))}" for k in RunDiff.CLASSES)
             + f", unchanged: {diff.unchanged}"]
    for k in RunDiff.CLASSES:
        items: list[CellChange] = getattr(diff, k)
        if not items:
            continue
        lines.append("")
        lines.append(f"{_TITLES[k]} ({len(items)}):")
        for ch in items[:limit]:
            ratio = ""
            if ch.base_ratio is not None or ch.new_ratio is not None:
                ratio = f"  ratio {fmt_ratio(ch.base_ratio) or '—'} -> {fmt_ratio(ch.new_ratio) or '—'}"
            lines.append(f"  {_fmt_status(ch.base_status):>8} -> {_fmt_status(ch.new_status):<8} {ch.id}{ratio}")
            if ch.base_known or ch.new_known:
                lines.append(f"      known: {_fmt_known(ch.base_known)} -> {_fmt_known(ch.new_known)}")
            if k in ("newly_failing", "still_failing") or (k == "only_in_new" and _failing(ch.new_status)):
                if ch.first_failure:
                    lines.append(f"      {ch.first_failure}")
                if ch.repro:
                    lines.append(f"      repro: {ch.repro}")
        if len(items) > limit:
            lines.append(f"  ... and {len(items) - limit} more")
    if diff.ratio_grown or diff.exit_code == 0:
        lines.append("")
        lines.append(f"(ratio grown: both runs good, new > {diff.ratio_growth:g} x base and new > 0.1)")
    return "\n".join(lines) + "\n"


def render_diff_html(diff: RunDiff, base: dict[str, Any], new: dict[str, Any], *, limit: int = 2_000) -> str:
    """Self-contained HTML page of ``diff`` (static, no JavaScript); ``limit`` rows per class."""
    e = lambda s: html.escape("" if s is None else str(s), quote=True)  # noqa: E731

    def chip(s: str | None) -> str:
        if s is None:
            return '<span class="muted">—</span>'
        return f'<span class="badge s-{e(s) if s in GOOD_STATUSES + BAD_STATUSES + ("skipped",) else "other"}">{e(s)}</span>'

    def side(rec: dict[str, Any], label: str) -> str:
        env = rec.get("environment") or {}
        return (f'<div><dt>{label}</dt><dd>{e(rec.get("backend"))} · torch {e(env.get("torch"))} · '
                f'{e(env.get("git_commit") or "no commit")} · {e(rec.get("started"))} · '
                f'{len(rec.get("cells") or [])} cells · {verdict(rec)}</dd></div>')

    sections = []
    for k in RunDiff.CLASSES:
        items: list[CellChange] = getattr(diff, k)
        if not items:
            continue
        rows = "".join(
            f'<tr><td>{chip(ch.base_status)}</td><td>{chip(ch.new_status)}</td>'
            f'<td class="num">{e(fmt_ratio(ch.base_ratio))}</td><td class="num">{e(fmt_ratio(ch.new_ratio))}</td>'
            f'<td class="idcell" style="padding-left:16px">{e(ch.id)}'
            + (f'<div class="mono">known: {e(_fmt_known(ch.base_known))} → {e(_fmt_known(ch.new_known))}</div>'
               if ch.base_known or ch.new_known else "")
            + (f'<div class="muted mono" style="white-space:pre-wrap">{e(ch.first_failure)}</div>' if ch.first_failure and _failing(ch.new_status) else "")
            + (f'<div class="mono">repro: {e(ch.repro)}</div>' if ch.repro and _failing(ch.new_status) else "")
            + "</td></tr>" for ch in items[:limit])
        more = f'<p class="muted">… and {len(items) - limit:,} more (see the text diff).</p>' if len(items) > limit else ""
        sections.append(
            f'<section class="card" id="{k}"><h2>{_TITLES[k]} ({len(items):,})</h2>'
            '<table class="plain" style="width:100%;table-layout:fixed"><tr><th style="width:90px">base</th>'
            '<th style="width:90px">new</th><th class="num" style="width:90px">base ratio</th>'
            '<th class="num" style="width:90px">new ratio</th><th style="padding-left:16px">cell</th></tr>'
            f"{rows}</table>{more}</section>")
    v = "REGRESSION" if diff.exit_code else "NO NEW FAILURES"
    pills = "".join(f'<span class="pill"><b>{len(getattr(diff, k)):,}</b> {_TITLES[k].lower()}</span>'
                    for k in RunDiff.CLASSES) + f'<span class="pill"><b>{diff.unchanged:,}</b> unchanged</span>'
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>dw-harness diff · '
        f'{v}</title><style>{_assets.css()}</style></head><body><header class="top"><h1>dw-harness diff '
        f'<span class="verdict v-{"FAIL" if diff.exit_code else "PASS"}">{v}</span></h1></header><main>'
        f'<section class="card"><dl class="meta" style="grid-template-columns:1fr">{side(base, "base")}{side(new, "new")}</dl>'
        + "".join(f'<p class="t-fail"><b>gate fails:</b> {e(p)}</p>' for p in diff.problems)
        + "".join(f'<p class="t-fail">note: ledger entry {e(s)} is stale in new (a fix landed: delete it)</p>'
                  for s in diff.new_stale)
        + f'<div class="counts">{pills}</div><p class="muted" style="font-size:12px">ratio grown = good in both runs, '
        f'new worst ratio &gt; {diff.ratio_growth:g} × base and &gt; 0.1.</p></section>'
        + ("".join(sections) or '<section class="card"><p>No differences.</p></section>')
        + "</main></body></html>")
