"""Stage 5, once the direct tiers are final: a cache class whose kept buffer
is a slab its methods fill in place is pooled (T3) (issue 11, round 23).

The class patterns (``rules/tiers.toml``) know a KV pool by its name
(``*KVCache*``, ``*CachePool*``); a plain ``WindowedCache`` or ``CudaCache``
is named a cache, not a pool, and its constructor's buffers read as the
constructor's T2. What the class does with the buffer says more: a method
writes a range of it in place (``self.k[:b, start:start + n] = keys``,
``self.data[i:j].copy_(x)``) or an allocating method hands out its entries
(``def alloc(self): return self.data[idx], idx``). Such a member is a slab
the steps fill: what the constructor keeps in it is T3, and so is what a
method of the class stores back into it (``self.k = self.k.to(device)``,
``self.v = torch.zeros(to_bsz, ...)`` to grow it). A derived site whose
``via`` is such a slab and that keeps the object (T2: built in a
constructor or an initialiser) is the slab's allocation: T3.

Left alone: a class whose name says no cache (the graph runner's static
inputs, written by a slice copy every step, are T2 set-up buffers); a
member only read, or written whole (a rope table computed once); a derived
construction made per call (T4). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ClassInfo, ProjectIndex
from .retier import Decision, retier

_CACHE = re.compile(r"Cache(?![a-z])")  # `WindowedCache`, `CudaCache`, `KVCacheLayer`; not `Cached`
_MEMBER = re.compile(r"self\.([A-Za-z_]\w*)")
_ALLOC = re.compile(r"_?(?:alloc|allocate|get_block|take)\w*")


def slab_caches(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, str], str] = {}

    def filled(owner: ClassInfo, member: str) -> str:
        """How a method of ``owner`` fills ``self.member`` in place ("" when none does)."""
        key = (owner.key, member)
        if key not in memo:
            memo[key] = _filled(owner, member)
        return memo[key]

    def direct(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is None
                and site.tier in (Tier.T2, Tier.T4))

    def decide(site: Site) -> Decision | None:
        found = _member(site, index)
        if found is None:
            return None
        owner, member, role = found
        how = filled(owner, member)
        if not how or (role != "constructor" and site.tier is not Tier.T4):
            return None
        made = "kept" if role == "constructor" else "stored back"
        return Tier.T3, (f"pooled: {owner.name} keeps a slab in self.{member} ({made} by {site.scope}): {how}; "
                         f"was: {site.tier_reason}")

    sites = retier(sites, direct, decide)
    slabs = {(s.path, s.span.line, s.api): s for s in sites
             if s.via is None and s.tier is Tier.T3 and s.tier_reason.startswith("pooled: ") and " keeps a slab " in
             s.tier_reason}
    if not slabs:
        return sites

    def derived(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is not None
                and site.tier is Tier.T2)

    def decide_derived(site: Site) -> Decision | None:
        via = site.via
        under = slabs.get((via.path, via.line, via.api)) if via is not None else None
        if under is None:
            return None
        slab = under.tier_reason.split("; was: ")[0].removeprefix("pooled: ")
        return Tier.T3, (f"pooled: constructs {site.api}, whose allocation is a slab ({under.path}:{under.span.line}: "
                         f"{slab}); was: {site.tier_reason}")

    return retier(sites, derived, decide_derived)


def _member(site: Site, index: ProjectIndex) -> tuple[ClassInfo, str, str] | None:
    """The cache class, the member the site is kept in, and the role of its function."""
    found = _MEMBER.fullmatch((site.target or "").strip())
    if found is None:
        return None
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None or func.scope is None or not _CACHE.search(func.owner.name):
        return None
    return func.owner, found.group(1), func.scope.role


def _filled(owner: ClassInfo, member: str) -> str:
    entry = f"self.{member}["
    for name, methods in sorted(owner.methods.items()):
        for method in methods:
            if method.scope is None or method.scope.role == "constructor":
                continue
            for a in method.assigns:
                if a.op != "del" and any(t.strip().startswith(entry) and ":" in t for t in a.targets):
                    return f"{name} writes a range of it in place (line {a.line})"
            for c in method.calls:
                if c.callee.startswith(entry) and c.callee.endswith("].copy_"):
                    return f"{name} copies into a range of it (line {c.span.line})"
            if _ALLOC.fullmatch(name) and any(r.value.strip().startswith(entry) for r in method.returns):
                return f"{name} hands out its entries"
    return ""
