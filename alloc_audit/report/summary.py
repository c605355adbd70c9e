"""The numbers every human-facing report shows, computed once and rendered by
terminal, Markdown and HTML alike: totals by tier and kind, pivots by
directory, file, tier, rule or API, findings grouped by rule, the allowlist
status and the next actions. Pure functions of the ``ReportContext``."""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..model import ROLE_ORDER, TIER_NAMES, TIER_ORDER, Finding, Severity, Site, SiteKind, Tier
from .context import ReportContext
from .sizes import estimate_bytes, human

PIVOTS = ("dir", "file", "tier", "rule", "api")


@dataclass(frozen=True)
class Row:
    """One line of a pivot: a directory, file, tier or API and its sites."""

    name: str
    sites: int
    tiers: tuple[int, ...]  # counts in TIER_ORDER
    bytes: int  # the sum of the estimates that are known
    sized: int  # how many of the sites have an estimate
    findings: int
    role: str = "production"  # the code role of the row's sites (dir and file pivots), production first


@dataclass(frozen=True)
class RuleGroup:
    rule: str
    severity: Severity
    summary: str
    findings: tuple[Finding, ...]  # open (not suppressed)
    suppressed: int

    @property
    def files(self) -> int:
        return len({f.path for f in self.findings})


@dataclass(frozen=True)
class AllowlistStatus:
    entries: int
    accepted: int  # direct sites the entries cover
    accepted_derived: int  # derived sites (factory calls) they cover, counted apart as everywhere
    new: int
    grown: int
    loose: int
    stale: int

    @property
    def clean(self) -> bool:
        return not (self.new or self.grown or self.loose or self.stale)


def counted(sites: Iterable[Site]) -> list[Site]:
    """The acquisitions a census counts: direct sites, releases left out."""
    return [s for s in sites if s.counted]


def derived(sites: Iterable[Site]) -> list[Site]:
    return [s for s in sites if s.via is not None]


def sizes(ctx: ReportContext) -> dict[int, int]:
    """id(site) -> estimated bytes, for the sites whose size is known."""
    out = {}
    for site in ctx.result.sites:
        value = estimate_bytes(site, ctx.bindings)
        if value is not None:
            out[id(site)] = value
    return out


def tier_kind_counts(sites: Sequence[Site]) -> tuple[list[SiteKind], dict[tuple[Tier, SiteKind], int]]:
    kinds: list[SiteKind] = [k for k in SiteKind if k is not SiteKind.RELEASE and any(s.kind is k for s in sites)]
    return kinds, dict(Counter((s.tier, s.kind) for s in sites))


def tier_bytes(sites: Sequence[Site], known: dict[int, int]) -> dict[Tier, tuple[int, int]]:
    """tier -> (bytes, sized sites)."""
    out: dict[Tier, tuple[int, int]] = {}
    for s in sites:
        if id(s) in known:
            total, n = out.get(s.tier, (0, 0))
            out[s.tier] = (total + known[id(s)], n + 1)
    return out


def group_name(site: Site, by: str) -> str:
    if by == "dir":
        return posixpath.dirname(site.path) or "."
    if by == "file":
        return site.path
    if by == "tier":
        return site.tier.value
    if by == "api":
        return site.api
    raise ValueError(by)


def pivot(ctx: ReportContext, by: str, known: dict[int, int]) -> list[Row]:
    """Rows for ``by`` in dir|file|tier|api, most sites first (tiers in
    their order), then by name."""
    sites = counted(ctx.result.sites)
    finding_counts: Counter[str] = Counter()
    for f in ctx.result.findings:
        if not f.suppressed and by in ("dir", "file"):
            finding_counts[posixpath.dirname(f.path) or "." if by == "dir" else f.path] += 1
    groups: dict[str, list[Site]] = {}
    for s in sites:
        groups.setdefault(group_name(s, by), []).append(s)
    rows = []
    for name, members in groups.items():
        tiers = Counter(s.tier for s in members)
        sized = [known[id(s)] for s in members if id(s) in known]
        role = min((s.role for s in members), key=lambda r: ROLE_ORDER.get(r, 0))
        rows.append(Row(name, len(members), tuple(tiers[t] for t in TIER_ORDER), sum(sized), len(sized),
                        finding_counts[name], role))
    if by == "tier":
        order = {t.value: i for i, t in enumerate(TIER_ORDER)}
        return sorted(rows, key=lambda r: order[r.name])
    if by in ("dir", "file"):  # production code leads (issue 16): tests and benchmarks after it
        return sorted(rows, key=lambda r: (ROLE_ORDER.get(r.role, 0), -r.sites, r.name))
    return sorted(rows, key=lambda r: (-r.sites, r.name))


