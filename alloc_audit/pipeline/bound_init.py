"""Stage 5, classify (after the callers): native ``*_init`` functions whose
outputs are returned to a per-step Python caller.

Input: classified sites, the project index and the caller globs of
``rules/tiers.toml`` ``[callers]`` (``per-step``). Output: the same sites,
those re-tiered T4 with a reason naming the binding and the caller.

A C++ function named like an initialiser (T2 by its name) that returns what
it allocates (``auto out = at::empty(...); outputs.push_back(out); return
outputs;``) and is bound to Python (``m.def("forward_init",
&bottleneck_forward_init)``) makes new outputs on every call; when a
per-step Python function calls the binding (``ext.forward_init(...)`` in an
autograd ``forward``), they are per call: T4 (DESIGN.md, "Lifetime
tiers"). The name says init but the callers say per step. A buffer the
function keeps (a member, a static) is left alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex

_QUOTED = re.compile(r'^\s*"([A-Za-z_]\w*)"')


def bound_per_step(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    per_step = matcher(globs.per_step)
    bindings: dict[str, dict[str, str]] = {}
    out = []
    for site in sites:
        if (site.tier is Tier.T2 and site.via is None and site.kind is SiteKind.DEVICE
                and site.language is not Language.PYTHON and site.tier_reason.startswith("initialiser ")):
            site = _bound(site, index, per_step, bindings)
        out.append(site)
    return out


def _bound(site: Site, index: ProjectIndex, per_step: object, bindings: dict[str, dict[str, str]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or not _returned(site, func):
        return site
    names = bindings.get(site.path)
    if names is None:
        names = bindings[site.path] = _bindings(index, site.path)
    exported = names.get(func.name)
    if exported is None:
        return site
    for caller, _ in index.calls_named(exported):
        if caller.language is Language.PYTHON and per_step(caller.name):  # type: ignore[operator]
            return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"per step: {func.qualname} returns it through the binding {exported!r}, which "
                f"{caller.qualname} ({caller.path}) calls on every step, whatever its name ({site.tier_reason})"))
    return site


def _returned(site: Site, func: Func) -> bool:
    """The site's local is returned, or added to a container the function
    returns (``outputs.push_back(out1)`` ... ``return outputs``)."""
    if site.kept == "return":
        return True
    target = (site.target or "").strip()
    if not target.isidentifier() or site.kept not in ("", "local"):
        return False
    returned = {r.value.strip() for r in func.returns}
    if target in returned:
        return True
    for call in func.calls:
        holder, _, method = call.callee.rpartition(".")
        if method in ("push_back", "emplace_back") and call.arglist.strip() == target and holder in returned:
            return True
    return False


def _bindings(index: ProjectIndex, path: str) -> dict[str, str]:
    """The functions of the file bound to Python, by their C++ name: the
    name each ``.def("name", &function, ...)`` exports."""
    out: dict[str, str] = {}
    for func in index.functions_in(path):
        for call in func.calls:
            if call.callee.rsplit(".", 1)[-1] != "def":
                continue
            m = _QUOTED.match(call.arglist)
            ref = re.search(r"&\s*([A-Za-z_][\w:]*)", call.arglist)
            if m is not None and ref is not None:
                out.setdefault(ref.group(1).rsplit("::", 1)[-1], m.group(1))
    return out
