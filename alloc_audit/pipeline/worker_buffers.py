"""Stage 5, after ``repinned_members``: a worker's relay buffer pinned once
before its serving loop is kept for the worker's life (issue 11, round 20).

A function that pins a local (``relay = torch.empty(n, pin_memory=True)``)
and then runs an unbounded loop (``while True:``, left only by a ``return``
or ``break`` when told to stop: a copy worker, a server loop) that does not
re-make the local there pins it once and reuses it for as long as the worker
runs: T5b, not the building function's "per call: transient staging"
(T5a). A buffer pinned inside the loop, or before a bounded loop (``for i
in range(n)``: one call's chunks), stays T5a. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ProjectIndex
from .retier import Decision, retier

_FOREVER = frozenset({"True", "1"})


def worker_buffers(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return site.tier is Tier.T5A and site.kind is SiteKind.PINNED_HOST and site.via is None \
            and site.language is Language.PYTHON and (site.target or "").strip().isidentifier()

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None:
            return None
        local = (site.target or "").strip()
        line = site.stmt_line or site.span.line
        for loop in func.blocks:
            if loop.kind != "loop" or loop.test.strip() not in _FOREVER or loop.span.line <= line:
                continue
            # not re-made in the loop (the extractor elides the uses: `relay[:n].view(...)` is `(...).view`)
            rebound = any(loop.span.contains_line(c.span.line) and (c.target or "").strip() == local
                          for c in func.calls) or \
                any(loop.span.contains_line(a.line) and local in a.targets for a in func.assigns)
            used = not rebound
            if used:
                return Tier.T5B, (f"persistent pinned host buffer: {site.scope} pins {local} once before its serving "
                                  f"loop (line {loop.span.line}) and reuses it every round; was: {site.tier_reason}")
        return None

    return retier(sites, eligible, decide)
