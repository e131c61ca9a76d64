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
table.grid td{vertical-align:top;padding:4px 5px;border-bottom:1px solid var(--soft);border-right:1px solid var(--soft)}
table.grid td.worst-fail{box-shadow:inset 3px 0 0 var(--fail)}table.grid td.worst-error{box-shadow:inset 3px 0 0 var(--error)}
table.grid td.worst-timeout{box-shadow:inset 3px 0 0 var(--timeout)}
table.grid tr:hover th.rh{background:#eef4ff}
table.grid th.rh.rep{color:#afb8c1}
.colsum{font-weight:600;color:var(--fail);font-size:11px}
.chips{display:flex;flex-wrap:wrap;gap:2px;width:164px;content-visibility:auto;contain-intrinsic-size:auto 164px auto 40px}
.chip{display:inline-block;min-width:30px;height:18px;line-height:18px;padding:0 3px;border-radius:3px;color:#fff;font:600 10px/18px var(--mono);text-align:center;cursor:pointer;user-select:none}
.chip:hover{outline:2px solid #24292f;outline-offset:0}
.chip.near{box-shadow:inset 0 0 0 2px #f0b72f}
.chip.sel{outline:2px solid var(--accent);outline-offset:1px}
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
#detail{position:fixed;top:0;right:0;bottom:0;width:min(980px,62vw);background:#fff;border-left:1px solid var(--line);box-shadow:-8px 0 24px rgba(31,35,40,.15);overflow:auto;z-index:20;padding:0 0 40px}
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
.rank>.rb{padding:6px 10px}
.exc{margin:6px 0}.exc .et{font-family:var(--mono);font-size:12px;font-weight:600;color:var(--fail);white-space:pre-wrap;overflow-wrap:anywhere}
pre.traceback{background:#1f2328;color:#e6edf3;border-radius:6px;padding:10px 12px;margin-top:6px;max-height:420px;overflow:auto;font-size:11.5px}
table.checks{border-collapse:collapse;width:100%;font-size:12px}
table.checks th{text-align:left;color:var(--muted);font-weight:600;border-bottom:1px solid var(--line);padding:3px 6px;white-space:nowrap}
table.checks td{border-bottom:1px solid var(--soft);padding:3px 6px;vertical-align:top}
table.checks td.nm2{font-family:var(--mono);overflow-wrap:anywhere}
table.checks tr.bad td{background:#fff5f5}
table.checks tr.msg td{background:#fff5f5;border-bottom:1px solid var(--line)}
table.checks tr.msg pre{color:#82071e;font-size:11.5px}
.ok1{color:var(--pass);font-weight:700}.ok0{color:var(--fail);font-weight:700}
.repro{display:flex;gap:8px;align-items:flex-start;background:#1f2328;color:#e6edf3;border-radius:6px;padding:8px 10px}
.repro pre{flex:1;min-width:0;font-size:12px}
.repro button{background:#30363d;color:#e6edf3;border-color:#484f58}
.foot{color:var(--muted);font-size:11px;text-align:center;margin-top:24px}
"""

JS = r"""
(function () {
  "use strict";
  var t0 = performance.now(), T = window.__timings = {script_start_ms: t0};
  var D = JSON.parse(document.getElementById("dw-data").textContent);
  T.parse_ms = performance.now() - t0;
  var S = D.S, ST = D.statuses, AX = D.axes, KINDS = D.kinds;
  var SEV = ["fail", "error", "timeout", "skipped", "xfail", "pass"];
  var LABEL = {pass: "pass", xfail: "expected error met", fail: "fail", error: "error", timeout: "timeout", skipped: "skipped"};
  var GLYPH = {pass: "ok", xfail: "xf", fail: "\u2717", error: "err", timeout: "t/o", skipped: "skip"};
  var ABBR = {world_size: "ws", microbatches: "mb", num_gemms: "g"};
  var MARK = "\u0001";
  var axPos = {};
  AX.forEach(function (a, i) { axPos[a[0]] = i; });

  var cells = D.cells.map(function (a, i) {
    return {i: i, id: a[0], st: ST[a[1]], ax: a[2], r: a[3] === undefined ? null : a[3],
            dur: a[4], ff: a[5] == null ? null : S[a[5]], rp: a[6], xp: a[7],
            ranks: a[8] || [], lvl: a[9] || null, drop: a[10] || 0, ex: a[11] || null};
  });
  var byId = {};
  cells.forEach(function (c) { byId[c.id] = c.i; });

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
    return String(+r.toPrecision(3));
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
  function worst(sts) {
    var best = null;
    for (var k in sts) { var p = SEV.indexOf(k); if (p < 0) p = 1; if (best === null || p < best[0]) best = [p, k]; }
    return best ? best[1] : null;
  }
  function ratioNum(r) { r = rnum(r); return r == null ? -1 : (r !== r ? Infinity : r); }

  // ---------------------------------------------------------------- layout + grid
  var layout = {rows: D.layout.rows.filter(function (a) { return a in axPos; }),
                cols: D.layout.cols.filter(function (a) { return a in axPos; })};
  var grid = document.getElementById("grid");
  var chipEls = [], slotOf = [], slotCells = [], rowEls = [], nCols = 0, colEls = [], selected = null;

  function groups(cols) {
    // distinct value tuples over `cols` (axis positions), sorted by each axis's value order
    var map = {}, list = [], keyOf = new Array(cells.length);
    cells.forEach(function (c) {
      var v = cols.map(function (p) { return c.ax[p]; }), k = v.join(",");
      keyOf[c.i] = k;
      if (!(k in map)) { map[k] = 0; list.push({k: k, v: v}); }
    });
    list.sort(function (a, b) {
      for (var j = 0; j < a.v.length; j++) if (a.v[j] !== b.v[j]) return a.v[j] - b.v[j];
      return 0;
    });
    list.forEach(function (g, n) { map[g.k] = n; });
    return {list: list, pos: cells.map(function (c) { return map[keyOf[c.i]]; })};
  }
  var spanEls = [], HEAD_ROW = 26;  // px, = table.grid thead th height
  function pinRowHeaders() {
    // each row-axis column sticks at its own offset, so they stack instead of overlapping
    var first = grid.querySelector("tbody tr");
    if (!first) return;
    var ths0 = first.querySelectorAll("th.rh");
    ths0.forEach(function (th) { th.style.left = ""; });  // (no CSS left: natural positions)
    var x0 = ths0[0].getBoundingClientRect().left;
    var lefts = Array.prototype.map.call(ths0, function (th) { return th.getBoundingClientRect().left - x0; });
    grid.querySelectorAll("tr").forEach(function (tr) {
      var ths = tr.querySelectorAll("th.rh:not(.ax)");
      if (ths.length === lefts.length) ths.forEach(function (th, j) { th.style.left = lefts[j] + "px"; });
    });
    grid.querySelectorAll("th.rh.ax").forEach(function (th) { th.style.left = "0px"; });
  }
  function build() {
    var ri = layout.rows.map(function (a) { return axPos[a]; });
    var ci = layout.cols.map(function (a) { return axPos[a]; });
    var R = groups(ri), C = groups(ci), rowList = R.list, colList = C.list;
    slotOf = new Array(cells.length);
    var slotMap = {};
    cells.forEach(function (c) {
      var key = R.pos[c.i] * 100000 + C.pos[c.i];
      (slotMap[key] = slotMap[key] || []).push(c.i);
      slotOf[c.i] = key;
    });
    nCols = colList.length;
    var h = ["<thead>"], lead = Math.max(1, ri.length);
    ci.forEach(function (p, j) {
      h.push('<tr><th class="rh ax" colspan="' + lead + '">' + esc(AX[p][0]) + " \u2192</th>");
      // merge neighbouring columns that agree on this and every earlier column axis
      for (var k = 0; k < nCols; ) {
        var e = k + 1;
        while (e < nCols && colList[e].v.slice(0, j + 1).join() === colList[k].v.slice(0, j + 1).join()) e++;
        h.push('<th data-span="' + k + "," + (e - 1) + '" colspan="' + (e - k) + '">' +
               esc(axisLabel(AX[p][0], AX[p][1][colList[k].v[j]])) + "</th>");
        k = e;
      }
      h.push("</tr>");
    });
    h.push("<tr>");
    ri.forEach(function (p) { h.push('<th class="rh">' + esc(AX[p][0]) + "</th>"); });
    if (!ri.length) h.push('<th class="rh"></th>');
    colList.forEach(function (g, k) { h.push('<th data-c="' + k + '" class="colsum" id="cs' + k + '"></th>'); });
    h.push("</tr></thead><tbody>");
    rowList.forEach(function (g, r) {
      h.push('<tr data-r="' + r + '">');
      var prev = r ? rowList[r - 1].v : null, same = !!prev;
      ri.forEach(function (p, j) {
        same = same && prev[j] === g.v[j];
        h.push('<th class="rh' + (same ? " rep" : "") + '">' + esc(axisValueShort(AX[p][1][g.v[j]])) + "</th>");
      });
      if (!ri.length) h.push('<th class="rh">all cells</th>');
      for (var k = 0; k < nCols; k++) {
        var list = slotMap[r * 100000 + k];
        h.push('<td data-c="' + k + '" id="sl' + (r * 100000 + k) + '"><div class="chips">');
        if (list) list.forEach(function (i) {
          var c = cells[i], t = c.r != null ? fmtRatio(c.r) : (GLYPH[c.st] || c.st);
          var near = c.st === "pass" && ratioNum(c.r) >= 0.5 ? " near" : "";
          h.push('<span class="chip ' + sclass(c.st) + near + '" data-i="' + i + '" data-status="' + esc(c.st) + '">' + esc(t) + "</span>");
        });
        h.push("</div></td>");
      }
      h.push("</tr>");
    });
    h.push("</tbody>");
    grid.innerHTML = h.join("");
    chipEls = new Array(cells.length);
    var nodes = grid.querySelectorAll(".chip");
    for (var n = 0; n < nodes.length; n++) chipEls[+nodes[n].getAttribute("data-i")] = nodes[n];
    rowEls = Array.prototype.slice.call(grid.querySelectorAll("tbody tr"));
    colEls = [];
    grid.querySelectorAll("[data-c]").forEach(function (el) {
      var k = +el.getAttribute("data-c"); (colEls[k] = colEls[k] || []).push(el);
    });
    spanEls = Array.prototype.slice.call(grid.querySelectorAll("th[data-span]"));
    grid.querySelectorAll("thead tr").forEach(function (tr, j) {  // stack the sticky header rows
      tr.querySelectorAll("th").forEach(function (th) { th.style.top = (j * HEAD_ROW) + "px"; });
    });
    slotCells = slotMap;
    applyFilters();
    requestAnimationFrame(pinRowHeaders);
    if (selected != null && chipEls[selected]) chipEls[selected].classList.add("sel");
  }

  // ---------------------------------------------------------------- filters
  var stOn = {}, axOn = AX.map(function (a) { return a[1].map(function () { return true; }); });
  ST.forEach(function (s) { stOn[s] = true; });
  var query = "";
  function visible(c) {
    if (!stOn[c.st]) return false;
    for (var p = 0; p < c.ax.length; p++) if (c.ax[p] >= 0 && !axOn[p][c.ax[p]]) return false;
    if (query && c.id.toLowerCase().indexOf(query) < 0) return false;
    return true;
  }
  function applyFilters() {
    var vis = 0, rowVis = {}, colVis = {}, colBad = {}, slotSt = {};
    cells.forEach(function (c) {
      var v = visible(c), el = chipEls[c.i];
      if (el) el.classList.toggle("h", !v);
      if (!v) return;
      vis++;
      var key = slotOf[c.i], r = Math.floor(key / 100000), k = key % 100000;
      rowVis[r] = 1; colVis[k] = 1;
      if (c.st === "fail" || c.st === "error" || c.st === "timeout") colBad[k] = (colBad[k] || 0) + 1;
      (slotSt[key] = slotSt[key] || {})[c.st] = 1;
    });
    rowEls.forEach(function (tr, r) { tr.classList.toggle("h", !rowVis[r]); });
    colEls.forEach(function (els, k) { els.forEach(function (el) { el.classList.toggle("h", !colVis[k]); }); });
    spanEls.forEach(function (th) {
      var ab = th.getAttribute("data-span").split(","), n = 0;
      for (var k = +ab[0]; k <= +ab[1]; k++) if (colVis[k]) n++;
      th.classList.toggle("h", !n);
      if (n) th.colSpan = n;
    });
    for (var key in slotCells) {
      var td = document.getElementById("sl" + key);
      if (!td) continue;
      td.className = "";
      var w = slotSt[key] ? worst(slotSt[key]) : null;
      if (w === "fail" || w === "error" || w === "timeout") td.className = "worst-" + w;
    }
    for (var k = 0; k < nCols; k++) {
      var cs = document.getElementById("cs" + k);
      if (cs) cs.textContent = colBad[k] ? colBad[k] + " bad" : "";
    }
    document.getElementById("shown").textContent = "showing " + vis.toLocaleString() + " of " + cells.length.toLocaleString() + " cells";
  }
  function buildFilters() {
    var box = document.getElementById("filters"), h = [], nSt = {};
    cells.forEach(function (c) { nSt[c.st] = (nSt[c.st] || 0) + 1; });
    h.push('<div class="frow all"><label class="k">status</label>');
    ST.forEach(function (s) {
      if (!nSt[s]) return;
      h.push('<span class="tog" data-st="' + esc(s) + '"><i class="sw ' + sclass(s) + '"></i>' + esc(LABEL[s] || s) + '<span class="n">' + nSt[s] + "</span></span>");
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
        h.push('<span class="tog" data-ax="' + p + '" data-v="' + j + '">' + esc(axisLabel(a[0], v)) + '<span class="n">' + n[j] + "</span></span>");
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
    var h = ['<table class="checks"><thead><tr>' + (rankCol ? "<th>rank</th>" : "") +
             '<th>check</th><th>kind</th><th>ok</th><th class="num">max_abs</th><th class="num">max_rel</th>' +
             '<th class="num">bound_at_worst</th><th class="num">ratio</th><th>expected</th><th>actual</th></tr></thead><tbody>'];
    var ncol = rankCol ? 10 : 9;
    checks.forEach(function (x) {
      var a = x.c, kind = typeof a[1] === "number" ? KINDS[a[1]] : S[a[1]], ok = !!a[2], msg = null, t = [];
      t.push(rankCol ? "<td>" + x.rank + "</td>" : "");
      t.push('<td class="nm2">' + esc(S[a[0]]) + "</td><td>" + esc(kind) + '</td><td class="ok' + (ok ? 1 : 0) + '">' + (ok ? "\u2713" : "\u2717") + "</td>");
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
      if (msg != null) h.push('<tr class="msg"><td colspan="' + ncol + '"><pre>' + esc(S[msg]) + "</pre></td></tr>");
    });
    h.push("</tbody></table>");
    return h.join("");
  }
  function excBlock(e, sameAs) {
    if (!e) return "";
    var h = '<div class="exc"><div class="et">' + esc(S[e[0]]) + ": " + esc(S[e[1]]) + "</div>";
    if (e[2] != null) h += sameAs != null ? '<div class="muted">traceback identical to rank ' + sameAs + "</div>"
                                          : '<pre class="traceback">' + esc(S[e[2]]) + "</pre>";
    return h + "</div>";
  }
  function renderDetail(c) {
    var h = [];
    h.push('<div class="dh"><div class="id">' + esc(c.id) + '</div><button class="close" title="close (Esc)" id="dclose">\u00d7</button>');
    h.push('<div style="margin-top:6px;display:flex;gap:10px;align-items:center;flex-wrap:wrap"><span class="badge ' + sclass(c.st) + '">' + esc(LABEL[c.st] || c.st) + "</span>");
    h.push('<span class="muted">expects ' + (c.xp ? "the clear error" : "pass") + " \u00b7 " + fmtNum(c.dur) + " s" +
           (c.r != null ? " \u00b7 worst ratio <b>" + esc(fmtRatio(c.r)) + "</b>" : "") + "</span></div></div>");
    h.push('<div class="db">');
    if (c.ff) h.push('<div class="ff">' + esc(c.ff) + "</div>");
    var cmd = String(c.rp == null ? "" : S[c.rp]).split(MARK).join(c.id);
    h.push("<h3>Reproduce</h3>");
    h.push('<div class="repro"><pre class="repro-cmd" id="repro-cmd">' + esc(cmd) + '</pre><button data-copy="repro-cmd">Copy</button></div>');
    h.push('<h3>Axes</h3><div class="kv">');
    AX.forEach(function (a, p) { if (c.ax[p] >= 0) h.push("<span><em>" + esc(a[0]) + "=</em>" + esc(JSON.stringify(a[1][c.ax[p]])) + "</span>"); });
    h.push("</div>");
    if (c.ex) {
      h.push("<h3>Example" + (c.ex.shrunk ? ' <span class="badge s-fail">shrunk by hypothesis</span>' : "") + "</h3>");
      var exLines = Object.keys(c.ex).map(function (k) { return k + ": " + JSON.stringify(c.ex[k]); });
      h.push('<pre class="mono" style="background:var(--soft);padding:8px 10px;border-radius:6px">' + esc(exLines.join("\n")) + "</pre>");
    }
    if (c.lvl) {
      h.push("<h3>Ranks</h3>");
      h.push('<div class="note">This cell met its expectation, so the report keeps ' +
             (c.lvl === "fold" ? "each check once, at the rank where it came closest to its bound" :
              c.lvl === "none" ? "only the rank statuses" : "at most its " + c.lvl.slice(3) + " closest checks, each once at its worst rank") +
             (c.drop ? " (" + c.drop + " per-rank check results omitted)" : "") + ", to keep the file small. <code>results.json</code> has every value.</div>");
      var flat = [];
      c.ranks.forEach(function (g) { g[3].forEach(function (a) { flat.push({rank: g[0], c: a}); }); });
      c.ranks.forEach(function (g) { if (g[2]) h.push('<div class="rank"><div class="rh2">rank ' + g[0] + '</div><div class="rb">' + excBlock(g[2]) + "</div></div>"); });
      if (flat.length) h.push(checkRows(flat, true));
      h.push('<p class="muted">rank statuses: ' + c.ranks.map(function (g) { return "rank " + g[0] + " " + esc(S[g[1]]); }).join(", ") + "</p>");
    } else {
      var tbs = {}, failed = [];
      c.ranks.forEach(function (g) {  // an "exception" check of a rank that raised restates its error: skip
        g[3].forEach(function (a) { if (!a[2] && !(g[2] && KINDS[a[1]] === "exception")) failed.push({rank: g[0], c: a}); });
      });
      var anyProblem = failed.length || c.ranks.some(function (g) { return g[2]; });
      if (failed.length) h.push('<h3>Failed checks (' + failed.length + ')</h3>' + checkRows(failed, true));
      h.push("<h3>Ranks</h3>");
      if (!c.ranks.length) h.push('<p class="muted">no per-rank results were recorded for this cell.</p>');
      c.ranks.forEach(function (g) {
        var rs = S[g[1]], nBad = g[3].filter(function (a) { return !a[2]; }).length;
        var opened = !anyProblem || nBad || g[2];
        h.push('<details class="rank"' + (opened ? " open" : "") + '><summary class="rh2">rank ' + g[0] +
               ' <span class="badge ' + sclass(rs) + '">' + esc(rs) + "</span>" +
               '<span class="muted" style="font-weight:400">' + g[3].length + " checks" + (nBad ? ", " + nBad + " failed" : "") +
               (g[2] ? ", raised " + esc(S[g[2][0]]) : "") + '</span></summary><div class="rb">');
        var same = null;
        if (g[2] && g[2][2] != null) { if (tbs[g[2][2]] !== undefined) same = tbs[g[2][2]]; else tbs[g[2][2]] = g[0]; }
        h.push(excBlock(g[2], same));
        if (g[3].length) h.push(checkRows(g[3].map(function (a) { return {rank: g[0], c: a}; }), false));
        h.push("</div></details>");
      });
    }
    h.push("</div>");
    return h.join("");
  }
  function open(i, scroll) {
    var c = cells[i];
    if (!c) return;
    detail.innerHTML = renderDetail(c);
    detail.hidden = false;
    detail.scrollTop = 0;
    if (selected != null && chipEls[selected]) chipEls[selected].classList.remove("sel");
    selected = i;
    if (chipEls[i]) { chipEls[i].classList.add("sel"); if (scroll) chipEls[i].scrollIntoView({block: "nearest"}); }
  }
  function close() {
    detail.hidden = true;
    if (selected != null && chipEls[selected]) chipEls[selected].classList.remove("sel");
    selected = null;
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }
  function fromHash() {
    var raw = location.hash.slice(1), h = raw;
    if (!raw) return;
    try { h = decodeURIComponent(raw); } catch (e) {}
    if (byId.hasOwnProperty(h)) open(byId[h], true);
    else if (byId.hasOwnProperty(raw)) open(byId[raw], true);
  }
  grid.addEventListener("click", function (e) {
    var t = e.target.closest(".chip");
    if (!t) return;
    var i = +t.getAttribute("data-i");
    open(i, false);
    history.replaceState(null, "", "#" + encodeURIComponent(cells[i].id).replace(/%3D/g, "=").replace(/%2C/g, ","));
  });
  grid.addEventListener("mouseover", function (e) {
    var t = e.target.closest(".chip");
    if (!t || t.title) return;
    var c = cells[+t.getAttribute("data-i")];
    t.title = c.id + "\n" + (LABEL[c.st] || c.st) + (c.r != null ? " \u00b7 worst ratio " + fmtRatio(c.r) : "") + (c.ff ? "\n" + c.ff : "");
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
  requestAnimationFrame(function () { setTimeout(function () { window.__renderedAt = performance.now(); }, 0); });
})();
"""
