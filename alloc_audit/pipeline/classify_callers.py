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
  load paths (``load_weights`` and the like) is load-time staging: T5a.
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
