"""Pack a run record into the two compact JSON blobs the HTML report embeds.

Why a packed form: the ``full`` preset has 21,600 cells x up to 4 ranks x ~30 checks; the
record as written is tens of MB, and a report that big is slow to open and awkward to attach
to CI. Time to first render is what the reader feels, so the page carries two blobs:

``summary`` (``<script id="dw-data">``, decoded at once; everything the grid and the filters
need), columnar:

* ``id``: the cell ids; ``st``: per cell, an index into ``statuses``;
* ``vocab``: the status vocabulary (``harness.vocabulary.status.vocabulary()``: label, glyph, good,
  bad, severity of each status), so the page never restates it;
* ``ax``: per cell and axis (flat, ``len(axes)`` per cell), an index into that axis' values
  in ``axes`` (``-1`` when the cell lacks the axis);
* ``r``: the worst error/bound ratio per cell (4 significant digits; ``null`` when none;
  NaN/inf as the strings ``"nan"``/``"inf"``; a failing ratio is never rounded down to 1);
* ``ff``: ``{cell index: S index}`` of the first-failure lines (sparse);
* ``rp`` / ``rpx``: the repro template most cells share and ``{cell index: S index}`` for
  the others; a template holds ``\\u0001`` where the cell id goes.
* ``le``: the ledger's entries (CONTRACTS §7) as ``[id, upstream, title, stale]`` (``[]``
  without a ledger); ``kn``: ``{cell index: [raw status, entry index, ...]}`` for the
  ``known`` cells (sparse): the backend's own verdict and the entries that explain it.

``detail`` (``<script id="dw-detail">``, decoded only when a cell is first opened, or when
the page is idle): its own string table ``S`` (check names, messages, tracebacks, error types,
rank statuses) and, per cell, ``[duration_s, expects_error, example, ranks, level, dropped,
checks, path]`` with trailing empties dropped:

* ``ranks`` is a list of ``[rank, status, error, checks]`` (``error`` is ``0`` or
  ``[type, message, traceback, phase]``, all S indices, trailing empties dropped; ``phase``
  is the backend phase that raised), or, for a thinned cell whose ranks all
  share the cell's status and raised nothing, just the number of ranks;
* a check is ``[name, 0, ok, ratio, max_abs, max_rel, bound_at_worst, numel, mismatched,
  index, message]`` for tensors and ``[name, kind, ok, expected, actual, message]`` for the
  other kinds (``actual`` dropped when ok and equal to ``expected``); numbers keep 4
  significant digits;
* fail/error/timeout/xfail cells always keep every rank and check (``level`` absent). Passing
  and skipped cells are *thinned* only when both blobs together would exceed ``budget``
  bytes, in steps (``level`` indexes ``LEVELS``): ``fold`` (each check once, at the rank
  where it is worst), ``top8``/``top3`` (the few worst checks, and how many were dropped),
  ``none``. A thinned cell's kept checks are the flat ``checks`` list of ``[rank, *check]``.
  ``results.json`` remains the full truth;
* ``path`` is the cell's path evidence, ``[S index]`` of its compact JSON ``{"rank", "choice",
  "kernels"}``: TE's recorded choice (``harness.cell.te_path``) and the kernels the backend says
  TE called, from the rank that took another path than the cell names, else the first rank
  that has any (identical evidence of many cells is one string); absent when none.

Both blobs are embedded with a standard codec: the compact JSON, gzip-compressed, in base64
(:func:`encode`); the page decodes them with the browser's ``DecompressionStream("gzip")``.
Base64 text cannot close a ``<script>`` element, whatever a traceback contains.

:func:`decode` and :func:`unpack` are the reference decoder (the tests use them; the page's
JavaScript mirrors them).
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
import tempfile
import zlib
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

from harness.vocabulary.status import vocabulary

from ._common import STATUSES

KINDS: tuple[str, ...] = ("tensor", "count", "flag", "dtype", "exception", "twin", "shape", "scale")
#: thinning levels for cells that met their expectation, least lossy first.
LEVELS: tuple[str, ...] = ("full", "fold", "top8", "top3", "none")
#: statuses whose per-check detail may be thinned; everything else is kept whole.
THINNABLE: tuple[str, ...] = ("pass", "skipped")
TRACEBACK_LIMIT = 24_000  # characters kept per traceback (head and tail)
ID_MARK = "\u0001"  # stands for the cell id inside an interned repro template
#: the ``type`` of the ``<script>`` elements holding the encoded blobs
SCRIPT_TYPE = "application/gzip;base64"
_SAMPLE = 256
#: characters of a blob's JSON text compressed at a time
_BLOB_CHUNK = 1 << 20
_INF = math.inf


def num(x: Any) -> Any:
    """A JSON-safe number with 4 significant digits; non-finite floats become strings."""
    if x.__class__ is not float:
        return x
    if x != x:
        return "nan"
    if x in (_INF, -_INF):
        return "inf" if x > 0 else "-inf"
    return float("%.4g" % x)


def _ratio(x: Any) -> Any:
    """``num(x)``, except that a ratio above 1 (a failure) is never rounded down to 1."""
    r = num(x)
    if r.__class__ is float and r <= 1.0 < x:
        return x
    return r


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
    """A string table: ``add(s)`` returns a stable index, ``None`` stays ``None``."""

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

    def copy(self) -> "_Strings":
        new = _Strings()
        new.index, new.table = dict(self.index), list(self.table)
        return new


# ----------------------------------------------------------------------------- summary


def _axis_key(v: Any) -> Any:
    if v is None or v.__class__ in (str, int, float, bool):
        return (v.__class__, v)  # the class keeps True apart from 1
    return json.dumps(v, sort_keys=True, default=str)


def _axes_index(cells: Iterable[dict[str, Any]]) -> tuple[list[list[Any]], dict[str, dict[Any, int]]]:
    """``[[axis, [values...]], ...]`` (the summary's ``axes``) and, per axis, the index of each
    value's key (``_axis_key``) in it.

    Values keep matrix order, except numeric axes, which are sorted ascending.
    """
    names: list[str] = []
    values: dict[str, dict[Any, Any]] = {}
    for c in cells:
        for a, v in (c.get("axes") or {}).items():
            vals = values.get(a)
            if vals is None:
                names.append(a)
                vals = values[a] = {}
            k = _axis_key(v)
            if k not in vals:
                vals[k] = v
    index: dict[str, dict[Any, int]] = {}
    table: list[list[Any]] = []
    for a in names:
        keys = list(values[a])
        if all(isinstance(values[a][k], (int, float)) and not isinstance(values[a][k], bool) for k in keys):
            keys.sort(key=lambda k: values[a][k])
        index[a] = {k: i for i, k in enumerate(keys)}
        table.append([a, [_jsonable(values[a][k]) for k in keys]])
    return table, index


def _axis_indices(c: dict[str, Any], names: list[str], index: dict[str, dict[Any, int]]) -> list[int]:
    """A cell's part of the summary's flat ``ax``: per axis, its value's index (-1: absent)."""
    ax = c.get("axes") or {}
    return [index[a][_axis_key(ax[a])] if a in ax else -1 for a in names]


def _ledger_rows(cells: Iterable[dict[str, Any]], entries: list[dict[str, Any]]) -> list[list[Any]]:
    """``le`` of the summary: the ledger's entries, then each id a ``known`` cell names but the
    ledger lacks (in the order the cells name them)."""
    le = [[str(e.get("id")), e.get("upstream"), e.get("title"), bool(e.get("stale"))] for e in entries]
    have = {e[0] for e in le}
    for c in cells:
        if c.get("status") != "known":
            continue
        for eid in c.get("known") or []:
            if str(eid) not in have:
                have.add(str(eid))
                le.append([str(eid), None, None, False])
    return le


def _dumps(x: Any) -> str:
    """Compact JSON text, as :func:`encode` writes it."""
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class _Blob:
    """A JSON object written a piece at a time to an unnamed file: the text ``encode`` would
    compress, and the size ``_size`` gives, without the object ever being held. Why: the
    summary has a column per cell (ids, statuses, axes, ratios), and a record of hundreds of
    thousands of cells would hold them all, several times over, to write one page."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n")
        self._ascii = 0
        self._keys = 0

    def _put(self, text: str) -> None:
        self._file.write(text)
        self._ascii += _ascii_len(text)

    def _key(self, name: str) -> None:
        self._put(("," if self._keys else "{") + _dumps(name) + ":")
        self._keys += 1

    def value(self, name: str, value: Any) -> None:
        """``"name":value``."""
        self._key(name)
        self._put(_dumps(value))

    def items(self, name: str, values: Iterable[Any]) -> None:
        """``"name":[values]``, a value at a time."""
        self._key(name)
        self._put("[")
        for n, v in enumerate(values):
            self._put("," + _dumps(v) if n else _dumps(v))
        self._put("]")

    def pairs(self, name: str, pairs: Iterable[tuple[str, Any]]) -> None:
        """``"name":{key:value, ...}``, a pair at a time."""
        self._key(name)
        self._put("{")
        for n, (k, v) in enumerate(pairs):
            self._put(("," if n else "") + _dumps(k) + ":" + _dumps(v))
        self._put("}")

    def size(self) -> int:
        """``_size`` of the object (closed: ``}`` counted)."""
        return self._ascii + 1

    def encoded(self) -> Iterator[str]:
        """``encode`` of the object, in pieces (their concatenation is its text)."""
        self._file.write("}")
        self._file.seek(0)
        yield from _gzip_base64(iter(lambda: self._file.read(_BLOB_CHUNK), ""))
        self._file.close()

    def close(self) -> None:
        self._file.close()


def _summary(cells: Iterable[dict[str, Any]], statuses: list[str],
             entries: list[dict[str, Any]] | None = None,
             extra: Callable[[], dict[str, Any]] | None = None) -> _Blob:
    """The summary blob, written as the cells are read (two passes for what the columns need
    first: the axes' values, the repro templates, the ledger's rows; then the columns); its keys
    and bytes are those of the dict this module once built, ``extra()``'s keys last."""
    st_index = {s: i for i, s in enumerate(statuses)}
    le = _ledger_rows(cells, entries or [])
    pos = {e[0]: i for i, e in enumerate(le)}
    axes_table, index = _axes_index(cells)
    names = [a for a, _ in axes_table]
    S = _Strings()
    uses: Counter = Counter()
    for c in cells:
        uses[S.add(_template(c))] += 1
    common = uses.most_common(1)[0][0] if uses else None
    n = sum(uses.values())
    blob = _Blob()
    for key, value in (("v", 4), ("n", n), ("statuses", statuses), ("vocab", vocabulary()), ("axes", axes_table),
                       ("kinds", list(KINDS)), ("levels", list(LEVELS))):
        blob.value(key, value)
    blob.items("id", (str(c.get("id", "")) for c in cells))
    blob.items("st", (st_index[c.get("status", "error")] for c in cells))
    blob.items("ax", (i for c in cells for i in _axis_indices(c, names, index)))
    blob.items("r", (_ratio(c.get("worst_ratio")) for c in cells))
    blob.pairs("ff", ((str(i), S.add(c["first_failure"])) for i, c in enumerate(cells)
                      if c.get("first_failure") is not None))
    blob.value("rp", common)
    blob.pairs("rpx", ((str(i), t) for i, t in enumerate(S.add(_template(c)) for c in cells) if t != common))
    blob.value("le", le)
    blob.pairs("kn", ((str(i), [c.get("raw_status")] + [pos[str(eid)] for eid in c.get("known") or []])
                      for i, c in enumerate(cells) if c.get("status") == "known"))
    blob.value("S", S.table)
    for key, value in (extra() if extra else {}).items():
        blob.value(key, value)
    return blob


