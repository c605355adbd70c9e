"""``alloc-audit join`` for people: the terminal (rich) and Markdown
renderings. Both show the same things in the same order: the accounted
share, joined bytes per site, implicit allocation points, bytes per tier,
the runtime findings, the sites the run never reached, and the footer that
reconciles the buckets with reserved and allocated memory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..runtime.results import Join, JoinedSite, Usage
from .join_json import tier_label
from .sizes import human

if TYPE_CHECKING:
    from ..commands.join import JoinOutcome

STATUS_ORDER = {"confirmed": 0, "runtime": 1, "not-observed": 2, "not-reached": 3}


def _lifetime(u: Usage) -> str:
    v = u.median_lifetime_us
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.1f} s"
    return f"{v / 1000:.1f} ms" if v >= 1000 else f"{v:.0f} us"


def _churn(u: Usage) -> str:
    return "-" if u.churn_per_step is None else f"{u.churn_per_step:g}"


def reached(j: Join) -> list[JoinedSite]:
    rows = [s for s in j.sites if s.usage.reached]
    return sorted(rows, key=lambda s: (-s.usage.live_bytes, -s.usage.bytes_allocated, s.site.sort_key))


def unreached(j: Join) -> list[JoinedSite]:
    return [s for s in j.sites if s.verdict == "not-reached"]


def headline(j: Join, what: str, min_accounted: float | None) -> list[str]:
    stacks = ", ".join(sorted({s.stacks for s in j.snapshots}))
    events = sum(s.events for s in j.snapshots)
    lines = [f"{len(j.snapshots)} {what} ({stacks} stacks, {events} trace events, {j.steps} steps)"]
    exact = sum(s.usage.live_bytes for s in j.sites if s.how == "exact")
    function = sum(s.usage.live_bytes for s in j.sites if s.how and s.how != "exact")
    reserved = f" of {human(j.reserved)} reserved" if j.source == "snapshot" else ""
    lines.append(f"live at the snapshot: {human(j.live)}{reserved}; {j.accounted_share:.1f}% accounted to census "
                 f"sites ({human(exact)} exact, {human(function)} function match)")
    if min_accounted is not None:
        verdict = "passes" if j.accounted_share >= min_accounted else "FAILS"
        lines.append(f"--min-accounted {min_accounted:g}%: {verdict}")
    lines.append(f"frame files mapped to the tree: {j.frames_mapped} of {j.frames_total}")
    return lines


def reconcile(j: Join) -> list[str]:
    implicit = sum(p.usage.live_bytes for p in j.implicit)
    parts = [f"sites {human(j.accounted)}", f"implicit {human(implicit)}"]
    parts += [f"{b.name} {human(b.bytes)}" for b in j.buckets if b.name in ("no-frames", "outside-root")]
    out = [f"live {human(j.live)} = " + " + ".join(parts)]
    slack = next((b for b in j.buckets if b.name == "cache-slack"), None)
    if slack is not None:
        out.append(f"reserved {human(j.reserved)} = live {human(j.live)} + cache slack {human(slack.bytes)}")
    for b in j.buckets:
        if b.name in ("history-truncated", "pytorch-allocator") and b.bytes:
            out.append(f"{b.name}: {human(b.bytes)} ({b.note})")
    return out


def findings_sorted(j: Join) -> list:  # type: ignore[type-arg]
    return sorted(j.findings, key=lambda f: (STATUS_ORDER.get(f.status, 9), f.sort_key))


# ---------------------------------------------------------------- terminal


def render_terminal(outcome: JoinOutcome, color: bool, width: int | None = None) -> str:
    from rich.table import Table
    from rich.text import Text

    from .terminal import console, finish

    out = console(color, width)
    for what, j in (("snapshot(s)", outcome.snapshot), ("native record(s)", outcome.native)):
        if j is None:
            continue
        out.print(Text(f"alloc-audit join: {headline(j, what, outcome.min_accounted if what[0] == 's' else None)[0]}"
                       f" against {outcome.root_display}", style="bold"))
        for line in headline(j, what, outcome.min_accounted if what[0] == "s" else None)[1:]:
            out.print(Text(line))
        sites = Table(title="Joined bytes per site", title_justify="left", show_edge=False, pad_edge=False)
        # peak, lifetimes and the observed lifetime: in the Markdown, HTML and JSON
        for col in ("site", "tier", "live", "allocs", "/step", "captured", "verdict"):
            sites.add_column(col, justify="left" if col in ("site", "tier", "verdict") else "right",
                             overflow="fold", min_width=30 if col == "site" else None)
        for s in reached(j):
            u = s.usage
            name = f"{s.site.path}:{s.site.span.line} {s.site.api}" + (" (function match)" if "function" in s.how
                                                                       else "")
            sites.add_row(name, s.site.tier.value, human(u.live_bytes), str(u.allocs), _churn(u),
                          human(u.capture_bytes) if u.capture_bytes else "-",
                          Text(s.verdict, style="red" if s.verdict == "disagrees" else ""))
        out.print()
        out.print(sites)
        if j.implicit:
            table = Table(title="Implicit allocation points (no census site), by bytes", title_justify="left",
                          show_edge=False, pad_edge=False)
            for col in ("line", "function", "live", "peak", "allocs", "in capture"):
                table.add_column(col, justify="left" if col in ("line", "function") else "right")
            for p in j.implicit[:15]:
                table.add_row(f"{p.path}:{p.line}", p.function, human(p.usage.live_bytes), human(p.usage.peak_bytes),
                              str(p.usage.allocs), human(p.usage.capture_bytes) if p.usage.capture_bytes else "-")
            out.print()
            out.print(table)
            if len(j.implicit) > 15:
                out.print(Text(f"... and {len(j.implicit) - 15} more implicit points (JSON lists them all)"))
        tiers = Table(title="Bytes per tier", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("tier", "live at snapshot", "peak"):
            tiers.add_column(col, justify="left" if col == "tier" else "right")
        for t, live, peak in j.tiers:
            tiers.add_row(f"{t} {tier_label(t)}" if t != tier_label(t) else t, human(live), human(peak))
        out.print()
        out.print(tiers)
        if j.findings:
            out.print()
            out.print(Text("Runtime findings", style="bold"))
            for f in findings_sorted(j):
                style = {"confirmed": "red", "runtime": "yellow"}.get(f.status, "dim")
                out.print(Text.assemble((f"[{f.status}] ", style), f"{f.path}:{f.line}: {f.rule}: ",
                                        Text(f.message)))
        missing = unreached(j)
        if missing:
            out.print()
            out.print(Text(f"Not reached by this run: {len(missing)} sites", style="bold"))
            for s in missing[:20]:
                out.print(Text(f"  {s.site.path}:{s.site.span.line} {s.site.api} {s.site.tier.value}"))
            if len(missing) > 20:
                out.print(Text(f"  ... and {len(missing) - 20} more"))
        out.print()
        for line in reconcile(j):
            out.print(Text(line))
        out.print()
    return finish(out, color)


# ---------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(outcome: JoinOutcome) -> str:
    lines = ["# alloc-audit join", ""]
    for what, j in (("snapshot(s)", outcome.snapshot), ("native record(s)", outcome.native)):
        if j is None:
            continue
        head = headline(j, what, outcome.min_accounted if what[0] == "s" else None)
        lines += [f"## {head[0][0].upper()}{head[0][1:]}", ""] + [f"- {h}" for h in head[1:]] + [""]
        lines += ["### Joined bytes per site", ""]
        lines += _table(
            ("site", "api", "tier", "match", "live", "peak", "allocs", "churn/step", "median life", "in capture",
             "observed", "verdict"),
            ((f"`{s.site.path}:{s.site.span.line}`", f"`{s.site.api}`", s.site.tier.value, s.how or "-",
              human(s.usage.live_bytes), human(s.usage.peak_bytes), str(s.usage.allocs), _churn(s.usage),
              _lifetime(s.usage), human(s.usage.capture_bytes) if s.usage.capture_bytes else "-", s.observed,
              f"**{s.verdict}**" if s.verdict == "disagrees" else s.verdict) for s in reached(j)))
        if j.implicit:
            lines += ["", "### Implicit allocation points (no census site)", ""]
            lines += _table(("line", "function", "live", "peak", "allocs", "in capture"),
                            ((f"`{p.path}:{p.line}`", f"`{p.function}`", human(p.usage.live_bytes),
                              human(p.usage.peak_bytes), str(p.usage.allocs),
                              human(p.usage.capture_bytes) if p.usage.capture_bytes else "-") for p in j.implicit[:25]))
        lines += ["", "### Bytes per tier", ""]
        lines += _table(("tier", "live at snapshot", "peak"),
                        ((f"{t} ({tier_label(t)})" if t != tier_label(t) else t, human(live), human(peak))
                         for t, live, peak in j.tiers))
        if j.findings:
            lines += ["", "### Runtime findings", ""]
            lines += [f"- **{f.status}** `{f.path}:{f.line}` {f.rule}: {_md(f.message)}" for f in findings_sorted(j)]
        missing = unreached(j)
        if missing:
            lines += ["", f"### Not reached by this run ({len(missing)} sites)", ""]
            lines += [f"- `{s.site.path}:{s.site.span.line}` `{s.site.api}` {s.site.tier.value}" for s in missing]
        lines += ["", "### Reconciliation", ""] + [f"- {line}" for line in reconcile(j)] + [""]
    return "\n".join(lines)
