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
applies the same rule again once every direct tier is final.

A direct ``x.pin_memory()`` (T5a, a tensor's staging copy by its name) that
resolves to a project method named ``pin_memory`` (``ema.pin_memory()`` of
``ema = Ema(...)``, also from a nested function through its enclosing
one's local) is that method's call: the method's persistent pinned memory
(T5b, kept on its object) is what it allocates.

A pinned copy stored back into a tensor's storage (``p.data =
p.data.pin_memory()`` over a module's parameters; not ``self.data``, an
object's own member, nor a ``.grad``) re-points the parameter at pinned
memory: the parameter keeps it, T5b (round 19). Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .buffer_classes import buffer_class_sites
from .derive import keeps_pinned
from .index import Func, ProjectIndex

_STORAGE = re.compile(r"(?!self\.|cls\.)[A-Za-z_]\w*(?:\.(?!grad\b)[A-Za-z_]\w*)*\.data")


def kept_pinned(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    direct = {(s.path, s.span.line): s for s in sites if s.via is None and s.kind is SiteKind.PINNED_HOST}
    if not direct:
        return list(sites)
    buffers = buffer_class_sites([s for s in sites if s.via is None])
    kept_by = {(s.path, s.scope) for s in direct.values() if s.tier is Tier.T5B}
    out = []
    for site in sites:
        if site.via is None and site.tier is Tier.T5A and site.api == "Tensor.pin_memory":
            method = _pinning_method(site, index, kept_by)
            if not method and site.target is not None and _STORAGE.fullmatch(site.target.strip()):
                site = dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                    f"kept pinned: stored into {site.target.strip()}, the tensor's own storage re-pointed at the "
                    f"pinned copy (T5b); was: {site.tier_reason}"))
            elif method:
                site = dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                    f"calls {method}, which keeps the pinned host memory on its object (T5b); was: {site.tier_reason}"))
        via = site.via
        under = direct.get((via.path, via.line)) if via is not None and site.language is Language.PYTHON else None
        if under is not None and site.kind is SiteKind.PINNED_HOST and keeps_pinned(site, under, index, buffers):
            site = dataclasses.replace(site, tier=under.tier, tier_reason=(
                f"constructs {site.api}, which keeps its pinned host memory ({under.api} at "
                f"{under.path}:{under.span.line} is T5b: pinned once, reused); was: {site.tier_reason}"))
        out.append(site)
    return out


def _pinning_method(site: Site, index: ProjectIndex, kept_by: set[tuple[str, str]]) -> str:
    """The project ``pin_memory`` method (with a T5b site) the call at
    ``site`` runs: its receiver is a local bound to a construction of the
    method's class, in the function or one enclosing it; "" if none."""
    funcs = _enclosing(site.path, site.scope, index)
    call = next((c for c in funcs[0].calls if c.span == site.span), None) if funcs else None
    if call is None:
        return ""
    receiver, _, name = call.callee.rpartition(".")
    if name != "pin_memory" or not receiver.isidentifier():
        return ""
    for outer in funcs:
        for bound in outer.calls:
            if (bound.target or "").strip() != receiver:
                continue
            for ctor in index.resolve(outer, bound):
                if ctor.owner is not None and (ctor.path, f"{ctor.owner.qualname}.pin_memory") in kept_by:
                    return f"{ctor.owner.qualname}.pin_memory"
    return ""


def _enclosing(path: str, scope: str, index: ProjectIndex) -> list[Func]:
    """The function of ``scope`` and those enclosing it, innermost first."""
    out = []
    while scope:
        func = index.func(path, scope)
        if func is not None:
            out.append(func)
        scope = scope.rpartition(".")[0]
    return out
