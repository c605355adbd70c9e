"""Stage 5, right after classify: closures registered as module hooks
(issue 11, round 18).

Input: classified sites and the project index. Output: the same sites, a
nested function's device sites that classify tiered by an enclosing
initialiser's or constructor's name (``post_init``, ``_setup_*_hooks``)
re-tiered T4 when the closure is registered as a hook.

A function defined inside a setup method and handed to
``module.register_forward_hook(hook)`` (any ``register*hook*`` call of the
enclosing functions: ``register_forward_pre_hook``, a project's
``self.register_hook(layer, hook, "forward")``), directly or as the
result of a nested factory that returns it (``make_hook(name)`` whose
``return hook``), runs on every forward of that module, not when the setup
method runs: what it allocates and drops is per call (DESIGN.md, "Lifetime
tiers": allocated per call in a function that runs per step). A nested
helper the setup method calls itself keeps the initialiser's tier. The
later use-based passes still see the site (an entry a hook keeps on the
object is theirs). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .index import Func, ProjectIndex, last_name
from .names import IDENTIFIER
from .retier import Decision, python_device_site, retier

_REGISTER = re.compile(r"register\w*hook\w*")
_BY_NAME = ("initialiser ", "constructor ")  # classify's name-based reasons (rules/tiers.toml)
_DEPTH = 3  # enclosing functions searched for the registration


def hook_closures(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2) and site.tier_reason.startswith(_BY_NAME) \
            and site.scope.count(".") >= 1

    def decide(site: Site) -> Decision | None:
        found = hook_registration(site, index)
        if found is None:
            return None
        closure, holder, line = found
        return Tier.T4, (f"per forward: {closure} is registered as a hook by {holder} (line {line}) and runs on "
                         f"every forward, not when the setup runs; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def hook_registration(site: Site, index: ProjectIndex) -> tuple[str, str, int] | None:
    """(the closure, the function that registers it, the line) when the
    site's function, or one enclosing it, is a nested function handed to a
    ``register*hook*`` call of a function enclosing it."""
    return registered_closure(site.path, site.scope, index)


def registered_closure(path: str, scope: str, index: ProjectIndex) -> tuple[str, str, int] | None:
    """``hook_registration`` for the function ``scope`` of ``path``."""
    parts = scope.split(".")
    chain = [index.func(path, ".".join(parts[:n])) for n in range(len(parts), 0, -1)]
    funcs = [f for f in chain if f is not None and f.scope is not None]
    for i, closure in enumerate(funcs[:-1]):
        parent = funcs[i + 1]
        if closure.qualname.rsplit(".", 1)[0] != parent.qualname or not _is_function(parent):
            continue
        names = {closure.name}
        holders = funcs[i + 1:i + 1 + _DEPTH]
        if any(r.value.strip() == closure.name for r in parent.returns):
            names.add(parent.name)  # a factory that returns the hook: its call is what gets registered
        for holder in holders:
            if not _is_function(holder):
                break
            call = next((c for c in holder.calls if _REGISTER.fullmatch(last_name(c.callee))
                         and names & set(IDENTIFIER.findall(c.arglist))), None)
            if call is not None:
                return closure.qualname, holder.qualname, call.span.line
    return None


def _is_function(func: Func) -> bool:
    return func.scope is not None and func.scope.role in ("function", "method", "constructor")
