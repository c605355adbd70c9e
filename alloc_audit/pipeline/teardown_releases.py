"""Stage 5, after every tier pass: a free in a C++ destructor releases the
object's own buffers and lives as they do (issue 11, round 28).

Input: classified sites and the project index. Output: the same sites, the
release sites of a destructor (``cudaFree(d_input_)`` in ``~Model``), or of
a method that only the destructor of its class calls
(``Context::FreeCudaBuffers`` from ``~Context``), re-tiered to the tier of
the allocations of the same class that made the freed member (the
constructor's ``cudaMalloc(&d_input_, n)``, an initialiser's
``AllocateCudaBuffers(&d_input_, n)``): a destructor runs once per object,
not per step, and its free ends the lifetime the allocation began (DESIGN.md
"Lifetime tiers": a release carries the lifetime of what it frees).

Left alone: a free of a member no allocation of the class names (a buffer a
caller handed in: its lifetime is the caller's), a member the class's
allocations make with different tiers (a constructor's and a per-call
method's), a method anything but the destructor calls (a reset, a per-step
release), and every free outside a class. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .native_pinned import member_root

_NAME = re.compile(r"\s*(?:\([^()]*\)\s*)?[*&(\s]*(?:this\s*->\s*)?([A-Za-z_]\w*)\s*\)?\s*$")


def teardown_releases(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    releases = [i for i, s in enumerate(sites) if _candidate(s)]
    if not releases:
        return list(sites)
    teardown: dict[int, tuple[Func, str]] = {}  # site position -> (the destructor's class method, via)
    for i in releases:
        func = index.func(sites[i].path, sites[i].scope)
        how = _teardown(func, index) if func is not None else ""
        if func is not None and how:
            teardown[i] = (func, how)
    if not teardown:
        return list(sites)
    owners = {_class(func) for func, _ in teardown.values()}
    made: dict[tuple[str, str], list[Site]] = {}  # (class, member) -> the class's allocations of it
    for site in sites:
        if site.kind is SiteKind.RELEASE or site.language is Language.PYTHON or site.tier is Tier.UNKNOWN:
            continue
        func = index.func(site.path, site.scope)
        if func is None or _class(func) not in owners:
            continue
        for member in _members(site):
            made.setdefault((_class(func), member), []).append(site)
    out = list(sites)
    for i, (func, how) in teardown.items():
        site = sites[i]
        name = _name(site.target or "")
        kept = made.get((_class(func), name), []) if name else []
        tiers = {s.tier for s in kept}
        if len(tiers) != 1:
            continue
        tier = tiers.pop()
        if tier is site.tier:
            continue
        first = min(kept, key=lambda s: (s.path, s.span.line))
        out[i] = dataclasses.replace(site, tier=tier, tier_reason=(
            f"teardown: {how} frees the member {name}, which {first.scope} made at {first.path}:{first.span.line} "
            f"({tier.value}); a destructor runs once per object, and the free ends that buffer's lifetime "
            f"(was: {site.tier_reason})"))
    return out


def kept_until_teardown(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """Round 29: what a method (not the constructor) allocates into a member
    of its object (``cuMemCreate(&m_handles.back(), n)`` in an arena's
    ``enlarge``) and nothing frees before the object's teardown (the class
    frees memory, and only in its destructor and what only the destructor
    calls) is kept by the object for its life, as the constructor's own
    allocations are: it takes their tier (one tier), not the growing
    method's "per call". A class whose other methods free memory (a reset, a
    per-step release, a grow that frees the old buffer) manages it in
    another way and is left alone; so is a class whose constructor
    allocates nothing (no lifetime of its own to read)."""
    candidates = [i for i, s in enumerate(sites) if s.tier is Tier.T4 and s.via is None and s.kind in _KEPT
                  and s.language is not Language.PYTHON and s.tier_reason.startswith("per call in ")
                  and bool(s.target)]
    if not candidates:
        return list(sites)
    ctor_tiers: dict[str, set[Tier]] = {}  # class -> its constructors' own allocations' tiers
    frees: dict[str, bool] = {}  # class -> whether a method other than its teardown frees memory
    for site in sites:
        if site.language is Language.PYTHON or site.via is not None:
            continue
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or not _class(func):
            continue
        if site.kind is SiteKind.RELEASE:
            frees[_class(func)] = frees.get(_class(func), False) or not _teardown(func, index)
        elif func.scope.role == "constructor" and site.kind in _KEPT:
            ctor_tiers.setdefault(_class(func), set()).add(site.tier)
    out = list(sites)
    for i in candidates:
        site = sites[i]
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role != "method" or func.owner is None:
            continue
        owner = _class(func)
        tiers = ctor_tiers.get(owner, set())
        member = member_root(site.target or "", func)
        if len(tiers) != 1 or frees.get(owner, True) or not member or member not in func.owner.fields:
            continue
        tier = next(iter(tiers))
        out[i] = dataclasses.replace(site, tier=tier, tier_reason=(
            f"kept by its object until teardown: {func.qualname} stores it in the member {member}, and nothing "
            f"of {func.owner.name} frees memory before its destructor; the object's own allocations (its "
            f"constructor's) are {tier.value} ({site.tier_reason})"))
    return out


_KEPT = (SiteKind.DEVICE, SiteKind.VIRTUAL, SiteKind.MANAGED)


def _candidate(site: Site) -> bool:
    return site.kind is SiteKind.RELEASE and site.language is not Language.PYTHON and site.via is None \
        and bool(site.target)


def _teardown(func: Func, index: ProjectIndex) -> str:
    """How ``func`` runs only at teardown: it is the destructor, or every call
    that may reach it (one at least) is in the destructor of its class."""
    if func.scope is None or not _class(func):
        return ""
    if func.scope.role == "destructor":
        return func.qualname
    if func.scope.role != "method":
        return ""
    calls = index.calls_reaching(func)
    if not calls or any(caller.scope is None or caller.scope.role != "destructor" or _class(caller) != _class(func)
                        for caller, _call, _resolved in calls):
        return ""
    return f"{func.qualname} (called only from {calls[0][0].qualname})"


def _class(func: Func) -> str:
    """The class a method belongs to: the index's class, or, for a class
    defined more than once (not resolved), its qualified name in this file."""
    if func.owner is not None:
        return func.owner.key
    owner = func.scope.owner if func.scope is not None else None
    return f"{func.path}::{owner}" if owner else ""


def _name(target: str) -> str:
    m = _NAME.match(target)
    return m.group(1) if m else ""


def _members(site: Site) -> set[str]:
    """The members an allocation makes: its target, and for a helper that
    fills what it is handed (``AllocateCudaBuffers(&d_buf_, n)``) the
    addresses among its arguments."""
    out = {name} if (name := _name(site.target or "")) else set()
    for arg in site.shape:
        text = arg.strip()
        if text.startswith("&"):
            name = _name(text[1:])
            if name:
                out.add(name)
    return out
