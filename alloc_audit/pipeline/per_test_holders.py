"""Stage 5, after the derived sites' callers: plain holder objects a test
builds for itself (issue 11, round 16).

Input: derived sites tiered by ``tiers_of_derived`` and the project index.
Output: the same sites, a few re-tiered T4 with a reason naming the class.

An object with device buffers built in a test function is "built once"
(once per test: T2) when it is set-up state the test shares with what it
drives: a model, a module. A plain class of test code (no base but ``object``, no methods but
dunders) whose constructor fills attributes with tensors is a holder of the
test's inputs: bound to a local of one test, never returned, it dies when the
test ends, like the test's other inputs: per call (T4; DESIGN.md,
"Lifetime tiers": dropped -> scratch). A torch module or any class with a
base keeps the tier ``tiers_of_derived`` gave it.

Round 29: any project class that is no torch module, built by a test
function itself (``test*``: the runner calls it once per test) into a local
that the test neither returns, yields (a fixture), aliases nor hands to a
container, and that no loop of the test reads after it is built (an
optimizer stepped 100 times is set-up state the test reuses: it keeps its
tier), is per call too: the object and whatever it holds (a pooled slab, T3,
included) die when the test returns. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..globs import test_path
from ..model import Language, Site, SiteKind, Tier
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex
from .names import has_name
from .retier import Decision, retier

ONCE_PER_TEST = "runs once per test"  # the reason classify_callers gives a test function


def per_test_holders(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    modules: dict[str, bool] = {}

    def eligible(site: Site) -> bool:
        return (site.via is not None and site.tier in (Tier.T2, Tier.T3) and site.language is Language.PYTHON
                and test_path(site.path))

    def decide(site: Site) -> Decision | None:
        local = (site.target or "").strip()
        func = index.func(site.path, site.scope)
        if func is None or not local.isidentifier() or any(has_name(r.value, local, ".", "([.")
                                                           for r in func.returns):
            return None
        holder = _plain_class(site, index) if site.tier is Tier.T2 and ONCE_PER_TEST in site.tier_reason else None
        if holder is not None:
            return Tier.T4, (f"per test: {holder.name} is a plain holder (no base class) of device tensors, bound "
                             f"to the local {local} of {func.qualname} and dropped when the test ends; "
                             f"was: {site.tier_reason}")
        built = _built_by_test(site, func, local, index, modules) if site.kind is SiteKind.DEVICE else None
        if built is None:
            return None
        return Tier.T4, (f"per test: {func.qualname} builds {built.name} (no torch module) into the local {local}, "
                         "used by no loop of the test and neither returned nor kept: it dies, with what it holds, "
                         f"when the test returns; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


# a call that keeps its argument: put into a container, registered, handed to a thread
_KEEPS = re.compile(r"(?:^|\.)(?:append|appendleft|extend|insert|add|put|setdefault|update|register_\w+|"
                    r"Thread|Process|submit|setattr)$")


def _built_by_test(site: Site, func: Func, local: str, index: ProjectIndex,
                   modules: dict[str, bool]) -> ClassInfo | None:
    """The project class (no torch module) a test function (``test*``, not a
    generator) builds into ``local``, when nothing after the build keeps the
    object (an alias, a container, a keeping call) and no loop reads it."""
    scope = func.scope
    if scope is None or scope.yields or not func.name.startswith("test") or "<" in func.qualname:
        return None
    classes = index.classes_named(site.api.rsplit(".", 1)[-1])
    if not classes or any(is_module(index, c.qualname, c.bases, modules) for c in classes):
        return None
    line = site.span.end_line
    word = re.compile(rf"\b{re.escape(local)}\b")
    loops = [b.span for b in func.blocks if b.kind == "loop" and b.span.end_line > line]
    for a in func.assigns:
        if a.line > line and word.search(a.value) and (
                a.value.strip() == local or any(s.contains_line(a.line) for s in loops)):
            return None  # aliased (`other = obj`), or read in a loop
    for c in func.calls:
        if c.span.line <= line or not (word.search(c.arglist) or word.match(c.callee)):
            continue
        if _KEEPS.search(c.callee) or any(s.contains_line(c.span.line) for s in loops) \
                or re.search(rf"[\[{{][^\]}}]*\b{re.escape(local)}\b", c.arglist):
            return None  # handed to a container (`jit(m, transforms=[t])`), or used by a loop of the test
    return classes[0]


def _plain_class(site: Site, index: ProjectIndex) -> ClassInfo | None:
    """The class the site constructs, when its constructor holds the
    underlying allocation, it has no base but ``object``, it is defined in
    test code and has no methods but dunders (a holder of inputs, not a
    wrapper with a workspace it plans and runs with)."""
    via = site.via
    if via is None:
        return None
    name = site.api.rsplit(".", 1)[-1]
    for func in index.functions_in(via.path):
        owner = func.owner
        if (func.scope is not None and func.scope.role == "constructor" and owner is not None
                and owner.name == name and func.scope.span.contains_line(via.line)):
            holder = all(b in ("object", "") for b in owner.bases) and test_path(via.path) and all(
                m.startswith("__") for m in owner.methods)
            return owner if holder else None
    return None
