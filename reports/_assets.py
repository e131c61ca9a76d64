"""Inline CSS and JavaScript of the HTML report (kept apart from the Python that fills it).

The page must work from a file attachment with no network, so everything is inline: the
system font stack (no web fonts), CSS-only charts, and a small vanilla-JS program that builds
the matrix grid from the embedded JSON (see ``_pack.py`` for its layout) and renders a cell's
details only when it is opened.
"""

CSS = r"""
:root{
  --pass:#1f883d;--xfail:#0f7b8a;--fail:#cf222e;--error:#d4570b;--timeout:#8250df;--skipped:#8c959f;
  --bg:#f6f8fa;--panel:#fff;--ink:#1f2328;--muted:#656d76;--line:#d0d7de;--soft:#eaeef2;--accent:#0969da;
  --mono:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,"DejaVu Sans Mono","Liberation Mono",monospace;
}
*{box-sizing:border-box}
html,body{margin:0;padding:0}
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI","Noto Sans",Helvetica,Arial,sans-serif;color:var(--ink);background:var(--bg)}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
code,pre,.mono{font-family:var(--mono);font-size:12px}
pre{margin:0;white-space:pre-wrap;word-break:break-word}
header.top{background:#24292f;color:#fff;padding:14px 24px 12px}
header.top h1{margin:0;font-size:18px;font-weight:600;display:flex;align-items:center;gap:12px;flex-wrap:wrap}
header.top .sub{color:#c9d1d9;font-size:12px;margin-top:2px}
.verdict{display:inline-block;padding:2px 10px;border-radius:12px;font-size:13px;font-weight:700;letter-spacing:.04em}
.v-PASS{background:var(--pass)}.v-FAIL{background:var(--fail)}.v-INCOMPLETE{background:#bf8700;color:#fff}
.banner{background:#fff8c5;border:1px solid #d4a72c;color:#4d2d00;padding:10px 24px;font-weight:600}
.banner b{font-size:15px;letter-spacing:.04em}
main{padding:16px 24px 48px;max-width:100%}
section.card{background:var(--panel);border:1px solid var(--line);border-radius:8px;margin:0 0 16px;padding:14px 16px}
section.card>h2{font-size:15px;margin:0 0 10px;font-weight:600}
.meta{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:6px 20px;margin:0}
.meta div{min-width:0}.meta dt{color:var(--muted);font-size:11px;text-transform:uppercase;letter-spacing:.04em}
.meta dd{margin:0;font-weight:500;overflow-wrap:anywhere}
.cmd{display:flex;gap:8px;align-items:flex-start;margin-top:10px;background:var(--soft);border-radius:6px;padding:8px 10px}
.cmd pre{flex:1;min-width:0}
button{font:inherit;font-size:12px;border:1px solid var(--line);background:#f6f8fa;border-radius:6px;padding:3px 10px;cursor:pointer;color:var(--ink)}
button:hover{background:#eef1f4}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin-top:12px}
.pill{display:inline-flex;align-items:center;gap:6px;border-radius:14px;padding:2px 10px 2px 4px;background:var(--soft);font-size:13px;white-space:nowrap}
.pill .dot{width:18px;height:18px;border-radius:9px;display:inline-block}
.pill b{font-variant-numeric:tabular-nums}
.s-pass{background:var(--pass)}.s-xfail{background:var(--xfail)}.s-fail{background:var(--fail)}
.s-error{background:var(--error)}.s-timeout{background:var(--timeout)}.s-skipped{background:var(--skipped)}
.s-other{background:#57606a}
.t-pass{color:var(--pass)}.t-xfail{color:var(--xfail)}.t-fail{color:var(--fail)}.t-error{color:var(--error)}
.t-timeout{color:var(--timeout)}.t-skipped{color:var(--skipped)}
details.more{margin-top:10px}details.more summary{cursor:pointer;color:var(--muted);font-size:12px}
table.plain{border-collapse:collapse;font-size:12px;margin-top:6px}
table.plain th,table.plain td{border-bottom:1px solid var(--soft);padding:3px 10px 3px 0;text-align:left;vertical-align:top}
table.plain th{color:var(--muted);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;font-family:var(--mono)}
/* filters */
.filters{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:6px 24px}
.filters .frow.all{grid-column:1/-1}
.frow{display:flex;flex-wrap:wrap;align-items:center;gap:4px 6px}
.frow>label.k{min-width:86px;color:var(--muted);font-size:12px}
.tog{border:1px solid var(--line);border-radius:12px;padding:1px 9px;font-size:12px;background:#fff;cursor:pointer;user-select:none;white-space:nowrap}
.tog.off{opacity:.45;text-decoration:line-through}
.tog .n{color:var(--muted);margin-left:4px;font-variant-numeric:tabular-nums}
.tog .sw{display:inline-block;width:9px;height:9px;border-radius:5px;margin-right:5px}
input.search{font:inherit;font-size:12px;padding:3px 8px;border:1px solid var(--line);border-radius:6px;width:320px}
select.role{font-size:12px;border:1px solid var(--line);border-radius:6px;background:#fff;padding:1px 2px}
.shown{color:var(--muted);font-size:12px;margin-left:auto}
/* grid */
.gridwrap{overflow:auto;max-height:78vh;border:1px solid var(--line);border-radius:6px;background:#fff}
table.grid{border-collapse:separate;border-spacing:0;font-size:12px}
table.grid th{position:sticky;top:0;background:#f6f8fa;z-index:2;font-weight:600;padding:0 8px;border-bottom:1px solid var(--line);border-right:1px solid var(--soft);white-space:nowrap;text-align:center}
table.grid thead th{height:26px;line-height:25px}
table.grid th.ax{color:var(--muted);font-weight:500;text-align:right;font-size:11px}
table.grid th.rh{position:sticky;z-index:1;background:#fbfcfd;text-align:left;font-weight:500;border-right:1px solid var(--line)}
table.grid thead th.rh{z-index:3;background:#f6f8fa;color:var(--muted);font-size:11px}
table.grid td{vertical-align:top;padding:1px 2px;border-bottom:1px solid var(--soft);border-right:1px solid var(--soft)}
table.grid td.worst-fail{box-shadow:inset 3px 0 0 var(--fail)}table.grid td.worst-error{box-shadow:inset 3px 0 0 var(--error)}
table.grid td.worst-timeout{box-shadow:inset 3px 0 0 var(--timeout)}
table.grid tr:hover th.rh{background:#eef4ff}
table.grid th.rh.rep{color:#afb8c1}
.colsum{font-weight:600;color:var(--fail);font-size:11px}
.chips{display:flex;flex-wrap:wrap;align-content:flex-start;gap:2px;width:172px;padding:3px;content-visibility:auto;contain-intrinsic-size:auto 172px auto 46px}
.chip{display:inline-block;min-width:30px;height:18px;line-height:18px;padding:0 3px;border-radius:3px;color:#fff;font:600 10px/18px var(--mono);text-align:center;cursor:pointer;user-select:none}
.chip:hover{outline:2px solid #24292f;outline-offset:0}
.chip.near{box-shadow:inset 0 0 0 2px #f0b72f}
.chip.sel{outline:2px solid var(--accent);outline-offset:1px;position:relative;z-index:1}
.chip.h,tr.h,th.h,td.h{display:none}
.legend{display:flex;flex-wrap:wrap;gap:10px;font-size:12px;color:var(--muted);margin:8px 0 0}
.legend span{display:inline-flex;align-items:center;gap:4px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:3px}
/* near miss */
.nm{display:grid;grid-template-columns:minmax(300px,1fr) minmax(360px,1.3fr);gap:24px}
@media (max-width:1000px){.nm{grid-template-columns:1fr}}
.bars{display:grid;grid-template-columns:88px 1fr 56px;gap:4px 8px;align-items:center;font-size:12px}
.bars .lab{text-align:right;color:var(--muted);font-family:var(--mono);font-size:11px}
.bars .track{height:16px;background:var(--soft);border-radius:3px;display:flex;overflow:hidden}
.bars .track i{display:block;height:100%}
.bars .cnt{font-variant-numeric:tabular-nums;font-family:var(--mono);font-size:11px}
.bars .lab.over{color:var(--fail);font-weight:600}
.rbar{display:inline-block;height:8px;border-radius:2px;background:#f0b72f;vertical-align:middle}
.idcell{font-family:var(--mono);font-size:11px;overflow-wrap:anywhere}
.muted{color:var(--muted)}
/* detail drawer */
#detail{position:fixed;top:0;right:0;bottom:0;width:min(940px,58vw);background:#fff;border-left:1px solid var(--line);box-shadow:-8px 0 24px rgba(31,35,40,.15);overflow:auto;z-index:20;padding:0 0 40px}
#detail[hidden]{display:none}
#detail .dh{position:sticky;top:0;background:#fff;border-bottom:1px solid var(--line);padding:12px 18px 10px;z-index:1}
#detail .dh .id{font-family:var(--mono);font-size:13px;font-weight:600;overflow-wrap:anywhere;margin-right:40px}
#detail .close{position:absolute;right:14px;top:10px;font-size:16px;line-height:1;padding:4px 9px}
#detail .db{padding:8px 18px}
#detail h3{font-size:13px;margin:16px 0 6px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:0 9px;font-size:12px;font-weight:600;line-height:20px}
.kv{display:flex;flex-wrap:wrap;gap:4px 6px}
.kv span{background:var(--soft);border-radius:4px;padding:1px 7px;font-size:12px;font-family:var(--mono)}
.kv span em{font-style:normal;color:var(--muted)}
.ff{background:#ffebe9;border:1px solid #ffcecb;border-radius:6px;padding:8px 10px;margin-top:10px;font-family:var(--mono);font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}
.note{background:#ddf4ff;border:1px solid #b6e3ff;border-radius:6px;padding:6px 10px;font-size:12px;margin:8px 0}
.rank{border:1px solid var(--line);border-radius:6px;margin:10px 0;overflow:hidden}
.rank>.rh2{background:#f6f8fa;padding:6px 10px;font-weight:600;display:flex;gap:10px;align-items:center;cursor:pointer;list-style:none}
.rank>summary.rh2::-webkit-details-marker{display:none}
.rank>summary.rh2::before{content:"\25B8";color:var(--muted);font-size:11px}
.rank[open]>summary.rh2::before{content:"\25BE"}
.rank>.rb{padding:6px 10px;overflow-x:auto}
.exc{margin:6px 0}.exc .et{font-family:var(--mono);font-size:12px;font-weight:600;color:var(--fail);white-space:pre-wrap;overflow-wrap:anywhere}
pre.traceback{background:#1f2328;color:#e6edf3;border-radius:6px;padding:10px 12px;margin-top:6px;max-height:420px;overflow:auto;font-size:11.5px}
table.checks{border-collapse:collapse;width:100%;font-size:12px}
table.checks th{text-align:left;color:var(--muted);font-weight:600;border-bottom:1px solid var(--line);padding:3px 6px;white-space:nowrap}
table.checks td{border-bottom:1px solid var(--soft);padding:3px 6px;vertical-align:top}
table.checks td.num{white-space:nowrap}
table.checks td.nm2{font-family:var(--mono);white-space:nowrap}
table.checks tr.bad td{background:#fff5f5}
table.checks tr.msg td{background:#fff5f5;border-bottom:1px solid var(--line)}
table.checks tr.msg pre{color:#82071e;font-size:11.5px}
.ok1{color:var(--pass);font-weight:700}.ok0{color:var(--fail);font-weight:700}
.repro{display:flex;gap:8px;align-items:flex-start;background:#1f2328;color:#e6edf3;border-radius:6px;padding:8px 10px}
.repro pre{flex:1;min-width:0;font-size:12px}
.repro button{background:#30363d;color:#e6edf3;border-color:#484f58}
.foot{color:var(--muted);font-size:11px;text-align:center;margin-top:24px}
.dsub{margin-top:6px;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
pre.example{background:var(--soft);padding:8px 10px;border-radius:6px}
"""