def _template(c: dict[str, Any]) -> str:
    """A cell's repro command with its id as ``ID_MARK``."""
    cid, repro = str(c.get("id", "")), str(c.get("repro") or "")
    return repro.replace(cid, ID_MARK) if cid else repro


# ----------------------------------------------------------------------------- detail


def _pack_check(c: dict[str, Any], S: _Strings) -> list[Any]:
    g = c.get
    kind = g("kind", "tensor")
    if kind == "tensor":
        return _trim([S.add(g("name", "?")), 0, 1 if g("ok") else 0, _ratio(g("ratio")), num(g("max_abs")),
                      num(g("max_rel")), num(g("bound_at_worst")), g("numel"), g("mismatched") or None,
                      g("index"), S.add(g("message"))])
    k = KINDS.index(kind) if kind in KINDS else kind  # an unknown kind travels as its name
    ok = 1 if g("ok") else 0
    exp, act, msg = _jsonable(g("expected")), _jsonable(g("actual")), S.add(g("message"))
    if ok and exp == act and msg is None:
        return _trim([S.add(g("name", "?")), k, ok, exp])
    return [S.add(g("name", "?")), k, ok, exp, act, msg]


def _pack_error(err: dict[str, Any] | None, S: _Strings) -> Any:
    if not err:
        return 0
    tb = err.get("traceback")
    return _trim([S.add(err.get("type", "Exception")), S.add(err.get("message", "")),
                  S.add(_clip_traceback(tb) if tb else None), S.add(err.get("phase"))])


