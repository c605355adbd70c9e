"""Terminal output (rich): the ``scan`` summary and, with ``--verbose``, every
site. Rendered into a string; colour only when the caller says the output
is a terminal, so piped output has no escape codes."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable

from ..model import TIER_NAMES, TIER_ORDER, Finding, Severity, Site, SiteKind, Tier
from . import summary
from .context import ReportContext
from .words import plural

KIND_ORDER = [k for k in SiteKind]
TIER_STYLE = {
    Tier.T1: "magenta",
    Tier.T2: "blue",
    Tier.T3: "cyan",
    Tier.T4: "yellow",
    Tier.T5A: "green",
    Tier.T5B: "green",
    Tier.UNKNOWN: "red",
}


def console(color: bool, width: int | None):  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(
        file=io.StringIO(),
        force_terminal=color,
        color_system="auto" if color else None,
        width=width or 100,
        no_color=not color,
        highlight=False,
        emoji=False,
        soft_wrap=False,
    )


def finish(out, color: bool) -> str:  # type: ignore[no-untyped-def]
    """The rendered text; without colour, lines lose the padding rich adds
    (piped output and files get no trailing whitespace)."""
    text: str = out.file.getvalue()
    if color:
        return text
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def header_line(ctx: ReportContext) -> str:
    from .. import __version__

    s = ctx.result.stats
    errors = f", {s.parse_errors} with parse errors" if s.parse_errors else ""
    return (f"alloc-audit {__version__} · root {ctx.root_display} · {plural(s.files, 'file')}, "
            f"{s.parsed} analysed{errors}"
            f" · {s.seconds:.2f} s")


def acquisitions(sites: Iterable[Site]) -> list[Site]:
    return [s for s in sites if s.acquires]


def tier_kind_table(sites: list[Site], width: int = 100):  # type: ignore[no-untyped-def]
    """Sites by tier and kind. Below WIDE columns the tier column shows the
    tier alone and the names follow in a legend (tier_legend), so no name is
    cut; hyphenated kind headers wrap at the hyphen."""
    from rich.table import Table

    direct = [s for s in sites if s.via is None]
    derived = [s for s in sites if s.via is not None]
    kinds = [k for k in KIND_ORDER if k is not SiteKind.RELEASE and any(s.kind is k for s in direct)]
    wide = width >= WIDE
    table = Table(title="Allocation sites by tier and kind", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tier", no_wrap=True)
    for kind in kinds:
        table.add_column(kind.value if wide else kind.value.replace("-", "-\n"), justify="right")
    table.add_column("direct", justify="right", style="bold")
    table.add_column("derived", justify="right")
    counts = Counter((s.tier, s.kind) for s in direct)
    dcounts = Counter(s.tier for s in derived)
    for tier in TIER_ORDER:
        row_total = sum(counts[(tier, k)] for k in kinds)
        if not row_total and not dcounts[tier]:
            continue
        label = summary.tier_label(tier) if wide else tier.value
        table.add_row(
            f"[{TIER_STYLE[tier]}]{tier.value}[/]{label[len(tier.value):]}",
            *[str(counts[(tier, k)] or "") for k in kinds],
            str(row_total),
            str(dcounts[tier] or ""),
        )
    table.add_row("total", *[str(sum(counts[(t, k)] for t in TIER_ORDER)) for k in kinds], str(len(direct)),
                  str(len(derived)), style="bold")
    return table


def tier_legend(sites: list[Site], width: int) -> str:
    """The tier names under a narrow table, packed into lines by hand (rich
    would break inside a name: it wraps at any whitespace)."""
    present = {s.tier for s in sites}
    lines: list[str] = []
    for label in (summary.tier_label(t) for t in TIER_ORDER if t in present and t is not Tier.UNKNOWN):
        if lines and len(lines[-1]) + 3 + len(label) <= width:
            lines[-1] += " · " + label
        else:
            lines.append(label)
    return "\n".join(f"[dim]{line}[/]" for line in lines)


def top_files_table(sites: list[Site], limit: int = 10):  # type: ignore[no-untyped-def]
    from rich.table import Table

    per_file: dict[str, Counter[Tier]] = {}
    for s in sites:
        if s.via is None:
            per_file.setdefault(s.path, Counter())[s.tier] += 1
    ranked = sorted(per_file.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:limit]
    table = Table(title=f"Top files (of {len(per_file)})", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("file", overflow="fold")
    table.add_column("sites", justify="right", style="bold")
    for tier in TIER_ORDER:
        table.add_column(tier.value, justify="right")
    for path, counts in ranked:
        table.add_row(path, str(sum(counts.values())), *[str(counts[t] or "") for t in TIER_ORDER])
    return table


def sites_table(sites: list[Site]):  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title="Sites", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("location", overflow="fold")
    table.add_column("api", overflow="fold")
    table.add_column("kind")
    table.add_column("tier")
    table.add_column("scope / reason", overflow="fold")
    for s in sites:
        via = f" via {s.via.api} ({s.via.path}:{s.via.line})" if s.via else ""
        table.add_row(
            f"{s.path}:{s.span.line}",
            s.api + via,
            s.kind.value,
            f"[{TIER_STYLE[s.tier]}]{s.tier.value}[/]",
            f"{s.scope}\n[dim]{s.tier_reason}[/]",
        )
    return table


def finding_lines(findings: Iterable[Finding], limit: int | None = None) -> list[str]:
    from ..model import ROLE_ORDER

    lines = []
    # production code first (issue 16); the given order within a role
    ordered = sorted(findings, key=lambda f: ROLE_ORDER.get(f.role, 0))
    for i, f in enumerate(ordered):
        if limit is not None and i >= limit:
            break
        colour = {Severity.ERROR: "red", Severity.WARNING: "yellow"}.get(f.severity, "blue")
        role = "" if f.role == "production" else f" [dim]\\[{f.role}][/]"
        lines.append(f"[{colour}]{f.severity.value}[/] [bold]{f.rule}[/] {f.path}:{f.line} ({f.scope}){role}")
        lines.append(f"    {_escape(f.message)}")
        for r in f.related:
            lines.append(f"    [dim]{r.path}:{r.line}: {_escape(r.note)}[/]")
    return lines


def indented(out, line: str, hang: int = 4) -> None:  # type: ignore[no-untyped-def]
    """Print a line whose wrapped continuation is indented: by the line's own
    indentation, plus ``hang`` for a line that starts at column 0 (a finding's
    head), so a wrapped line never falls back to column 0."""
    from rich.padding import Padding
    from rich.text import Text

    indent = len(line) - len(line.lstrip(" "))
    if indent:
        out.print(Padding(line.lstrip(" "), (0, 0, 0, indent)))
        return
    wrapped = Text.from_markup(line).wrap(out, max(out.width - hang, 20))
    for n, part in enumerate(wrapped):
        out.print(Padding(part, (0, 0, 0, hang)) if n else part)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def render_scan(ctx: ReportContext, color: bool) -> str:
    out = console(color, ctx.width)
    sites = ctx.result.sites
    acq = acquisitions(sites)
    out.print(header_line(ctx))
    out.print()
    if not acq:
        out.print("No allocation sites found.")
    else:
        out.print(tier_kind_table(acq, ctx.width or 100))
        if (ctx.width or 100) < WIDE:
            out.print(tier_legend(acq, ctx.width or 100))
        out.print()
        out.print(top_files_table(acq))
        releases = sum(1 for s in sites if s.kind is SiteKind.RELEASE)
        if releases:
            out.print(f"\n[dim]{releases} native release sites (cudaFree & co.) recorded for pairing; "
                      "not counted above.[/]")
    if ctx.verbose and sites:
        out.print()
        out.print(sites_table(list(sites)))
    findings = [f for f in ctx.result.findings if not f.suppressed]
    if findings:
        out.print()
        counts = Counter(f.severity for f in findings)
        out.print(f"[bold]Findings[/]: {plural(counts[Severity.ERROR], 'error')}, "
                  f"{plural(counts[Severity.WARNING], 'warning')}")
        limit = None if ctx.verbose else 20
        for line in finding_lines(findings, limit):
            indented(out, line)
        if limit is not None and len(findings) > limit:
            out.print(f"[dim]… {len(findings) - limit} more (use --verbose, or --format json)[/]")
    errors = ctx.result.errors
    if errors:
        out.print()
        out.print(f"[bold]Files with problems[/]: {len(errors)}")
        shown = errors if ctx.verbose else errors[:10]
        for e in shown:
            indented(out, f"  {e.path}: {_escape(e.message)}")
        if len(shown) < len(errors):
            out.print(f"  [dim]… {len(errors) - len(shown)} more (use --verbose)[/]")
    return finish(out, color)


# ---------------------------------------------------------------- report

WIDE = 120  # from this width on, one column per tier


def render_report(ctx: ReportContext, color: bool) -> str:
    """The developer report: one screen of totals, the pivot, hazards by
    rule, the allowlist status and what to do next."""
    from rich.padding import Padding

    out = console(color, ctx.width)
    known = summary.sizes(ctx)
    sites = summary.counted(ctx.result.sites)
    out.print(header_line(ctx))
    out.print()
    if not sites:
        out.print("No allocation sites found.")
    else:
        out.print(totals_table(ctx, sites, known))
        sized = sum(1 for s in sites if id(s) in known)
        if sized:
            out.print(f"[dim]est. bytes: {sized} of {plural(len(sites), 'site')} have a size from literals or "
                      "bindings; "
                      "≥ marks a partial sum.[/]")
        out.print()
        by = ctx.pivot if ctx.pivot in summary.PIVOTS else "dir"
        out.print(rules_table(ctx) if by == "rule" else pivot_table(ctx, by, known))
    groups = [g for g in summary.rule_groups(ctx) if g.findings]
    if groups:
        out.print()
        out.print("[bold]Hazards[/]" + ("" if ctx.verbose else " [dim](messages and every location: --verbose)[/]"))
        for group in groups:
            hazard_group(out, ctx, group)
    status = summary.allowlist_status(ctx)
    if status is not None:
        out.print()
        state = "[green]clean[/]" if status.clean else "[red]out of date[/]"
        derived = f" (+{status.accepted_derived} derived)" if status.accepted_derived else ""
        out.print(f"[bold]Allowlist[/] {state}: {plural(status.entries, 'entry', 'entries')} accept "
                  f"{plural(status.accepted, 'site')}{derived}; {plural(status.new, 'new site')}, "
                  f"{status.grown} grown, {status.loose} loose, {status.stale} stale")
    if ctx.result.errors:
        out.print()
        out.print(f"[bold]Files with problems[/]: {len(ctx.result.errors)}")
        shown_errors = ctx.result.errors if ctx.verbose else ctx.result.errors[:5]
        for e in shown_errors:
            out.print(Padding(f"{e.path}: {_escape(e.message)}", (0, 0, 0, 2)))
        if len(shown_errors) < len(ctx.result.errors):
            out.print(f"  [dim]… {len(ctx.result.errors) - len(shown_errors)} more (--verbose)[/]")
    actions = summary.next_actions(ctx, known)
    if actions:
        out.print()
        out.print("[bold]Next[/]")
        for i, action in enumerate(actions, 1):
            out.print(Padding(f"{i}. {_escape(action)}", (0, 0, 0, 2)))
    return finish(out, color)


def hazard_group(out, ctx: ReportContext, group: summary.RuleGroup) -> None:  # type: ignore[no-untyped-def]
    """A rule's findings; wrapped lines keep their indentation."""
    from rich.padding import Padding

    def line(text: str, indent: int) -> None:
        out.print(Padding(text, (0, 0, 0, indent)) if indent else text)

    colour = "red" if group.severity is Severity.ERROR else "yellow"
    files = f"{group.files} file{'s' if group.files != 1 else ''}"
    line(f"[{colour}]{group.rule}[/] {len(group.findings)} in {files} [dim]— {_escape(group.summary)}[/]", 0)
    shown = group.findings if ctx.verbose else group.findings[:3]
    for f in shown:
        line(f"{f.path}:{f.line} [dim]in[/] {_escape(f.scope)}", 2)
        if ctx.verbose:
            line(_escape(f.message), 4)
        related = f.related if ctx.verbose else f.related[:1]
        for r in related:
            more = len(f.related) - len(related)
            tail = f" [dim](+{more} more)[/]" if more and r is related[-1] else ""
            line(f"[dim]↳ {r.path}:{r.line} {_escape(r.note)}[/]{tail}", 4)
    if len(shown) < len(group.findings):
        line(f"[dim]… {len(group.findings) - len(shown)} more[/]", 2)


