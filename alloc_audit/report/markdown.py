"""The report as GitHub-flavoured Markdown, for a PR comment or a CI job
summary (``$GITHUB_STEP_SUMMARY``): compact tables first, long lists folded
into ``<details>``. Deterministic (no timings), so it can be diffed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from .. import __version__
from ..model import TIER_ORDER, Finding, Severity, Site, SiteKind
from ..ratchet.delta import Delta
from . import summary
from .context import ReportContext

FOLD = 10  # rows shown before the rest is folded into <details>


def cell(text: str) -> str:
    """Text safe inside a table cell: no pipes, no raw HTML, one line."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\r", " ").replace("\n", " "))


def code(text: str) -> str:
    """An inline code span that survives backticks and pipes in ``text``."""
    text = text.replace("|", "\\|").replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("--:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def details(summary_text: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary_text}</summary>", "", *body, "", "</details>", ""]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _bytes(total: int, sized: int, of: int) -> str:
    return summary.bytes_text(total, sized, of, fraction=True)


def render(ctx: ReportContext) -> str:
    known = summary.sizes(ctx)
    sites = summary.counted(ctx.result.sites)
    out: list[str] = ["## alloc-audit report", ""]
    out += _headline(ctx, sites)
    if ctx.base is not None:
        out += _delta(ctx.base)
    if sites:
        out += _totals(ctx, sites, known)
    out += _hazards(ctx)
    if sites:
        by = ctx.pivot if ctx.pivot in ("dir", "file", "api") else "dir"
        out += _pivot(ctx, by, known)
    status = summary.allowlist_status(ctx)
    if status is not None:
        out += _allowlist(ctx, status)
    if ctx.result.errors:
        body = [f"- {code(e.path)}: {cell(e.message)}" for e in ctx.result.errors]
        out += details(f"{_plural(len(ctx.result.errors), 'file')} with problems", body)
    actions = summary.next_actions(ctx, known)
    if actions:
        out += ["### Next steps", ""]
        out += [f"{i}. {cell(a)}" for i, a in enumerate(actions, 1)]
        out.append("")
    out.append(f"<sub>alloc-audit {__version__} · root {code(ctx.root_display)} · "
               f"{_plural(ctx.result.stats.files, 'file')}, {ctx.result.stats.parsed} analysed</sub>")
    return "\n".join(out) + "\n"


def _headline(ctx: ReportContext, sites: list[Site]) -> list[str]:
    open_ = [f for f in ctx.result.findings if not f.suppressed]
    errors = sum(1 for f in open_ if f.severity is Severity.ERROR)
    derived = len(summary.derived(ctx.result.sites))
    files = len({s.path for s in sites})
    parts = [f"**{_plural(len(sites), 'allocation site')}**" + (f" (+{derived} derived)" if derived else "")
             + f" in {_plural(files, 'file')}",
             f"**{_plural(len(open_), 'finding')}** ({_plural(errors, 'error')}, "
             f"{_plural(len(open_) - errors, 'warning')})"]
    status = summary.allowlist_status(ctx)
    if status is not None:
        parts.append("allowlist **clean**" if status.clean else
                     f"allowlist **out of date** ({status.new} new, {status.grown} grown, {status.stale} stale)")
    return [" · ".join(parts), ""]


def _delta(delta: Delta) -> list[str]:
    out = [f"### Change against {code(delta.ref)} ({delta.commit[:10]})", ""]
    if delta.empty:
        return out + ["No sites added or removed, no findings new or fixed.", ""]
    rows = [[summary.tier_label(t), f"+{a}" if a else "", f"−{r}" if r else ""] for t, a, r in delta.by_tier()]
    if rows:
        net = len(delta.added) - len(delta.removed)
        rows.append(["**total**", f"**+{len(delta.added)}**", f"**−{len(delta.removed)}**"])
        out += table(["tier", "added", "removed"], rows, [False, True, True])
        out += ["", f"{_plural(delta.base_sites, 'site')} at the base, {delta.base_sites + net} now.", ""]
    out.append(f"Findings: **{len(delta.new_findings)} new**, {len(delta.fixed_findings)} fixed.")
    out.append("")
    if delta.added:
        out += details(f"Added sites ({len(delta.added)})", _site_rows(delta.added))
    if delta.removed:
        out += details(f"Removed sites ({len(delta.removed)})", _site_rows(delta.removed))
    if delta.new_findings:
        out += details(f"New findings ({len(delta.new_findings)})", _finding_items(delta.new_findings))
    if delta.fixed_findings:
        out += details(f"Fixed findings ({len(delta.fixed_findings)})", _finding_items(delta.fixed_findings))
    return out


def _site_rows(sites: Iterable[Site]) -> list[str]:
    return table(["location", "api", "kind", "tier", "scope"],
                 ([code(f"{s.path}:{s.span.line}"), code(s.api), s.kind.value, s.tier.value, cell(s.scope)]
                  for s in sites),
                 [False] * 5)