def _ranks_full(cell: dict[str, Any], S: _Strings) -> list[Any]:
    return [[r.get("rank", i), S.add(r.get("status", "")), _pack_error(r.get("error"), S),
             [_pack_check(c, S) for c in r.get("comparisons") or []]]
            for i, r in enumerate(cell.get("ranks") or [])]


def _folded(cell: dict[str, Any]) -> tuple[list[tuple[tuple[int, float], int, dict[str, Any]]], int]:
    """Each check name once, taken from the rank where it is worst; returns ([(badness, rank,
    check)], total number of checks). Badness: (failed?, ratio) with None lowest, NaN highest."""
    worst: dict[str, tuple[tuple[int, float], int, dict[str, Any]]] = {}
    total = 0
    for i, r in enumerate(cell.get("ranks") or ()):
        rank = r.get("rank", i)
        comps = r.get("comparisons") or ()
        total += len(comps)
        for c in comps:
            x = c.get("ratio")
            if x is None:
                x = -1.0
            elif x.__class__ is not float:
                try:
                    x = float(x)
                except (TypeError, ValueError):
                    x = _INF
            if x != x:
                x = _INF
            key = (0 if c.get("ok", True) else 1, x)
            name = c.get("name", "?")
            cur = worst.get(name)
            if cur is None or key > cur[0]:
                worst[name] = (key, rank, c)
    return list(worst.values()), total


