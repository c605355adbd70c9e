"""The change between a base scan and this one (``report --base REF``):
sites added and removed by tier, findings new and fixed. A site is
identified by its allowlist key and tier (so a site whose tier changed
counts as removed from one tier and added to another), a finding by its
stable key; line moves are not changes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..model import TIER_ORDER, Finding, Site, Tier
from .keys import site_key

SiteId = tuple[str, str, str, str]


@dataclass(frozen=True)
class Delta:
    ref: str
    commit: str
    base_sites: int
    added: tuple[Site, ...]  # sites of this tree beyond the base's count for their key and tier
    removed: tuple[Site, ...]  # sites of the base beyond this tree's count (base line numbers)
    new_findings: tuple[Finding, ...]
    fixed_findings: tuple[Finding, ...]

    def by_tier(self) -> list[tuple[Tier, int, int]]:
        """(tier, added, removed) for the tiers that changed, in tier order."""

        plus, minus = Counter(s.tier for s in self.added), Counter(s.tier for s in self.removed)
        return [(t, plus[t], minus[t]) for t in TIER_ORDER if plus[t] or minus[t]]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.new_findings or self.fixed_findings)


def _site_id(site: Site) -> SiteId:
    path, scope, api = site_key(site)
    return (path, scope, api, site.tier.value)


def _counted(sites: Iterable[Site]) -> list[Site]:
    return [s for s in sites if s.counted]


def _surplus(ours: list[Site], theirs: list[Site]) -> list[Site]:
    """The sites of ``ours`` beyond the count ``theirs`` has for the same id
    (the last ones in line order: an inserted site usually comes after)."""
    have = Counter(_site_id(s) for s in theirs)
    groups: dict[SiteId, list[Site]] = {}
    for s in ours:
        groups.setdefault(_site_id(s), []).append(s)
    out: list[Site] = []
    for key, members in groups.items():
        extra = len(members) - have[key]
        if extra > 0:
            out += members[-extra:]
    return sorted(out, key=lambda s: (s.path, s.span.line, s.span.col, s.api))


def _finding_surplus(ours: Iterable[Finding], theirs: Iterable[Finding]) -> list[Finding]:
    have = Counter((f.rule, f.key) for f in theirs if not f.suppressed)
    out = []
    for f in ours:
        if f.suppressed:
            continue
        k = (f.rule, f.key)
        if have[k] > 0:
            have[k] -= 1
        else:
            out.append(f)
    return out


def compute(ref: str, commit: str, base_sites: Iterable[Site], base_findings: Iterable[Finding],
            sites: Iterable[Site], findings: Iterable[Finding]) -> Delta:
    base_list, head_list = _counted(base_sites), _counted(sites)
    base_f, head_f = list(base_findings), list(findings)
    return Delta(
        ref=ref,
        commit=commit,
        base_sites=len(base_list),
        added=tuple(_surplus(head_list, base_list)),
        removed=tuple(_surplus(base_list, head_list)),
        new_findings=tuple(_finding_surplus(head_f, base_f)),
        fixed_findings=tuple(_finding_surplus(base_f, head_f)),
    )
