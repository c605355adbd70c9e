"""Stage 5, classify (after the kept results): objects built for one pass.

Input: classified sites and the project index. Output: the same sites, a
few constructor sites re-tiered, each with a reason naming the loop. Pure.

DESIGN.md ("Lifetime tiers"): where the result goes decides, not the name.
A class whose every construction in the project sits in a loop body
(``for name, w in weights.items(): helper = ClipHelper(w)``) into a local
that the pass drops (not appended, not stored on an object or into a
container the function returns, not handed to another construction, not
returned) makes its constructor's buffers on every pass: T4. Built in a
loop and kept (``self.layers.append(Layer(d))``, a list the builder
returns), it keeps the constructor's tier.

Helpers for ``classify_callers`` (objects built per step): the classmethod
factories of a class (``return cls(...)`` in ``from_input_ids``), which
build it for their callers, and ``default_fill``: a constructor's test on
its own parameter (``if position_ids is None:``) fills in a default on
every construction, it guards nothing to run once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, Tier
from .index import Func, ProjectIndex

_CONSTRUCTOR = "constructor "  # the reason of the constructor pattern (rules/tiers.toml)
_ADDS = (".append", ".extend", ".insert", ".add", ".update", ".setdefault", ".add_module", ".register_module")
# `p is None`, `p.x is not None`, `p.get_x() is None`: the root named and the whole operand
_NONE_TEST = re.compile(r"(?<![\w.])(([A-Za-z_]\w*)(?:\.\w+(?:\(\))?)*)\s+is\s+(?:not\s+)?None\b")
_PATHS = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+(?:\(\))?)+")


def class_factories(index: ProjectIndex, funcs: Sequence[Func], memo: dict[str, list[Func]]) -> list[Func]:
    """The classmethods of the class of constructors ``funcs`` that build
    it (``cls(...)``): a call of one is a construction. Once per class."""
    owner = funcs[0].owner if funcs else None
    if owner is None or funcs[0].language is not Language.PYTHON:
        return []
    key = f"cls()#{owner.key}"
    if key not in memo:
        memo[key] = [f for path in owner.paths for f in index.functions_in(path)
                     if f.owner is owner and f.scope is not None and f.scope.params[:1] == ("cls",)
                     and any(c.callee == "cls" for c in f.calls)]
    return memo[key]


def default_fill(func: Func, test: str, target: str = "") -> bool:
    """``test`` (of a branch in constructor ``func``) compares only its
    parameters, or what they hold, with None: a default filled in, or an
    optional input taken, on every construction (``if pos is None: pos =
    torch.arange(n)``, ``if jt.weights_or_none() is not None:``). In any
    function or method when ``target``, what the branch allocates into, is
    a parameter (a local, not the object): ``if latent is None: latent =
    torch.randn(...)`` fills a default on every call."""
    scope = func.scope
    if scope is None or "hasattr" in test or (scope.role != "constructor" and not (
            target in scope.params and scope.role in ("function", "method"))):
        return False
    found = _NONE_TEST.findall(test)
    # every attribute path of the test is one of the compared operands
    paths = _PATHS.findall(test)
    return bool(found) and all(root in scope.params and root not in ("self", "cls") for _, root in found) \
        and all(p in {whole for whole, _ in found} for p in paths)


def built_per_pass(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, str | None] = {}
    out = []
    for site in sites:
        if site.tier is Tier.T2 and site.via is None and site.language is Language.PYTHON \
                and site.tier_reason.startswith(_CONSTRUCTOR):
            site = _per_pass(site, index, memo)
        out.append(site)
    return out


def _per_pass(site: Site, index: ProjectIndex, memo: dict[str, str | None]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role != "constructor" or func.owner is None:
        return site
    key = func.owner.key
    if key not in memo:
        memo[key] = _every_build_in_a_loop(index, index.constructors(func.owner))
    where = memo[key]
    if where is None:
        return site
    return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
        f"per loop pass: every construction of {func.owner.name} is in a loop that drops it ({where}); "
        f"{site.tier_reason}"))


def _every_build_in_a_loop(index: ProjectIndex, ctors: list[Func]) -> str | None:
    """Where the class is built (one place, for the reason) when every
    construction is inside a loop into a local the pass drops, else None."""
    if not ctors:
        return None
    dist = index.callers_within(ctors, 1)
    callers = [index.funcs[f] for f, d in sorted(dist.items()) if d == 1 and f in index.funcs]
    if not callers:
        return None
    found = None
    for caller in callers:
        if caller.scope is None or caller.scope.role in ("module", "class"):
            return None
        lines = [c for c in caller.calls if set(index.resolve(caller, c)) & set(ctors)]
        if not lines:
            return None
        for call in lines:
            loop = next((b for b in caller.blocks if b.kind == "loop" and b.span.contains_line(call.span.line)),
                        None)
            name = (call.target or "").strip()
            if loop is None or not name.isidentifier() or _kept(caller, name, call.span.line, loop.span.end_line):
                return None
            found = found or f"{caller.qualname}, {caller.path}:{call.span.line}"
    return found


def _kept(caller: Func, name: str, start: int, end: int) -> bool:
    """The local ``name`` outlives the pass: returned, stored on an object
    or into a container (`self.h = h`, `blocks.append(h)`), handed to a
    construction or to a method of ``self``."""
    word = re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w])")
    own = re.compile(rf"(?<![\w.]){re.escape(name)}\s*(?:[,)\]}}]|$)")  # the object itself, not a member of it
    if any(word.search(r.value) for r in caller.returns):
        return True
    for a in caller.assigns:
        if start < a.line <= end and own.search(a.value.strip()) and not all(
                t.strip().isidentifier() for t in a.targets):
            return True
    for call in caller.calls:
        if not (start < call.span.line <= end) or not own.search(call.arglist):
            continue
        leaf = call.callee.rpartition(".")[2]
        if call.callee.endswith(_ADDS) or leaf[:1].isupper() or call.callee.startswith("self.") \
                or leaf in ("setattr", "register_buffer"):
            return True
    return False
