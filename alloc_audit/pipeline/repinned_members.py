"""Stage 5, after ``native_pinned``: a pinned member re-made on every step
is staging, not a buffer kept (issue 11, round 20).

``lifetimes`` calls a pinned host buffer stored in ``self.x`` kept (T5b):
the object holds it. When the method that stores it does so on every call
(no guard naming the member: ``if self.x is None or ...``), is not set-up
work (a constructor, an ``init*``/``setup*`` method) and runs once per step
(a per-step name, or called inside a loop body by a function within two
calls up: ``while queue: scheduler.bench_text_gen(...)``, or by a method
that is: ``batch.to_pinned()`` there; the method's own per-step name does
not count: a ``forward`` storing ``self.host`` keeps it, the
project-caller-lifetimes convention), each step pins a fresh tensor and
rebinds the member; the previous one is dropped, never reused. That is
staging re-made per step (T5a). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Call, Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER, has_word
from .retier import Decision, retier

_KEPT = "persistent pinned host buffer kept in self."  # lifetimes' reason for a member store
_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")
_SET_UP = re.compile(r"_*(?:init|setup|set_up|load)")  # set-up work, loading included
_UP = 2
_FLAG = re.compile(r"(?:not\s+)?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")


def flag_test(test: str) -> bool:
    """A bare flag (``actual_run``, ``not self.enabled``), not a comparison."""
    return _FLAG.fullmatch(test.strip()) is not None


def repinned_members(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    step = matcher(globs.per_step) if globs.per_step else (lambda name: False)
    load = matcher(globs.load) if globs.load else (lambda name: False)

    def per_step(name: str) -> bool | None:
        return None if load(name) else step(name)
    memo: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T5B and site.kind is SiteKind.PINNED_HOST and site.via is None \
            and site.language is Language.PYTHON and site.tier_reason.startswith(_KEPT)

    def decide(site: Site) -> Decision | None:
        member = (site.target or "").strip()
        if not _MEMBER.fullmatch(member):
            return None
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.owner is None or func.scope.role != "method" \
                or _SET_UP.match(func.name):
            return None
        line = site.stmt_line or site.span.line
        # re-made only when the member (or a local read from it: `pinned = self.x`) is missing or too small,
        # or under any test but a bare flag (`if actual_run:`): grown on demand (`if n > self.capacity:`)
        names = [member] + [a.targets[0] for a in func.assigns if len(a.targets) == 1 and a.value.strip() == member]
        if any(b.test and (any(has_word(b.test, n) for n in names) or not flag_test(b.test))
               for b in func.blocks if b.span.contains_line(line)):
            return None
        if func.id not in memo:
            memo[func.id] = step_reason(func, index, per_step, own=False)
        step = memo[func.id]
        if not step:
            return None
        return Tier.T5A, (f"pinned host memory re-made per step: {site.scope} rebinds {member} to a fresh pinned "
                          f"tensor on every call ({step}); was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def step_reason(func: Func, index: ProjectIndex, per_step: object, own: bool = True, depth: int = _UP,
                loops: bool = True) -> str:
    """How ``func`` runs once per step, or "": its name, or a caller (by
    name, resolving to it or to nothing known) within ``_UP`` calls up that
    calls the chain in a loop or is per step. ``per_step`` answers None for a
    load path: the walk stops there (a loader's loop over modules). With
    ``own`` false, ``func``'s own per-step name does not count; with ``loops``
    false, only per-step callers count, ``depth`` calls up."""
    assert callable(per_step)
    own_step = per_step(func.name)
    if own_step is None:
        return ""
    if own_step and own:
        return f"{func.name} is per step"
    frontier = [func]
    seen = {func.id}
    for _ in range(depth):
        ups: list[Func] = []
        for callee in frontier:
            for caller, call in callers_by_name(callee, index):
                if caller.scope is not None and (caller.scope.role == "constructor" or _SET_UP.match(caller.name)):
                    continue
                step = per_step(caller.name)
                if step is None or _conditional(caller, call):
                    continue
                if loops and _looped(caller, call):
                    return f"{caller.qualname} calls {call.callee} in a loop"
                if step:
                    return f"{caller.qualname} is per step"
                if caller.id not in seen:
                    seen.add(caller.id)
                    ups.append(caller)
        frontier = ups
    return ""


def _conditional(caller: Func, call: Call) -> bool:
    """The call runs only under a test on what it is given (a re-init when a
    size grows: ``if n > self.max_n: self._reinitialize(n)``), not a bare
    flag and not a test of something else (``if __name__ == "__main__":``)."""
    given = set(IDENTIFIER.findall(call.arglist))
    return any(b.test and not flag_test(b.test) and given.intersection(IDENTIFIER.findall(b.test))
               for b in caller.blocks if b.kind in ("if", "elif") and b.span.contains_line(call.span.line))


def callers_by_name(func: Func, index: ProjectIndex) -> list[tuple[Func, Call]]:
    """The calls by ``func``'s name that resolve to it, or to no project
    function and are no allocation site themselves (``x.pin_memory()`` on a
    tensor is not a call of a project method named ``pin_memory``)."""
    out = []
    for caller, i in index.calls_named(func.name):
        call = caller.call_at(i) if caller.table is not None else None
        if call is None:
            continue
        targets = index.resolve(caller, call)
        if func in targets or (not targets and not any(s.span == call.span for s in caller.sites)):
            out.append((caller, call))
    return out


def _looped(caller: Func, call: Call) -> bool:
    """``call`` sits in a loop of ``caller`` and runs on one object each
    time round: no receiver, or one bound before the loop (a parameter, a
    local assigned or built earlier, ``self.x``), not a loop variable or an entry."""
    loops = [b for b in caller.blocks if b.kind == "loop" and b.span.contains_line(call.span.line)]
    if not loops:
        return False
    receiver = call.callee.rpartition(".")[0]
    if not receiver:
        return True
    if "[" in receiver or "(" in receiver:
        return False
    root = receiver.split(".", 1)[0]
    if root in ("self", "cls") or (caller.scope is not None and root in caller.scope.params):
        return True
    start = min(b.span.line for b in loops)
    return any(a.line < start and root in a.targets for a in caller.assigns) or \
        any(c.span.line < start and (c.target or "").strip() == root for c in caller.calls)