bytes_cell = summary.bytes_text


def tier_mix(tiers: tuple[int, ...]) -> str:
    """'T2 5 · T4 3': the tier counts of a row, in tier order."""
    return " · ".join(f"[{TIER_STYLE[t]}]{t.value}[/] {n}" for t, n in zip(TIER_ORDER, tiers) if n)


def totals_table(ctx: ReportContext, sites: list[Site], known: dict[int, int]):  # type: ignore[no-untyped-def]
    from rich.table import Table

    kinds, counts = summary.tier_kind_counts(sites)
    derived = summary.derived(ctx.result.sites)
    dcounts = Counter(s.tier for s in derived)
    sized = summary.tier_bytes(sites, known)
    table = Table(title="Sites by tier", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tier", no_wrap=True)
    table.add_column("sites", justify="right", style="bold", no_wrap=True)
    table.add_column("derived", justify="right", no_wrap=True)
    if sized:
        table.add_column("est. bytes", justify="right", no_wrap=True)
    table.add_column("kinds", overflow="fold", ratio=1)
    per_tier = Counter(s.tier for s in sites)
    for tier in TIER_ORDER:
        if not per_tier[tier] and not dcounts[tier]:
            continue
        label = f"[{TIER_STYLE[tier]}]{tier.value}[/]" + ("" if tier is Tier.UNKNOWN else f" {TIER_NAMES[tier]}")
        row = [label, str(per_tier[tier]), str(dcounts[tier] or "")]
        if sized:
            total, n = sized.get(tier, (0, 0))
            row.append(bytes_cell(total, n, per_tier[tier]))
        row.append(", ".join(f"{k.value} {counts[(tier, k)]}" for k in kinds if counts.get((tier, k))))
        table.add_row(*row)
    footer = ["total", str(len(sites)), str(len(derived) or "")]
    if sized:
        footer.append(bytes_cell(sum(t for t, _ in sized.values()), sum(n for _, n in sized.values()), len(sites)))
    footer.append(", ".join(f"{k.value} {sum(v for (_, kk), v in counts.items() if kk is k)}" for k in kinds))
    table.add_row(*footer, style="bold")
    return table


PIVOT_TITLES = {"dir": ("directory", "directories"), "file": ("file", "files"), "tier": ("tier", "tiers"),
                "api": ("API", "APIs")}


def pivot_table(ctx: ReportContext, by: str, known: dict[int, int]):  # type: ignore[no-untyped-def]
    from rich.table import Table

    rows = summary.pivot(ctx, by, known)
    limit = len(rows) if ctx.verbose or by == "tier" else ctx.limit
    wide = (ctx.width or 100) >= WIDE
    tiers = [i for i, t in enumerate(TIER_ORDER) if any(r.tiers[i] for r in rows)]
    any_bytes = any(r.sized for r in rows)
    one, many = PIVOT_TITLES[by]
    shown = rows[:limit]
    more = f", top {len(shown)}" if len(shown) < len(rows) else ""
    counted_rows = f"{len(rows)} {one if len(rows) == 1 else many}"
    table = Table(title=f"Sites by {one} ({counted_rows}{more})", title_justify="left", show_edge=False,
                  pad_edge=False)
    # explicit widths (rich would truncate the last column instead): the
    # narrow columns are fixed, the name and the tier mix share the rest
    longest = max((len(r.name) for r in shown), default=8)
    widths = [5] + ([10] if any_bytes else []) + ([8] if by in ("dir", "file") else [])
    if by != "tier" and wide:
        widths += [max(len(TIER_ORDER[i].value), 3) for i in tiers]
    mix = by != "tier" and not wide
    free = (ctx.width or 100) - sum(widths) - 3 * (len(widths) + (1 if mix else 0))
    name_w = max(8, min(longest, free - (14 if mix else 0)))
    mix_w = max(8, free - name_w)
    table.add_column(one.lower(), overflow="fold", width=name_w)
    table.add_column("sites", justify="right", style="bold", no_wrap=True)
    if by != "tier":
        if wide:
            for i in tiers:
                tier = TIER_ORDER[i]
                table.add_column(f"[{TIER_STYLE[tier]}]{tier.value}[/]", justify="right", no_wrap=True)
        else:
            table.add_column("tiers", overflow="fold", width=mix_w)
    if any_bytes:
        table.add_column("est. bytes", justify="right", no_wrap=True)
    if by in ("dir", "file"):
        table.add_column("findings", justify="right", no_wrap=True)
    for row in shown:
        name = summary.tier_label(Tier(row.name)) if by == "tier" else row.name
        cells = [_escape(name), str(row.sites)]
        if by != "tier":
            cells += [str(row.tiers[i] or "") for i in tiers] if wide else [tier_mix(row.tiers)]
        if any_bytes:
            cells.append(bytes_cell(row.bytes, row.sized, row.sites))
        if by in ("dir", "file"):
            cells.append(str(row.findings or ""))
        table.add_row(*cells)
    if len(shown) < len(rows):
        rest = rows[len(shown):]
        table.add_row(f"[dim]… {len(rest)} more (--verbose)[/]", f"[dim]{sum(r.sites for r in rest)}[/]")
    return table


def rules_table(ctx: ReportContext):  # type: ignore[no-untyped-def]
    from rich.table import Table

    wide = (ctx.width or 100) >= WIDE
    groups = summary.rule_groups(ctx)
    table = Table(title="Findings by rule", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("rule", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("open", justify="right", style="bold", no_wrap=True)
    table.add_column("suppressed", justify="right", no_wrap=True)
    table.add_column("files", justify="right", no_wrap=True)
    if wide:
        table.add_column("what it flags", overflow="fold", ratio=1)
    for g in groups:
        cells = [g.rule, g.severity.value, str(len(g.findings)), str(g.suppressed or ""), str(g.files or "")]
        if wide:
            cells.append(_escape(g.summary))
        table.add_row(*cells)
    if not groups:
        table.add_row("[dim]no findings[/]", "", "", "", "")
    return table


def render_rule_doc(name: str, severity: str, default_on: bool, doc: str, color: bool, width: int | None) -> str:
    """A rule's documentation (its module docstring), as `rules explain` shows it."""
    from rich.console import Console
    from rich.markdown import Markdown

    buffer = io.StringIO()
    out = Console(file=buffer, force_terminal=color, no_color=not color, width=width or 100, highlight=False)
    out.print(Markdown(f"# {name} ({severity}{'' if default_on else ', off by default'})\n\n" + doc))
    return buffer.getvalue()
