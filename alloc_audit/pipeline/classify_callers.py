"""Stage 5, classify (second pass): tiers decided by who calls the function.

Input: classified sites, the project index and the caller globs of ``rules/tiers.toml`` ``[callers]``. Output:
the same sites, a few re-tiered, each with a reason naming the caller.

Names are evidence, not proof (DESIGN.md, "Lifetime tiers"):

- an initialiser by name (T2: ``setup``, ``init_*``) that a per-step function
  calls directly (``forward`` calls ``self.setup(n)``) allocates on every
  step: T4, unless the allocation is guarded to run once (it sits under a
  test that names its target or ``None``: lazy initialisation, not ``if latent is None: latent = ...``);
- a buffer returned to callers that are all constructors is built once per
  object: T2 (T1 while the model is built);
- a persistent pinned buffer (T5b) of a class that is constructed only from
  load paths (``load_weights`` and the like) is load-time staging: T5a;
- a device buffer that a function keeps or returns (not a temporary), where
  every chain of callers (up to ``_LOAD_DEPTH`` calls up) starts in a load
  path, is a weight uploaded while the model loads: T1 (``load_col`` called
  only from ``load_weights``, whatever its own name);
- a device buffer a method keeps on its object (``self.x``, a C++ member),
  where the method is called only from its class's constructors
  (``self._preprocessing()`` in ``__init__``), is built once per object: T2;
  T1 when the member names a weight (``self.qzeros``) of a torch module.
  A public Python method may have callers outside the project: only
  private ones (``_name``) count;
- a function named like a load path (``load_quanted_weights``) that a
  per-step function calls (a weight sync) is per step, and a load path
  called per step is no load root for the rule above; a nested function
  inherits its enclosing function's callers; load-time temporaries are T1
  too (the judges' convention: DESIGN puts ``load_weights`` sites in T1);
- a class constructed by a per-step function (``GradientAccumulator(...)``
  in ``TiledMLP.backward``) allocates its constructor's buffers per call;
- an object with persistent buffers (a derived site) built in a function
  that runs once (``main``, ``configure*``: ``[callers] once``, or reached
  only from those or from module level) lives for the run: T2, and so does
  a buffer such a function keeps on its object (``self.x``). A test runs
  once per case, many in one process: no run-once function (docs/tiers.md 3).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, SiteKind, Tier
from .built_per_pass import class_factories, default_fill
from .caller_lifetimes import NameMemo, attribute_caller
from .default_device import MODEL_BUILD
from .dispatched import per_step_reader
from .index import Func, ProjectIndex
from .kept_builds import kept_by_loader
from .loop_calls import calls_in_loop, script_entry
from .member_callers import member_callers, speaking_function

_FUNCTION_ROLES = frozenset({"function", "method"})
_LOAD_DEPTH = 3  # calls up from the site's function to a load path
_STEP_DEPTH = 2  # calls up from a load path to a per-step function that makes it a weight sync
Pred = Callable[[str], bool]
_INITIALISER = "initialiser "  # the reason of the initialiser-name patterns (rules/tiers.toml)
_COMPARES = re.compile(r"!=|==|<|>")


@dataclass
class _Ctx:
    """The compiled caller globs and the memos of one scan."""

    index: ProjectIndex
    per_step: Pred | None
    load: Pred | None
    once: Pred | None
    callers: dict[str, list[Func]] = dataclasses.field(default_factory=dict)
    chains: dict[tuple[str, str], tuple[bool, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    stepped: dict[str, Func | None] = dataclasses.field(default_factory=dict)
    named: NameMemo = dataclasses.field(default_factory=NameMemo)


def _context(index: ProjectIndex, globs: CallerGlobs) -> _Ctx:
    load = matcher(globs.load) if globs.load else None  # a test named after what it tests is no load path
    return _Ctx(index, matcher(globs.per_step) if globs.per_step else None,
                None if load is None else lambda n: not n.startswith(("test_", "_test_")) and load(n),
                matcher(globs.once) if globs.once else None)


def tiers_from_callers(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step and not globs.load:
        return list(sites)
    ctx = _context(index, globs)
    return [_direct(site, ctx) if site.via is None and site.kept != "static" else site for site in sites]


def _direct(site: Site, ctx: _Ctx) -> Site:
    index, memo, load = ctx.index, ctx.callers, ctx.load
    pinned = site.kind is SiteKind.PINNED_HOST
    if ctx.per_step is not None and site.tier is Tier.T2 and not pinned:
        site = _per_step(site, index, ctx.per_step, memo)
        if site.tier is Tier.T2 and site.language is Language.PYTHON and site.tier_reason.startswith(_INITIALISER):
            site = _initialiser_not_kept(site, ctx)
    elif site.tier is Tier.T4 and site.kept == "return" and not pinned:
        site = _returned_to_constructors(site, ctx)
    elif site.tier is Tier.T1 and site.language is Language.PYTHON:
        site = _load_called_per_step(site, ctx)
    if load is not None and site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON:
        site = _reached_from_load(site, ctx)
    if site.tier is Tier.T4 and site.kind is SiteKind.DEVICE:
        site = _kept_by_constructor_only(site, index, memo)
    if site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.kept.startswith("self."):
        site = _kept_once(site, ctx)
    elif load is not None and site.tier is Tier.T5B and site.language is Language.PYTHON:
        site = _load_only(site, index, load, memo)
    return site


def tiers_of_derived(derived: Sequence[Site], direct: Sequence[Site], index: ProjectIndex,
                     globs: CallerGlobs) -> list[Site]:
    """A derived site (an object whose constructor keeps device memory)
    built in a function that runs once (``main``, ``configure*``, or only
    reached from those) or returned to constructors only (a
    ``static`` factory a layer's ``__init__`` calls) holds that memory for
    the run or the object: T2, not per call; one built in the constructor
    of an object a per-step function builds is per call (T4)."""
    ctx = _context(index, globs)
    persistent = {(s.path, s.span.line) for s in direct if s.tier is Tier.T2}
    out = []
    for site in derived:
        via = site.via
        if via is None or site.language is not Language.PYTHON:
            out.append(site)
            continue
        func = index.func(site.path, site.scope)
        if site.tier is Tier.T4 and (via.path, via.line) in persistent and func is not None:
            outer = index.func(site.path, site.scope.removesuffix(".<lambda>"))  # a lambda handed to a builder
            once = _runs_once(func, ctx) or (outer is not None and _runs_once(outer, ctx))
            if once:
                site = dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                    f"built once: {once}; {site.api} keeps {via.api} ({via.path}:{via.line}) for the run"))
            elif site.span.line in {r.line for r in func.returns}:
                site = _returned_to_constructors(site, ctx)
        elif (site.tier is Tier.T2 and ctx.per_step is not None and func is not None and func.scope is not None
              and func.scope.role == "constructor"):
            site = _per_step(site, index, ctx.per_step, ctx.callers)
        out.append(site)
    return out


def _callers(index: ProjectIndex, funcs: list[Func], memo: dict[str, list[Func]]) -> list[Func]:
    key = "|".join(sorted(f.id for f in funcs))
    found = memo.get(key)
    if found is None:
        dist = index.callers_within(funcs, 1)
        found = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
        if not found and len(funcs) == 1:
            found = _enclosing_caller(index, funcs[0])
        memo[key] = found
    return found


def _enclosing_caller(index: ProjectIndex, func: Func) -> list[Func]:
    """A nested function no resolved call reaches runs inside its enclosing
    function when that function calls it by name (it inherits its callers)."""
    qual = func.qualname
    if "." not in qual or func.language is not Language.PYTHON:
        return []
    outer = index.func(func.path, qual.rsplit(".", 1)[0])
    if outer is None or outer.scope is None or outer.scope.role not in _FUNCTION_ROLES:
        return []
    return [outer] if any(c.rsplit(".", 1)[-1] == func.name for c in outer.callees) else []


def _per_step(site: Site, index: ProjectIndex, per_step: Pred, memo: dict[str, list[Func]]) -> Site:
    func = index.func(site.path, speaking_function(site))  # a closure asks its enclosing function's callers
    if func is None or func.scope is None:
        return site
    if func.scope.role == "constructor" and func.owner is not None and func.language is Language.PYTHON:
        return _constructed_per_step(site, func, index, per_step, memo)
    if func.scope.role not in _FUNCTION_ROLES or _guarded_once(site, func):
        return site
    found = _callers(index, [func], memo)
    caller = next((c for c in found if per_step(c.name)), None) or member_callers(func, found, index, per_step)
    if caller is None:
        return site
    return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
        f"per step: {func.qualname} is called by {caller.qualname} ({caller.path}) on every step, "
        f"whatever its name ({site.tier_reason})"))


def _initialiser_not_kept(site: Site, ctx: _Ctx) -> Site:
    """An initialiser by name (T2) whose buffer is not kept on the object
    (a temporary, or returned to its caller) lives as long as the call that
    made it: a load-time temporary (T1) in a weight initialiser
    (``init_weights``, ``reset_parameters``: ``[callers] load``) or in a
    function only load paths reach; per step (T4) when a per-step function
    reaches it (``forward`` -> ``predict`` -> ``initialize_state``)."""
    handed = site.kept.startswith("handed:")  # filled by a call (`init_(q)`, `w.copy_(q)`): a temporary here
    if site.kept not in ("", "local", "return") and not handed:
        return site
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or _guarded_once(site, func):
        return site
    load = ctx.load
    if load is not None and site.kept != "return" and site.kind is SiteKind.DEVICE:
        named = next((p for p in func.qualname.split(".") if load(p)), None)
        if named is not None and _stepped(func, ctx) is None:
            return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                f"a load-time temporary in weight initialiser {named}; per call in {site.scope}"))
        proven, roots = _chain(func, ctx, "load") if not handed else (False, ())
        if proven:
            return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                f"a load-time temporary: every caller chain starts in a load path ({', '.join(roots[:3])}); "
                f"per call in {site.scope}"))
    read = not handed or site.kept.startswith("handed:torch.")  # read by a torch op (`torch.cat([q, pad])`)
    stepper = _stepped(func, ctx, _LOAD_DEPTH) if read else None
    if stepper is not None:
        what = "its result is returned" if site.kept == "return" else "a temporary"
        return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
            f"per step: {func.qualname} is reached from {stepper.qualname} ({stepper.path}) on every step and "
            f"keeps nothing on the object ({what}); {site.tier_reason}"))
    return site


def _constructed_per_step(site: Site, func: Func, index: ProjectIndex, per_step: Pred,
                          memo: dict[str, list[Func]]) -> Site:
    """A constructor's buffers are per call when a per-step function builds
    the object (`GradientAccumulator(...)` in `TiledMLP.backward`), directly
    or through the constructor or a ``from_*`` factory of an object built
    per step (a logits processor built by the chooser that
    `prepare_for_decode` builds)."""
    owner = func.owner
    if owner is None or _guarded_once(site, func):
        return site
    found = _built_per_step(index.constructors(owner), index, per_step, memo, _LOAD_DEPTH, {owner.name})
    if found is None:
        return site
    caller, path = found
    via = "".join(f" -> {p}" for p in path)
    return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
        f"per call: {owner.name} is constructed in {caller.qualname} ({caller.path}){via}, which runs on every "
        f"step ({site.tier_reason})"))


def _built_per_step(funcs: list[Func], index: ProjectIndex, per_step: Pred, memo: dict[str, list[Func]],
                    depth: int, seen: set[str]) -> tuple[Func, tuple[str, ...]] | None:
    """A per-step function (not a script's entry: ``generate`` run by ``__main__``) running ``funcs``
    (constructors), directly or through constructors and ``from_*`` factories, and the way there."""
    factories = class_factories(index, funcs, memo)  # `return cls(...)` in a classmethod builds it
    callers = [c for c in _callers(index, funcs, memo) + factories if not script_entry(c, _callers(index, [c], memo))]
    for caller in callers:
        if per_step(caller.name) and (caller.owner is None or caller.owner.name not in seen):
            return caller, ()
    if depth <= 1:
        return None
    for caller in callers:
        if caller.scope is not None and caller.scope.role == "constructor" and caller.owner is not None:
            if caller.owner.name in seen:
                continue
            up = index.constructors(caller.owner)
            seen = seen | {caller.owner.name}
        elif caller.name.startswith("from_") or caller in factories:
            up = [caller]
        else:
            continue
        found = _built_per_step(up, index, per_step, memo, depth - 1, seen)
        if found is not None:
            return found[0], (*found[1], caller.qualname)
    return None


def _load_called_per_step(site: Site, ctx: _Ctx) -> Site:
    """A function named like a load path (`load_quanted_weights`) that a
    per-step function calls (a weight sync in the rollout) allocates per
    step; a parameter, a module move or a model build keeps T1."""
    if ctx.load is None or ctx.per_step is None or site.wrapper or site.api.startswith("Module."):
        return site
    if MODEL_BUILD in site.device_context:
        return site
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or not ctx.load(func.name):
        return site
    stepper = _stepped(func, ctx, 1)
    if stepper is None:
        return site
    return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
        f"per step: {func.qualname} is named like a load path but {stepper.qualname} ({stepper.path}) calls it "
        f"on every step; per call in {site.scope}"))


def _stepped(func: Func, ctx: _Ctx, depth: int = _STEP_DEPTH) -> Func | None:
    """A per-step caller of ``func`` up to ``depth`` calls up (or of a dispatch table's reader, or through a member)."""
    key = f"{func.id}#{depth}"
    if key in ctx.stepped:
        return ctx.stepped[key]
    found = None
    if ctx.per_step is not None:
        dist = ctx.index.callers_within([func], depth)
        funcs = [f for fid in sorted(dist, key=lambda f: (dist[f], f)) if (f := ctx.index.funcs.get(fid)) is not None]
        found = next((f for f in funcs if dist[f.id] > 0 and ctx.per_step(f.name)), None) or per_step_reader(
            funcs, ctx.index, ctx.per_step, ctx.callers) or member_callers(func, funcs, ctx.index, ctx.per_step)
    ctx.stepped[key] = found
    return found


def _returned_to_constructors(site: Site, ctx: _Ctx) -> Site:
    """A buffer returned to callers that are all constructors is built once
    per object (`cache = self._compute_cos_sin_cache()` in `__init__`): the
    caller's, not per step. Built with the model (under a dynamic model
    construction), it is model-resident. Not when the method may also run
    through an attribute of another object (``caller_lifetimes``), nor when
    a per-step function builds the object (``FP8Tensor(...)`` in ``backward``)."""
    index = ctx.index
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    callers = _callers(index, [func], ctx.callers)
    if not callers or not all(c.scope is not None and c.scope.role == "constructor" for c in callers):
        return site
    if attribute_caller(func, index, ctx.named) is not None or (ctx.per_step is not None and any(
            _built_per_step(index.constructors(c.owner), index, ctx.per_step, ctx.callers, _LOAD_DEPTH,
                            {c.owner.name}) for c in callers if c.owner is not None)):
        return site
    names = ", ".join(sorted({c.qualname for c in callers})[:3])
    if MODEL_BUILD in site.device_context:
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"model-resident: returned to constructor {names} while the model is built; {site.tier_reason}"))
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"returned to constructor {names} only: built once per object; {site.tier_reason}"))


