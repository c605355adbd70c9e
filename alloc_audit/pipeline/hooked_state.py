"""Stage 5, last of the tier passes: a device tensor handed to an object
that is registered as a hook on a module lives as long as the module
(issue 11, round 22).

    index = index.to(proj.weight.device)
    Reorderer(index, dim=-1).as_hook().register(attn.module)   # kept on the model: T1
    layer.register_forward_pre_hook(Scaler(scale))              # the same

A Python device site bound to a local ``NAME``, and a later construction of
a project class in the same function that takes ``NAME`` whole as an
argument, with no rebinding of ``NAME`` between them, whose object is
registered on a module: a method chain from the construction that calls
``.register(...)`` with an argument, or the construction is the argument
of a module's ``register_forward_hook`` / ``register_forward_pre_hook``
(and the backward ones). The module keeps the hook and the hook keeps the
tensor for every forward: model state, T1, whatever the function's name or
callers say. A tensor handed to a construction that is not registered, or
only through an attribute (``C(NAME.shape)``), keeps its tier. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Site, Tier
from .host_params import chain
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_HOOK_METHODS = frozenset({"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                           "register_full_backward_pre_hook"})


def hooked_state(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, list[tuple[Call, str]]] = {}

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2, Tier.T3, Tier.T4) and bool(site.target) \
            and (site.target or "").isidentifier()

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        if func.id not in memo:
            memo[func.id] = _registered_constructions(func, index)
        name = site.target or ""
        for call, how in memo[func.id]:
            if call.span.line <= site.span.line or not _takes(call, name) \
                    or _rebound(func, name, site.span.line, call.span.line):
                continue
            return Tier.T1, (f"kept on the model: {name} is handed to {call.callee.rsplit('.', 1)[-1]} "
                             f"(line {call.span.line}), {how}; was: {site.tier_reason}")
        return None

    return retier(sites, eligible, decide)


def _registered_constructions(func: Func, index: ProjectIndex) -> list[tuple[Call, str]]:
    """The constructions of project classes in ``func`` whose object is registered on a module."""
    calls = list(func.calls)
    if not any(c.callee.endswith(".register") or c.callee.rsplit(".", 1)[-1] in _HOOK_METHODS for c in calls):
        return []
    out = []
    for call in calls:
        if call.callee.startswith("(") or index.constructed_class(func, call) is None:
            continue
        links = chain(func, call)
        if any(c.callee.endswith(".register") and c.arglist.strip() for c in links if c.span != call.span):
            out.append((call, "whose object is registered as a hook on a module"))
            continue
        outer = next((c for c in calls if c.callee.rsplit(".", 1)[-1] in _HOOK_METHODS and _inside(call, c)), None)
        if outer is not None:
            out.append((call, f"registered by {outer.callee}"))
    return out


def _inside(inner: Call, outer: Call) -> bool:
    a, b = inner.span, outer.span
    return (a.line, a.col) > (b.line, b.col) and (a.end_line, a.end_col) <= (b.end_line, b.end_col)


def _takes(call: Call, name: str) -> bool:
    return any(a.text.strip() == name for a in split_args(call.arglist))


def _rebound(func: Func, name: str, start: int, end: int) -> bool:
    return any(start < a.line < end and name in a.targets for a in func.assigns) or any(
        start < c.span.line < end and (c.target or "").strip() == name for c in func.calls)
