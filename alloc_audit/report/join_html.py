"""``alloc-audit join`` as one self-contained HTML page: inline CSS, inline
SVG and a few lines of inline JavaScript (sorting), no network. Summary
cards, bytes per tier as bars, a timeline of live bytes per tier (one line
per tier over the replayed trace), the joined bytes per site, the implicit
allocation points, the runtime findings and the reconciliation footer.
Deterministic: no timestamps."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from .. import __version__
from ..runtime.results import Join
from .join_json import tier_label
from .join_text import findings_sorted, headline, reached, reconcile, unreached
from .sizes import human

if TYPE_CHECKING:
    from ..commands.join import JoinOutcome

COLORS = {"T1": "#3b6fd4", "T2": "#2a9d8f", "T3": "#8a5cd1", "T4": "#e76f51", "T5a": "#e9c46a", "T5b": "#c9a227",
          "unknown": "#888888", "implicit": "#d1495b", "unattributed": "#555555"}

CSS = """
:root { color-scheme: light dark; --fg: #1d2330; --bg: #ffffff; --muted: #5d6675; --line: #d9dde3; --card: #f5f7fa; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6e8eb; --bg: #15181d; --muted: #9aa3ad; --line: #333a44; --card: #1e232a; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 0 auto;
       max-width: 1200px; padding: 24px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; margin-top: 22px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
        min-width: 150px; }
