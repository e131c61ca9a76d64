"""The HTML report: one self-contained file rendered from the run record alone.

Why it looks the way it does:

* It is opened from CI artifacts, often offline, so it has no network dependency (inline
  CSS/JS, system fonts, CSS charts).
* A ``full`` sweep has 21,600 cells. Rendering their detail panels up front would make a
  100 MB page, so the record is packed once (``_pack.py``) into two JSON blobs: a compact
  summary that the browser decodes at once to build the filters and the grid - the first screenful synchronously, the other rows in chunks after the first paint -
  and the per-rank detail, placed after the program and decoded only when a cell is first
  opened (or when the page is idle). Both are gzip-compressed JSON in base64, decoded by
  the browser's ``DecompressionStream``. A cell's detail panel is rendered when it is opened.
* The parts that are small and useful without JavaScript (header, counts, near-miss view,
  failure signatures, the known-defects ledger, self-test table) are rendered here, server
  side, escaped.
* A ledger entry that no longer reproduces (stale) fails the run, so it is shown as loudly
  as a failing cell: a banner under the header, a pill, and its ledger row, in the fail red.
* A cell where TE ran another path than it names (``path not taken``) passes the gate but
  tested nothing of that path: its own card lists those cells by the reason TE gave, and a
  cell's detail shows the path evidence (TE's recorded choice, the kernels called).
"""

from __future__ import annotations

import heapq
import html
import json
import math
import re
from typing import Any, Iterable, Iterator, Sequence

from . import _assets
from .review_section import html as review_html
from .review_section import paths_not_taken
from ._common import (BAD_STATUSES, STATUS_LABELS, STATUSES, backend_facts, counts_of, entry_state, fmt_duration,
                      fmt_ratio, ledger_entries, ratio_key, stale_entries, stale_line, verdict, worst_check)
from ._pack import SCRIPT_TYPE, pack

#: log buckets of the near-miss histogram: (label, lower bound inclusive, upper bound exclusive).
RATIO_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("< 1e-3", -math.inf, 1e-3),
    ("1e-3 – 1e-2", 1e-3, 1e-2),
    ("1e-2 – 0.1", 1e-2, 0.1),
    ("0.1 – 0.5", 0.1, 0.5),
    ("0.5 – 1", 0.5, 1.0 + 1e-12),
    ("> 1", 1.0 + 1e-12, math.inf),
)
TOP_NEAR_MISSES = 20
#: statuses whose pill the Run card shows even at zero (the others only when they occur)
ALWAYS_COUNTED: tuple[str, ...] = ("pass", "fail")
#: cell links listed per ledger entry (the grid filter shows them all)
LEDGER_CELL_LINKS = 12


def _e(s: Any) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def _status_class(s: str) -> str:
    return f"s-{s}" if s in STATUSES else "s-other"


