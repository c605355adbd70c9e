"""Stage 5, after the derived sites: a torch module returned to a keeper is
module state (issue 11, round 13; the judges' convention: a sub-module's
parameters and buffers are T1, like weights).

A derived site (an object whose constructor holds device memory) that its
function returns, where the class is a torch module (a base named
``*Module``) and every call of the function one call up stores the result
on another object (``module.samplers[name] = make_sampler(...)``,
``self.head = build_head(...)``), is a sub-module kept by what holds it:
it lives as long as the model, T1, not per call. A caller that runs per
step re-makes it (unless the call runs only when the holder lacks the
entry: ``if name not in module.samplers:``, made on the first step and
kept), and a caller that drops, returns or binds the result to a
local leaves it to the other rules. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Call, Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex, last_name
from .retier import Decision, retier

# an attribute of an object, or an entry of one: `module.samplers[name]`, `self.head`
_ON_OBJECT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\[[^\]]*\])*")


def kept_submodules(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None

    def eligible(site: Site) -> bool:
        return (site.via is not None and site.tier is Tier.T4 and site.kind is SiteKind.DEVICE
                and site.language is Language.PYTHON)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role not in ("function", "method"):
            return None
        if site.span.line not in {r.line for r in func.returns} or not _module_class(site, func, index):
            return None
        kept = _kept_by_callers(func, index, per_step)
        if not kept:
            return None
        return Tier.T1, (f"module state: {func.qualname} returns the module {site.api}, and {kept}: a sub-module "
                         f"kept for the model's life; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _module_class(site: Site, func: Func, index: ProjectIndex) -> bool:
    """The site constructs a torch module (a class with a base named ``*Module``)."""
    for call in func.calls:
        if call.span.line == site.span.line and last_name(call.callee) == site.api:
            for ctor in index.resolve(func, call):
                owner = ctor.owner
                if owner is not None and any(last_name(b).endswith("Module") for b in owner.bases):
                    return True
    return False


def _kept_by_callers(func: Func, index: ProjectIndex, per_step: Callable[[str], bool] | None) -> str:
    """Where every caller (one call up) keeps ``func``'s result on an object, or ""."""
    kept = ""
    for fid, depth in sorted(index.callers_within([func], 1).items()):
        caller = index.funcs.get(fid)
        if depth != 1 or caller is None:
            continue
        calls = [c for c in caller.calls if func in index.resolve(caller, c)]
        if not calls or any(not _ON_OBJECT.fullmatch((c.target or "").strip()) for c in calls):
            return ""
        if per_step is not None and per_step(caller.name) and not all(_made_once(caller, c) for c in calls):
            return ""
        kept = kept or f"{caller.qualname} keeps it in {(calls[0].target or '').strip()}"
    return kept


def _made_once(caller: Func, call: Call) -> bool:
    """The call runs only when its holder lacks the entry (``if name not in
    module.samplers: module.samplers[name] = make(...)``): built on the first
    step, then kept."""
    holder = (call.target or "").strip().split("[", 1)[0]
    return any(b.kind.startswith("if") and b.span.contains_line(call.span.line) and holder in b.test
               and ("not in" in b.test or "None" in b.test) for b in caller.blocks)