def _guarded_once(site: Site, func: Func) -> bool:
    """Under a test that names the target or None (`if self.buf is None:`),
    or that compares what the object keeping it holds (`if batch > cache.max_batch:
    cache.pool = ...`: rebuilt only when stale)."""
    target = site.target or ""
    holder = re.compile(rf"(?<![\w.]){re.escape(target.rsplit('.', 1)[0])}\.") if "." in target else None
    for block in func.blocks:
        if block.kind != "if" and not block.kind.startswith("if"):
            continue
        test = block.test
        if block.span.contains_line(site.span.line) and (
                (("None" in test or (target and target in test)) and not default_fill(func, test, target))
                or "hasattr" in test
                or (holder is not None and "[" not in target and holder.search(test) and _COMPARES.search(test))):
            return True
    return False


def _load_only(site: Site, index: ProjectIndex, load: object, memo: dict[str, list[Func]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None:
        return site
    ctors = index.constructors(func.owner)
    callers = _callers(index, ctors, memo) if ctors else []
    if not callers or not all(load(c.name) for c in callers):  # type: ignore[operator]
        return site
    names = ", ".join(sorted({c.qualname for c in callers})[:3])
    kept = kept_by_loader(site, func, func.owner, callers, names)  # round 32: it outlives the load
    return kept if kept is not None else dataclasses.replace(site, tier=Tier.T5A, tier_reason=(
        f"load-time staging: {func.owner.name} is constructed only from load paths ({names}); "
        f"{site.tier_reason}"))


def _reached_from_load(site: Site, ctx: _Ctx) -> Site:
    """A device buffer of a function that only load paths reach (every
    caller chain starts in ``load_weights`` or the like, none passes through
    a per-step function) is allocated while the model loads: T1, kept
    (a weight) or not (a load-time temporary, the judges' convention)."""
    func = ctx.index.func(site.path, site.scope)
    load = ctx.load
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or load is None:
        return site
    if load(func.name):  # its temporaries and values handed on (name patterns skip them), unless run per step
        if (site.kept in (None, "", "local") or site.kept.startswith("handed:")) and _stepped(func, ctx) is None:
            what = "value handed on (to a loaded weight)" if site.kept else "temporary"
            return dataclasses.replace(site, tier=Tier.T1, tier_reason=f"a load-time {what} in {func.qualname}; "
                                       f"{site.tier_reason}")
        return site
    proven, roots = _chain(func, ctx, "load")
    if not proven:
        return site
    names = ", ".join(roots[:3])
    what = "a load-time temporary" if site.kept in (None, "", "local") else "reached only from load paths"
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"{what}: every caller chain starts in a load path ({names}); {site.tier_reason}"))


