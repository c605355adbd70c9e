"""Stage 5, last: a pool's constructor that only probes its devices holds
no slab (issue 11, round 20).

The pooled patterns (rules/tiers.toml: a ``*KVPool*`` class's constructor)
call every device allocation of the constructor the pool's slab (T3). One
whose value the constructor drops at once (``torch.zeros(1, device=d)`` as
a statement of its own: a probe that each device works) is freed right
away: T4. A construction of the class whose derived site names such a probe
(the class allocates nothing else there) builds no slab either: T4,
wherever the object is kept. Pure; only Python T3 sites are looked at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ProjectIndex


def dropped_probes(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    probes: set[tuple[str, int]] = set()
    out = []
    for site in sites:
        if site.via is None and site.tier is Tier.T3 and site.language is Language.PYTHON \
                and site.kind is SiteKind.DEVICE and _dropped(site, index):
            probes.add((site.path, site.span.line))
            site = dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"per call: {site.scope} drops the value at once (a probe, not the pool's slab); "
                f"was: {site.tier_reason}"))
        out.append(site)
    if not probes:
        return out
    return [dataclasses.replace(s, tier=Tier.T4, tier_reason=(
        f"per call: {s.api} allocates only a probe it drops at once ({s.via.api} at {s.via.path}:{s.via.line}); "
        f"it holds no slab; was: {s.tier_reason}"))
        if s.via is not None and s.tier is Tier.T3 and (s.via.path, s.via.line) in probes
        and _only_probes(s, out, probes) else s for s in out]


def _dropped(site: Site, index: ProjectIndex) -> bool:
    """The allocation is a statement of its own in a constructor: no target,
    not an argument or receiver of another call, not assigned, returned or
    yielded."""
    if site.target is not None:
        return False
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role != "constructor":
        return False
    line = site.stmt_line or site.span.line
    if any(a.line <= line <= a.line + a.value.count("\n") for a in func.assigns):
        return False
    if any(r.line <= line <= r.line + r.value.count("\n") for r in func.returns) or line in func.scope.yields:
        return False
    return not any(c.span != site.span and c.span.contains(site.span) for c in func.calls
                   if c.span.line <= site.span.line)


def _only_probes(derived: Site, sites: list[Site], probes: set[tuple[str, int]]) -> bool:
    """Every device allocation of the probe's constructor is a dropped probe."""
    assert derived.via is not None
    scope = next((s.scope for s in sites if s.via is None and (s.path, s.span.line) ==
                  (derived.via.path, derived.via.line)), None)
    return scope is not None and all((s.path, s.span.line) in probes for s in sites
                                     if s.via is None and s.path == derived.via.path and s.scope == scope
                                     and s.kind is SiteKind.DEVICE)