def _header(record: dict[str, Any], counts: dict[str, int]) -> tuple[str, str]:
    """The page header (verdict, INCOMPLETE banner) and the "Run" card (environment, counts)."""
    env = record.get("environment") or {}
    v = verdict(record)
    n = sum(counts.values())
    sel = record.get("selection") or {}
    items: list[tuple[str, Any]] = [
        ("backend", record.get("backend")),
        *backend_facts(record),
        ("torch", env.get("torch")),
        ("device / process group", " / ".join(str(x) for x in (env.get("device"), env.get("pg_backend")) if x)),
        ("world sizes", ", ".join(str(w) for w in record.get("world_sizes") or []) or None),
        ("preset", sel.get("preset")),
        ("ledger", _ledger_fact(record)),
        ("git commit", (env.get("git_commit") or "")[:12] or None),
        ("started", record.get("started")),
        ("finished", record.get("finished") or ("— (incomplete)" if record.get("status") == "incomplete" else None)),
        ("duration", fmt_duration(record.get("duration_s"))),
        ("host", env.get("hostname")),
        ("python", env.get("python")),
        ("platform", env.get("platform")),
    ]
    meta = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(val)}</dd></div>" for k, val in items if val not in (None, ""))
    pills = "".join(
        f'<span class="pill"><i class="dot {_status_class(s)}"></i>{_e(STATUS_LABELS.get(s, s))} <b>{c:,}</b></span>'
        for s, c in counts.items() if c or s in ALWAYS_COUNTED)
    stale = stale_entries(record)
    if stale:
        pills += (f'<a class="pill stale" href="#ledger"><i class="dot s-fail"></i>stale ledger entries '
                  f'<b>{len(stale):,}</b></a>')
    launches = record.get("launches") or []
    noted = [l for l in launches if l.get("note")]
    exits: dict[Any, int] = {}
    for l in launches:
        exits[l.get("exit_code")] = exits.get(l.get("exit_code"), 0) + 1
    exit_txt = ", ".join(f"exit {k}: {n}" for k, n in exits.items())
    launch_rows = "".join(
        f"<tr><td class=num>{_e(l.get('world_size'))}</td><td class=num>{len(l.get('cells') or [])}</td>"
        f"<td class=num>{_e(l.get('exit_code'))}</td><td class=num>{_e(fmt_duration(l.get('duration_s')))}</td>"
        f"<td class=num>{_e(l.get('attempt', 0))}</td><td>{_e(l.get('note') or '')}</td>"
        f"<td class=mono>{_e(l.get('log_dir'))}</td></tr>" for l in launches)
    more = []
    if launches:
        more.append(
            f'<details class="more"{" open" if record.get("status") == "incomplete" else ""}><summary>{len(launches)} torchrun launch'
            f'{"es" if len(launches) != 1 else ""} ({_e(exit_txt)}{f"; {len(noted)} with a note" if noted else ""})</summary>'
            '<table class="plain"><tr><th class=num>ws</th><th class=num>cells</th><th class=num>exit</th>'
            f'<th class=num>duration</th><th class=num>attempt</th><th>note</th><th>log dir</th></tr>{launch_rows}</table></details>')
    for key, title in (("selection", "selection"), ("tolerance", "tolerance policy")):
        if record.get(key):
            more.append(f'<details class="more"><summary>{title}</summary><pre class="mono">'
                        f'{_e(json.dumps(record[key], indent=1, default=str))}</pre></details>')
    banner = ""
    if record.get("status") == "incomplete":
        banner = ('<div class="banner" id="incomplete"><b>INCOMPLETE</b> — the sweep did not finish; this report '
                  f'covers the {n:,} cells recorded before it stopped.</div>')
    if stale:
        banner += ('<div class="banner stale" id="stale"><b>STALE LEDGER</b> — '
                   + "; ".join(f'<a href="#ledger-{_e(e.get("id"))}">{_e(stale_line(e, record))}</a>' for e in stale)
                   + "</div>")
    top = (f'<header class="top"><h1>dw-harness report <span class="verdict v-{v}">{v}</span></h1>'
           f'<div class="sub">{n:,} cells · backend {_e(record.get("backend"))} · '
           f'{_e(record.get("started") or "")}</div></header>{banner}')
    return top, (
        f"<section class=\"card\" id=\"run\"><h2>Run</h2><dl class=\"meta\">{meta}</dl>"
        f'<div class="counts">{pills}</div>'
        f'<div class="cmd"><pre id="run-cmd">{_e(record.get("command") or " ".join(record.get("argv") or []))}</pre>'
        f'<button data-copy="run-cmd">Copy</button></div>{"".join(more)}</section>')


def _ledger_fact(record: dict[str, Any]) -> str | None:
    led = record.get("ledger")
    if not led:
        return None
    n, stale = len(led.get("entries") or []), len(stale_entries(record))
    return f"{led.get('name')} ({n} entr{'y' if n == 1 else 'ies'}{f', {stale} stale' if stale else ''})"


def _cell_links(ids: list[str], limit: int = LEDGER_CELL_LINKS) -> str:
    links = ", ".join(f'<a href="#{_e(i)}">{_e(i)}</a>' for i in ids[:limit])
    return links + (f' <span class="muted">and {len(ids) - limit:,} more</span>' if len(ids) > limit else "")


def symptom_text(f: dict[str, Any]) -> str:
    """One form of an entry's signature, as a line: ``check weight*.main_grad ratio 300..30000``."""
    what = f"exception {f['exception']}" if f.get("exception") else f"check {f.get('check')}"
    parts = [what]
    if f.get("message"):
        parts.append(f"/{f['message']}/")
    if f.get("ratio"):
        parts.append(f"ratio {f['ratio'][0]:g}..{f['ratio'][1]:g}")
    if f.get("at"):
        parts.append(f"at {f['at']}")
    if f.get("when"):
        parts.append(f"when {f['when']}")
    return " ".join(parts) + (" (also)" if f.get("also") else "")


