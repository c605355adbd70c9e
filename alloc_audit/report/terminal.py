"""Terminal output (rich): the ``scan`` summary and, with ``--verbose``, every
site. Rendered into a string; colour only when the caller says the output
is a terminal, so piped output has no escape codes."""

from __future__ import annotations

import io
from collections import Counter
from typing import Iterable

from ..model import TIER_NAMES, Finding, Severity, Site, SiteKind, Tier
from .context import ReportContext

TIER_ORDER = [Tier.T1, Tier.T2, Tier.T3, Tier.T4, Tier.T5A, Tier.T5B, Tier.UNKNOWN]
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


def header_line(ctx: ReportContext) -> str:
    from .. import __version__

    s = ctx.result.stats
    errors = f", {s.parse_errors} with parse errors" if s.parse_errors else ""
    return (f"alloc-audit {__version__} · root {ctx.root_display} · {s.files} files, {s.parsed} analysed{errors}"
            f" · {s.seconds:.2f} s")


def acquisitions(sites: Iterable[Site]) -> list[Site]:
    return [s for s in sites if s.kind is not SiteKind.RELEASE]


def tier_kind_table(sites: list[Site]):  # type: ignore[no-untyped-def]
    from rich.table import Table

    direct = [s for s in sites if s.via is None]
    derived = [s for s in sites if s.via is not None]
    kinds = [k for k in KIND_ORDER if k is not SiteKind.RELEASE and any(s.kind is k for s in direct)]
    table = Table(title="Allocation sites by tier and kind", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tier")
    for kind in kinds:
        table.add_column(kind.value, justify="right")
    table.add_column("direct", justify="right", style="bold")
    table.add_column("derived", justify="right")
    counts = Counter((s.tier, s.kind) for s in direct)
    dcounts = Counter(s.tier for s in derived)
    for tier in TIER_ORDER:
        row_total = sum(counts[(tier, k)] for k in kinds)
        if not row_total and not dcounts[tier]:
            continue
        table.add_row(
            f"[{TIER_STYLE[tier]}]{tier.value}[/] {TIER_NAMES[tier]}",
            *[str(counts[(tier, k)] or "") for k in kinds],
            str(row_total),
            str(dcounts[tier] or ""),
        )
    table.add_row("total", *[str(sum(counts[(t, k)] for t in TIER_ORDER)) for k in kinds], str(len(direct)),
                  str(len(derived)), style="bold")
    return table


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
    lines = []
    for i, f in enumerate(findings):
        if limit is not None and i >= limit:
            break
        colour = "red" if f.severity is Severity.ERROR else "yellow"
        lines.append(f"[{colour}]{f.severity.value}[/] [bold]{f.rule}[/] {f.path}:{f.line} ({f.scope})")
        lines.append(f"    {_escape(f.message)}")
        for r in f.related:
            lines.append(f"    [dim]{r.path}:{r.line}: {_escape(r.note)}[/]")
    return lines


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
        out.print(tier_kind_table(acq))
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
        out.print(f"[bold]Findings[/]: {counts[Severity.ERROR]} errors, {counts[Severity.WARNING]} warnings")
        limit = None if ctx.verbose else 20
        for line in finding_lines(findings, limit):
            out.print(line)
        if limit is not None and len(findings) > limit:
            out.print(f"[dim]… {len(findings) - limit} more (use --verbose, or --format json)[/]")
    errors = ctx.result.errors
    if errors:
        out.print()
        out.print(f"[bold]Files with problems[/]: {len(errors)}")
        shown = errors if ctx.verbose else errors[:10]
        for e in shown:
            out.print(f"  {e.path}: {_escape(e.message)}")
        if len(shown) < len(errors):
            out.print(f"  [dim]… {len(errors) - len(shown)} more (use --verbose)[/]")
    return out.file.getvalue()  # type: ignore[attr-defined,no-any-return]
