// alloc-audit HTML report: a sortable, filterable, virtualised table of every
// site (only the rows in view are in the DOM, so 100k sites stay responsive),
// and the light/dark switch. No dependencies, no network.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("alloc-data").textContent);
  var S = D.strings, rows = D.sites, N = rows.length;
  // row: [path, line, scope, api, kind, tier, bytes, reason, allowlisted, via]
  var P = 0, LINE = 1, SCOPE = 2, API = 3, KIND = 4, TIER = 5, BYTES = 6, REASON = 7, ALLOW = 8, VIA = 9;
  var ROW_H = 28, OVERSCAN = 12;
  var box = document.getElementById("site-box");
  var body = document.getElementById("site-rows");
  var count = document.getElementById("site-count");
  var query = document.getElementById("f-text");
  var fTier = document.getElementById("f-tier"), fKind = document.getElementById("f-kind");
  var fAllow = document.getElementById("f-allow");
  var headers = document.querySelectorAll("#site-table thead th");

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  // break opportunities after path and scope separators, so a wrapped cell breaks at a / or a . first
  function brk(s) { return esc(s).replace(/(::|[\/.])/g, "$1<wbr>"); }
  function human(n) {
    if (n === null) return "";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], v = n, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i === 0 ? n + " B" : v.toFixed(1) + " " + units[i];
  }

  var hay = new Array(N);
  for (var i = 0; i < N; i++) {
    var r = rows[i];
    hay[i] = (S[r[P]] + ":" + r[LINE] + " " + S[r[SCOPE]] + " " + S[r[API]] + " " + S[r[REASON]] + " " +
              (r[VIA] >= 0 ? S[r[VIA]] : "")).toLowerCase();
  }

  var KEYS = {
    location: function (r) { return S[r[P]]; },
    scope: function (r) { return S[r[SCOPE]]; },
    api: function (r) { return S[r[API]]; },
    kind: function (r) { return S[r[KIND]]; },
    tier: function (r) { return D.tierOrder[S[r[TIER]]]; },
    bytes: function (r) { return r[BYTES] === null ? -1 : r[BYTES]; },
    reason: function (r) { return S[r[REASON]]; },
    allowlisted: function (r) { return r[ALLOW]; }
  };
  var sortKey = null, sortDir = 1;
  var view = [];

  function compare(a, b) {
    var ra = rows[a], rb = rows[b], ka = KEYS[sortKey](ra), kb = KEYS[sortKey](rb);
    if (ka < kb) return -sortDir;
    if (ka > kb) return sortDir;
    if (sortKey === "location" && ra[LINE] !== rb[LINE]) return (ra[LINE] - rb[LINE]) * sortDir;
    return a - b;
  }

  function apply() {
    var q = query.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    var tier = fTier.value, kind = fKind.value, allow = fAllow.value;
    var out = [];
    for (var i = 0; i < N; i++) {
      var r = rows[i];
      if (tier && S[r[TIER]] !== tier) continue;
      if (kind && S[r[KIND]] !== kind) continue;
      if (allow === "yes" && r[ALLOW] !== 1) continue;
      if (allow === "no" && r[ALLOW] !== 0) continue;
      var h = hay[i], ok = true;
      for (var j = 0; j < q.length; j++) { if (h.indexOf(q[j]) < 0) { ok = false; break; } }
      if (ok) out.push(i);
    }
    if (sortKey) out.sort(compare);
    view = out;
    count.textContent = view.length === N ? N + " sites" : view.length + " of " + N + " sites";
    box.scrollTop = 0;
    draw(false);
  }

  function rowHtml(r, n) {
    var allow = r[ALLOW] === 1 ? '<span class="yes">yes</span>' :
                r[ALLOW] === 0 ? '<span class="no">no</span>' : '<span class="na">–</span>';
    var api = S[r[API]] + (r[VIA] >= 0 ? " via " + S[r[VIA]] : "");
    var loc = S[r[P]] + ":" + r[LINE];
    var tier = S[r[TIER]];
    return '<tr class="' + (n % 2 ? "odd" : "even") + '">' +
      '<td class="mono">' + brk(loc) + "</td>" +
      '<td class="mono">' + brk(S[r[SCOPE]]) + "</td>" +
      '<td class="mono">' + brk(api) + "</td>" +
      "<td>" + esc(S[r[KIND]]) + "</td>" +
      '<td><span class="tier t-' + esc(tier) + '">' + esc(tier) + "</span></td>" +
      '<td class="num">' + human(r[BYTES]) + "</td>" +
      "<td>" + brk(S[r[REASON]]) + "</td>" +
      "<td>" + allow + "</td></tr>";
  }

  // Rows wrap, so their heights differ: each row's height is measured once it
  // has been drawn (until then it counts as ROW_H), and the spacers above and
  // below the drawn rows are the sums of those heights.
  var measured = new Float64Array(N);
  function heightOf(i) { return measured[view[i]] || ROW_H; }
  // column widths: the short columns their pixels, the rest shared by content (html.py column_widths)
  function sizeColumns() {
    var width = document.getElementById("site-table").clientWidth, fixed = 0, floor = 0, shared = [];
    Array.prototype.forEach.call(headers, function (th) {
      fixed += +(th.getAttribute("data-px") || 0);
      if (th.getAttribute("data-share") !== null) shared.push(th);
    });
    // each shared column gets its minimum, then the rest by share
    shared.forEach(function (th) { floor += +(th.getAttribute("data-min") || 0); });
    var rest = Math.max(0, width - fixed - floor);
    shared.forEach(function (th) {
      th.style.width = Math.floor(+(th.getAttribute("data-min") || 0) + rest * +th.getAttribute("data-share")) + "px";
    });
  }
  var drawn = [-1, -1];
  function draw(force) {
    var top = box.scrollTop, h = box.clientHeight || 600;
    var start = 0, y = 0;
    while (start < view.length && y + heightOf(start) < top) { y += heightOf(start); start++; }
    var above = y, end = start;
    while (end < view.length && y < top + h) { y += heightOf(end); end++; }
    for (var k = 0; k < OVERSCAN && start > 0; k++) { start--; above -= heightOf(start); }
    end = Math.min(view.length, end + OVERSCAN);
    if (!force && drawn[0] === start && drawn[1] === end && drawn.view === view) return;
    drawn = [start, end]; drawn.view = view;
    var below = 0;
    for (var j = end; j < view.length; j++) below += heightOf(j);
    var html = ['<tr class="spacer"><td colspan="8" style="height:' + above + 'px"></td></tr>'];
    for (var i = start; i < end; i++) html.push(rowHtml(rows[view[i]], i));
    html.push('<tr class="spacer"><td colspan="8" style="height:' + below + 'px"></td></tr>');
    if (!view.length) html = ['<tr><td colspan="8" class="empty">No site matches these filters.</td></tr>'];
    body.innerHTML = html.join("");
    if (!view.length) return;
    var changed = false, trs = body.rows;
    for (var n = 1; n < trs.length - 1; n++) {
      var hgt = trs[n].getBoundingClientRect().height, idx = view[start + n - 1];
      if (Math.abs(measured[idx] - hgt) > 0.5) { measured[idx] = hgt; changed = true; }
    }
    if (changed) draw(true);  // once more with the true heights (they are now known, so this settles)
  }

  var pending = null;
  box.addEventListener("scroll", function () {
    if (pending === null) pending = requestAnimationFrame(function () { pending = null; draw(false); });
  });
  var timer = null;
  query.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(apply, 120); });
  [fTier, fKind, fAllow].forEach(function (el) { el.addEventListener("change", apply); });
  Array.prototype.forEach.call(headers, function (th) {
    th.addEventListener("click", function () {
      var key = th.getAttribute("data-key");
      sortDir = sortKey === key ? -sortDir : 1;
      sortKey = key;
      Array.prototype.forEach.call(headers, function (o) { o.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      apply();
    });
  });

  var theme = document.getElementById("theme");
  theme.addEventListener("click", function () {
    var root = document.documentElement, now = root.getAttribute("data-theme");
    var dark = now ? now === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
    root.setAttribute("data-theme", dark ? "light" : "dark");
  });
  window.addEventListener("resize", function () { sizeColumns(); measured.fill(0); draw(true); });
  sizeColumns();
  apply();
  document.documentElement.setAttribute("data-ready", "1");
})();