def _ledger(record: dict[str, Any]) -> str:
    """The known-defects ledger (CONTRACTS §7): the file, and per entry what it claims (upstream
    reference, §6 row, its signature, cell filter) and what it did in this run."""
    led = record.get("ledger")
    if not led:
        return ""
    judged = led.get("judged_stale", True)
    facts = [("file", led.get("path")), ("package", led.get("package")), ("versions", led.get("versions")),
             ("entries", len(ledger_entries(record))),
             ("stale", len(stale_entries(record)) if judged else "not judged (a shard)")]
    meta = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts if v not in (None, ""))
    rows = []
    for e in ledger_entries(record):
        eid, stale = str(e.get("id")), bool(e.get("stale"))
        claims = "".join(f"<div>{_e(symptom_text(f))}</div>" for f in e.get("fails") or [])
        claims += f"<div><em>cells</em> {_e(e.get('cells'))}</div>"
        # the cells that say most: where it makes cells known, else where it reproduced, else
        # (a stale entry) the cells it selects, where it should have reproduced
        label, ids = next(((k, e[key]) for k, key in (("known", "known_cells"), ("reproduced in", "reproduced"),
                                                     ("selects", "selected")) if e.get(key)), ("", []))
        cells = f'<span class="muted">{label}:</span> {_cell_links(ids)}' if ids else ""
        show = (f' <button data-entry="{_e(eid)}" title="show only the cells this entry makes known">show in grid</button>'
                if e.get("known_cells") else "")
        rows.append(
            f'<tr id="ledger-{_e(eid)}"{" class=stale" if stale else ""}><td><b class="mono">{_e(eid)}</b>'
            f'<div class="ltitle">{_e(e.get("title"))}</div></td><td>{_e(e.get("upstream"))}</td>'
            f'<td>{_e(e.get("kind"))}</td><td>{_e(e.get("row"))}</td>'
            f'<td{" class=t-fail" if stale else ""}>{_e(entry_state(e, judged))}'
            + (f'<div class="muted">{_e(stale_line(e, record))}</div>' if stale else "")
            + f'</td><td class="mono lclaims">{claims}</td><td class="idcell">{cells or "—"}{show}</td></tr>')
    table = ('<table class="plain ledger"><tr><th>entry</th><th>upstream</th><th>kind</th><th title="the row of docs/contracts.md §6 (what the upstream release does) this entry is">what upstream does</th><th>state</th>'
             f'<th>explains</th><th>cells</th></tr>{"".join(rows)}</table>') if rows else '<p class="muted">no entries.</p>'
    return ('<section class="card" id="ledger"><h2>Known-defects ledger</h2><p class="muted" style="margin:0 0 8px">'
            'A cell whose failures are all explained by entries is <b>known defect</b> (it meets its expectation); '
            'an entry that selects cells but reproduces in none is <b>stale</b> and fails the run: a fix landed, '
            f'delete the entry.</p><dl class="meta">{meta}</dl>{table}</section>')


