"""The report as one self-contained HTML page: inline CSS and JavaScript, no
network, light and dark mode. Summary cards, SVG charts (sites by directory
and tier, findings by rule), the findings with their related locations, and
a sortable, filterable, virtualised table of every site.

The sites travel as compact JSON (strings interned once, a row is a list),
so a 50k-site tree stays a few MB. Deterministic: no timestamps."""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from importlib import resources
from typing import Any

from .. import __version__
from ..model import TIER_ORDER, Severity, Site, SiteKind, Tier
from ..ratchet.keys import site_key
from . import charts, summary
from .context import ReportContext
from .sizes import human
from .words import plural


def _asset(name: str) -> str:
    return resources.files("alloc_audit.report").joinpath("assets", name).read_text(encoding="utf-8")


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.values: list[str] = []

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.values)
            self.values.append(text)
        return found


def site_data(ctx: ReportContext, known: dict[int, int]) -> dict[str, Any]:
    strings = _Strings()
    covered = ctx.allowlist.covered_keys if ctx.allowlist is not None else None
    rows = []
    for s in ctx.result.sites:
        if s.kind is SiteKind.RELEASE:
            continue
        allow = -1 if covered is None or s.via is not None else int(site_key(s) in covered)
        via = strings(f"{s.via.api} ({s.via.path}:{s.via.line})") if s.via is not None else -1
        rows.append([strings(s.path), s.span.line, strings(s.scope), strings(s.api), strings(s.kind.value),
                     strings(s.tier.value), known.get(id(s)), strings(s.tier_reason), allow, via])
    return {
        "strings": strings.values,
        "sites": rows,
        "tierOrder": {t.value: i for i, t in enumerate(TIER_ORDER)},
    }


