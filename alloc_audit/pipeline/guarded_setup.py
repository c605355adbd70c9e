"""Stage 5, classify (after ``run_once``): set-up work that the objects
calling it make run once, through a flag the set-up method sets.

Input: classified sites and the project index. Output: the same sites, the
per-call (T4) Python device sites of such set-up work re-tiered T2, with a
reason naming the guard.

``run_once`` reads the guard inside the method's own class (``if not
self._built: self._build()``). Set-up is as often guarded by its users,
on the object they reach it through (``if not context.ready:
context.prepare()`` in another class), or by the object itself under a
test on a member the method fills (``if self.scratch is None:
self.prepare()``). A method runs once per object (again only after
something resets the flag: an unload) when:

- it sets a flag member (``self.ready = True``), and
- it has callers, and every call of it sits under an ``if`` on the
  receiver of that call (``context``, ``self``) saying that the flag is
  unset (``not context.ready``, ``context.ready is False``) or that a
  member the method stores is missing (``self.scratch is None``).

What it allocates, and what the functions it calls allocate when they are
reached only from such a method (up to ``_DEPTH`` - 1 calls up; a nested function
inherits its enclosing function's callers; a call handing the ``device``
parameter the CPU or ``meta`` allocates nothing on the device and does not
count), is set-up for the object's life: its kept tables and the
temporaries that build them run once, not per step (DESIGN.md "Lifetime
tiers": set up once -> T2). A method with a call outside such a test, or no
flag, is left alone. Its calls are those the call graph resolves to it and
those by its name it leaves unresolved (an object of unknown type); where
other project functions share the name, an unresolved call counts only when
its guard names the method's own flag. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .index.values import off_device

_DEPTH = 5  # calls up from the site's function to the guarded set-up method
_FUNCTION_ROLES = frozenset({"function", "method"})
_SELF_MEMBER = re.compile(r"self\.\w+")
# `not R.x`, `R.x is False`, `R.x is None` on a receiver R (`self`, `context`, `self.ctx[i]`)
_UNSET = re.compile(r"^\(?\s*(?:not\s+(.+)\.(\w+)|(.+)\.(\w+)\s+is\s+(False|None))\s*\)?$")
_Memo = dict[str, "tuple[str, str] | None"]
_Roots = dict[tuple[str, int], "tuple[str, str] | None"]


@dataclass
class _Ctx:
    index: ProjectIndex
    defined: dict[str, int]  # how many project functions have each name
    roots: _Roots = field(default_factory=dict)
    guards: _Memo = field(default_factory=dict)


def guarded_setup(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    if not any(_candidate(s) for s in sites):
        return list(sites)
    defined: dict[str, int] = {}
    flagged = []
    for func in index.functions():
        defined[func.name] = defined.get(func.name, 0) + 1
        if func.owner is not None and func.language is Language.PYTHON and _flags(func):
            flagged.append(func)
    ctx = _Ctx(index, defined)
    below = _below([f for f in flagged if _guard(f, ctx) is not None], ctx)
    if not below:  # no guarded set-up method: nothing to follow
        return list(sites)
    return [_retiered(site, ctx) if _candidate(site) and _inside(site, below) else site for site in sites]


def _inside(site: Site, below: set[tuple[str, str]]) -> bool:
    """The site's function is one of ``below``, or nested in one (it
    inherits that function's callers)."""
    scope = site.scope
    while True:
        if (site.path, scope) in below:
            return True
        if "." not in scope:
            return False
        scope = scope.rsplit(".", 1)[0]


def _below(roots: list[Func], ctx: _Ctx) -> set[tuple[str, str]]:
    """The functions the guarded methods are or call, within ``_DEPTH`` - 1
    resolved calls: only their sites (and their nested functions') can be
    set-up work; the callers of each are checked afterwards."""
    seen = {f.id: f for f in roots}
    frontier = list(roots)
    for _ in range(_DEPTH - 1):
        step = []
        for func in frontier:
            for _call, targets in ctx.index.callees(func):
                for target in targets:
                    if target.id not in seen:
                        seen[target.id] = target
                        step.append(target)
        frontier = step
    return {(f.path, f.qualname) for f in seen.values()}


def _candidate(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON
            and site.via is None)


def _retiered(site: Site, ctx: _Ctx) -> Site:
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    found = _root(func, ctx, _DEPTH, frozenset())
    if found is None:
        return site
    method, test = found
    reached = "" if method == func.qualname else f"; {func.qualname} is reached only from it"
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"set up once per object: {method} runs only under `{test}` and sets that state{reached}: "
        f"persistent ({site.tier_reason})"))