def _near_miss(cells: Iterable[dict[str, Any]]) -> str:
    """Histogram of worst_ratio (log buckets, stacked by status) and the top passing ratios."""
    buckets: list[dict[str, int]] = [{} for _ in RATIO_BUCKETS]
    no_ratio = 0
    for c in cells:
        r = c.get("worst_ratio")
        if r is None:
            no_ratio += 1
            continue
        k = ratio_key(r)
        for b, (_, lo, hi) in enumerate(RATIO_BUCKETS):
            if lo <= k < hi or (b == len(RATIO_BUCKETS) - 1 and k >= lo):
                buckets[b][c.get("status", "error")] = buckets[b].get(c.get("status", "error"), 0) + 1
                break
    peak = max([sum(b.values()) for b in buckets] + [1])
    bars = []
    for (label, _, _), b in zip(RATIO_BUCKETS, buckets):
        total = sum(b.values())
        segs = "".join(f'<i class="{_status_class(s)}" style="width:{100 * b[s] / peak:.3f}%" '
                       f'title="{_e(STATUS_LABELS.get(s, s))}: {b[s]:,}"></i>'
                       for s in list(STATUSES) + sorted(set(b) - set(STATUSES)) if b.get(s))
        over = " over" if label.startswith(">") else ""
        bars.append(f'<span class="lab{over}">{_e(label)}</span><span class="track">{segs}</span>'
                    f'<span class="cnt">{total:,}</span>')
    # nlargest is sorted(..., reverse=True)[:n] holding n cells, not every passing one
    passing = heapq.nlargest(TOP_NEAR_MISSES, (c for c in cells if c.get("status") == "pass"
                                               and c.get("worst_ratio") is not None),
                             key=lambda c: ratio_key(c["worst_ratio"]))
    rows = []
    for c in passing:
        wc = worst_check(c)
        w = min(100.0, 100.0 * min(ratio_key(c["worst_ratio"]), 1.0))
        rows.append(
            f'<tr><td class="num" style="white-space:nowrap">{_e(fmt_ratio(c["worst_ratio"]))} <span class="rbar" style="width:{w * 0.6:.1f}px"></span></td>'
            f'<td class="idcell"><a href="#{_e(c["id"])}">{_e(c["id"])}</a></td>'
            f'<td class="mono">{_e(f"{wc[0]} (rank {wc[1]})" if wc else "")}</td></tr>')
    top = ('<table class="plain" style="width:100%"><tr><th class="num">ratio</th><th>cell</th><th>worst check</th></tr>'
           + "".join(rows) + "</table>") if rows else '<p class="muted">no passing cell recorded a ratio.</p>'
    return (
        '<section class="card" id="near-miss"><h2>Near misses</h2><div class="nm"><div>'
        '<p class="muted" style="margin:0 0 8px">Worst error / tolerance-bound ratio per cell. '
        'A ratio above 1 fails; passing cells close to 1 are the ones a slightly worse backend would fail.</p>'
        f'<div class="bars">{"".join(bars)}</div>'
        f'<p class="muted" style="font-size:12px">{no_ratio:,} cells recorded no ratio (errors, skips, '
        'expected-error cells).</p></div>'
        f'<div><h2 style="font-size:13px;margin:0 0 4px">Top {TOP_NEAR_MISSES} passing cells by ratio</h2>{top}</div></div></section>')


_DIGITS = re.compile(r"(?<![A-Za-z_])[-+]?\d[\d.e+\-]*")


def failure_signature(text: str | None) -> str:
    """``first_failure`` with numbers replaced by ``#``: groups failures that differ only in values."""
    return _DIGITS.sub("#", (text or "(no message)").strip())[:240]


def _signatures(cells: Iterable[dict[str, Any]], limit: int = 12) -> str:
    groups: dict[str, list[Any]] = {}  # signature -> [cells, the first one's id]
    for c in cells:
        if c.get("status") in BAD_STATUSES:
            g = groups.setdefault(f'{c.get("status")}: {failure_signature(c.get("first_failure"))}', [0, c["id"]])
            g[0] += 1
    if not groups:
        return ""
    rows = "".join(
        f'<tr><td class="num">{n:,}</td><td class="mono" style="overflow-wrap:anywhere">{_e(sig)}</td>'
        f'<td class="idcell"><a href="#{_e(first)}">{_e(first)}</a></td></tr>'
        for sig, (n, first) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:limit])
    extra = f'<p class="muted">… and {len(groups) - limit} more signatures.</p>' if len(groups) > limit else ""
    return ('<section class="card" id="signatures"><h2>Failure signatures</h2>'
            '<table class="plain" style="width:100%"><tr><th class="num">cells</th><th>first failure (numbers as #)</th>'
            f'<th>example cell</th></tr>{rows}</table>{extra}</section>')


