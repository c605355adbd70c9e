"""Stage 5a, derive: calls to project factories become *derived sites* in
the caller's scope (found by the index), classified like direct sites; a
derived site whose memory is pooled keeps the pool's tier, and one whose
memory its caller exports (`cudaIpcGetMemHandle`) is an IPC slab."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from ..catalog import ApiCatalog, TierPattern
from ..model import FileFacts, Language, Site, SiteKind, Tier
from .classify import classify_sites
from .index import ProjectIndex


def derive_sites(index: ProjectIndex, files: Mapping[str, FileFacts], tiers: tuple[TierPattern, ...],
                 direct: Sequence[Site], apis: ApiCatalog | None = None) -> list[Site]:
    derived = index.derived_sites()
    if apis is not None:
        derived = kinds_from_use(derived, index, apis)
    return _owner_tiers(classify_sites(derived, files, tiers), direct)


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


def kinds_from_use(derived: tuple[Site, ...], index: ProjectIndex, apis: ApiCatalog) -> tuple[Site, ...]:
    """Kind from use for derived sites, as extraction does for direct ones: a
    factory's device memory whose result the caller passes to an export call
    (`cudaIpcGetMemHandle(self.buf)`) in the same scope is an IPC slab."""
    out = []
    for site in derived:
        if site.kind is SiteKind.DEVICE and site.target:
            func = index.func(site.path, site.scope)
            exports = apis.py_exports if site.language is Language.PYTHON else apis.cpp_exports
            target = site.target.lstrip("*&")
            for call in func.calls if func is not None else ():
                leaf = re.split(r"\.|::|->", call.callee)[-1]
                if leaf in exports and target in re.findall(r"[A-Za-z_][\w.>-]*", call.arglist.replace("&", " ")):
                    site = dataclasses.replace(site, kind=SiteKind.IPC)
                    break
        out.append(site)
    return tuple(out)