JS = r"""
(function () {
  "use strict";
  var t0 = performance.now(), T = window.__timings = {script_start_ms: t0};
  var D = JSON.parse(document.getElementById("dw-data").textContent);
  T.parse_ms = performance.now() - t0;
  var S = D.S, ST = D.statuses, AX = D.axes, KINDS = D.kinds, LEVELS = D.levels, N = D.n;
  var SEV = ["fail", "error", "timeout", "skipped", "xfail", "pass"];
  var LABEL = {pass: "pass", xfail: "expected error met", fail: "fail", error: "error", timeout: "timeout", skipped: "skipped"};
  var GLYPH = {pass: "ok", xfail: "xf", fail: "\u2717", error: "err", timeout: "t/o", skipped: "skip"};
  var ABBR = {world_size: "ws", microbatches: "mb", num_gemms: "g"};
  var BAD = {fail: 1, error: 1, timeout: 1};
  var MARK = "\u0001", A62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", DEC = {};
  for (var q = 0; q < A62.length; q++) DEC[A62.charAt(q)] = q;
  function dec(s, pos, w) { var v = 0; for (var k = 0; k < w; k++) v = v * 62 + DEC[s.charAt(pos + k)]; return v; }
  var axPos = {};
  AX.forEach(function (a, i) { axPos[a[0]] = i; });

  // ---------------------------------------------------------------- cells (the summary blob)
  // ids are decoded on first use (search, hash links, details): the grid needs none of them
  var cells = new Array(N), byId = null, CODE = new Int16Array(128);
  for (var q2 = 0; q2 < A62.length; q2++) CODE[A62.charCodeAt(q2)] = q2;
  (function () {
    var nAx = AX.length, AW = D.aw, AXS = D.ax, STS = D.st, FF = D.ff, RR = D.r, pos = 0;
    for (var i = 0; i < N; i++) {
      var ax = new Array(nAx);
      for (var p = 0; p < nAx; p++, pos += AW) {
        var ch = AXS.charCodeAt(pos);
        ax[p] = ch === 45 ? -1 : AW === 1 ? CODE[ch] : dec(AXS, pos, AW);  // 45: "-", absent
      }
      var ff = FF[i];
      cells[i] = {i: i, _id: null, st: ST[CODE[STS.charCodeAt(i)]], ax: ax, r: RR[i], ff: ff === undefined ? null : S[ff]};
    }
  })();
  function idOf(i) {
    var c = cells[i];
    if (c._id === null) {
      var e = D.id[i], W = D.w, TOK = D.T, s = "";
      for (var k = 0; k < e.length; k += W) s += (k ? D.sep : "") + TOK[W === 1 ? CODE[e.charCodeAt(k)] : dec(e, k, W)];
      c._id = s;
    }
    return c._id;
  }
  function indexOfId(id) {
    if (!byId) { byId = {}; for (var i = 0; i < N; i++) byId[idOf(i)] = i; }
    return byId.hasOwnProperty(id) ? byId[id] : -1;
  }
  function reproOf(c) {
    var t = D.rpx[c.i];
    if (t === undefined) t = D.rp;
    return t == null ? "" : String(S[t]).split(MARK).join(idOf(c.i));
  }

  // ---------------------------------------------------------------- details (the detail blob, parsed lazily)
  var DD = null;
  function detailData() {
    if (!DD) {
      var t = performance.now(), el = document.getElementById("dw-detail");
      DD = el ? JSON.parse(el.textContent) : {S: [], c: []};
      T.detail_parse_ms = performance.now() - t;
    }
    return DD;
  }
  function whenParsed(fn) {  // the detail blob follows this script: wait for the parser to pass it
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn); else fn();
  }
  function detailOf(c) {
    var a = detailData().c[c.i] || [], raw = a[3] || [], ranks = [], byRank = {};
    if (typeof raw === "number") { for (var r = 0; r < raw; r++) ranks.push({rank: r, st: c.st, err: 0, checks: []}); }
    else raw.forEach(function (g) { ranks.push({rank: g[0], st: DD.S[g[1]], err: g[2], checks: g[3].slice()}); });
    ranks.forEach(function (g) { byRank[g.rank] = g; });
    (a[6] || []).forEach(function (x) { if (byRank[x[0]]) byRank[x[0]].checks.push(x.slice(1)); });
    return {dur: a[0] || 0, xp: !!a[1], ex: a[2] || null, ranks: ranks, lvl: a[4] ? LEVELS[a[4]] : null, drop: a[5] || 0};
  }

  function esc(s) {
    return String(s == null ? "" : s).replace(/&/g, "&amp;").replace(/</g, "&lt;")
      .replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }
  function sclass(st) { return LABEL.hasOwnProperty(st) ? "s-" + st : "s-other"; }
  function rnum(x) { return x === "nan" ? NaN : x === "inf" ? Infinity : x === "-inf" ? -Infinity : x; }
  function fmtNum(x) {
    if (x == null) return "";
    if (typeof x === "string") return x;
    if (x === 0) return "0";
    var a = Math.abs(x);
    if (Number.isInteger(x) && a < 1e9) return String(x);
    return (a >= 1e4 || a < 1e-3) ? x.toExponential(2) : String(+x.toPrecision(4));
  }
  function fmtRatio(r) {
    if (r == null) return "";
    if (typeof r === "string") return r;
    if (r === 0) return "0";
    if (r < 0.01) return r.toExponential(0);
    if (r < 1) return String(+r.toPrecision(2));
    if (r < 100) return String(+r.toPrecision(3));
    if (r < 1e4) return String(Math.round(r));
    return r.toExponential(1).replace("e+", "e");
  }
  function axisLabel(name, v) {
    if (typeof v === "boolean") return v ? name : "no " + name;
    if (typeof v === "number" && ABBR[name]) return ABBR[name] + v;
    return String(v);
  }
  function axisValueShort(v) {
    if (typeof v === "boolean") return v ? "\u2713" : "\u2013";
    return String(v);
  }
  function sevOf(st) { var p = SEV.indexOf(st); return p < 0 ? 1 : p; }
  function ratioNum(r) { r = rnum(r); return r == null ? -1 : (r !== r ? Infinity : r); }
  function chipText(c) {  // the ratio when it says something (passing, or over the bound), else a glyph
    if (c.r != null && (c.st === "pass" || ratioNum(c.r) > 1)) return fmtRatio(c.r);
    return GLYPH[c.st] || c.st;
  }

  // ---------------------------------------------------------------- filters state
  var stOn = {}, axOn = AX.map(function (a) { return a[1].map(function () { return true; }); });
  ST.forEach(function (s) { stOn[s] = true; });
  var query = "";
  function visible(c) {
    if (!stOn[c.st]) return false;
    for (var p = 0; p < c.ax.length; p++) if (c.ax[p] >= 0 && !axOn[p][c.ax[p]]) return false;
    if (query && idOf(c.i).toLowerCase().indexOf(query) < 0) return false;
    return true;
  }

  // ---------------------------------------------------------------- layout + grid
  // The grid is one table built from HTML strings: the head and the first rows (about a
  // screenful) at once, the rest in chunks after the first paint, one chunk per frame.
  var FIRST_CHIPS = 1200, CHUNK_CHIPS = 3000, HEAD_ROW = 26;  // px, = table.grid thead th height
  var layout = {rows: D.layout.rows.filter(function (a) { return a in axPos; }),
                cols: D.layout.cols.filter(function (a) { return a in axPos; })};
  var grid = document.getElementById("grid");
  var G = null, buildToken = 0, selected = null, pendingScroll = null;
  var vis = new Uint8Array(N), rowVis, colVis, colBad, slotWorst, nVis = 0;
  var colStyle = document.createElement("style"), pinStyle = document.createElement("style");
  document.head.appendChild(colStyle);
  document.head.appendChild(pinStyle);

  function groups(cols) {
    // distinct value tuples over `cols` (axis positions), sorted by each axis's value order
    var map = {}, list = [], keyOf = new Array(N), i, j;
    for (i = 0; i < N; i++) {
      var v = new Array(cols.length);
      for (j = 0; j < cols.length; j++) v[j] = cells[i].ax[cols[j]];
      var k = v.join(",");
      keyOf[i] = k;
      if (!(k in map)) { map[k] = 0; list.push({k: k, v: v}); }
    }
    list.sort(function (a, b) {
      for (var j = 0; j < a.v.length; j++) if (a.v[j] !== b.v[j]) return a.v[j] - b.v[j];
      return 0;
    });
    list.forEach(function (g, n) { map[g.k] = n; });
    var pos = new Array(N);
    for (i = 0; i < N; i++) pos[i] = map[keyOf[i]];
    return {list: list, pos: pos};
  }
  function computeVis() {
    var nR = G.rowList.length, nC = G.colList.length, slotSev = {};
    rowVis = new Uint8Array(nR); colVis = new Uint8Array(nC); colBad = new Int32Array(nC); slotWorst = {}; nVis = 0;
    for (var i = 0; i < N; i++) {
      var c = cells[i], v = visible(c);
      vis[i] = v ? 1 : 0;
      if (!v) continue;
      nVis++;
      var key = G.slotOf[i], k = key % 100000, s = sevOf(c.st);
      rowVis[(key - k) / 100000] = 1; colVis[k] = 1;
      if (BAD[c.st]) colBad[k]++;
      if (!(key in slotSev) || s < slotSev[key]) slotSev[key] = s;
    }
    for (var key2 in slotSev) if (BAD[SEV[slotSev[key2]]]) slotWorst[key2] = " worst-" + SEV[slotSev[key2]];
  }
  function paintHead() {
    // column visibility is one style rule, so rows rendered later follow it too
    var hidden = [];
    for (var k = 0; k < G.colList.length; k++) if (!colVis[k]) hidden.push('#grid [data-c="' + k + '"]');
    colStyle.textContent = hidden.length ? hidden.join(",") + "{display:none}" : "";
    grid.querySelectorAll("th[data-span]").forEach(function (th) {
      var ab = th.getAttribute("data-span").split(","), n = 0;
      for (var k = +ab[0]; k <= +ab[1]; k++) if (colVis[k]) n++;
      th.classList.toggle("h", !n);
      if (n) th.colSpan = n;
    });
    for (var k2 = 0; k2 < G.colList.length; k2++) {
      var cs = document.getElementById("cs" + k2);
      if (cs) cs.textContent = colBad[k2] ? colBad[k2] + " bad" : "";
    }
    document.getElementById("shown").textContent = "showing " + nVis.toLocaleString() + " of " + N.toLocaleString() + " cells";
  }
  function rowHtml(r) {
    var g = G.rowList[r], ri = G.ri, h = ['<tr data-r="' + r + '"' + (rowVis[r] ? "" : ' class="h"') + ">"];
    var prev = r ? G.rowList[r - 1].v : null, same = !!prev;
    for (var j = 0; j < ri.length; j++) {
      same = same && prev[j] === g.v[j];
      h.push('<th class="rh' + (same ? " rep" : "") + '">' + esc(axisValueShort(AX[ri[j]][1][g.v[j]])) + "</th>");
    }
    if (!ri.length) h.push('<th class="rh">all cells</th>');
    for (var k = 0; k < G.colList.length; k++) {
      var key = r * 100000 + k, list = G.slotMap[key];
      h.push('<td data-c="' + k + '" id="sl' + key + '"' + (slotWorst[key] ? ' class="' + slotWorst[key].slice(1) + '"' : "") +
             '><div class="chips"' + (list && list.length > 40 ? ' style="contain-intrinsic-size:auto 172px auto ' + (6 + Math.ceil(list.length / 5) * 20) + 'px"' : "") + ">");
      if (list) for (var n = 0; n < list.length; n++) {
        var i = list[n], c = cells[i];
        h.push('<span class="chip ' + sclass(c.st) + (c.st === "pass" && ratioNum(c.r) >= 0.5 ? " near" : "") +
               (vis[i] ? "" : " h") + (i === selected ? " sel" : "") + '" data-i="' + i + '">' + esc(chipText(c)) + "</span>");
      }
      h.push("</div></td>");
    }
    h.push("</tr>");
    return h.join("");
  }
  function renderRows(maxChips) {
    var h = [], n = 0;
    while (G.done < G.rowList.length && (!h.length || n < maxChips)) { h.push(rowHtml(G.done)); n += G.rowCount[G.done]; G.done++; }
    if (h.length) G.tbody.insertAdjacentHTML("beforeend", h.join(""));
    if (pendingScroll != null) {  // a cell opened from the URL: keep it in view while rows arrive
      var el = chipEl(pendingScroll);
      if (el) el.scrollIntoView({block: "center"});
    }
  }
  function pinRowHeaders() {
    // each row-axis column sticks at its own offset, so they stack instead of overlapping
    var first = G.tbody.rows[0];
    if (!first) return;
    var ths = first.querySelectorAll("th.rh"), x0 = ths[0].getBoundingClientRect().left, css = [];
    for (var j = 0; j < ths.length; j++)
      css.push("#grid tr>th.rh:nth-child(" + (j + 1) + "){left:" + (ths[j].getBoundingClientRect().left - x0) + "px}");
    pinStyle.textContent = css.join("");
  }
  function build() {
    var token = ++buildToken, ri = layout.rows.map(function (a) { return axPos[a]; }),
        ci = layout.cols.map(function (a) { return axPos[a]; });
    var R = groups(ri), C = groups(ci), rowList = R.list, colList = C.list, nCols = colList.length;
    G = {ri: ri, ci: ci, rowList: rowList, colList: colList, slotOf: new Array(N), slotMap: {},
         rowCount: new Int32Array(rowList.length), done: 0, tbody: null};
    for (var i = 0; i < N; i++) {
      var key = R.pos[i] * 100000 + C.pos[i];
      (G.slotMap[key] = G.slotMap[key] || []).push(i);
      G.slotOf[i] = key;
      G.rowCount[R.pos[i]]++;
    }
    computeVis();
    var h = ["<thead>"], lead = Math.max(1, ri.length);
    ci.forEach(function (p, j) {
      h.push('<tr><th class="rh ax" colspan="' + lead + '" style="top:' + (j * HEAD_ROW) + 'px">' + esc(AX[p][0]) + " \u2192</th>");
      // merge neighbouring columns that agree on this and every earlier column axis
      for (var k = 0; k < nCols; ) {
        var e = k + 1;
        while (e < nCols && colList[e].v.slice(0, j + 1).join() === colList[k].v.slice(0, j + 1).join()) e++;
        h.push('<th data-span="' + k + "," + (e - 1) + '" colspan="' + (e - k) + '" style="top:' + (j * HEAD_ROW) + 'px">' +
               esc(axisLabel(AX[p][0], AX[p][1][colList[k].v[j]])) + "</th>");
        k = e;
      }
      h.push("</tr>");
    });
    var top = ' style="top:' + (ci.length * HEAD_ROW) + 'px"';
    h.push("<tr>");
    ri.forEach(function (p) { h.push('<th class="rh"' + top + ">" + esc(AX[p][0]) + "</th>"); });
    if (!ri.length) h.push('<th class="rh"' + top + "></th>");
    colList.forEach(function (g, k) { h.push('<th data-c="' + k + '" class="colsum" id="cs' + k + '"' + top + "></th>"); });
    h.push("</tr></thead><tbody></tbody>");
    grid.innerHTML = h.join("");
    G.tbody = grid.tBodies[0];
    paintHead();
    renderRows(FIRST_CHIPS);
    var step = function () {
      if (token !== buildToken) return;  // regrouped meanwhile: that build carries on
      pinRowHeaders();
      if (G.done < G.rowList.length) {
        renderRows(CHUNK_CHIPS);
        requestAnimationFrame(function () { setTimeout(step, 0); });
      } else {
        if (pendingScroll != null) {  // sizes settle once every row is laid out: one last scroll
          var target = pendingScroll;
          pendingScroll = null;
          requestAnimationFrame(function () { var el = chipEl(target); if (el) el.scrollIntoView({block: "center"}); });
        }
        grid.setAttribute("data-complete", "1");
        if (window.__gridCompleteAt === undefined) {
          window.__gridCompleteAt = performance.now();
          (window.requestIdleCallback || function (f) { setTimeout(f, 50); })(function () { whenParsed(detailData); });
        }
      }
    };
    grid.removeAttribute("data-complete");
    requestAnimationFrame(function () {
      setTimeout(function () {  // runs once the frame with the first rows is out
        if (window.__renderedAt === undefined) window.__renderedAt = performance.now();
        step();
      }, 0);
    });
  }
  function applyFilters() {
    computeVis();
    // static lists: a live collection re-walks the DOM on every access after a class changes
    var chips = G.tbody.querySelectorAll(".chip"), rows = Array.prototype.slice.call(G.tbody.rows);
    for (var n = 0; n < chips.length; n++) {
      var el = chips[n], hide = !vis[+el.getAttribute("data-i")];
      if (hide !== el.classList.contains("h")) el.classList.toggle("h", hide);
    }
    for (var r = 0; r < rows.length; r++) {
      rows[r].classList.toggle("h", !rowVis[r]);
      for (var k = 0; k < G.colList.length; k++) {
        var key = r * 100000 + k, td = document.getElementById("sl" + key);
        if (td) td.className = slotWorst[key] ? slotWorst[key].slice(1) : "";
      }
    }
    paintHead();
  }
  function buildFilters() {
    var box = document.getElementById("filters"), h = [], nSt = {};
    cells.forEach(function (c) { nSt[c.st] = (nSt[c.st] || 0) + 1; });
    h.push('<div class="frow all"><label class="k">status</label>');
    ST.forEach(function (s) {
      if (!nSt[s]) return;
      h.push('<span class="tog" data-st="' + esc(s) + '"><i class="sw ' + sclass(s) + '"></i>' + esc(LABEL[s] || s) + '<span class="n">' + nSt[s].toLocaleString() + "</span></span>");
    });
    h.push('<input class="search" id="q" placeholder="filter by cell id substring\u2026" type="search"><span class="shown" id="shown"></span></div>');
    AX.forEach(function (a, p) {
      var n = a[1].map(function () { return 0; });
      cells.forEach(function (c) { if (c.ax[p] >= 0) n[c.ax[p]]++; });
      var role = layout.rows.indexOf(a[0]) >= 0 ? "row" : layout.cols.indexOf(a[0]) >= 0 ? "col" : "";
      h.push('<div class="frow"><label class="k">' + esc(a[0]) + "</label>");
      h.push('<select class="role" data-ax="' + esc(a[0]) + '" title="place this axis on the grid">' +
             ["", "row", "col"].map(function (o) {
               return '<option value="' + o + '"' + (o === role ? " selected" : "") + ">" + (o ? "grid " + o : "in slot") + "</option>";
             }).join("") + "</select>");
      a[1].forEach(function (v, j) {
        h.push('<span class="tog" data-ax="' + p + '" data-v="' + j + '">' + esc(axisLabel(a[0], v)) + '<span class="n">' + n[j].toLocaleString() + "</span></span>");
      });
      h.push("</div>");
    });
    box.innerHTML = h.join("");
    box.addEventListener("click", function (e) {
      var t = e.target.closest(".tog");
      if (!t) return;
      if (t.hasAttribute("data-st")) { var s = t.getAttribute("data-st"); stOn[s] = !stOn[s]; t.classList.toggle("off", !stOn[s]); }
      else { var p = +t.getAttribute("data-ax"), j = +t.getAttribute("data-v"); axOn[p][j] = !axOn[p][j]; t.classList.toggle("off", !axOn[p][j]); }
      applyFilters();
    });
    box.addEventListener("change", function (e) {
      var sel = e.target.closest("select.role");
      if (!sel) return;
      var a = sel.getAttribute("data-ax");
      layout.rows = layout.rows.filter(function (x) { return x !== a; });
      layout.cols = layout.cols.filter(function (x) { return x !== a; });
      if (sel.value === "row") layout.rows.push(a);
      if (sel.value === "col") layout.cols.push(a);
      build();
    });
    var q = document.getElementById("q"), timer = null;
    q.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { query = q.value.trim().toLowerCase(); applyFilters(); }, 120);
    });
  }

  // ---------------------------------------------------------------- details
  var detail = document.getElementById("detail");
  function show(v) { return typeof v === "string" ? v : JSON.stringify(v); }
  function checkRows(checks, rankCol) {
    var DS = DD.S, h = ['<table class="checks"><thead><tr>' + (rankCol ? "<th>rank</th>" : "") +
             '<th>check</th><th>kind</th><th>ok</th><th class="num">max abs</th><th class="num">max rel</th>' +
             '<th class="num" title="tolerance bound at the worst element">bound</th><th class="num" title="worst error / bound">ratio</th>' +
             '<th>expected</th><th>actual</th></tr></thead><tbody>'];
    var ncol = rankCol ? 10 : 9;
    checks.forEach(function (x) {
      var a = x.c, kind = typeof a[1] === "number" ? KINDS[a[1]] : DS[a[1]], ok = !!a[2], msg = null, t = [];
      t.push(rankCol ? "<td>" + x.rank + "</td>" : "");
      t.push('<td class="nm2">' + esc(DS[a[0]]) + "</td><td>" + esc(kind) + '</td><td class="ok' + (ok ? 1 : 0) + '">' + (ok ? "\u2713" : "\u2717") + "</td>");
      if (kind === "tensor") {
        t.push('<td class="num">' + fmtNum(a[4]) + '</td><td class="num">' + fmtNum(a[5]) + '</td><td class="num">' + fmtNum(a[6]) +
               '</td><td class="num">' + fmtNum(a[3]) + "</td>");
        var ext = [];
        if (a[8]) ext.push(a[8] + (a[7] ? " / " + a[7] : "") + " mismatched");
        else if (a[7]) ext.push(a[7] + " elements");
        if (a[9]) ext.push("worst at (" + a[9].join(", ") + ")");
        t.push('<td colspan="2" class="muted">' + esc(ext.join(" \u00b7 ")) + "</td>");
        msg = a[10];
      } else {
        var exp = a[3], act = a.length > 4 ? a[4] : a[3];
        if (exp == null && act == null) exp = act = "";
        t.push('<td></td><td></td><td></td><td></td><td class="mono">' + esc(show(exp)) + '</td><td class="mono">' + esc(show(act)) + "</td>");
        msg = a[5];
      }
      h.push('<tr class="' + (ok ? "" : "bad") + '">' + t.join("") + "</tr>");
      if (msg != null) h.push('<tr class="msg"><td colspan="' + ncol + '"><pre>' + esc(DS[msg]) + "</pre></td></tr>");
    });
    h.push("</tbody></table>");
    return h.join("");
  }
  function excBlock(e, sameAs) {
    if (!e) return "";
    var DS = DD.S, h = '<div class="exc"><div class="et">' + esc(DS[e[0]]) + ": " + esc(DS[e[1]]) + "</div>";
    if (e[2] != null) h += sameAs != null ? '<div class="muted">traceback identical to rank ' + sameAs + "</div>"
                                          : '<pre class="traceback">' + esc(DS[e[2]]) + "</pre>";
    return h + "</div>";
  }
  function renderDetail(c, d) {
    var h = [], DS = DD.S;
    h.push('<div class="dh"><div class="id">' + esc(idOf(c.i)) + '</div><button class="close" title="close (Esc)" id="dclose">\u00d7</button>');
    h.push('<div class="dsub"><span class="badge ' + sclass(c.st) + '">' + esc(LABEL[c.st] || c.st) + "</span>");
    h.push('<span class="muted">expects ' + (d.xp ? "the clear error" : "pass") + " \u00b7 " + fmtNum(d.dur) + " s" +
           (c.r != null ? " \u00b7 worst ratio <b>" + esc(fmtRatio(c.r)) + "</b>" : "") + "</span></div></div>");
    h.push('<div class="db">');
    if (c.ff) h.push('<div class="ff">' + esc(c.ff) + "</div>");
    h.push("<h3>Reproduce</h3>");
    h.push('<div class="repro"><pre class="repro-cmd" id="repro-cmd">' + esc(reproOf(c)) + '</pre><button data-copy="repro-cmd">Copy</button></div>');
    h.push('<h3>Axes</h3><div class="kv">');
    AX.forEach(function (a, p) { if (c.ax[p] >= 0) h.push("<span><em>" + esc(a[0]) + "=</em>" + esc(JSON.stringify(a[1][c.ax[p]])) + "</span>"); });
    h.push("</div>");
    if (d.ex) {
      h.push("<h3>Example" + (d.ex.shrunk ? ' <span class="badge s-fail">shrunk by hypothesis</span>' : "") + "</h3>");
      var exLines = Object.keys(d.ex).map(function (k) { return k + ": " + JSON.stringify(d.ex[k]); });
      h.push('<pre class="mono example">' + esc(exLines.join("\n")) + "</pre>");
    }
    if (d.lvl) {
      h.push("<h3>Ranks</h3>");
      h.push('<div class="note">This cell met its expectation, so the report keeps ' +
             (d.lvl === "fold" ? "each check once, at the rank where it came closest to its bound" :
              d.lvl === "none" ? "only the rank statuses" : "at most its " + d.lvl.slice(3) + " closest checks, each once at its worst rank") +
             (d.drop ? " (" + d.drop + " per-rank check results omitted)" : "") + ", to keep the file small. <code>results.json</code> has every value.</div>");
      var flat = [];
      d.ranks.forEach(function (g) { g.checks.forEach(function (a) { flat.push({rank: g.rank, c: a}); }); });
      d.ranks.forEach(function (g) { if (g.err) h.push('<div class="rank"><div class="rh2">rank ' + g.rank + '</div><div class="rb">' + excBlock(g.err) + "</div></div>"); });
      if (flat.length) h.push(checkRows(flat, true));
      h.push('<p class="muted">rank statuses: ' + d.ranks.map(function (g) { return "rank " + g.rank + " " + esc(g.st); }).join(", ") + "</p>");
    } else {
      var tbs = {}, failed = [];
      d.ranks.forEach(function (g) {  // an "exception" check of a rank that raised restates its error: skip
        g.checks.forEach(function (a) { if (!a[2] && !(g.err && KINDS[a[1]] === "exception")) failed.push({rank: g.rank, c: a}); });
      });
      var anyProblem = failed.length || d.ranks.some(function (g) { return g.err; });
      if (failed.length) h.push('<h3>Failed checks (' + failed.length + ')</h3>' + checkRows(failed, true));
      h.push("<h3>Ranks</h3>");
      if (!d.ranks.length) h.push('<p class="muted">no per-rank results were recorded for this cell.</p>');
      d.ranks.forEach(function (g) {
        var nBad = g.checks.filter(function (a) { return !a[2]; }).length;
        var opened = !anyProblem || nBad || g.err;
        h.push('<details class="rank"' + (opened ? " open" : "") + '><summary class="rh2">rank ' + g.rank +
               ' <span class="badge ' + sclass(g.st) + '">' + esc(g.st) + "</span>" +
               '<span class="muted" style="font-weight:400">' + g.checks.length + " checks" + (nBad ? ", " + nBad + " failed" : "") +
               (g.err ? ", raised " + esc(DS[g.err[0]]) : "") + '</span></summary><div class="rb">');
        var same = null;
        if (g.err && g.err[2] != null) { if (tbs[g.err[2]] !== undefined) same = tbs[g.err[2]]; else tbs[g.err[2]] = g.rank; }
        h.push(excBlock(g.err, same));
        if (g.checks.length) h.push(checkRows(g.checks.map(function (a) { return {rank: g.rank, c: a}; }), false));
        h.push("</div></details>");
      });
    }
    h.push("</div>");
    return h.join("");
  }
  function chipEl(i) { return grid.querySelector('.chip[data-i="' + i + '"]'); }
  function select(i, scroll) {
    var old = selected != null ? chipEl(selected) : null;
    if (old) old.classList.remove("sel");
    selected = i;
    pendingScroll = null;
    if (i == null) return;
    var el = chipEl(i);
    if (el) { el.classList.add("sel"); if (scroll) el.scrollIntoView({block: "center"}); }
    if (scroll && grid.getAttribute("data-complete") !== "1") pendingScroll = i;  // rows still arriving
  }
  function open(i, scroll) {
    var c = cells[i];
    if (!c) return;
    whenParsed(function () {
      var t = performance.now();
      detail.innerHTML = renderDetail(c, detailOf(c));
      detail.hidden = false;
      detail.scrollTop = 0;
      select(i, scroll);
      T.last_open_ms = performance.now() - t;
    });
  }
  function close() {
    detail.hidden = true;
    select(null, false);
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }
  function fromHash() {
    var raw = location.hash.slice(1), h = raw;
    if (!raw) return;
    try { h = decodeURIComponent(raw); } catch (e) {}
    var i = indexOfId(h);
    if (i < 0) i = indexOfId(raw);
    if (i >= 0) open(i, true);
  }
  grid.addEventListener("click", function (e) {
    var t = e.target.closest(".chip");
    if (!t) return;
    var i = +t.getAttribute("data-i");
    open(i, false);
    history.replaceState(null, "", "#" + encodeURIComponent(idOf(i)).replace(/%3D/g, "=").replace(/%2C/g, ","));
  });
  grid.addEventListener("mouseover", function (e) {
    var t = e.target.closest(".chip");
    if (!t || t.title) return;
    var c = cells[+t.getAttribute("data-i")];
    t.title = idOf(c.i) + "\n" + (LABEL[c.st] || c.st) + (c.r != null ? " \u00b7 worst ratio " + fmtRatio(c.r) : "") + (c.ff ? "\n" + c.ff : "");
  });
  window.addEventListener("hashchange", fromHash);
  document.addEventListener("keydown", function (e) { if (e.key === "Escape" && !detail.hidden) close(); });
  document.addEventListener("click", function (e) {
    if (e.target.id === "dclose") { close(); return; }
    var b = e.target.closest("button[data-copy]");
    if (!b) return;
    var text = document.getElementById(b.getAttribute("data-copy")).textContent;
    var done = function () { var o = b.textContent; b.textContent = "Copied"; setTimeout(function () { b.textContent = o; }, 1200); };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, fallback); else fallback();
    function fallback() {
      var ta = document.createElement("textarea"); ta.value = text; document.body.appendChild(ta); ta.select();
      try { document.execCommand("copy"); done(); } catch (err) {} document.body.removeChild(ta);
    }
  });

  T.unpack_ms = performance.now() - t0 - T.parse_ms;
  var t1 = performance.now();
  buildFilters();
  T.filters_ms = performance.now() - t1;
  t1 = performance.now();
  build();
  T.grid_ms = performance.now() - t1;
  fromHash();
  window.__gridBuiltAt = performance.now();
  window.__buildMs = window.__gridBuiltAt - t0;
})();
"""