def _not_taken(record: dict[str, Any], limit: int = 12) -> str:
    """The ``path_not_taken`` cells by the reason TE gave (they pass the gate, untested)."""
    groups = paths_not_taken(record)
    if not groups:
        return ""
    rows = "".join(
        f'<tr><td class="num">{len(ids):,}</td><td style="overflow-wrap:anywhere">{_e(reason)}</td>'
        f'<td class="idcell">{_cell_links(ids, 3)}</td></tr>' for reason, ids in groups[:limit])
    extra = f'<p class="muted">… and {len(groups) - limit} more reasons.</p>' if len(groups) > limit else ""
    return ('<section class="card" id="not-taken"><h2>Path not taken</h2><p class="muted" style="margin:0 0 8px">'
            'TE ran another execution path in these cells than their module value names: they say nothing about '
            'the named path and count toward no ledger entry (a review that requires one of their entries is '
            'red).</p><table class="plain" style="width:100%"><tr><th class="num">cells</th><th>the reason TE gave'
            f'</th><th>cells</th></tr>{rows}</table>{extra}</section>')


def _selftest(selftest: dict[str, Any]) -> str:
    mutants = selftest.get("mutants") or []
    score = selftest.get("score")
    rows = []
    for m in mutants:
        killed = bool(m.get("killed"))
        ids = m.get("killing_cells") or []
        links = ", ".join(f'<a href="#{_e(i)}">{_e(i)}</a>' for i in ids[:3])
        if len(ids) > 3:
            links += f' <span class="muted">and {len(ids) - 3:,} more</span>'
        rows.append(
            f'<tr><td class="mono">{_e(m.get("name"))}</td><td>{_e(m.get("description"))}</td>'
            f'<td class="{"t-pass" if killed else "t-fail"}" style="font-weight:700">{"killed" if killed else "SURVIVED"}</td>'
            f'<td class="num">{len(ids):,}</td><td class="idcell">{links}</td><td class="mono">{_e(m.get("first_check"))}</td></tr>')
    score_txt = f"{100 * float(score):.1f}%" if isinstance(score, (int, float)) else _e(score)
    fa = selftest.get("false_alarms")
    return (
        '<section class="card" id="selftest"><h2>Self-test (mutants)</h2>'
        f'<p>score <b>{score_txt}</b> · {sum(1 for m in mutants if m.get("killed"))} of {len(mutants)} mutants killed'
        f' · false alarms on the clean backend: <b class="{"t-fail" if fa else "t-pass"}">{_e(fa)}</b></p>'
        '<table class="plain" style="width:100%"><tr><th>mutant</th><th>fault</th><th>verdict</th>'
        f'<th class="num">killing cells</th><th>examples</th><th>first failing check</th></tr>{"".join(rows)}</table>'
        f'{_sensitivity(selftest.get("sensitivity") or [])}</section>')


def _sensitivity(rows: list[dict[str, Any]]) -> str:
    """The measured detection threshold (``harness.orchestration.sensitivity``): one row per recipe, dtype
    and kind (a record written before the recipe column: ``none``)."""
    if not rows:
        return ""

    def k(value: Any, missing: str) -> str:
        return f"{value:g}" if isinstance(value, (int, float)) else missing

    def _ratio(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, (int, float)) else "-"

    body = "".join(
        f'<tr><td class="mono">{_e(r.get("recipe") or "none")}</td>'
        f'<td class="mono">{_e(r.get("dtype"))}</td><td class="mono">{_e(r.get("kind"))}</td>'
        f'<td class="num {"" if r.get("smallest_caught") else "t-fail"}">{k(r.get("smallest_caught"), "never")}</td>'
        f'<td class="num">{k(r.get("largest_missed"), "-")}</td>'
        f'<td class="num">{_ratio(r.get("worst_clean_ratio"))}</td>'
        f'<td class="idcell">{_e(r.get("catching_cell") or "")}</td></tr>' for r in rows)
    return ('<h3>Sensitivity: the smallest relative error k·u caught per tensor kind</h3>'
            '<table class="plain" style="width:100%"><tr><th>recipe</th><th>dtype</th><th>tensor kind</th>'
            '<th class="num">smallest k caught</th><th class="num">largest k missed</th>'
            f'<th class="num">worst clean ratio</th><th>caught first in</th></tr>{body}</table>')


DEFAULT_ROWS: tuple[str, ...] = ("module", "weight", "hooks", "fused")
DEFAULT_COLS: tuple[str, ...] = ("dtype", "world_size")


def render_html(record: dict[str, Any], *, rows: Sequence[str] = DEFAULT_ROWS,
                cols: Sequence[str] = DEFAULT_COLS, selftest: dict[str, Any] | None = None,
                budget: int = 8_000_000) -> str:
    """Render ``record`` (the parsed ``results.json``) as one self-contained HTML page (the
    pieces of :func:`html_pieces`, joined)."""
    return "".join(html_pieces(record, rows=rows, cols=cols, selftest=selftest, budget=budget))


