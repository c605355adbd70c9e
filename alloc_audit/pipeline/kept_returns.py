"""Stage 5, before the derived sites: a buffer a function returns is as
long-lived as what its callers keep it in (issue 11, round 22).

A device buffer tiered T4 only because its function runs per call ("per
call in F") that F returns (directly, or through a local or a list the
return names) is

- a weight (T1) when every call of F outside test code keeps the result as
  one: stored in a ``self.x`` its class registers as a buffer, wrapped in a
  ``Parameter`` or a registration (``self.weight = nn.Parameter(w)`` after
  ``w = m.transform_weight(w)``), or copied into one (``layer.weight.copy_(w)``,
  a registered member): a weight transform run at load time;
- kept by the object (T2) when F takes nothing but its object (a workspace
  factory, not an op making its output from its inputs) and every such call
  stores the result in a ``self.x`` (``self.workspace =
  self._alloc_workspace()``) in set-up work: a constructor, or a method only
  constructors call (within three calls).

Calls are found by F's name, resolved or not (a call resolved to another
function does not count); tests exercise F, their use says nothing about its
lifetime. A call that drops the result or uses it per call keeps the site
T4, and so does a function nobody outside tests calls. ``derive`` then
counts a kept workspace (T2) as its callers' allocation (``Matmul(...)``
whose constructor keeps the workspace is a derived site through it); a
weight never makes a construction a derived site. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import split_args, split_top_level
from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Call, Site, Tier
from .index import Func, ProjectIndex
from .lazy_members import registration_of_member
from .module_state import REGISTERS
from .names import IDENTIFIER
from .retier import Decision, python_device_site, retier

RETURNED_KEPT = "returned and kept: "  # derive counts these as allocations of their callers
_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")
_COPY = re.compile(r"\.(?:copy_|set_)$")
# what a weight is called: `layer.weight`, `self.qweight.data`, `p.bias`
_WEIGHTY = re.compile(r"(?:^|[._])(?:\w*weights?|bias)(?:\.data)?$")


def kept_returns(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role not in ("function", "method") \
                or not _returned(site, func):
            return None
        kept = _kept_by_callers(func, index, per_step)
        if kept is None:
            return None
        tier, how = kept
        return tier, (f"{RETURNED_KEPT}{how}: every call of {func.qualname} keeps what it returns; "
                      f"was: {site.tier_reason}")

    return retier(sites, lambda s: python_device_site(s, Tier.T4) and s.tier_reason.startswith("per call in "),
                  decide)


def _returned(site: Site, func: Func) -> bool:
    """``func`` returns the site's memory: on the return's line, or a local
    (or a list or tuple holding it, `result = [weight]`) the return names
    and nothing binds again."""
    lines = {r.line for r in func.returns}
    if site.stmt_line in lines or site.span.line in lines:
        return True
    local = (site.target or "").strip()
    if not local.isidentifier():
        return False
    line = site.span.line
    if any(a.line > line and local in a.targets for a in func.assigns) or \
            any(c.span.line > line and (c.target or "").strip() == local for c in func.calls):
        return False  # bound again (`n = n.int() // k`): what is returned is another tensor
    named = {w for r in func.returns for w in IDENTIFIER.findall(r.value)}
    if local in named:
        return True
    return any(len(a.targets) == 1 and a.targets[0] in named and a.line > site.span.line
               and a.value.strip()[:1] in "[(" and local in (e.strip() for e in split_top_level(a.value.strip()[1:-1]))
               for a in func.assigns)


def _kept_by_callers(func: Func, index: ProjectIndex,
                     per_step: Callable[[str], bool] | None) -> tuple[Tier, str] | None:
    """(T1, how) when every call outside test code keeps the result as a
    weight, (T2, how) when every one keeps it on ``self`` (not per step);
    None otherwise, or when there is no such call."""
    callers = {caller.id: caller for caller, _ in index.calls_named(func.name)}
    # a workspace factory takes nothing but its object: an op (`rms_norm(x, w)`) makes its output from its inputs
    factory = func.scope is not None and not [p for p in func.scope.params if p not in ("self", "cls")]
    weights: list[str] = []
    members: list[str] = []
    for caller in callers.values():
        if test_path(caller.path):
            continue
        for call in caller.calls_of(func.name):
            resolved = index.resolve(caller, call)
            if resolved and func not in resolved:
                continue
            how = _as_weight(caller, call)
            if how:
                weights.append(f"{how} in {caller.qualname}")
            elif factory and _MEMBER.fullmatch((call.target or "").strip()) \
                    and not (per_step is not None and per_step(caller.name)) and _set_up(caller, index, 3):
                members.append(f"{call.target} in {caller.qualname}")
            else:
                return None
    if members:
        return Tier.T2, f"kept on the object ({', '.join((members + weights)[:2])})"
    return (Tier.T1, f"a weight transform run at load time ({', '.join(weights[:2])})") if weights else None


def _set_up(func: Func, index: ProjectIndex, depth: int) -> bool:
    """``func`` is a constructor, or a method only constructors call (through
    at most ``depth`` calls): set-up work, run once per object."""
    if func.scope is None or func.scope.role == "constructor":
        return func.scope is not None
    if depth <= 0 or func.scope.role != "method":
        return False
    callers = [index.funcs[fid] for fid, d in index.callers_within([func], 1).items() if d == 1 and fid in index.funcs]
    return bool(callers) and all(_set_up(c, index, depth - 1) for c in callers)


def _as_weight(caller: Func, call: Call) -> str:
    """How ``caller`` keeps the call's result as a weight, or ""."""
    target = (call.target or "").strip()
    line = call.span.line
    if target.startswith("self.") and registration_of_member(caller, target):
        return f"stored in the registered {target}"
    outer = next((c for c in caller.calls if c is not call and c.span.contains(call.span)
                  and REGISTERS.search(c.callee)), None)
    if outer is not None:
        return f"wrapped in {outer.callee}"
    if not target.isidentifier():
        return ""
    for later in caller.calls:
        if later.span.line < line or later is call:
            continue
        args = [a.text.strip() for a in split_args(later.arglist)]
        if REGISTERS.search(later.callee) and any(a == target or a.startswith(target + ".") for a in args):
            return f"wrapped in {later.callee}"
        if _COPY.search(later.callee) and args[:1] == [target] and _into_weight(caller, later.callee):
            return f"copied by {later.callee}"
    for assign in caller.assigns:
        if assign.line > line and len(assign.targets) == 1 and assign.value.strip() == target \
                and assign.targets[0].startswith("self.") and registration_of_member(caller, assign.targets[0]):
            return f"stored in the registered {assign.targets[0]}"
    return ""


def _into_weight(caller: Func, callee: str) -> bool:
    """``callee`` (``w.copy_``) copies into a weight: a member its class
    registers as a buffer, or one named for weights."""
    receiver = callee.rsplit(".", 1)[0]
    return _WEIGHTY.search(receiver) is not None or (
        _MEMBER.fullmatch(receiver) is not None and bool(registration_of_member(caller, receiver)))
