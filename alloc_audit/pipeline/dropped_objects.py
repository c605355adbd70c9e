"""Stage 5, after the per-call constructions: objects their builders drop
after one use keep their state for that call only (issue 11, round 22).

    index = Calibrator(config, quantizer).calibrate(weights)   # built, used once, dropped
    ...
    residual = Calibrator(config, quantizer)                   # a local the builder deletes
    ...
    index = residual.calibrate(weights)
    del residual

A class every construction of which (the calls of its constructors, one
call up; at least one) is either the receiver of one call of a method of
the class whose returns never hand out ``self`` whole (the object is
dropped when the statement ends), or bound to a local that the builder
``del``s and never stores on an object, in a container or in another
construction, lives for one call of its builder: what its methods keep on
it (the T2 of a constructor or an initialiser, ``self.arange =
torch.arange(n)`` in ``init_indexes``) is per call, T4; and so is what a
module-level initialiser returns when every caller is a method of such a
class. A class also built by a ``cls(...)`` factory, by ``super()``, kept,
returned, or used by more than one call keeps its tiers. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Call, Site, Tier
from .built_per_call import keeps
from .built_per_pass import class_factories
from .host_params import chain
from .index import ClassInfo, Func, ProjectIndex
from .names import has_word
from .retier import Decision, python_device_site, retier

_REASONS = ("constructor ", "initialiser ")  # the reasons of the constructor and initialiser patterns
_SELF_WHOLE = re.compile(r"(?<![\w.])self\b(?!\s*\.)")


def dropped_objects(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}

    def dropped(owner: ClassInfo) -> str:
        if owner.key not in memo:
            memo[owner.key] = ""
            ctors = index.constructors(owner)
            memo[owner.key] = "" if not ctors or class_factories(index, ctors, factories) \
                else _dropped_by_builders(owner, ctors, index)
        return memo[owner.key]

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2) and site.tier_reason.startswith(_REASONS)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None:
            return None
        if func.owner is not None:
            found = dropped(func.owner)
            if not found:
                return None
            return Tier.T4, (f"per call: {func.owner.name} is dropped by its builders after one use ({found}); "
                             f"was: {site.tier_reason}")
        if func.scope.role != "function":
            return None
        callers = [index.funcs.get(fid) for fid, d in index.callers_within([func], 1).items() if d == 1]
        owners = {c.owner.key: c.owner for c in callers if c is not None and c.owner is not None}
        if not callers or any(c is None or c.owner is None for c in callers) \
                or not all(dropped(o) for o in owners.values()):
            return None
        names = ", ".join(sorted(o.name for o in owners.values()))
        return Tier.T4, (f"per call: returned only to methods of {names}, dropped by their builders after one use; "
                         f"was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _dropped_by_builders(owner: ClassInfo, ctors: list[Func], index: ProjectIndex) -> str:
    """How every builder of ``owner`` drops it ("" when one does not)."""
    builders = [index.funcs[fid] for fid, d in sorted(index.callers_within(ctors, 1).items())
                if d == 1 and fid in index.funcs]
    shown: list[str] = []
    for builder in builders:
        if builder.scope is None or builder.scope.role not in ("function", "method"):
            return ""
        calls = [c for c in builder.calls if index.constructed_class(builder, c) is owner]
        if not calls:
            return ""  # `super().__init__(...)` of a subclass, or a call the rule cannot see
        for call in calls:
            how = _dropped_at(builder, call, owner, index)
            if not how:
                return ""
            shown.append(f"{how} in {builder.qualname}")
    return ", ".join(sorted(set(shown))[:3])


def _dropped_at(builder: Func, call: Call, owner: ClassInfo, index: ProjectIndex) -> str:
    """How ``builder`` drops the object construction ``call`` makes ("" when it may keep it)."""
    links = chain(builder, call)
    outer = [c for c in links if c.span != call.span]
    target = (call.target or "").strip()
    if len(outer) == 1 and outer[0].callee.startswith("(...)."):
        method = outer[0].callee.rsplit(".", 1)[-1]
        found = _method(owner, method, index)
        if found and not any(_SELF_WHOLE.search(r.value) for f in found for r in f.returns):
            return f"used once by .{method}()"
        return ""
    if outer or not target.isidentifier():
        return ""
    deleted = any(a.op == "del" and target in a.targets and a.line > call.span.line for a in builder.assigns)
    if not deleted or keeps(builder, owner, index) \
            or any(r.line > call.span.line and has_word(r.value, target) for r in builder.returns):
        return ""
    return f"deleted as {target}"


def _method(owner: ClassInfo, name: str, index: ProjectIndex) -> list[Func]:
    """``owner``'s method ``name`` or its nearest base's, a generic base
    (``Calibrator[Config, Tensor]``) looked up by its plain name when the
    project defines one class of that name."""
    found = index.method_lookup(owner, name)
    for base in owner.bases:
        if found or "[" not in base:
            continue
        classes = index.classes_named(base.split("[", 1)[0].rsplit(".", 1)[-1])
        found = index.method_lookup(classes[0], name) if len(classes) == 1 else []
    return found
