"""The skeleton of a tier pass: the sites a pass may look at, and for each
one what it decides (a new tier and its reason) or None to leave it. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..model import Language, Site, SiteKind, Tier

WEIGHT_UPLOAD = "weight upload: "  # the reason a weight upload (T1) starts with: passes read it as evidence

Decision = tuple[Tier, str]


def python_device_site(site: Site, *tiers: Tier) -> bool:
    """A direct (not derived) Python device site with one of ``tiers``."""
    return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is None
            and site.tier in tiers)


def retier(sites: Sequence[Site], eligible: Callable[[Site], bool],
           decide: Callable[[Site], Decision | None]) -> list[Site]:
    out = []
    for site in sites:
        decision = decide(site) if eligible(site) else None
        out.append(site if decision is None else dataclasses.replace(site, tier=decision[0],
                                                                     tier_reason=decision[1]))
    return out
