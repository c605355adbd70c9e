"""Stage 5, before ``kept_pinned`` (C++): pinned host memory a function
hands on outlives the call (issue 11, round 20).

The building function alone says "per call: transient staging" (T5a) for a
C++ pinned allocation outside a constructor. Two shapes keep it (T5b):

- **A construction kept right there.** A derived pinned site (``auto opt =
  std::make_shared<Optimizer>(...)``, whose constructor pins) whose local a
  later statement of the function stores outside it: a static or global
  registry (``s_registry[id] = opt;``), a member, or what a parameter refers
  to. The object outlives the call, and so does its pinned memory;
  ``buffer_classes`` then gives the class's own allocations that tier.
- **A builder that hands its buffers out.** A function that frees no host
  memory it pins and stores at least one of its pinned locals outside the
  function (``out = {.tokens = tokens, ...}`` for a ``Batch& out``
  parameter, a member, a global): it builds set-up data for its caller,
  which keeps it; every pinned allocation there outlives the call. A
  function that pins, copies and frees in one call stays T5a.

Pure; only C++ T5a pinned sites are looked at (one index lookup each,
memoised per function).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER
from .retier import Decision, retier

# the name a store's target starts from: `s_registry[id]`, `*out`, `out.tokens`, `this->x_`
_ROOT = re.compile(r"\s*[*&(]*\s*(this\s*->\s*)?([A-Za-z_]\w*)")
_MOVED = re.compile(r"\s*(?:std::)?move\s*\(\s*([A-Za-z_]\w*)\s*\)\s*|\s*([A-Za-z_]\w*)\s*")


def native_pinned(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """C++ T5a pinned sites whose buffer the function stores outside itself: T5b."""
    memo: dict[tuple[str, str], tuple[Func, frozenset[str]] | None] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T5A and site.kind is SiteKind.PINNED_HOST and site.language is not Language.PYTHON

    def decide(site: Site) -> Decision | None:
        local = (site.target or "").strip()
        if not local.isidentifier():
            return None
        key = (site.path, site.scope)
        if key not in memo:
            func = index.func(site.path, site.scope)
            memo[key] = (func, _locals(func)) if func is not None and func.scope is not None else None
        found = memo[key]
        if found is None:
            return None
        func, declared = found
        line = site.stmt_line or site.span.line
        if site.via is not None:
            place = _stored_outside(func, declared, line, local)
            if place:
                return Tier.T5B, (f"persistent pinned host buffer: {site.scope} stores the object in {place}, "
                                  f"which outlives the call; was: {site.tier_reason}")
            return None
        place = _handed_out(func, declared)
        if place:
            return Tier.T5B, (f"persistent pinned host buffer: {site.scope} frees none of the host memory it "
                              f"pins and hands it to its caller ({place}); was: {site.tier_reason}")
        return None

    return retier(sites, eligible, decide)


def _locals(func: Func) -> frozenset[str]:
    """Names the function declares (a store to them stays in the call)."""
    return frozenset(t for a in func.assigns if a.type is not None and not a.type.startswith("static ")
                     for t in a.targets)


def member_root(target: str, func: Func) -> str:
    """The member (or global) name a store to ``target`` in ``func`` starts
    from (``prefill_update`` of ``prefill_update.indptr``, ``ws_`` of
    ``this->ws_``), or "" for a local or a parameter."""
    m = _ROOT.match(target)
    if m is None or func.scope is None:
        return ""
    root = m.group(2)
    if m.group(1):
        return root
    return root if root not in _locals(func) and root not in func.scope.params else ""


def _outside(target: str, declared: frozenset[str]) -> str:
    """``target`` if a store to it leaves the function (a member, a global,
    what a parameter refers to), else ""."""
    m = _ROOT.match(target)
    if m is None:
        return ""
    return target.strip() if m.group(1) or m.group(2) not in declared else ""


def _stored_outside(func: Func, declared: frozenset[str], line: int, local: str) -> str:
    for a in func.assigns:
        if a.line <= line or a.type is not None or a.op != "=" or len(a.targets) != 1:
            continue
        m = _MOVED.fullmatch(a.value)
        if m is not None and (m.group(1) or m.group(2)) == local:
            place = _outside(a.targets[0], declared)
            if place:
                return place
    return ""


def _handed_out(func: Func, declared: frozenset[str]) -> str:
    if any(s.kind is SiteKind.RELEASE and s.api.endswith("FreeHost") for s in func.sites):
        return ""
    pinned = {(s.target or "").strip() for s in func.sites if s.kind is SiteKind.PINNED_HOST and s.via is None}
    for a in func.assigns:
        if a.type is not None or len(a.targets) != 1 or not pinned.intersection(IDENTIFIER.findall(a.value)):
            continue
        place = _outside(a.targets[0], declared)
        if place:
            return place
    return ""
