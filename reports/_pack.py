"""Pack a run record into the compact JSON the HTML report embeds.

Why a packed form: the ``full`` preset has 10k+ cells x 4 ranks x ~20 checks; the record as
written is tens of MB, and a report that big is slow to open and awkward to attach to CI.
The page therefore carries one JSON blob that the browser expands lazily:

* every repeated string (check names, messages, tracebacks, repro templates) lives once in a
  string table ``S`` and is referenced by index;
* axis values are indices into per-axis value lists;
* numbers keep 4 significant digits (NaN/inf become the strings ``"nan"``/``"inf"``);
* checks are arrays with a per-kind layout and trailing empties dropped:
  tensor ``[name, 0, ok, ratio, max_abs, max_rel, bound_at_worst, numel, mismatched, index,
  message]``; other kinds ``[name, kind, ok, expected, actual, message]`` where ``actual`` is
  dropped when ok and equal to ``expected``;
* fail/error/timeout/xfail cells always keep every rank and check. Passing and skipped cells
  are *thinned* only when the whole blob would exceed ``budget`` bytes, in steps: ``fold``
  (each check once, at the rank where it is worst), then ``top8``/``top3`` (the few worst
  checks, plus how many were dropped), then ``none``. The chosen level is recorded so the
  page can say so; ``results.json`` remains the full truth.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from ._common import STATUSES, ratio_key

KINDS: tuple[str, ...] = ("tensor", "count", "flag", "dtype", "exception")
#: thinning levels for cells that met their expectation, least lossy first.
LEVELS: tuple[str, ...] = ("full", "fold", "top8", "top3", "none")
TRACEBACK_LIMIT = 24_000  # characters kept per traceback (head and tail)
_ID_MARK = "\u0001"  # stands for the cell id inside an interned repro template


def num(x: Any) -> Any:
    """A JSON-safe number with 4 significant digits; non-finite floats become strings."""
    if x.__class__ is not float:
        return x
    if x != x:
        return "nan"
    if x in (math.inf, -math.inf):
        return "inf" if x > 0 else "-inf"
    return float("%.4g" % x)


def _jsonable(x: Any) -> Any:
    """``x`` with non-finite floats as strings (``JSON.parse`` rejects NaN); copies only if needed."""
    cls = x.__class__
    if cls is str or cls is int or cls is bool or x is None:
        return x
    if cls is float:
        return x if math.isfinite(x) else num(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _trim(a: list[Any]) -> list[Any]:
    while a and a[-1] is None:
        a.pop()
    return a


def _clip_traceback(tb: str) -> str:
    if len(tb) <= TRACEBACK_LIMIT:
        return tb
    half = TRACEBACK_LIMIT // 2
    return f"{tb[:half]}\n... [{len(tb) - TRACEBACK_LIMIT} characters clipped by the report] ...\n{tb[-half:]}"


class _Strings:
    """The string table: ``add(s)`` returns a stable index, ``None`` stays ``None``."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.table: list[str] = []

    def add(self, s: Any) -> int | None:
        if s is None:
            return None
        if s.__class__ is not str:
            s = str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def _pack_check(c: dict[str, Any], S: _Strings) -> list[Any]:
    g = c.get
    kind = g("kind", "tensor")
    if kind == "tensor":
        ratio = num(g("ratio"))
        if ratio.__class__ is float and ratio <= 1.0 < g("ratio"):  # never round a failure to 1
            ratio = g("ratio")
        return _trim([S.add(g("name", "?")), 0, 1 if g("ok") else 0, ratio, num(g("max_abs")),
                      num(g("max_rel")), num(g("bound_at_worst")), g("numel"), g("mismatched") or None,
                      g("index"), S.add(g("message"))])
    k = KINDS.index(kind) if kind in KINDS else S.add(kind)  # unknown kinds travel as strings
    ok = 1 if g("ok") else 0
    exp, act, msg = _jsonable(g("expected")), _jsonable(g("actual")), S.add(g("message"))
    if ok and exp == act and msg is None:
        return _trim([S.add(g("name", "?")), k, ok, exp])
    return [S.add(g("name", "?")), k, ok, exp, act, msg]