def rule_groups(ctx: ReportContext) -> list[RuleGroup]:
    """Findings by rule, errors first, then by count; production code's
    findings first within a rule."""
    from ..rules import ALL_RULES

    summaries = {r.name: r.summary for r in ALL_RULES}
    open_: dict[str, list[Finding]] = {}
    suppressed: Counter[str] = Counter()
    severity: dict[str, Severity] = {}
    rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    for f in sorted(ctx.result.findings, key=lambda f: ROLE_ORDER.get(f.role, 0)):  # production code first
        if f.rule not in severity or rank[f.severity] < rank[severity[f.rule]]:
            severity[f.rule] = f.severity
        if f.suppressed:
            suppressed[f.rule] += 1
        else:
            open_.setdefault(f.rule, []).append(f)
    groups = [RuleGroup(rule, severity[rule], summaries.get(rule, ""), tuple(open_.get(rule, ())), suppressed[rule])
              for rule in severity]
    return sorted(groups, key=lambda g: (g.severity is not Severity.ERROR, -len(g.findings), g.rule))


def allowlist_status(ctx: ReportContext) -> AllowlistStatus | None:
    c = ctx.allowlist
    if c is None:
        return None
    return AllowlistStatus(
        entries=len(c.entries),
        accepted=sum(1 for _, sites in (*c.ok, *c.loose) for s in sites if s.via is None),
        accepted_derived=sum(1 for _, sites in (*c.ok, *c.loose) for s in sites if s.via is not None),
        new=sum(len(sites) for _, sites in c.new),
        grown=len(c.grown),
        loose=len(c.loose),
        stale=len(c.stale),
    )


def next_actions(ctx: ReportContext, known: dict[int, int]) -> list[str]:
    """What to do next, most urgent first; commands are in backticks."""
    out = []
    groups = rule_groups(ctx)
    errors = [g for g in groups if g.severity is Severity.ERROR and g.findings]
    warnings = [g for g in groups if g.severity is not Severity.ERROR and g.findings]
    for g in errors:
        out.append(f"Fix {len(g.findings)} {g.rule} error{'s' if len(g.findings) != 1 else ''} "
                   f"(`alloc-audit rules explain {g.rule}`).")
    if warnings:
        names = ", ".join(g.rule for g in warnings[:3]) + (", …" if len(warnings) > 3 else "")
        total = sum(len(g.findings) for g in warnings)
        out.append(f"Review {total} warning{'s' if total != 1 else ''} ({names}); fix them or suppress each with "
                   "`# alloc-audit: ignore[rule] reason`.")
    status = allowlist_status(ctx)
    if status is None:
        out.append("No allowlist yet: `alloc-audit allowlist init` records today's sites so CI can stop new ones.")
    else:
        if status.new or status.grown:
            out.append(f"{status.new} site{'s' if status.new != 1 else ''} not on the allowlist"
                       f"{f' and {status.grown} grown entries' if status.grown else ''}: move them to a planned tier, "
                       "or accept them with `alloc-audit allowlist update --add-new` and a reason.")
        if status.stale or status.loose:
            out.append(f"Shrink the allowlist ({status.stale} stale, {status.loose} loose): "
                       "`alloc-audit allowlist update`.")
    unknown = sum(1 for s in counted(ctx.result.sites) if s.tier is Tier.UNKNOWN)
    if unknown:
        out.append(f"Classify {unknown} site{'s' if unknown != 1 else ''} of unknown tier: `alloc-audit audit`, "
                   "or `# alloc-audit: tier=T2 reason` on the line.")
    if ctx.result.errors:
        out.append(f"{len(ctx.result.errors)} file{'s' if len(ctx.result.errors) != 1 else ''} could not be read "
                   "or parsed cleanly; sites in them may be missing (they are listed under files with problems).")
    sites = counted(ctx.result.sites)
    if sites and not any(id(s) in known for s in sites):
        out.append("Sizes are unknown: bind the symbols they use (`--bind hidden_size=4096`, or "
                   "`[tool.alloc-audit.bindings]`) to see estimated bytes per tier.")
    return out


def bytes_text(total: int, sized: int, of: int, fraction: bool = False) -> str:
    """'36.0 MiB' when every site is sized, '≥ 36.0 MiB' (with ``fraction``:
    '≥ 36.0 MiB (3/5)') when only some are, '' when none is."""
    if not sized:
        return ""
    if sized == of:
        return human(total)
    return f"≥ {human(total)} ({sized}/{of})" if fraction else f"≥ {human(total)}"


def tier_label(tier: Tier) -> str:
    return tier.value if tier is Tier.UNKNOWN else f"{tier.value} {TIER_NAMES[tier]}"
