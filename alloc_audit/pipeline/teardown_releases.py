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
