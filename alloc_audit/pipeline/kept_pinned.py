"""Stage 5, last: an object whose constructor keeps persistent pinned host
memory keeps it wherever it is built, judged with the final tiers (issue
11, round 17).

``derive`` gives a derived pinned-host site (``Group(...)`` whose
constructor pins every parameter into ``self.cpu_params``) the tier of its
real allocation (``via``) when that is persistent pinned memory (T5b),
where the building function alone says "per call: transient staging"
(T5a); ``derive.keeps_pinned`` says when. It runs before the passes that
find a pinned buffer kept by the caller of a helper that returns it
(``cpu[p] = self._to_cpu(p)``, T5a -> T5b after ``derive``). This pass
applies the same rule again once every direct tier is final. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..model import Language, Site, SiteKind
from .buffer_classes import buffer_class_sites
from .derive import keeps_pinned
from .index import ProjectIndex


def kept_pinned(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    direct = {(s.path, s.span.line): s for s in sites if s.via is None and s.kind is SiteKind.PINNED_HOST}
    if not direct:
        return list(sites)
    buffers = buffer_class_sites([s for s in sites if s.via is None])
    out = []
    for site in sites:
        via = site.via
        under = direct.get((via.path, via.line)) if via is not None and site.language is Language.PYTHON else None
        if under is not None and site.kind is SiteKind.PINNED_HOST and keeps_pinned(site, under, index, buffers):
            site = dataclasses.replace(site, tier=under.tier, tier_reason=(
                f"constructs {site.api}, which keeps its pinned host memory ({under.api} at "
                f"{under.path}:{under.span.line} is T5b: pinned once, reused); was: {site.tier_reason}"))
        out.append(site)
    return out
