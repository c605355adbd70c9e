"""Stage 5, last of the tier passes (after ``lazy_members`` and the
accumulator passes, which would keep it again): a lazily built member that is
made anew each step (issue 11, rounds 19-20).

``lazy_members`` keeps ``if self._sqr is None: self._sqr = torch.zeros(n,
device=d)`` for the process (T2): it is rebuilt only when the member is None.
What sets it back to None, and who builds the object, decide (first match):

1. Another method of the class sets ``self._sqr = None`` at its top level
   (not under a branch or loop) and runs on every step: a method named like a
   per-step function (rules/tiers.toml [callers] per-step), or a callback the
   class hands on (``queue_callback(self._final_callback)``,
   ``register_hook(self._hook)``: it runs when the step's hooks run). A member
   kept per key is left to 2 and 3.
2. The object keeping it is built only in per-call code (``built_per_call``'s
   builders: ``_Replicator(t)`` in ``step()``, dropped after). So too (round
   24) for a buffer a method returns to the class's own methods, which keep
   it on the object (``self.mask = self._calc_mask(...)`` in ``__call__`` of
   a logits processor ``generate`` builds each call).
3. The build sits under ``if self.x is None:`` and another method that runs
   per step resets it: a per-step name, ``train_batch``/``eval_batch``, or a
   method a per-step function calls (``release_workspace()`` from
   ``generate``; a loop's calls do not count: ``unload()`` in a loader's
   loop, a test's loop). The reset may sit under a test of a configuration
   flag of the object (``if self.contiguous_gradients:``, a bare
   ``self.flag``, decided once).

Each is T4. A reset in a method of any other name (``reset()``,
``configure()``), one under any other test (``if stale:``), or in the
building method itself (a stale cache dropped) keeps it T2. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, Tier
from .built_per_call import per_call_builders
from .built_per_pass import class_factories
from .index import Func, ProjectIndex
from .lazy_members import member_of
from .repinned_members import step_reason
from .retier import Decision, retier

_LAZY = "created lazily: "
_KEPT_BY_CALLERS = "kept by its callers: "  # kept_accumulators: a method's result its callers keep on the object
_SELF_NAME = re.compile(r"self\.([A-Za-z_]\w*)")
# one batch per call: a training engine's `train_batch(data_iter)`, `eval_batch`
_BATCH = re.compile(r"_*(?:train|eval)_batch")
_FLAG = re.compile(r"(?:not\s+)?self\.[A-Za-z_]\w*")


def reset_members(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    named = matcher(globs.per_step)

    def batch_step(name: str) -> bool:
        return named(name) or _BATCH.fullmatch(name) is not None
    built: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}
    steps: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T2 and (_LAZY in site.tier_reason or site.tier_reason.startswith(_KEPT_BY_CALLERS))

    def decide(site: Site) -> Decision | None:
        if site.tier_reason.startswith(_KEPT_BY_CALLERS):  # kept on its own object by the class's methods
            builders = _object_per_call(site, index, named, built, factories) if _own_callers(site, index) else ""
            return (Tier.T4, (f"per call: the object whose methods keep it is built only in per-call code "
                              f"({builders}) and dropped after; was: {site.tier_reason}")) if builders else None
        reset = _reset_by_name(site, index, named) if " per key " not in site.tier_reason else None
        if reset is not None:
            member, method, why = reset
            return Tier.T4, (f"rebuilt per step: {method.qualname} sets {member} back to None on every step "
                             f"({why}), so the lazily built buffer is made anew each time; was: {site.tier_reason}")
        builders = _object_per_call(site, index, named, built, factories)
        if builders:
            return Tier.T4, (f"per call: the object keeping it is built only in per-call code ({builders}) and "
                             f"dropped after; was: {site.tier_reason}")
        if site.via is None and site.language is Language.PYTHON and site.tier_reason.startswith(_LAZY):
            return _reset_by_caller(site, index, batch_step, steps)
        return None

    return retier(sites, eligible, decide)


def _reset_by_caller(site: Site, index: ProjectIndex, per_step: Callable[[str], bool],
                     memo: dict[str, str]) -> Decision | None:
    """Rule 3: the build is guarded by ``self.x is None`` and a method that
    runs per step (by name or by its callers) resets the member."""
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None:
        return None
    member = member_of(site, func)
    line = site.stmt_line or site.span.line
    # rebuilt when the member is missing (`if self.x is None:`), not moved while present (`is not None`)
    if member is None or not any(b.test and _missing(b.test, member) for b in func.blocks
                                 if b.span.contains_line(line)):
        return None
    prefix = func.owner.qualname + "."
    for method in index.functions_in(site.path):
        if method is func or not method.qualname.startswith(prefix) or method.scope is None \
                or method.scope.role == "constructor" or not _resets(method, member):
            continue
        if method.id not in memo:
            memo[method.id] = step_reason(method, index, per_step, depth=1, loops=False)
        if memo[method.id]:
            return Tier.T4, (f"rebuilt per step: {method.qualname} sets {member} back to None on every step "
                             f"({memo[method.id]}); was: {site.tier_reason}")
    return None


def _own_callers(site: Site, index: ProjectIndex) -> bool:
    """Every caller of the site's method (one at least) is a method of its
    own class: what they keep on ``self`` is kept on the same object."""
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None:
        return False
    callers = [index.funcs.get(fid) for fid, d in index.callers_within([func], 1).items() if d == 1]
    return bool(callers) and all(c is not None and c.owner is func.owner for c in callers)


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


def _reset_by_name(site: Site, index: ProjectIndex, per_step: object) -> tuple[str, Func, str] | None:
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


def _resets(method: Func, member: str) -> bool:
    """``method`` sets ``member`` to None, at its top level or under a test
    of a flag of the object only, outside loops."""
    for a in method.assigns:
        if a.op != "=" or a.targets != (member,) or a.value.strip() != "None":
            continue
        around = [b for b in method.blocks if b.span.contains_line(a.line)]
        if all(b.kind == "if" and _FLAG.fullmatch(b.test.strip()) and b.test.strip().removeprefix("not ").strip()
               != member for b in around):
            return True
    return False


def _missing(test: str, member: str) -> bool:
    return f"{member} is None" in test or f"not {member}" in test.replace("not hasattr", "")
