"""Stage 5, after ``lifetimes``: a tensor stored to ``P.data`` where ``P``
is a parameter of the function, and every call of the function sits in a
loop of its caller and hands in for ``P`` a name that loop binds, replaces
the storage of a value made in every pass (a loss, a metric), not of a
module's parameter: per step, T4 (issue 11, round 22).

    def log_loss(name, loss):
        loss.data = torch.tensor(0.0, device=device)   # T4, not T1

    for step in range(steps):
        loss = loss_fn(x, y)
        log_loss("all", loss)

``lifetimes`` calls any store to ``X.data`` a parameter's storage (T1). A
parameter of a module is made once, outside the training loop; a name a
loop binds holds a new tensor in every pass. Every call must resolve and
pass a bare name bound (assigned or a call's target) inside a loop that
contains the call, by a value made there: a lookup (``params.get(k)``,
``params[k]``, ``getattr``) in a container bound outside the loop fetches a
parameter that exists already. Anything else keeps T1. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .host_params import every_caller_binds
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_STORAGE = "model-resident: becomes the storage of parameters or buffers (stored to "
_LOOKUP = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*(?:\[|\.get\()")
_PARAM_DATA = re.compile(r"([A-Za-z_]\w*)\.data")


def per_pass_storage(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, str], str] = {}

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T1) and site.tier_reason.startswith(_STORAGE)

    def decide(site: Site) -> Decision | None:
        found = _PARAM_DATA.fullmatch((site.target or "").strip())
        func = index.func(site.path, site.scope)
        if found is None or func is None or func.scope is None or found.group(1) not in func.scope.params:
            return None
        param = found.group(1)
        if any(a.line < site.span.line and param in a.targets for a in func.assigns):
            return None
        key = (func.id, param)
        if key not in memo:
            where: list[str] = []

            def bound_in_loop(caller: Func, passed: tuple[str, ...], line: int) -> bool:
                place = _loop_binding(caller, passed[0], line)
                where.append(place)
                return bool(place)

            memo[key] = where[0] if every_caller_binds(func, (param,), index, bound_in_loop) else ""
        place = memo[key]
        if not place:
            return None
        return Tier.T4, (f"per step: {param}.data is replaced with a value made in every pass ({place}), "
                         f"not a parameter's storage; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _loop_binding(caller: Func, name: str, line: int) -> str:
    """Where a loop of ``caller`` around ``line`` binds ``name``, or ""."""
    if not name.isidentifier():
        return ""
    for block in caller.blocks:
        if block.kind != "loop" or not block.span.contains_line(line):
            continue
        span = block.span
        values = [a.value.strip() for a in caller.assigns if span.contains_line(a.line) and name in _names(a.targets)]
        values += [c.callee + "(" for c in caller.calls
                   if span.contains_line(c.span.line) and name in _names((c.target or "",))]
        inside = {n for a in caller.assigns if span.contains_line(a.line) for n in _names(a.targets)} | {
            n for c in caller.calls if span.contains_line(c.span.line) for n in _names((c.target or "",))}
        if values and all(_made(v, inside) for v in values):
            return f"{caller.qualname}:{line} passes {name}, bound in the loop at line {span.line}"
    return ""


def _made(value: str, inside: set[str]) -> bool:
    """The value is made in the pass: not a lookup (``params.get(k)``,
    ``params[k]``, ``getattr(m, k)``) in a container bound outside the loop
    (a module's parameters fetched by name are still its parameters)."""
    if value.startswith("getattr("):
        return False
    lookup = _LOOKUP.match(value)
    return lookup is None or lookup.group(1) in inside


def _names(targets: Sequence[str]) -> set[str]:
    """The names bound by assignment targets, tuples unpacked (``a, b = f()``)."""
    return {t.strip().strip("()[]*").strip() for target in targets for t in target.split(",")}