def _pack_error(err: dict[str, Any] | None, S: _Strings) -> Any:
    if not err:
        return 0
    tb = err.get("traceback")
    return [S.add(err.get("type", "Exception")), S.add(err.get("message", "")),
            S.add(_clip_traceback(tb) if tb else None)]


def _ranks_full(cell: dict[str, Any], S: _Strings) -> list[Any]:
    return [[r.get("rank", i), S.add(r.get("status", "")), _pack_error(r.get("error"), S),
             [_pack_check(c, S) for c in r.get("comparisons") or []]]
            for i, r in enumerate(cell.get("ranks") or [])]


def _check_badness(c: dict[str, Any]) -> tuple[int, float]:
    return (0 if c.get("ok", True) else 1, ratio_key(c.get("ratio")))


def _folded(cell: dict[str, Any]) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Each check name once, taken from the rank where it is worst; returns (checks, total)."""
    worst: dict[str, tuple[int, dict[str, Any]]] = {}
    total = 0
    for i, r in enumerate(cell.get("ranks") or []):
        for c in r.get("comparisons") or []:
            total += 1
            key = c.get("name", "?")
            cur = worst.get(key)
            if cur is None or _check_badness(c) > _check_badness(cur[1]):
                worst[key] = (r.get("rank", i), c)
    return list(worst.values()), total


def _ranks_thinned(cell: dict[str, Any], level: str, S: _Strings) -> tuple[list[Any], int]:
    """Rank groups for a thinned cell: ``[[rank, status, error, checks], ...]`` and #dropped."""
    checks, total = _folded(cell)
    if level.startswith("top"):
        keep = int(level[3:])
        checks = sorted(checks, key=lambda rc: _check_badness(rc[1]), reverse=True)[:keep]
    elif level == "none":
        checks = []
    by_rank: dict[int, list[Any]] = {}
    for rank, c in checks:
        by_rank.setdefault(rank, []).append(_pack_check(c, S))
    status = {r.get("rank", i): r.get("status", "") for i, r in enumerate(cell.get("ranks") or [])}
    errors = {r.get("rank", i): r.get("error") for i, r in enumerate(cell.get("ranks") or [])}
    groups = [[rank, S.add(status.get(rank, "")), _pack_error(errors.get(rank), S), cs]
              for rank, cs in sorted(by_rank.items())]
    # ranks that contributed no check still show their status (and any error)
    for rank in sorted(set(status) - set(by_rank)):
        groups.append([rank, S.add(status[rank]), _pack_error(errors.get(rank), S), []])
    groups.sort(key=lambda g: g[0])
    return groups, total - len(checks)