.card b { display: block; font-size: 20px; }
.muted { color: var(--muted); }
table { border-collapse: collapse; width: 100%; margin-top: 8px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { cursor: pointer; user-select: none; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: inline-block; height: 10px; border-radius: 2px; vertical-align: middle; }
.disagrees { color: #d1495b; font-weight: 600; }
svg text { fill: var(--fg); font-size: 11px; }
svg .axis { stroke: var(--line); }
code { font-size: 12px; }
"""

SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var desc = th.getAttribute('aria-sort') !== 'descending';
      table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', desc ? 'descending' : 'ascending');
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return desc ? -c : c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
document.documentElement.dataset.ready = '1';
"""


def _cell(text: str, value: object = None, cls: str = "") -> str:
    v = escape(str(text if value is None else value), quote=True)
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-v="{v}">{escape(str(text))}</td>'


def tier_bars(j: Join) -> str:
    if not j.tiers:
        return ""
    top = max(max(live, peak) for _, live, peak in j.tiers) or 1
    width, row = 640, 26
    parts = [f'<svg id="tier-bars" role="img" aria-label="bytes per tier" width="{width}" '
             f'height="{row * len(j.tiers) + 10}" viewBox="0 0 {width} {row * len(j.tiers) + 10}">']
    for i, (t, live, peak) in enumerate(j.tiers):
        y = 5 + i * row
        w_live = 360 * live / top
        w_peak = 360 * peak / top
        color = COLORS.get(t, "#888")
        label = f"{t} {tier_label(t)}" if t != tier_label(t) else t
        parts.append(f'<text x="0" y="{y + 14}">{escape(label)}</text>')
        parts.append(f'<rect class="peak" x="150" y="{y + 2}" width="{w_peak:.1f}" height="16" fill="{color}" '
                     f'opacity="0.3"><title>peak {human(peak)}</title></rect>')
        parts.append(f'<rect class="bar" data-tier="{escape(t)}" x="150" y="{y + 2}" width="{w_live:.1f}" height="16" '
                     f'fill="{color}"><title>{escape(t)}: {human(live)} live, peak {human(peak)}</title></rect>')
        parts.append(f'<text x="{150 + max(w_live, w_peak) + 6:.1f}" y="{y + 14}">{human(live)} '
                     f'(peak {human(peak)})</text>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(j: Join) -> str:
    if not j.timeline:
        return '<p class="muted">No trace events: the snapshot was recorded without history.</p>'
    width, height, left, bottom = 900, 260, 70, 24
    tiers = [t for t, _, _ in j.tiers]
    t_max = max(t for t, _ in j.timeline) or 1
    y_max = max(max(v) for _, v in j.timeline if v) or 1
    parts = [f'<svg id="timeline" role="img" aria-label="live bytes per tier over time" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}">',
             f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width}" y2="{height - bottom}"/>',
             f'<line class="axis" x1="{left}" y1="0" x2="{left}" y2="{height - bottom}"/>',
             f'<text x="0" y="12">{human(y_max)}</text><text x="0" y="{height - bottom}">0</text>',
             f'<text x="{width - 120}" y="{height - 6}">{t_max / 1e6:.3f} s</text>']
    for k, t in enumerate(tiers):
        points = []
        for time, values in j.timeline:
            x = left + (width - left - 10) * time / t_max
            y = (height - bottom) - (height - bottom - 8) * values[k] / y_max
            points.append(f"{x:.1f},{y:.1f}")
        parts.append(f'<polyline class="series" data-tier="{escape(t)}" fill="none" stroke-width="2" '
                     f'stroke="{COLORS.get(t, "#888")}" points="{" ".join(points)}">'
                     f'<title>{escape(t)}</title></polyline>')
    legend = " ".join(f'<span><span class="bar" style="width:12px;background:{COLORS.get(t, "#888")}"></span> '
                      f'{escape(t)}</span>' for t in tiers)
    parts.append("</svg>")
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def section(j: Join, what: str, outcome: JoinOutcome) -> str:
    head = headline(j, what, outcome.min_accounted if what[0] == "s" else None)
    implicit = sum(p.usage.live_bytes for p in j.implicit)
    out = [f"<h2>{escape(head[0][0].upper() + head[0][1:])}</h2>",
           '<div class="cards">',
           f'<div class="card"><span class="muted">live at snapshot</span><b>{human(j.live)}</b></div>',
           f'<div class="card"><span class="muted">accounted to sites</span><b id="accounted-share-{what[0]}">'
           f'{j.accounted_share:.1f}%</b></div>',
           f'<div class="card"><span class="muted">implicit points</span><b>{human(implicit)}</b></div>']
    if j.source == "snapshot":
        out.append(f'<div class="card"><span class="muted">reserved</span><b>{human(j.reserved)}</b></div>')
    out.append("</div>")
    out += [f'<p class="muted">{escape(line)}</p>' for line in head[1:]]
    out += ["<h3>Bytes per tier</h3>", tier_bars(j)]
    if j.source == "snapshot":
        out += ["<h3>Live bytes per tier over time</h3>", timeline_svg(j)]
    rows = reached(j)
    top = max((s.usage.live_bytes for s in rows), default=0) or 1
    out += ["<h3>Joined bytes per site</h3>", f'<table class="sortable" id="sites-{what[0]}"><thead><tr>',
            "".join(f'<th class="{"num" if c in ("live", "peak", "allocs", "churn/step", "in capture") else ""}">'
                    f"{c}</th>" for c in ("site", "api", "tier", "match", "live", "peak", "allocs", "churn/step",
                                          "in capture", "observed", "verdict")),
            "</tr></thead><tbody>"]
    for s in rows:
        u = s.usage
        bar = (f'<span class="bar" style="width:{max(1, int(80 * u.live_bytes / top))}px;'
               f'background:{COLORS.get(s.site.tier.value, "#888")}"></span> ') if u.live_bytes else ""
        out.append("<tr>" + _cell(f"{s.site.path}:{s.site.span.line}") + _cell(s.site.api) + _cell(s.site.tier.value)
                   + _cell(s.how or "-")
                   + f'<td class="num" data-v="{u.live_bytes}">{bar}{human(u.live_bytes)}</td>'
                   + _cell(human(u.peak_bytes), u.peak_bytes, "num") + _cell(str(u.allocs), u.allocs, "num")
                   + _cell("-" if u.churn_per_step is None else f"{u.churn_per_step:g}", u.churn_per_step or 0, "num")
                   + _cell(human(u.capture_bytes) if u.capture_bytes else "-", u.capture_bytes, "num")
                   + _cell(s.observed) + _cell(s.verdict, cls="disagrees" if s.verdict == "disagrees" else "")
                   + "</tr>")
    out.append("</tbody></table>")
    if j.implicit:
        out += ["<h3>Implicit allocation points (no census site)</h3>", '<table class="sortable"><thead><tr>'
                '<th>line</th><th>function</th><th class="num">live</th><th class="num">peak</th>'
                '<th class="num">allocs</th></tr></thead><tbody>']
        for p in j.implicit[:100]:
            out.append("<tr>" + _cell(f"{p.path}:{p.line}") + _cell(p.function)
                       + _cell(human(p.usage.live_bytes), p.usage.live_bytes, "num")
                       + _cell(human(p.usage.peak_bytes), p.usage.peak_bytes, "num")
                       + _cell(str(p.usage.allocs), p.usage.allocs, "num") + "</tr>")
        out.append("</tbody></table>")
    if j.findings:
        out += ['<h3>Runtime findings</h3><ul class="findings">']
        out += [f'<li data-status="{escape(f.status)}"><b>{escape(f.status)}</b> <code>{escape(f.path)}:{f.line}'
                f"</code> {escape(f.rule)}: {escape(f.message)}</li>" for f in findings_sorted(j)]
        out.append("</ul>")
    missing = unreached(j)
    if missing:
        out += [f"<h3>Not reached by this run ({len(missing)} sites)</h3><ul>"]
        out += [f"<li><code>{escape(s.site.path)}:{s.site.span.line}</code> {escape(s.site.api)} "
                f"{escape(s.site.tier.value)}</li>" for s in missing]
        out.append("</ul>")
    out += ["<h3>Reconciliation</h3><ul>"] + [f"<li>{escape(line)}</li>" for line in reconcile(j)] + ["</ul>"]
    return "\n".join(out)


def render(outcome: JoinOutcome) -> str:
    body = []
    for what, j in (("snapshot(s)", outcome.snapshot), ("native record(s)", outcome.native)):
        if j is not None:
            body.append(section(j, what, outcome))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>alloc-audit join: {escape(outcome.root_display)}</title><style>{CSS}</style></head>\n"
            f"<body><h1>alloc-audit join <span class=\"muted\">{escape(outcome.root_display)}</span></h1>\n"
            + "\n".join(body)
            + f'\n<p class="muted">alloc-audit {__version__}</p><script>{SCRIPT}</script></body></html>\n')