def _slow_key(x: Any) -> float:
    if x is None:
        return -1.0
    try:
        x = float(x)
    except (TypeError, ValueError):
        return _INF
    return _INF if x != x else x


def _top(cell: dict[str, Any], keep: int) -> tuple[list[tuple[Any, int, dict[str, Any]]], int]:
    """The ``keep`` worst checks, each name once (what ``_folded`` then a top-``keep`` cut
    gives), without folding every check: one C-level sort of (failed?, ratio, -order) keys."""
    entries: list[tuple[int, float, int, int, dict[str, Any]]] = []
    total = 0
    for i, r in enumerate(cell.get("ranks") or ()):
        rank = r.get("rank", i)
        comps = r.get("comparisons") or ()
        base = -total
        total += len(comps)
        entries += [(0 if c.get("ok", True) else 1,
                     x if x.__class__ is float and x == x else _slow_key(x), base - n, rank, c)
                    for n, c in enumerate(comps) for x in (c.get("ratio"),)]
    entries.sort(reverse=True)  # the third item is unique: the checks themselves are never compared
    out, seen = [], set()
    for bad, ratio, _, rank, c in entries:
        name = c.get("name", "?")
        if name not in seen:
            seen.add(name)
            out.append(((bad, ratio), rank, c))
            if len(out) == keep:
                break
    return out, total