def html_pieces(record: dict[str, Any], *, rows: Sequence[str] = DEFAULT_ROWS,
                cols: Sequence[str] = DEFAULT_COLS, selftest: dict[str, Any] | None = None,
                budget: int = 8_000_000) -> Iterator[str]:
    """The text of the self-contained HTML page of ``record`` (the parsed ``results.json``), in
    pieces: ``report.html`` is written a piece at a time, so the summary blob of a record of
    hundreds of thousands of cells goes from its file to the page without being held whole.

    Args:
        record: ``RunRecord.serialize()`` output.
        rows: axes whose value combinations make the grid rows (the page can regroup later).
        cols: axes whose value combinations make the grid columns.
        selftest: optional mutation-test summary, rendered as a table.
        budget: size target in bytes for the embedded data (both blobs); passing and skipped
            cells lose per-check detail (see ``_pack.py``) only when the full detail would not fit.

    Raises:
        ValueError: when ``rows``/``cols`` (given explicitly) name an axis no cell has, or when
            one axis is in both. The defaults silently skip axes a record lacks.
    """
    cells = record.get("cells") or []
    known = {a for c in cells for a in (c.get("axes") or {})}
    if rows is DEFAULT_ROWS:
        rows = tuple(a for a in rows if a in known)
    if cols is DEFAULT_COLS:
        cols = tuple(a for a in cols if a in known)
    for name, axes in (("rows", rows), ("cols", cols)):
        unknown = [a for a in axes if a not in known]
        if cells and unknown:
            raise ValueError(f"Unknown axis in {name}={tuple(axes)!r}: {unknown!r} (axes: {sorted(known)!r})")
    if set(rows) & set(cols):
        raise ValueError(f"Cannot have an axis both in rows={tuple(rows)!r} and cols={tuple(cols)!r}")
    counts = counts_of(record)
    top, run_card = _header(record, counts)
    summary, detail, level = pack(record, budget=budget,  # detail: already encoded, from disk
                                  extra=lambda: {"layout": {"rows": list(rows), "cols": list(cols)}})
    try:  # the summary's file is closed however the page ends
        v = verdict(record)
        legend = "".join(f'<span><i class="{_status_class(s)}"></i>{_e(STATUS_LABELS[s])}</span>' for s in STATUSES)
        legend += '<span><i style="background:var(--pass);box-shadow:inset 0 0 0 2px #f0b72f"></i>pass, ratio ≥ 0.5</span>'
        thin_note = ("" if level == "full" else
                     f'<p class="muted" style="font-size:12px;margin:6px 0 0">Large run: per-check detail of cells that met '
                     f'their expectation is thinned (level <code>{_e(level)}</code>); results.json has all of it.</p>')
        yield from [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>dw-harness {v} · {sum(counts.values()):,} cells · {_e(record.get('backend'))}</title>"
            f"<style>{_assets.css()}</style></head><body>",
            top, "<main>", review_html(record), run_card,
            '<section class="card" id="matrix"><h2>Matrix</h2><div class="filters" id="filters"></div>'
            f'<div class="legend">{legend}<span>· chip text = worst error/bound ratio · click a chip for details</span></div>'
            f'{thin_note}<div class="gridwrap" style="margin-top:10px"><table class="grid" id="grid">'
            '<tbody><tr><td>building the grid… (needs JavaScript)</td></tr></tbody></table></div></section>',
            _signatures(cells),
            _not_taken(record),
            _ledger(record),
            _near_miss(cells),
            _selftest(selftest) if selftest else "",
            f'<p class="foot">dw-harness · schema {_e(record.get("schema"))} · rendered from results.json</p></main>',
            '<aside id="detail" hidden></aside>',
            f'<script type="{SCRIPT_TYPE}" id="dw-data">']
        yield from summary.encoded()
        yield "</script>"
        yield f"<script>{_assets.js()}</script>"
        # after the program: the grid is built (and painted) while the parser is still here
        yield f'<script type="{SCRIPT_TYPE}" id="dw-detail">{detail}</script></body></html>'
    finally:
        summary.close()
