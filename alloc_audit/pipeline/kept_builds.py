"""Stage 5, classify_callers' helper (round 32): does a function keep an
object it builds on its own object?

Input: a function (from the index) and a class name. Output: whether the
function builds that class and keeps the result on ``self``.

A pinned member of a class built only on load paths is load staging (T5a)
when the load drops the object; when the loader keeps it on the object it
loads into, the member lives with that object, and later steps stream from
it: a kept pinned buffer (T5b). True: ``layer = Layer(i); ...;
self.layers.append(layer)``, ``self.cache = Cache(n)``. False: ``staged =
Layer(i); dst.copy_(staged.w)`` (dropped at return), ``layers.append(layer)``
on a local list that is returned (its callers decide, across files)."""

from __future__ import annotations

import dataclasses

from ..arglists import split_args
from ..model import Site
from .index import ClassInfo, Func
from .names import IDENTIFIER

_ADDS = frozenset({"append", "extend", "insert", "add", "setdefault", "__setitem__"})


def keeps_built(caller: Func, cls: str) -> bool:
    """Round 32: ``caller`` builds ``cls`` and keeps the object on its own
    object: bound to ``self.x`` (or an entry of it), or a local it adds to a
    ``self.x`` container (``self.layers.append(layer)``) or stores there."""
    for call in caller.calls:
        if call.callee != cls and not call.callee.endswith(f".{cls}"):
            continue
        target = (call.target or "").strip()
        if target.startswith("self."):
            return True
        if not IDENTIFIER.fullmatch(target):
            continue
        if any(c.callee.startswith("self.") and c.callee.rsplit(".", 1)[-1] in _ADDS
               and any(a.text.strip() == target for a in split_args(c.arglist)) for c in caller.calls):
            return True
        if any(t.startswith("self.") and a.value.strip() == target for a in caller.assigns for t in a.targets):
            return True
    return False


def kept_by_loader(site: Site, func: Func, cls: ClassInfo, loaders: list[Func], names: str) -> Site | None:
    """A pinned ``self.x`` of ``cls`` (made in ``func``), which ``loaders``
    (all load paths) build, one of which keeps the object on its own object
    and none of which replaces ``self.x`` on every object it builds (calls,
    outside any ``if``, another method of ``cls`` that binds ``self.x``
    anew: ``layer.to_gpu(d)`` doing ``self.w = self.w.to(d)``): the site
    with its (kept pinned) tier and a reason saying so; None otherwise."""
    target = (site.target or "").strip()
    if not target.startswith("self.") or not any(keeps_built(c, cls.name) for c in loaders):
        return None
    rebinders = {m.name for ms in cls.methods.values() for m in ms if m is not func
                 and (any(a.op == "=" and target in a.targets for a in m.assigns)
                      or any((c.target or "").strip() == target for c in m.calls))}
    if any(_calls_unconditionally(c, rebinders) for c in loaders):
        return None  # the load replaces the pinned copy: staging for it
    return dataclasses.replace(site, tier_reason=(
        f"{site.tier_reason}; {cls.name} is built on load paths ({names}) that keep it on their object, so its "
        f"pinned member lives with that object, not one load phase"))


def _calls_unconditionally(caller: Func, methods: set[str]) -> bool:
    """``caller`` calls one of ``methods`` on some object outside any ``if``/``else`` branch."""
    branches = [b for b in caller.blocks if b.kind == "else" or b.kind.startswith("if")]
    return any("." in c.callee and c.callee.rsplit(".", 1)[-1] in methods
               and not any(b.span.contains_line(c.span.line) for b in branches) for c in caller.calls)
