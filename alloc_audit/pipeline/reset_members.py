"""Stage 5, last of the tier passes (after ``lazy_members`` and the
accumulator passes, which would keep it again): a lazily built member the object drops
again on every step (issue 11, round 19).

``if self._sqr is None: self._sqr = torch.zeros(n, device=d)`` is kept for
the process (``lazy_members``: T2) unless another method of the class sets
``self._sqr = None`` again on every step: a method named like a per-step
function (rules/tiers.toml [callers] per-step), a callback the class hands
on (``queue_callback(self._final_callback)``, ``register_hook(self._hook)``:
it runs when the step's hooks run), not under a branch or loop of it. Then
the buffer is made anew each step: T4. A reset in a method of any other
name (``reset()``, ``configure()``), one under a test (``if stale:``) or in
the building method itself (a stale cache dropped) keeps it T2. So is a
member kept lazily (per key too) by an object whose class is built only in
per-call code (``built_per_call``'s builders: ``_Replicator(t)`` in
``step()``, dropped after): T4. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Site, Tier
from .built_per_call import per_call_builders
from .built_per_pass import class_factories
from .index import Func, ProjectIndex
from .lazy_members import member_of

_LAZY = "created lazily: "
_SELF_NAME = re.compile(r"self\.([A-Za-z_]\w*)")


def reset_members(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None
    if per_step is None:
        return list(sites)
    out = []
    memo: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}
    for site in sites:
        lazy = site.tier is Tier.T2 and _LAZY in site.tier_reason
        reset = _reset_per_step(site, index, per_step) if lazy and " per key " not in site.tier_reason else None
        if reset is not None:
            site = dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"rebuilt per step: {reset[1].qualname} sets {reset[0]} back to None on every step "
                f"({reset[2]}), so the lazily built buffer is made anew each time; was: {site.tier_reason}"))
        elif lazy:
            built = _object_per_call(site, index, per_step, memo, factories)
            if built:
                site = dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                    f"per call: the object keeping it is built only in per-call code ({built}) and dropped "
                    f"after; was: {site.tier_reason}"))
        out.append(site)
    return out


def _object_per_call(site: Site, index: ProjectIndex, per_step: object, memo: dict[str, str],
                     factories: dict[str, list[Func]]) -> str:
    """The per-call functions that build the object whose method keeps the
    site lazily (``built_per_call``'s notion: a replicator built inside
    ``step()``), or ""."""
    func = index.func(site.path, site.scope)
    owner = func.owner if func is not None else None
    if owner is None:
        return ""
    if owner.key not in memo:
        ctors = index.constructors(owner)
        memo[owner.key] = "" if class_factories(index, ctors, factories) else per_call_builders(ctors, index, per_step)
    return memo[owner.key]


def _reset_per_step(site: Site, index: ProjectIndex, per_step: object) -> tuple[str, Func, str] | None:
    func = index.func(site.path, site.scope)
    owner = func.owner if func is not None else None
    member = member_of(site, func) if func is not None else None
    if func is None or owner is None or member is None:
        return None
    prefix = owner.qualname + "."
    methods = [f for f in index.functions_in(site.path) if f.qualname.startswith(prefix)]
    for method in methods:
        if method.scope is None or method.scope.role == "constructor":
            continue
        if method is func or not any(a.op == "=" and a.targets == (member,) and a.value.strip() == "None"
                                     and not _branched(method, a.line) for a in method.assigns):
            continue
        if callable(per_step) and per_step(method.name):
            return member, method, f"{method.name} runs per step"
        handed = _handed_on(method, methods)
        if handed:
            return member, method, handed
    return None


def _branched(method: Func, line: int) -> bool:
    """The line sits under a branch or loop of the method (a reset when stale, not on every call)."""
    return any(b.span.line <= line <= b.span.end_line for b in method.blocks)


def _handed_on(method: Func, methods: list[Func]) -> str:
    """A call in the class that takes ``self.<method>`` as an argument (a
    callback or hook registration), as ``where``: "queued by X"."""
    for other in methods:
        for call in other.calls:
            if f"self.{method.name}" not in call.arglist:
                continue
            for arg in split_args(call.arglist):
                m = _SELF_NAME.fullmatch(arg.text.strip())
                if m is not None and m.group(1) == method.name:
                    return f"a callback {other.qualname} hands to {call.callee}"
    return ""
