(function () {
  "use strict";
  var t0 = performance.now(), T = window.__timings = {script_start_ms: t0};

  // The data blobs are gzip-compressed JSON in base64 (reports/_pack.py: encode); the browser's
  // own DecompressionStream inflates them.
  function inflate(id) {
    var el = document.getElementById(id);
    if (!el) return Promise.resolve(null);
    var bin = atob(el.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var k = 0; k < bin.length; k++) bytes[k] = bin.charCodeAt(k);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }
  function whenParsed(fn) {  // the detail blob follows this script: wait for the parser to pass it
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn); else fn();
  }
  inflate("dw-data").then(function (D) {
    T.parse_ms = performance.now() - t0;
    main(D);
  }).catch(function (e) {
    document.getElementById("grid").innerHTML = "<tbody><tr><td>cannot decode the report data: " + String(e) + "</td></tr></tbody>";
    throw e;
  });

function main(D) {
  var S = D.S, ST = D.statuses, AX = D.axes, KINDS = D.kinds, LEVELS = D.levels, N = D.n;
  var LE = D.le || [], KN = D.kn || {};  // ledger entries [id, upstream, title, stale]; known cells
  // the status vocabulary comes from the record's data (harness/vocabulary/status.py), never restated here
  var SEV = [], LABEL = {}, GLYPH = {}, BAD = {};
  D.vocab.slice().sort(function (a, b) { return a.severity - b.severity; }).forEach(function (s) { SEV.push(s.name); });
  D.vocab.forEach(function (s) { LABEL[s.name] = s.label; GLYPH[s.name] = s.glyph; if (s.bad) BAD[s.name] = 1; });
  var ABBR = {world_size: "ws", microbatches: "mb", num_gemms: "g"};
  var MARK = "\u0001";
  var axPos = {};
  AX.forEach(function (a, i) { axPos[a[0]] = i; });

  // ---------------------------------------------------------------- cells (the summary blob)
  var cells = new Array(N), byId = null;
  (function () {
    var nAx = AX.length, AXS = D.ax, STS = D.st, FF = D.ff, RR = D.r, pos = 0;
    for (var i = 0; i < N; i++) {
      var ax = new Array(nAx);
      for (var p = 0; p < nAx; p++, pos++) ax[p] = AXS[pos];
      var ff = FF[i];
      cells[i] = {i: i, st: ST[STS[i]], ax: ax, r: RR[i], ff: ff === undefined ? null : S[ff], kn: KN[i] || null};
    }
  })();
  function idOf(i) { return D.id[i]; }
  function indexOfId(id) {
    if (!byId) { byId = {}; for (var i = 0; i < N; i++) byId[idOf(i)] = i; }
    return byId.hasOwnProperty(id) ? byId[id] : -1;
  }
  function reproOf(c) {
    var t = D.rpx[c.i];
    if (t === undefined) t = D.rp;
    return t == null ? "" : String(S[t]).split(MARK).join(idOf(c.i));
  }

  // ---------------------------------------------------------------- details (the detail blob, decoded lazily)
  var DD = null, DDp = null;
  function detailData() {  // a promise of the detail blob, decoded once
    if (!DDp) DDp = new Promise(function (resolve) { whenParsed(resolve); }).then(function () {
      var t = performance.now();
      return inflate("dw-detail").then(function (d) {
        DD = d || {S: [], c: []};
        T.detail_parse_ms = performance.now() - t;
        return DD;
      });
    });
    return DDp;
  }
  function detailOf(c) {
    var a = DD.c[c.i] || [], raw = a[3] || [], ranks = [], byRank = {};
    if (typeof raw === "number") { for (var r = 0; r < raw; r++) ranks.push({rank: r, st: c.st, err: 0, checks: []}); }
    else raw.forEach(function (g) { ranks.push({rank: g[0], st: DD.S[g[1]], err: g[2], checks: g[3].slice()}); });
    ranks.forEach(function (g) { byRank[g.rank] = g; });
    (a[6] || []).forEach(function (x) { if (byRank[x[0]]) byRank[x[0]].checks.push(x.slice(1)); });
    return {dur: a[0] || 0, xp: !!a[1], ex: a[2] || null, ranks: ranks, lvl: a[4] ? LEVELS[a[4]] : null, drop: a[5] || 0,
            pe: a[7] ? JSON.parse(DD.S[a[7][0]]) : null};
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
  var query = "", entryOn = -1;  // entryOn: the ledger entry whose known cells alone are shown
  function visible(c) {
    if (!stOn[c.st]) return false;
    if (entryOn >= 0 && !(c.kn && c.kn.indexOf(entryOn, 1) > 0)) return false;
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
          (window.requestIdleCallback || function (f) { setTimeout(f, 50); })(function () { detailData(); });
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
    h.push('<span class="tog" id="entry-on" hidden title="show every cell again"></span>');
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
      if (t.id === "entry-on") { showEntry(-1); return; }
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

  function showEntry(k) {  // grid filter: the cells ledger entry k makes known (-1: off)
    entryOn = k;
    var t = document.getElementById("entry-on");
    t.hidden = k < 0;
    t.innerHTML = k < 0 ? "" : "ledger entry " + esc(LE[k][0]) + " \u00d7";
    applyFilters();
    if (k >= 0) document.getElementById("matrix").scrollIntoView({block: "start"});
  }
  function knownBlock(c) {  // a known cell: the backend's verdict and the entries that explain it
    var h = ['<div class="known"><b>' + esc(LABEL.known || "known") + "</b>: the backend's verdict is " +
             '<span class="badge ' + sclass(c.kn[0]) + '">' + esc(LABEL[c.kn[0]] || c.kn[0]) + "</span>; every failure " +
             "below is explained by the ledger:<ul>"];
    c.kn.slice(1).forEach(function (k) {
      var e = LE[k];
      h.push('<li><a class="mono" href="#ledger-' + esc(e[0]) + '">' + esc(e[0]) + "</a>" +
             (e[1] ? " (" + esc(e[1]) + ")" : "") + (e[2] ? " \u2014 " + esc(e[2]) : "") + "</li>");
    });
    return h.join("") + "</ul></div>";
  }

  var PATHS = {split_quantize: "split-quantize", grouped_tensor: "grouped-tensor"};
  function pathBlock(pe) {  // the path evidence: TE's recorded choice, its reason and inputs, the kernels called
    var h = ['<div class="path">'], ch = pe.choice, k = pe.kernels;
    if (ch) {
      var flags = Object.keys(ch.flags || {}).map(function (f) { return f + "=" + JSON.stringify(ch.flags[f]); });
      h.push("<div>TE took the <b>" + esc(PATHS[ch.path] || ch.path) + '</b> path <span class="muted">(rank ' + pe.rank +
             ", recorded on " + esc(ch.node) + ")</span></div>");
      if (ch.reason) h.push('<div class="why">' + esc(ch.reason) + "</div>");
      if (flags.length) h.push('<div class="pk"><em>ctx</em> ' + esc(flags.join(" \u00b7 ")) + "</div>");
      var inp = ch.inputs || {}, shown = Object.keys(inp).map(function (f) {
        var v = inp[f];
        if (f === "cublaslt" && typeof v === "number") v = Math.floor(v / 10000) + "." + Math.floor(v / 100) % 100 + "." + v % 100;
        return f + "=" + (typeof v === "string" ? v : JSON.stringify(v));
      });
      if (shown.length) h.push('<div class="pk"><em>TE saw</em> ' + esc(shown.join(" \u00b7 ")) + "</div>");
    } else {
      h.push('<div class="muted">TE recorded no path choice for this cell\'s module.</div>');
    }
    if (k) {
      var names = Object.keys(k).sort().map(function (n) { return n + " \u00d7" + k[n]; });
      h.push('<div class="pk"><em>kernels</em> ' + esc(names.join(" \u00b7 ") || "none") + "</div>");
    }
    return h.join("") + "</div>";
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
      var a = x.c, kind = typeof a[1] === "number" ? KINDS[a[1]] : String(a[1]), ok = !!a[2], msg = null, t = [];
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
    var DS = DD.S, h = '<div class="exc"><div class="et">' + esc(DS[e[0]]) + ": " + esc(DS[e[1]]) +
      (e[3] != null ? ' <span class="muted">(raised in the backend\'s ' + esc(DS[e[3]]) + ")</span>" : "") + "</div>";
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
    if (c.kn) h.push(knownBlock(c));
    var why = d.pe && d.pe.choice && d.pe.choice.reason;  // a path not taken: the path block says why
    if (c.ff && !(why && c.ff.indexOf(why) >= 0)) h.push('<div class="ff">' + esc(c.ff) + "</div>");
    if (d.pe) h.push("<h3>Path</h3>" + pathBlock(d.pe));
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
    detailData().then(function () {
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
    t.title = idOf(c.i) + "\n" + (LABEL[c.st] || c.st) + (c.r != null ? " \u00b7 worst ratio " + fmtRatio(c.r) : "") +
      (c.kn ? "\n" + c.kn.slice(1).map(function (k) { return LE[k][0] + (LE[k][1] ? " (" + LE[k][1] + ")" : ""); }).join(", ") : "") +
      (c.ff ? "\n" + c.ff : "");
  });
  window.addEventListener("hashchange", fromHash);
  document.addEventListener("keydown", function (e) { if (e.key === "Escape" && !detail.hidden) close(); });
  document.addEventListener("click", function (e) {
    if (e.target.id === "dclose") { close(); return; }
    var en = e.target.closest("button[data-entry]");
    if (en) {
      var id = en.getAttribute("data-entry");
      showEntry(LE.findIndex(function (x) { return x[0] === id; }));
      return;
    }
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
}
})();