def _kept_once(site: Site, ctx: _Ctx) -> Site:
    """A buffer kept on the object (``self.x``) by a function that runs once
    (``main``, ``configure*``, or reached only from those) lives
    as long as the object: T2 (DESIGN.md: kept in ``self.x`` ->
    persistent). Its temporaries stay per call."""
    if site.language is not Language.PYTHON:
        return site
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    once = _runs_once(func, ctx)
    if not once:
        return site
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"kept in {site.kept} by a function that runs once ({once}): persistent; {site.tier_reason}"))


def _runs_once(func: Func, ctx: _Ctx) -> str:
    """Why ``func`` runs once per process, or "" (a test is no such function)."""
    if ctx.per_step is not None and ctx.per_step(func.name):
        return ""
    if ctx.once is not None and ctx.once(func.name):
        return f"{func.qualname} runs once"
    proven, roots = _chain(func, ctx, "once")
    if not proven:
        return ""
    names = [r if r != "<module>" else "module-level code" for r in roots[:3]]
    return f"{func.qualname} is reached only from {', '.join(names)} (run{'s' if len(names) == 1 else ''} once)"


def _chain(func: Func, ctx: _Ctx, kind: str) -> tuple[bool, tuple[str, ...]]:
    """Whether every caller chain of ``func`` (up to ``_LOAD_DEPTH`` calls
    up) starts in a ``kind`` root (a load path; a run-once function or
    module-level code), and the roots. Memoised per function."""
    key = (func.id, kind)
    found = ctx.chains.get(key)
    if found is None:
        roots: set[str] = set()
        ok = _all_chains(func, ctx, kind, _LOAD_DEPTH, roots, set())
        found = ctx.chains[key] = (ok, tuple(sorted(roots)))
    return found


