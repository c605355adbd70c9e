"""Stage 5a, after derive: derived sites that allocate nothing on the device
(issue 11, round 7).

A call to a project function or class whose allocations are all moves
(``x.to(device)``, ``module.to(device=device)``) with the device held in a
parameter allocates nothing on the device when the call chain binds that
parameter to the CPU (``"cpu"``, ``torch.device("cpu")``, a module constant
bound to either, imported or not: ``move_to(m, device=CPU)``) or leaves it
``None`` where the move sits under ``if device is not None:`` (the branch
never runs: ``build_buffers(n)`` without ``device``; an unguarded
``x.to(None)`` leaves ``x`` where it is, which a default-device context may
have made the GPU, so it keeps its site). Such a derived site
is dropped. So is a move to ``self.device`` in the constructor (or a
method it calls on ``self``) that stored the parameter there (round 19).
The values come from the index (``values.bind_edge``): only what the
calls state is known, so a chain with an unknown link keeps its site.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site, Tier
from .index import Func, ProjectIndex, Reach
from .index.values import NONE, Env, Value, bind_edge, off_device
from .move_apis import TO_MOVES
from .off_device import attr_value

_SELF_ATTR = re.compile(r"self\.([A-Za-z_]\w*)")
_ATTR_DEPTH = 4
_DEPTH = 3


def drop_host_moves(derived: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = []
    for site in derived:
        if site.via is None or site.via.api not in TO_MOVES or site.language is not Language.PYTHON \
                or _stays_on_host(site, index) == "":
            out.append(site)
    return out


def _stays_on_host(site: Site, index: ProjectIndex) -> str:
    """Why every allocation the derived call reaches stays off the device, or ""."""
    found = index.site_call(site)
    if found is None:
        return ""
    caller, call = found
    cls = index.constructed_class(caller, call)
    starts = index.constructors(cls) if cls is not None else [f for f in index.resolve(caller, call) if f is not caller]
    whys = []
    for start in starts:
        env = _bind(index, caller, call, start, {})
        for reach in index.reach(start, _DEPTH):
            if not reach.site.acquires or (cls is not None and reach.site.tier is Tier.T1):
                continue  # a layer's own weights are counted where they are made
            why = _on_host(reach, start, env, index)
            if not why:
                return ""
            whys.append(why)
    return whys[0] if whys else ""


def _bind(index: ProjectIndex, caller: Func, call: Call, target: Func, env: Env) -> Env:
    """The edge's values, with the constants the caller's module imports."""
    return bind_edge(caller, call, target, env, index.visible_constants(caller.path))


def _on_host(reach: Reach, start: Func, env: Env, index: ProjectIndex) -> str:
    site = reach.site
    if site.api not in TO_MOVES:
        return ""
    funcs, start_env = [start], env
    for i, hop in enumerate(reach.hops):
        caller = funcs[-1]
        nxt = reach.hops[i + 1] if i + 1 < len(reach.hops) else None
        callee = index.func(nxt.path, nxt.caller) if nxt is not None else index.func(site.path, site.scope)
        if callee is None:
            return ""
        env = _bind(index, caller, hop.call, callee, env)
        funcs.append(callee)
    last = funcs[-1]
    move = next((c for c in last.calls if c.span.line == site.span.line and c.callee.endswith(".to")), None)
    if move is None:
        return ""
    args = split_args(move.arglist)
    device = next((a.text for a in args if a.keyword == "device"), None)
    if device is None:
        device = next((a.text for a in args if a.keyword is None), "")
    name = device.strip()
    value = env.get(name)
    if value is None:
        value = _own_attr(name, start, start_env, reach, index)
    if value is None:
        return ""
    if value.kind == NONE:
        # only a branch the call never takes; `x.to(None)` leaves x where it is,
        # which a default-device context may have made the GPU
        guard = re.compile(r"(?:\b" + re.escape(name) + r"\s+is\s+not\s+None|" + re.escape(name) + r")")
        if not any(b.kind in ("if", "elif") and b.span.contains_line(site.span.line) and guard.fullmatch(b.test.strip())
                   for b in last.blocks):
            return ""
        return f"{site.api} at {site.path}:{site.span.line} is under a branch the call skips: {value.why}"
    if off_device(value):
        return f"{site.api} at {site.path}:{site.span.line} moves to the {value.literal}: {value.why}"
    return ""


def _own_attr(name: str, start: Func, env: Env, reach: Reach, index: ProjectIndex) -> Value | None:
    """``self.device`` of the object being built, when the move runs in its
    constructor or a method the constructor calls on ``self``: what the
    constructor stored there from its parameter (round 19: `ULDLoss(cfg)`
    leaves ``device=None``, stored in ``self.device``)."""
    m = _SELF_ATTR.fullmatch(name)
    if m is None or start.scope is None or start.scope.role != "constructor" \
            or not all(hop.call.callee.startswith("self.") for hop in reach.hops):
        return None
    return attr_value(start, env, m.group(1), index, _ATTR_DEPTH)


def edge_stays_on_host(site: Site, caller: Func, call: Call, func: Func, index: ProjectIndex) -> str:
    """Why the move ``site`` in ``func`` moves nothing to the device when
    ``call`` in ``caller`` runs it, or ""."""
    if site.api not in TO_MOVES:
        return ""
    return _on_host(Reach(site, ()), func, _bind(index, caller, call, func, {}), index)