def _totals(ctx: ReportContext, sites: list[Site], known: dict[int, int]) -> list[str]:
    kinds, counts = summary.tier_kind_counts(sites)
    derived = Counter(s.tier for s in summary.derived(ctx.result.sites))
    sized = summary.tier_bytes(sites, known)
    per_tier = Counter(s.tier for s in sites)
    header = ["tier", *[k.value for k in kinds], "sites", "derived"] + (["est. bytes"] if sized else [])
    rows = []
    for tier in TIER_ORDER:
        if not per_tier[tier] and not derived[tier]:
            continue
        row = [summary.tier_label(tier), *[str(counts.get((tier, k), "")) for k in kinds],
               f"**{per_tier[tier]}**", str(derived[tier] or "")]
        if sized:
            row.append(_bytes(*sized.get(tier, (0, 0)), per_tier[tier]))
        rows.append(row)
    total = ["**total**", *[str(sum(v for (_, k), v in counts.items() if k is kind)) for kind in kinds],
             f"**{len(sites)}**", str(sum(derived.values()) or "")]
    if sized:
        total.append(_bytes(sum(t for t, _ in sized.values()), sum(n for _, n in sized.values()), len(sites)))
    rows.append(total)
    out = ["### Sites by tier and kind", ""]
    out += table(header, rows, [False] + [True] * (len(header) - 1))
    releases = sum(1 for s in ctx.result.sites if s.kind is SiteKind.RELEASE)
    if releases:
        out += ["", f"<sub>{_plural(releases, 'native release site')} (cudaFree & co.) not counted.</sub>"]
    return out + [""]


def _hazards(ctx: ReportContext) -> list[str]:
    groups = summary.rule_groups(ctx)
    if not groups:
        return ["### Hazards", "", "No findings.", ""]
    out = ["### Hazards", ""]
    out += table(["rule", "severity", "open", "suppressed", "files"],
                 ([code(g.rule), g.severity.value, str(len(g.findings)), str(g.suppressed or ""), str(g.files or "")]
                  for g in groups),
                 [False, False, True, True, True])
    out.append("")
    for g in groups:
        if g.findings:
            out += details(f"{g.rule} — {_plural(len(g.findings), g.severity.value)}: {cell(g.summary)}",
                           _finding_items(g.findings, with_rule=False))
    return out


def _finding_items(findings: Iterable[Finding], with_rule: bool = True) -> list[str]:
    out = []
    for f in findings:
        rule = f" {code(f.rule)}" if with_rule else ""
        out.append(f"- {code(f'{f.path}:{f.line}')}{rule} in {code(f.scope)}: {cell(f.message)}")
        for r in f.related:
            out.append(f"  - {code(f'{r.path}:{r.line}')} {cell(r.note)}")
    return out


def _pivot(ctx: ReportContext, by: str, known: dict[int, int]) -> list[str]:
    rows = summary.pivot(ctx, by, known)
    tiers = [i for i, t in enumerate(TIER_ORDER) if any(r.tiers[i] for r in rows)]
    any_bytes = any(r.sized for r in rows)
    name = {"dir": "directory", "file": "file", "api": "api"}[by]
    header = [name, "sites", *[TIER_ORDER[i].value for i in tiers]] + (["est. bytes"] if any_bytes else [])
    if by != "api":
        header.append("findings")

    def line(r: summary.Row) -> list[str]:
        cells = [code(r.name), str(r.sites), *[str(r.tiers[i] or "") for i in tiers]]
        if any_bytes:
            cells.append(_bytes(r.bytes, r.sized, r.sites))
        if by != "api":
            cells.append(str(r.findings or ""))
        return cells

    right = [False] + [True] * (len(header) - 1)
    title = {"dir": "directories", "file": "files", "api": "APIs"}[by]
    out = [f"### Top {title}", ""]
    out += table(header, (line(r) for r in rows[:FOLD]), right)
    out.append("")
    if len(rows) > FOLD:
        out += details(f"All {len(rows)} {title}", table(header, (line(r) for r in rows), right))
    return out


def _allowlist(ctx: ReportContext, status: summary.AllowlistStatus) -> list[str]:
    out = ["### Allowlist", ""]
    accepted = str(status.accepted) + (f" (+{status.accepted_derived} derived)" if status.accepted_derived else "")
    out += table(["entries", "accepted sites", "new sites", "grown", "loose", "stale"],
                 [[str(status.entries), accepted, str(status.new), str(status.grown), str(status.loose),
                   str(status.stale)]],
                 [True] * 6)
    out.append("")
    comparison = ctx.allowlist
    assert comparison is not None
    new_sites = [s for _, sites in comparison.new for s in sites]
    if new_sites:
        out += details(f"Sites not on the allowlist ({len(new_sites)})", _site_rows(new_sites))
    if comparison.stale:
        body = [f"- {code(f'{e.file}:{e.line}')} {code(e.render())}" for e in comparison.stale]
        out += details(f"Stale entries ({len(comparison.stale)})", body)
    return out