def _detail_thinned(cell: dict[str, Any], level: str, S: _Strings) -> list[Any]:
    if level.startswith("top"):
        checks, total = _top(cell, int(level[3:]))
    elif level == "none":
        checks, total = [], sum(len(r.get("comparisons") or ()) for r in cell.get("ranks") or ())
    else:
        checks, total = _folded(cell)
    status = cell.get("status", "")
    ranks_in = cell.get("ranks") or []
    if all(r.get("status", "") == status and not r.get("error") and r.get("rank", i) == i
           for i, r in enumerate(ranks_in)):
        ranks: Any = len(ranks_in)
    else:
        ranks = [[r.get("rank", i), S.add(r.get("status", "")), _pack_error(r.get("error"), S), []]
                 for i, r in enumerate(ranks_in)]
    checks.sort(key=lambda kc: kc[1])  # by rank; stable, so each rank keeps its order
    flat = [[rank] + _pack_check(c, S) for _, rank, c in checks]
    return [ranks, LEVELS.index(level), total - len(checks), flat]


def _path_evidence(cell: dict[str, Any], S: _Strings) -> list[int] | None:
    """The cell's path evidence as ``[S index]`` (see the module docstring; a list, so that
    index 0 is not trimmed as empty), None without any."""
    ranks = [r for r in cell.get("ranks") or [] if r.get("choice") or r.get("path")]
    if not ranks:
        return None
    r = next((r for r in ranks if (r.get("choice") or {}).get("reason")), ranks[0])
    pe = {"rank": r.get("rank", 0), "choice": r.get("choice"), "kernels": r.get("path")}
    return [S.add(json.dumps(_jsonable(pe), sort_keys=True, separators=(",", ":")))]


def _detail_cell(cell: dict[str, Any], level: str | None, S: _Strings) -> list[Any]:
    ex = cell.get("example")
    head = [num(float(cell.get("duration_s") or 0.0)), 1 if cell.get("expect") == "error" else 0,
            _jsonable(ex) if ex else 0]
    pe = _path_evidence(cell, S)
    if level is None or level == "full":
        ranks = _ranks_full(cell, S) if cell.get("ranks") else 0
        return _trim_zeros(head + [ranks, 0, 0, 0, pe])
    return _trim_zeros(head + _detail_thinned(cell, level, S) + [pe])


def _trim_zeros(a: list[Any]) -> list[Any]:
    """Drop trailing ``None``/``0``/empty lists (the decoder reads a missing entry as empty)."""
    while a and (a[-1] is None or a[-1] == [] or (a[-1].__class__ is int and a[-1] == 0)):
        a.pop()
    return a


def encode(data: Any) -> str:
    """Compact JSON, gzip-compressed, in base64: the text of a ``<script type=SCRIPT_TYPE>``."""
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    # zlib's gzip stream, as the blobs written in pieces (``_Blob``, ``_encode_detail``): the same
    # header on every Python (gzip.compress's OS byte differs between versions)
    return base64.b64encode(zlib.compress(raw, 6, wbits=31)).decode("ascii")


def decode(text: str) -> Any:
    """The inverse of :func:`encode` (what the page's JavaScript does)."""
    return json.loads(gzip.decompress(base64.b64decode(text)).decode("utf-8"))


def _size(x: Any) -> int:
    return len(json.dumps(x, separators=(",", ":"), ensure_ascii=True, allow_nan=False))


def _ascii_len(text: str) -> int:
    """``len`` of ``text``'s JSON with ``ensure_ascii`` (``_size``), from its JSON without it."""
    if text.isascii() and "\x7f" not in text:
        return len(text)
    # DEL is ASCII, but ``ensure_ascii`` escapes it too (``\u007f``)
    return len(text) + sum(5 if ord(ch) < 0x10000 else 11 for ch in text if ord(ch) >= 0x7F)


