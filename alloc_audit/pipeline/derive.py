"""Stage 5a, derive: calls to project factories become *derived sites* in
the caller's scope (found by the index), classified like direct sites; a
derived site whose memory is pooled keeps the pool's tier."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from ..catalog import TierPattern
from ..model import FileFacts, Site, Tier
from .classify import classify_sites
from .index import ProjectIndex


def derive_sites(index: ProjectIndex, files: Mapping[str, FileFacts], tiers: tuple[TierPattern, ...],
                 direct: Sequence[Site]) -> list[Site]:
    return _owner_tiers(classify_sites(index.derived_sites(), files, tiers), direct)


def _owner_tiers(derived: Iterable[Site], direct: Sequence[Site]) -> list[Site]:
    """A derived site whose memory is pooled (T3: a KV cache or state pool
    constructed anywhere) keeps that tier: the owner decides the lifetime."""
    tiers = {(s.path, s.span.line): s for s in direct}
    out = []
    for site in derived:
        under = tiers.get((site.via.path, site.via.line)) if site.via else None
        if under is not None and under.tier is Tier.T3 and site.tier is not Tier.T3:
            site = dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"constructs {site.api}: pooled memory ({under.api} at {under.path}:{under.span.line} is T3)"))
        out.append(site)
    return out
