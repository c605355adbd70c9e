"""Stage 5, classify (second pass): tiers decided by who calls the function.

Input: classified sites, the project index and the caller globs of
``rules/tiers.toml`` ``[callers]``. Output: the same sites, a few re-tiered,
each with a reason naming the caller.

Names are evidence, not proof (DESIGN.md, "Lifetime tiers"):

- an initialiser by name (T2: ``setup``, ``init_*``) that a per-step function
  calls directly (``forward`` calls ``self.setup(n)``) allocates on every
  step: T4, unless the allocation is guarded to run once (it sits under a
  test that names its target or ``None``: lazy initialisation);
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
  private ones (``_name``) count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, SiteKind, Tier
from .default_device import MODEL_BUILD
from .index import Func, ProjectIndex

_FUNCTION_ROLES = frozenset({"function", "method"})
_LOAD_DEPTH = 3  # calls up from the site's function to a load path


def tiers_from_callers(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step and not globs.load:
        return list(sites)
    per_step = matcher(globs.per_step) if globs.per_step else None
    load = matcher(globs.load) if globs.load else None
    callers_memo: dict[str, list[Func]] = {}
    out: list[Site] = []
    for site in sites:
        if site.via is None and site.kept != "static":
            if per_step is not None and site.tier is Tier.T2 and site.kind is not SiteKind.PINNED_HOST:
                site = _per_step(site, index, per_step, callers_memo)
            elif site.tier is Tier.T4 and site.kept == "return" and site.kind is not SiteKind.PINNED_HOST:
                site = _returned_to_constructors(site, index, callers_memo)
            if (load is not None and site.tier is Tier.T4 and site.kind is SiteKind.DEVICE
                    and site.kept not in (None, "local") and site.language is Language.PYTHON):
                site = _reached_from_load(site, index, load, callers_memo)
            if site.via is None and site.tier is Tier.T4 and site.kind is SiteKind.DEVICE:
                site = _kept_by_constructor_only(site, index, callers_memo)
            elif load is not None and site.tier is Tier.T5B and site.language is Language.PYTHON:
                site = _load_only(site, index, load, callers_memo)
        out.append(site)
    return out


def _callers(index: ProjectIndex, funcs: list[Func], memo: dict[str, list[Func]]) -> list[Func]:
    key = "|".join(sorted(f.id for f in funcs))
    found = memo.get(key)
    if found is None:
        dist = index.callers_within(funcs, 1)
        found = memo[key] = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
    return found


def _per_step(site: Site, index: ProjectIndex, per_step: object, memo: dict[str, list[Func]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    if _guarded_once(site, func):
        return site
    callers = [c for c in _callers(index, [func], memo) if per_step(c.name)]  # type: ignore[operator]
    if not callers:
        return site
    caller = callers[0]
    return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
        f"per step: {func.qualname} is called by {caller.qualname} ({caller.path}) on every step, "
        f"whatever its name ({site.tier_reason})"))


def _returned_to_constructors(site: Site, index: ProjectIndex, memo: dict[str, list[Func]]) -> Site:
    """A buffer returned to callers that are all constructors is built once
    per object (`cache = self._compute_cos_sin_cache()` in `__init__`): the
    caller's, not per step. Built with the model (under a dynamic model
    construction), it is model-resident."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    callers = _callers(index, [func], memo)
    if not callers or not all(c.scope is not None and c.scope.role == "constructor" for c in callers):
        return site
    names = ", ".join(sorted({c.qualname for c in callers})[:3])
    if MODEL_BUILD in site.device_context:
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"model-resident: returned to constructor {names} while the model is built; {site.tier_reason}"))
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"returned to constructor {names} only: built once per object; {site.tier_reason}"))


def _guarded_once(site: Site, func: Func) -> bool:
    """Under a test that names the target or None (`if self.buf is None:`)."""
    target = site.target or ""
    for block in func.blocks:
        if block.kind != "if" and not block.kind.startswith("if"):
            continue
        if block.span.contains_line(site.span.line) and ("None" in block.test or (target and target in block.test)
                                                         or "hasattr" in block.test):
            return True
    return False


def _load_only(site: Site, index: ProjectIndex, load: object, memo: dict[str, list[Func]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None:
        return site
    ctors = index.constructors(func.owner)
    if not ctors:
        return site
    callers = _callers(index, ctors, memo)
    if not callers or not all(load(c.name) for c in callers):  # type: ignore[operator]
        return site
    names = ", ".join(sorted({c.qualname for c in callers})[:3])
    return dataclasses.replace(site, tier=Tier.T5A, tier_reason=(
        f"load-time staging: {func.owner.name} is constructed only from load paths ({names}); "
        f"{site.tier_reason}"))


def _reached_from_load(site: Site, index: ProjectIndex, load: object, memo: dict[str, list[Func]]) -> Site:
    """A kept or returned device buffer of a function that only load paths
    reach (every caller chain starts in ``load_weights`` or the like) is a
    weight uploaded at load: T1."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or load(func.name):  # type: ignore[operator]
        return site
    roots: set[str] = set()
    if not _load_only_chain(func, index, load, memo, _LOAD_DEPTH, roots, set()):
        return site
    names = ", ".join(sorted(roots)[:3])
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"reached only from load paths: {names}; {site.tier_reason}"))


def _load_only_chain(func: Func, index: ProjectIndex, load: object, memo: dict[str, list[Func]], depth: int,
                     roots: set[str], seen: set[str]) -> bool:
    """Every caller of ``func`` is a load path or, within ``depth`` more
    calls, reached only from load paths. No callers (an entry point, or
    callers not found): not proven."""
    if func.id in seen:
        return False
    seen = seen | {func.id}
    callers = _callers(index, [func], memo)
    if not callers:
        return False
    for caller in callers:
        if load(caller.name):  # type: ignore[operator]
            roots.add(caller.qualname)
        elif depth <= 1 or not _load_only_chain(caller, index, load, memo, depth - 1, roots, seen):
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