class _Details:
    """The detail blob's per-cell entries in order, as JSON text on disk, and the size the blob's
    list of them takes (``_size``): a record of a few hundred thousand cells packs its detail
    without holding it (what ``encode`` of the whole would write, a piece at a time)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n")
        self.n = 0
        self._ascii = 0

    def add(self, packed: list[Any]) -> None:
        self.add_text(json.dumps(packed, separators=(",", ":"), ensure_ascii=False, allow_nan=False))

    def add_text(self, text: str) -> None:
        self._file.write(text + "\n")  # JSON text holds no raw newline
        self.n += 1
        self._ascii += _ascii_len(text)

    def size(self) -> int:
        """``_size`` of the list of the entries."""
        return 2 + self._ascii + max(self.n - 1, 0)

    def texts(self) -> Iterator[str]:
        self._file.seek(0)
        for _ in range(self.n):
            yield self._file.readline()[:-1]

    def close(self) -> None:
        self._file.close()


def _gzip_base64(texts: Iterable[str]) -> Iterator[str]:
    """``encode``'s text of the concatenation of ``texts``, in pieces: compressed as they come,
    in base64 a whole number of 3-byte groups at a time (so the pieces join up)."""
    zipper = zlib.compressobj(6, zlib.DEFLATED, 31)  # encode's stream, fed in pieces
    held = b""
    for text in texts:
        held += zipper.compress(text.encode("utf-8"))
        cut = len(held) - len(held) % 3
        if cut:
            yield base64.b64encode(held[:cut]).decode("ascii")
            held = held[cut:]
    yield base64.b64encode(held + zipper.flush()).decode("ascii")


def _encode_detail(strings: list[str], cells: _Details) -> str:
    """``encode({"S": strings, "c": [the cells]})``, the cells' JSON read from disk as it is compressed."""
    head = '{"S":' + json.dumps(strings, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + ',"c":['
    body = ("," + text if n else text for n, text in enumerate(cells.texts()))
    return "".join(_gzip_base64(itertools.chain([head], body, ["]}"])))


def pack(record: dict[str, Any], *, budget: int = 8_000_000,
         extra: Callable[[], dict[str, Any]] | None = None) -> tuple[_Blob, str, str]:
    """Pack ``record``; returns (the summary blob, on disk until its ``encoded()`` pieces are
    read, the detail blob already encoded (``encode``'s text), thinning level of
    passing/skipped cells).

    Args:
        record: the parsed ``results.json``; its ``cells`` are only iterated (a few passes), so
            they may be a stream (``harness.records.stored.StoredCells``); each cell's detail
            goes to disk as it is packed (``_Details``).
        budget: target size in bytes of both serialized blobs together; thinning stops at the
            first level that fits (``none`` may still exceed it for huge records).
        extra: optional callable returning more top-level keys for the summary.
    """
    cells = record.get("cells") or []
    statuses = list(STATUSES) + sorted({c.get("status", "error") for c in cells} - set(STATUSES))
    summary = _summary(cells, statuses, list((record.get("ledger") or {}).get("entries") or []), extra)
    try:
        return (summary, *_pack_detail(cells, budget - summary.size()))
    except BaseException:
        summary.close()
        raise


def _pack_detail(cells: Iterable[dict[str, Any]], room: int) -> tuple[str, str]:
    """The detail blob, encoded, and its thinning level: the least lossy level whose blob takes
    at most ``room`` bytes (``none`` whatever it takes)."""
    thin = [c.get("status") in THINNABLE for c in cells]
    n_thin = sum(thin)
    # the cells that are never thinned, once; their strings seed the detail string table
    S0 = _Strings()
    kept = _Details()
    for i, c in enumerate(cells):
        if not thin[i]:
            kept.add(_detail_cell(c, None, S0))
    li = 0
    if n_thin:
        n_checks = sum(len(r.get("comparisons") or ()) for c, t in zip(cells, thin) if t for r in c.get("ranks") or ())
        if 90 * n_checks + 60 * n_thin > room:  # may not fit: estimate from a sample
            fixed = kept.size() + _size(S0.table)
            idx = [i for i, t in enumerate(thin) if t]
            sample = set(idx[::max(1, len(idx) // _SAMPLE)][:_SAMPLE])
            drawn = [c for i, c in enumerate(cells) if i in sample]  # one pass: cells may be a stream
            for li, level in enumerate(LEVELS):
                Sx = _Strings()
                per = _size([_detail_cell(c, level, Sx) for c in drawn]) / len(drawn)
                if fixed + per * n_thin + _size(Sx.table) <= room:
                    break
    try:
        while True:
            level = LEVELS[li]
            S = S0.copy()
            per_cell = _Details()
            whole = kept.texts()
            for i, c in enumerate(cells):
                if thin[i]:
                    per_cell.add(_detail_cell(c, level, S))
                else:
                    per_cell.add_text(next(whole))
            # _size({"S": S.table, "c": per_cell})
            size = len('{"S":,"c":}') + _size(S.table) + per_cell.size()
            if li == len(LEVELS) - 1 or size <= room:
                try:
                    return _encode_detail(S.table, per_cell), level
                finally:
                    per_cell.close()
            per_cell.close()
            li += 1
    finally:
        kept.close()


# ----------------------------------------------------------------------------- decoder


def _unpack_check(a: list[Any], S: list[str], kinds: list[str]) -> dict[str, Any]:
    kind = kinds[a[1]] if isinstance(a[1], int) else a[1]
    a = list(a)
    if kind == "tensor":
        a += [None] * (11 - len(a))
        return {"name": S[a[0]], "kind": kind, "ok": bool(a[2]), "ratio": a[3], "max_abs": a[4], "max_rel": a[5],
                "bound_at_worst": a[6], "numel": a[7], "mismatched": a[8] or 0, "index": a[9],
                "message": None if a[10] is None else S[a[10]]}
    exp = a[3] if len(a) > 3 else None
    return {"name": S[a[0]], "kind": kind, "ok": bool(a[2]), "expected": exp,
            "actual": a[4] if len(a) > 4 else exp, "message": S[a[5]] if len(a) > 5 and a[5] is not None else None}


def _unpack_error(e: list[Any], S: list[str]) -> dict[str, Any]:
    e = list(e) + [None] * (4 - len(e))
    out = {"type": S[e[0]], "message": S[e[1]], "traceback": None if e[2] is None else S[e[2]]}
    if e[3] is not None:
        out["phase"] = S[e[3]]
    return out


def unpack(summary: dict[str, Any], detail: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Decode the blobs back into one dict per cell (the reference for the page's JavaScript).

    Keys: id, status, axes, worst_ratio, first_failure, repro, known and raw_status (the
    explaining entry ids and the backend's verdict of a ``known`` cell, else None); with ``detail`` also
    duration_s, expects_error, example, level (None when kept whole), dropped, ranks
    (``[{rank, status, error, checks}]``, thinned cells' kept checks under their rank), path
    (``{rank, choice, kernels}`` or None).
    """
    S = summary["S"]
    axes = summary["axes"]
    out = []
    for i in range(summary["n"]):
        cid = summary["id"][i]
        ax = {}
        for p, (name, values) in enumerate(axes):
            j = summary["ax"][i * len(axes) + p]
            if j >= 0:
                ax[name] = values[j]
        tpl = summary["rpx"].get(str(i), summary["rp"])
        ff = summary["ff"].get(str(i))
        kn = summary.get("kn", {}).get(str(i))
        cell = {"id": cid, "status": summary["statuses"][summary["st"][i]], "axes": ax,
                "worst_ratio": summary["r"][i], "first_failure": None if ff is None else S[ff],
                "repro": "" if tpl is None else S[tpl].replace(ID_MARK, cid),
                "known": None if kn is None else [summary["le"][j][0] for j in kn[1:]],
                "raw_status": None if kn is None else kn[0]}
        if detail is not None:
            DS, kinds = detail["S"], summary["kinds"]
            d = list(detail["c"][i]) + [None] * 8
            ranks_raw, level = d[3] or [], d[4] or 0
            if isinstance(ranks_raw, int):
                ranks = [{"rank": r, "status": cell["status"], "error": None, "checks": []} for r in range(ranks_raw)]
            else:
                ranks = [{"rank": g[0], "status": DS[g[1]],
                          "error": None if not g[2] else _unpack_error(g[2], DS),
                          "checks": [_unpack_check(a, DS, kinds) for a in g[3]]} for g in ranks_raw]
            by_rank = {r["rank"]: r for r in ranks}
            for a in d[6] or []:
                by_rank[a[0]]["checks"].append(_unpack_check(a[1:], DS, kinds))
            cell.update({"duration_s": d[0] or 0, "expects_error": bool(d[1]), "example": d[2] or None,
                         "level": LEVELS[level] if level else None, "dropped": d[5] or 0, "ranks": ranks,
                         "path": None if not d[7] else json.loads(DS[d[7][0]])})
        out.append(cell)
    return out
