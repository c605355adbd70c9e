"""Inline SVG charts for the HTML report, drawn here (not in the browser) so
they are deterministic, work without JavaScript and can be tested as text.
Colours come from CSS classes (``t-T2``, ``s-error``), so light and dark
mode restyle them; every bar has a ``<title>`` tooltip."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..model import TIER_ORDER
from . import summary

BAR_H = 18
GAP = 6
LABEL_W = 230
WIDTH = 720
RULE_WIDTH = 480


def _text_fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else "…" + text[-(chars - 1):]


def _frame(height: int, body: list[str], label: str, width: int = WIDTH) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
            f'viewBox="0 0 {width} {height}" width="100%" style="max-width:{round(width * 1.25)}px" '
            'preserveAspectRatio="xMinYMin meet">'
            + "".join(body) + "</svg>")


def _axis(x0: int, y: int, width: int, maximum: int) -> list[str]:
    """Ticks at round numbers along the bottom."""
    if maximum <= 0:
        return []
    step = 1
    for candidate in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000):
        step = candidate
        if maximum / candidate <= 6:
            break
    out = [f'<line class="axis" x1="{x0}" y1="{y}" x2="{x0 + width}" y2="{y}"/>']
    value = 0
    while value <= maximum:
        x = x0 + round(width * value / maximum)
        out.append(f'<line class="axis" x1="{x}" y1="{y}" x2="{x}" y2="{y + 4}"/>'
                   f'<text class="muted" x="{x}" y="{y + 15}" text-anchor="middle">{value}</text>')
        value += step
    return out


def stacked_tiers(rows: Sequence[summary.Row], what: str, limit: int = 15) -> str:
    """Horizontal stacked bars: one per directory (or file), one segment per
    tier, the rest folded into 'other'."""
    shown = list(rows[:limit])
    if len(rows) > limit:
        rest = rows[limit:]
        tiers = tuple(sum(r.tiers[i] for r in rest) for i in range(len(TIER_ORDER)))
        shown.append(summary.Row(f"{len(rest)} other {what}", sum(r.sites for r in rest), tiers,
                                 sum(r.bytes for r in rest), sum(r.sized for r in rest), 0))
    maximum = max((r.sites for r in shown), default=0)
    plot_w = WIDTH - LABEL_W - 60
    height = len(shown) * (BAR_H + GAP) + 28
    body: list[str] = []
    for n, row in enumerate(shown):
        y = n * (BAR_H + GAP) + 4
        body.append(f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 5}" text-anchor="end">'
                    f'<title>{escape(row.name)}</title>{escape(_text_fit(row.name, 36))}</text>')
        x = float(LABEL_W)
        for tier, count in zip(TIER_ORDER, row.tiers):
            if not count:
                continue
            w = plot_w * count / maximum
            body.append(f'<rect class="bar t-{tier.value}" x="{x:.1f}" y="{y}" width="{max(w, 1):.1f}" '
                        f'height="{BAR_H}" rx="2"><title>{escape(row.name)}: {count} {tier.value} '
                        f'({escape(summary.tier_label(tier))})</title></rect>')
            x += w
        body.append(f'<text class="muted" x="{x + 6:.1f}" y="{y + BAR_H - 5}">{row.sites}</text>')
    body += _axis(LABEL_W, len(shown) * (BAR_H + GAP) + 6, plot_w, maximum)
    return _frame(height, body, f"Allocation sites by {what} and tier")


def rule_bars(groups: Sequence[summary.RuleGroup]) -> str:
    """One bar per rule: open findings (red for errors, amber for warnings),
    then the suppressed ones in grey."""
    maximum = max((len(g.findings) + g.suppressed for g in groups), default=0)
    width = RULE_WIDTH
    label_w = 190
    plot_w = width - label_w - 50
    height = max(len(groups), 1) * (BAR_H + GAP) + 28
    body: list[str] = []
    if not groups:
        body.append(f'<text class="muted" x="{label_w}" y="{BAR_H}">no findings</text>')
    for n, g in enumerate(groups):
        y = n * (BAR_H + GAP) + 4
        body.append(f'<text x="{label_w - 8}" y="{y + BAR_H - 5}" text-anchor="end">{escape(g.rule)}</text>')
        x = float(label_w)
        for count, css, what in ((len(g.findings), f"s-{g.severity.value}", f"open {g.severity.value}s"),
                                 (g.suppressed, "s-suppressed", "suppressed")):
            if not count:
                continue
            w = plot_w * count / maximum
            body.append(f'<rect class="bar {css}" x="{x:.1f}" y="{y}" width="{max(w, 1):.1f}" height="{BAR_H}" '
                        f'rx="2"><title>{escape(g.rule)}: {count} {what}</title></rect>')
            x += w
        body.append(f'<text class="muted" x="{x + 6:.1f}" y="{y + BAR_H - 5}">{len(g.findings)}'
                    f'{f" (+{g.suppressed})" if g.suppressed else ""}</text>')
    body += _axis(label_w, max(len(groups), 1) * (BAR_H + GAP) + 6, plot_w, maximum)
    return _frame(height, body, "Findings by rule", width)