def _root(func: Func, ctx: _Ctx, depth: int, seen: frozenset[str]) -> tuple[str, str] | None:
    """The guarded set-up method ``func`` is (or is reached only from,
    within ``depth`` calls up), and its guard; None when some chain of
    callers escapes (a cycle included). Memoised per function and depth."""
    key = (func.id, depth)
    if key in ctx.roots:
        return ctx.roots[key]
    found = _guard(func, ctx)
    if found is None and depth > 1 and func.id not in seen:
        callers = _callers(func, ctx)
        roots = [_root(c, ctx, depth - 1, seen | {func.id}) for c in callers]
        if callers and all(r is not None for r in roots):
            found = roots[0]
    if func.id not in seen:
        ctx.roots[key] = found
    return found


def _callers(func: Func, ctx: _Ctx) -> list[Func]:
    """The functions calling ``func`` (unresolved calls by its name too,
    unless another project function has the name) with an argument that may
    put its allocations on the device; a nested function no call reaches,
    its enclosing function when that calls it by name."""
    out: dict[str, Func] = {}
    shared = ctx.defined.get(func.name, 0) > 1
    for caller, call, resolved in ctx.index.calls_reaching(func):
        if not resolved and shared:
            continue
        values = ctx.index.edge_values(caller, call, func, {}) if resolved else {}
        if not off_device(values.get("device")):
            out[caller.id] = caller
    if not out and "." in func.qualname:
        outer = ctx.index.func(func.path, func.qualname.rsplit(".", 1)[0])
        if outer is not None and outer.scope is not None and outer.scope.role in _FUNCTION_ROLES \
                and any(c.rsplit(".", 1)[-1] == func.name for c in outer.callees):
            out[outer.id] = outer
    return list(out.values())


def _guard(func: Func, ctx: _Ctx) -> tuple[str, str] | None:
    if func.id not in ctx.guards:
        ctx.guards[func.id] = _guarded(func, ctx)
    return ctx.guards[func.id]


def _guarded(func: Func, ctx: _Ctx) -> tuple[str, str] | None:
    """``func`` is a method that sets a flag on its object and every call
    of which is guarded by a test that the flag is unset or a member it
    stores is missing, on the call's receiver: (its name, one such test).

    The calls are those the call graph resolves to it, and those by its
    name it leaves unresolved (``context.prepare()`` on an object of unknown
    type): all of them when no other project function has the name; when
    others do, an unresolved call counts only when its guard names the
    method's own flag (it is then this method's), and the rest are taken
    to be the others'."""
    if func.owner is None or func.name == "__init__" or func.language is not Language.PYTHON:
        return None
    flags = _flags(func)
    if not flags:
        return None
    targets = [t for a in func.assigns for t in a.targets] + [(c.target or "").strip() for c in func.calls]
    stored = flags | {t.removeprefix("self.") for t in targets if _SELF_MEMBER.fullmatch(t)}
    shared = ctx.defined.get(func.name, 0) > 1
    shown = ""
    for caller, i in ctx.index.calls_named(func.name):
        if caller.table is None:
            continue
        call = caller.call_at(i)
        receiver = call.callee.rpartition(".")[0]
        test = _unset_test(caller, call.span.line, receiver, flags, stored) if receiver else ""
        if test:
            if not shown or test.startswith("not "):  # the flag's test reads best
                shown = test
            continue
        resolved = ctx.index.resolve(caller, call)  # only an unguarded call needs resolving
        if resolved and func not in resolved:
            continue  # another function's call
        if resolved or not shared:
            return None
    return (func.qualname, shown) if shown else None


def _flags(func: Func) -> set[str]:
    """The members ``func`` sets to ``True`` (``self.ready = True``)."""
    return {t.removeprefix("self.") for a in func.assigns if a.op == "=" and a.value.strip() == "True"
            for t in a.targets if _SELF_MEMBER.fullmatch(t)}


def _unset_test(caller: Func, line: int, receiver: str, flags: set[str], stored: set[str]) -> str:
    """The ``if`` around ``line`` whose test says the receiver's flag is
    unset (``not r.ready``, ``r.ready is False``) or a member the method
    stores is missing (``r.scratch is None``, ``not r.scratch``)."""
    for block in caller.blocks:
        if block.kind == "if" and block.span.contains_line(line):
            text = " ".join(block.test.split())
            m = _UNSET.match(text)
            if m is None or (m.group(1) or m.group(3)) != receiver:
                continue
            name = m.group(2) or m.group(4)
            if name in flags or (name in stored and m.group(5) != "False"):
                return text
    return ""