def _axis_key(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return (v.__class__.__name__, v)
    return json.dumps(v, sort_keys=True, default=str)


def _axes_table(cells: list[dict[str, Any]]) -> tuple[list[list[Any]], list[list[int]]]:
    """``[[axis, [values...]], ...]`` and, per cell, the index of its value on each axis (-1: absent).

    Values keep matrix order, except numeric axes, which are sorted ascending.
    """
    names: list[str] = []
    values: dict[str, dict[Any, Any]] = {}
    for c in cells:
        for a, v in (c.get("axes") or {}).items():
            if a not in values:
                names.append(a)
                values[a] = {}
            values[a].setdefault(_axis_key(v), v)
    index: dict[str, dict[Any, int]] = {}
    table: list[list[Any]] = []
    for a in names:
        keys = list(values[a])
        if all(isinstance(values[a][k], (int, float)) and not isinstance(values[a][k], bool) for k in keys):
            keys.sort(key=lambda k: values[a][k])
        index[a] = {k: i for i, k in enumerate(keys)}
        table.append([a, [_jsonable(values[a][k]) for k in keys]])
    rows = []
    for c in cells:
        ax = c.get("axes") or {}
        rows.append([index[a][_axis_key(ax[a])] if a in ax else -1 for a in names])
    return table, rows


def _pack_cell(c: dict[str, Any], axes: list[int], status_index: int, level: str | None,
               S: _Strings) -> list[Any]:
    """One cell: ``[id, status, axes, worst_ratio, duration_s, first_failure, repro, expects_error,
    ranks, thinning level, #checks dropped, example]`` (trailing empties dropped)."""
    cid = str(c.get("id", ""))
    repro = str(c.get("repro") or "")
    if level is None:
        ranks, dropped = _ranks_full(c, S), 0
    else:
        ranks, dropped = _ranks_thinned(c, level, S)
    ex = c.get("example")
    return _trim([
        cid, status_index, axes, num(c.get("worst_ratio")), num(float(c.get("duration_s") or 0.0)),
        S.add(c.get("first_failure")), S.add(repro.replace(cid, _ID_MARK) if cid else repro),
        1 if c.get("expect") == "error" else 0, ranks, level, dropped or None, _jsonable(ex) if ex else None,
    ])


#: statuses whose per-check detail may be thinned; everything else is kept whole.
THINNABLE: tuple[str, ...] = ("pass", "skipped")
_SAMPLE = 256


def _estimate_level(cells: list[dict[str, Any]], rows: list[list[int]], thinnable: list[int],
                    room: int) -> int:
    """Index into ``LEVELS`` of the least lossy level whose estimated size fits ``room`` bytes.

    Packs an evenly spaced sample of the thinnable cells at each level and scales up, so a
    10k-cell record is not packed once per level.
    """
    step = max(1, len(thinnable) // _SAMPLE)
    sample = thinnable[::step][:_SAMPLE]
    for li, level in enumerate(LEVELS):
        S = _Strings()
        packed = [_pack_cell(cells[i], rows[i], 0, None if level == "full" else level, S) for i in sample]
        per_cell = len(dump({"c": packed})) / len(sample)
        if per_cell * len(thinnable) + len(dump({"S": S.table})) <= room:
            return li
    return len(LEVELS) - 1


def pack(record: dict[str, Any], *, budget: int = 8_000_000,
         extra: Callable[[], dict[str, Any]] | None = None) -> tuple[dict[str, Any], str]:
    """Pack ``record``; returns (the packed dict, the thinning level used for passing/skipped cells).

    Args:
        record: the parsed ``results.json``.
        budget: target size in bytes of the serialized blob; thinning stops at the first level
            that fits (``none`` may still exceed it for huge records - ids alone are ~90 B/cell).
        extra: optional callable returning more top-level keys to embed.
    """
    cells = record.get("cells") or []
    statuses = list(STATUSES) + sorted({c.get("status", "error") for c in cells} - set(STATUSES))
    st_index = {s: i for i, s in enumerate(statuses)}
    axes_table, rows = _axes_table(cells)
    thinnable = [i for i, c in enumerate(cells) if c.get("status") in THINNABLE]
    thin_set = set(thinnable)

    def build(level: str) -> dict[str, Any]:
        S = _Strings()
        lvl = None if level == "full" else level
        packed = [_pack_cell(c, rows[i], st_index[c.get("status", "error")], lvl if i in thin_set else None, S)
                  for i, c in enumerate(cells)]
        data = {"statuses": statuses, "axes": axes_table, "kinds": list(KINDS), "S": S.table, "cells": packed}
        if extra:
            data.update(extra())
        return data

    li = 0
    # A cheap upper bound first (~90 B per check packed); only a record that may not fit pays
    # for the estimate: the kept cells are packed for their size, the thinnable ones sampled.
    n_checks = sum(len(r.get("comparisons") or ()) for c in cells for r in c.get("ranks") or ())
    if thinnable and 90 * n_checks + 600 * len(cells) > budget:
        S0 = _Strings()
        kept = [_pack_cell(c, rows[i], 0, None, S0) for i, c in enumerate(cells) if i not in thin_set]
        fixed = len(dump({"c": kept, "S": S0.table, "a": axes_table}))
        li = _estimate_level(cells, rows, thinnable, max(0, budget - fixed))
    while True:
        data = build(LEVELS[li])
        if li == len(LEVELS) - 1 or len(dump(data)) <= budget:
            return data, LEVELS[li]
        li += 1


def dump(data: dict[str, Any]) -> str:
    """Serialize for embedding inside ``<script type="application/json">``.

    ``</`` becomes ``<\\/`` (so ``</script>`` in a traceback cannot end the element) and
    ``<!--`` is escaped too (it would switch the HTML tokenizer into script-escape states).
    """
    s = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return s.replace("</", "<\\/").replace("<!--", "\\u003c!--")