def _all_chains(func: Func, ctx: _Ctx, kind: str, depth: int, roots: set[str], seen: set[str]) -> bool:
    """Every caller of ``func`` is a root or, within ``depth`` more calls,
    reached only from roots; a load root must not itself be called per step
    (`load_quanted_weights` in a weight sync). No callers (an entry point, or
    callers not found): not proven."""
    if func.id in seen:
        return False
    seen = seen | {func.id}
    callers = _callers(ctx.index, [func], ctx.callers)
    if not callers:
        return False
    root = ctx.load if kind == "load" else ctx.once
    for caller in callers:
        if ctx.per_step is not None and ctx.per_step(caller.name):
            return False
        if (root is not None and root(caller.name)) or (kind == "once" and caller.qualname == "<module>"):
            if kind == "load" and _stepped(caller, ctx) is not None or kind == "once" and calls_in_loop(caller, func):
                return False
            roots.add(caller.qualname)
        elif depth <= 1 or not _all_chains(caller, ctx, kind, depth - 1, roots, seen):
            return False
    return True


def _kept_by_constructor_only(site: Site, index: ProjectIndex, memo: dict[str, list[Func]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role != "method" or func.owner is None:
        return site
    if func.language is Language.PYTHON and not (func.name.startswith("_") and not func.name.startswith("__")):
        return site  # a public Python method may be called from outside the project (`ensure_capacity(n)`)
    member = _member(site, func)
    if member is None:
        return site
    callers = _callers(index, [func], memo)
    if not callers or not all(c.scope is not None and c.scope.role == "constructor" and c.owner is func.owner
                              for c in callers):
        return site
    names = ", ".join(sorted({c.qualname for c in callers})[:3])
    if _weight_member(member, func):
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"model weight {member} of module {func.owner.name}, set by {func.qualname}, called only from "
            f"constructor {names}; {site.tier_reason}"))
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"kept in {member} by {func.qualname}, called only from constructor {names}: built once per object; "
        f"{site.tier_reason}"))


_WEIGHT_MEMBER = matcher(["self.weight", "self.*_weight", "self.qweight", "self.bias", "self.qzeros", "self.zeros",
                          "self.scales", "self.*_scale", "self.g_idx"])


def _weight_member(member: str, func: Func) -> bool:
    """A weight by name (``self.qweight``, ``self.scales``) on a torch module
    (a base named ``*Module``): model-resident."""
    owner = func.owner
    return (func.language is Language.PYTHON and owner is not None and bool(_WEIGHT_MEMBER(member))
            and any(b.rsplit(".", 1)[-1].endswith("Module") for b in owner.bases))


def _member(site: Site, func: Func) -> str | None:
    """Where on its object a method keeps the site's memory: ``self.x``
    (Python), ``this->x`` or a field of the owning class (C++)."""
    if site.language is Language.PYTHON:
        kept = site.kept or ""
        return kept if kept.startswith("self.") and "[" not in kept else None
    target = site.target or ""
    name = target[6:] if target.startswith("this->") else target
    if func.owner is not None and name.isidentifier() and name in func.owner.fields:
        return f"this->{name}"
    return None
