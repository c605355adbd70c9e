"""Stage 5, after the callers' tiers: a class built only in per-call code
keeps its constructor's buffers per call (issue 11, round 19).

A constructor's state lives as long as the object, and the object lives
where it is built. When every construction of a class (the calls of its
constructors, one call up) sits in a plain function or method, not in a
constructor nor at module level, and each of those is a per-step function
or is reached from one within two calls (or only tests call it) (``myreq = Request(group, device)``
in ``alltoall_pooled``, which a dist module's ``forward`` calls, then hands
the request out to be awaited), the object is a per-call value (an
awaitable, a request) and what its constructor allocates is per call: T4,
not the constructor's T2. A class also built in a constructor, at module
level, by a ``cls(...)`` factory, or in a function no per-step function
reaches, or kept by its builder (stored on an object or in a container,
handed to another class's constructor) keeps T2. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Language, Site, SiteKind, Tier
from .built_per_pass import class_factories
from .index import ClassInfo, Func, ProjectIndex
from .names import has_word, starts_with_word
from .retier import Decision, retier

_CONSTRUCTOR = "constructor "  # the reason of the constructor pattern (rules/tiers.toml)
_PLAIN = frozenset({"function", "method"})
_UP = 2  # calls up from a constructing function to a per-step function


def built_per_call(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    per_step = matcher(globs.per_step)
    memo: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T2 and site.via is None and site.language is Language.PYTHON \
            and site.kind is SiteKind.DEVICE and site.tier_reason.startswith(_CONSTRUCTOR)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role != "constructor" or func.owner is None:
            return None
        key = func.owner.key
        if key not in memo:
            ctors = index.constructors(func.owner)
            memo[key] = "" if class_factories(index, ctors, factories) else per_call_builders(ctors, index, per_step)
        found = memo[key]
        if not found:
            return None
        return Tier.T4, (f"per call: {func.owner.name} is built only in per-call code ({found}); "
                         f"was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def per_call_builders(ctors: list[Func], index: ProjectIndex, per_step: object) -> str:
    """The functions that build the class, each per step or reached from a
    per-step function, named with the per-step function; "" when any is not."""
    if not ctors:
        return ""
    dist = index.callers_within(ctors, 1)
    builders = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
    if not builders:
        return ""
    named = []
    owner = ctors[0].owner
    for builder in builders:
        if builder.scope is None or builder.scope.role not in _PLAIN or owner is None \
                or _keeps(builder, owner, index):
            return ""
        stepper = _stepper(builder, index, per_step)
        if stepper is None and not _only_tests_call(builder, index):
            return ""
        if stepper is not None:
            named.append(builder.qualname if stepper is builder else f"{builder.qualname} <- {stepper.qualname}")
    if not named:
        return ""
    shown = ", ".join(named[:3]) + (f", +{len(named) - 3} more" if len(named) > 3 else "")
    return shown


def _keeps(func: Func, owner: ClassInfo, index: ProjectIndex) -> bool:
    """``func`` keeps an object of ``owner`` it builds: stored on an object
    or in a container (``self.state = State(...)``, ``runners[d] = runner``,
    ``self._fb = fb.to(device)``, ``self._fb = Fb(...).to(device)``), or
    handed to another project class's constructor (``Replace(..., lb)``)."""
    calls = func.calls
    stores = [a for a in func.assigns if any(not t.strip().isidentifier() for t in a.targets)]
    for call in calls:
        if index.constructed_class(func, call) is not owner:
            continue
        target = (call.target or "").strip()
        if target and not target.isidentifier():
            return True  # `self.state = State(...)`, `cls.wrappers[d] = Wrapper(...)`
        if not target:
            if any(a.line == call.span.line for a in stores) or any(
                    c.span.line == call.span.line and c.target and not c.target.strip().isidentifier() for c in calls):
                return True  # `self._fb = Fb(...).to(device)`
            continue
        if any(a.line > call.span.line and starts_with_word(a.value.strip(), target) for a in stores) or any(
                c.span.line > call.span.line and c.target and not c.target.strip().isidentifier()
                and starts_with_word(c.callee, target) for c in calls):
            return True  # `runners[d] = runner`, `self._fb = fb.to(device)`
        if any(c.span.line > call.span.line and has_word(c.arglist, target) and index.constructed_class(func, c)
               is not None for c in calls):
            return True
    return False


def _only_tests_call(func: Func, index: ProjectIndex) -> bool:
    """Every function that calls ``func`` is test code, and one does (an
    operation the tests call once per test)."""
    dist = index.callers_within([func], 1)
    callers = [fid for fid, d in dist.items() if d == 1]
    return bool(callers) and all(test_path(fid.split("::", 1)[0]) for fid in callers)


def _stepper(func: Func, index: ProjectIndex, per_step: object) -> Func | None:
    """``func`` when it is per step, or a per-step function that reaches it within ``_UP`` calls."""
    assert callable(per_step)
    if per_step(func.name):
        return func
    dist = index.callers_within([func], _UP)
    ups = [f for fid in sorted(dist, key=lambda f: (dist[f], f)) if dist[fid] > 0 and (f := index.funcs.get(fid))]
    return next((f for f in ups if per_step(f.name)), None)