def _json_script(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render(ctx: ReportContext) -> str:
    known = summary.sizes(ctx)
    sites = summary.counted(ctx.result.sites)
    groups = summary.rule_groups(ctx)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="color-scheme" content="light dark">',
        f"<title>alloc-audit report — {escape(ctx.root_display)}</title>",
        f"<style>{_asset('report.css')}</style>",
        "</head>",
        "<body>",
        "<main>",
        _header(ctx),
        _cards(ctx, sites, known, groups),
        _charts(ctx, known, groups),
        _next(ctx, known),
        _findings(groups),
        _table(ctx),
        _problems(ctx),
        "</main>",
        f'<script type="application/json" id="alloc-data">{_json_script(site_data(ctx, known))}</script>',
        f"<script>{_asset('report.js')}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def _header(ctx: ReportContext) -> str:
    s = ctx.result.stats
    errors = f", {s.parse_errors} with parse errors" if s.parse_errors else ""
    files = f"{s.files} file" + ("" if s.files == 1 else "s")
    return ("<header><h1>alloc-audit report</h1>"
            f'<span class="meta">root <code>{escape(ctx.root_display)}</code> · {files}, {s.parsed} '
            f"analysed{errors} · alloc-audit {escape(__version__)}</span>"
            '<button id="theme" type="button" title="Switch light/dark">◐ theme</button></header>')


def _card(number: str, label: str, css: str = "") -> str:
    return f'<div class="card {css}"><div class="n">{escape(number)}</div><div class="l">{escape(label)}</div></div>'


def _cards(ctx: ReportContext, sites: list[Any], known: dict[int, int], groups: list[summary.RuleGroup]) -> str:
    errors = sum(len(g.findings) for g in groups if g.severity is Severity.ERROR)
    warnings = sum(len(g.findings) for g in groups if g.severity is not Severity.ERROR)
    unknown = sum(1 for s in sites if s.tier is Tier.UNKNOWN)
    cards = [
        _card(str(len(sites)), "allocation sites"),
        _card(str(len(summary.derived(ctx.result.sites))), "derived sites (factory calls)"),
        _card(str(errors), "error findings", "bad" if errors else "good"),
        _card(str(warnings), "warning findings", "warn" if warnings else "good"),
        _card(str(unknown), "sites of unknown tier", "warn" if unknown else "good"),
    ]
    sized = [known[id(s)] for s in sites if id(s) in known]
    if sized:
        prefix = "" if len(sized) == len(sites) else "≥ "
        cards.append(_card(prefix + human(sum(sized)), f"estimated bytes ({len(sized)} of {len(sites)} sized)"))
    status = summary.allowlist_status(ctx)
    if status is not None:
        if status.clean:
            cards.append(_card(str(status.entries), "allowlist entries, clean", "good"))
        else:
            cards.append(_card(f"{status.new} new / {status.stale} stale",
                               f"allowlist ({plural(status.entries, 'entry', 'entries')})",
                               "bad"))
    legend = "".join(f'<span><i class="t-{t.value}"></i>{escape(summary.tier_label(t))} '
                     f'{sum(1 for s in sites if s.tier is t)}</span>' for t in TIER_ORDER)
    return f'<section class="cards">{"".join(cards)}</section><div class="legend">{legend}</div>'


def _charts(ctx: ReportContext, known: dict[int, int], groups: list[summary.RuleGroup]) -> str:
    rows = summary.pivot(ctx, "dir", known)
    which = f"top 15 of {len(rows)}" if len(rows) > 15 else f"{len(rows)} director{'y' if len(rows) == 1 else 'ies'}"
    return ('<h2>Where the sites are</h2><div class="charts">'
            f'<figure id="chart-dirs"><figcaption>Sites by directory and tier ({which})</figcaption>'
            f'{charts.stacked_tiers(rows, "directories")}</figure>'
            f'<figure id="chart-rules"><figcaption>Findings by rule (grey: suppressed)</figcaption>'
            f"{charts.rule_bars(groups)}</figure></div>")


def _next(ctx: ReportContext, known: dict[int, int]) -> str:
    actions = summary.next_actions(ctx, known)
    if not actions:
        return ""
    items = "".join(f"<li>{_inline_code(a)}</li>" for a in actions)
    return f'<h2>Next steps</h2><ol class="next">{items}</ol>'


def _inline_code(text: str) -> str:
    """Escape, and render `backticks` as code."""
    pieces = escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def _findings(groups: list[summary.RuleGroup]) -> str:
    if not groups:
        return '<h2>Findings</h2><p class="empty">No findings.</p>'
    out = ['<h2>Findings</h2><section id="findings">']
    for g in groups:
        total = len(g.findings)
        sup = f", {g.suppressed} suppressed" if g.suppressed else ""
        opened = " open" if g.severity is Severity.ERROR else ""
        out.append(f'<details class="rule" data-rule="{escape(g.rule)}"{opened}>'
                   f'<summary><span class="sev-{g.severity.value}">{escape(g.rule)}</span> — {total} open{sup} · '
                   f"{escape(g.summary)}</summary>")
        for f in g.findings:
            related = "".join(f"<li><code>{escape(r.path)}:{r.line}</code> {_inline_code(r.note)}</li>"
                              for r in f.related)
            badge = "" if f.role == "production" else f' <span class="role">{escape(f.role)}</span>'
            level = "" if f.severity is g.severity else \
                f' <span class="sev-{f.severity.value}">{f.severity.value}</span>'
            out.append(f'<div class="finding"><code>{escape(f.path)}:{f.line}</code> in <code>{escape(f.scope)}</code>'
                       f'{level}{badge}<div class="msg">{_inline_code(f.message)}</div>'
                       + (f"<ul>{related}</ul>" if related else "") + "</div>")
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


# Column widths follow the content. The short columns (kind, tier, bytes,
# allowlisted) get the pixels their longest value needs; the rest is shared
# by location, scope, api and reason in proportion to their typical (90th
# percentile) cell in characters, within bounds (a path or scope is worth
# showing whole, a long reason may wrap onto a few lines). Cells wrap rather
# than clip.
_FIXED_PX = {"kind": 96, "tier": 76, "bytes": 88, "allowlisted": 104}
_SHARED_BOUNDS = {"location": (12, 72), "scope": (8, 48), "api": (6, 40), "reason": (10, 90)}


def column_widths(sites: Sequence[Site]) -> list[tuple[str, str]]:
    """Each column's width as an attribute: ``data-px`` for the short ones,
    ``data-share`` of what is left for the others (report.js turns shares
    into pixels for the table's width: Chromium treats ``calc()`` with a
    percentage on a table column as auto), with a percentage as the width
    until then."""
    def typical(lengths: list[int]) -> int:
        """The 90th-percentile cell: a few outliers wrap, the rest fit."""
        ordered = sorted(lengths)
        return ordered[int(0.9 * (len(ordered) - 1))] if ordered else 0

    longest = {
        "location": typical([len(s.path) + 1 + len(str(s.span.line)) for s in sites]),
        "scope": typical([len(s.scope) for s in sites]),
        # a derived site shows "api via factory (path:line)"; its path may wrap
        "api": typical([len(s.api) + (len(s.via.api) + 5 if s.via else 0) for s in sites]),
        "reason": typical([len(s.tier_reason) for s in sites]),
    }
    # monospace columns take a little more room per character than the reason's proportional font;
    # (the api column's minimum below already holds a typical name: its share is for the derived sites' "via")
    scale = {"location": 1.3, "scope": 1.3, "api": 0.4, "reason": 1.0}
    weight = {k: min(max(longest[k], lo), hi) * scale[k] for k, (lo, hi) in _SHARED_BOUNDS.items()}
    total = sum(weight.values())
    reference = 1232 - sum(_FIXED_PX.values())  # the table at a 1,280 px window, for the first paint
    # an api name is not broken inside: its column is at least as wide as the typical name
    minimum = {"api": round(7.6 * min(typical([len(s.api) for s in sites]) + 1, 28)) + 16}
    attrs = {k: f'data-share="{w / total:.4f}" data-min="{minimum.get(k, 0)}" '
                f'style="width:{100 * w / total * reference / 1232:.1f}%"' for k, w in weight.items()}
    attrs.update({k: f'data-px="{px}" style="width:{px}px"' for k, px in _FIXED_PX.items()})
    order = ("location", "scope", "api", "kind", "tier", "bytes", "reason", "allowlisted")
    return [(k, attrs[k]) for k in order]


def _table(ctx: ReportContext) -> str:
    tiers = "".join(f'<option value="{t.value}">{escape(summary.tier_label(t))}</option>' for t in TIER_ORDER)
    kinds = "".join(f'<option value="{k.value}">{k.value}</option>' for k in SiteKind if k is not SiteKind.RELEASE)
    allow = ('<select id="f-allow" aria-label="allowlisted"><option value="">allowlisted: any</option>'
             '<option value="yes">allowlisted</option><option value="no">not allowlisted</option></select>'
             if ctx.allowlist is not None else '<select id="f-allow" hidden><option value=""></option></select>')
    head = "".join(f'<th data-key="{k}" {attrs} title="sort by {k}">{k}</th>'
                   for k, attrs in column_widths(ctx.result.sites))
    return ('<h2>Every site</h2>'
            '<div class="filters"><input id="f-text" type="search" placeholder="filter: path, scope, api, reason…" '
            'aria-label="filter sites">'
            f'<select id="f-tier" aria-label="tier"><option value="">tier: any</option>{tiers}</select>'
            f'<select id="f-kind" aria-label="kind"><option value="">kind: any</option>{kinds}</select>'
            f'{allow}<span id="site-count" class="count"></span></div>'
            f'<div id="site-box" class="vt"><table id="site-table"><thead><tr>{head}</tr></thead>'
            '<tbody id="site-rows"></tbody></table></div>')


def _problems(ctx: ReportContext) -> str:
    if not ctx.result.errors:
        return ""
    items = "".join(f"<li><code>{escape(e.path)}</code>: {escape(e.message)}</li>" for e in ctx.result.errors)
    return f"<h2>Files with problems ({len(ctx.result.errors)})</h2><ul>{items}</ul>"
