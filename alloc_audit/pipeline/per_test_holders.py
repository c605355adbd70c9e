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
base keeps the tier ``tiers_of_derived`` gave it. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..globs import test_path
from ..model import Language, Site, Tier
from .index import ClassInfo, ProjectIndex
from .names import has_name
from .retier import Decision, retier

ONCE_PER_TEST = "runs once per test"  # the reason classify_callers gives a test function


def per_test_holders(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return (site.via is not None and site.tier is Tier.T2 and site.language is Language.PYTHON
                and ONCE_PER_TEST in site.tier_reason and test_path(site.path))

    def decide(site: Site) -> Decision | None:
        local = (site.target or "").strip()
        func = index.func(site.path, site.scope)
        if func is None or not local.isidentifier() or any(has_name(r.value, local, ".", "([.")
                                                           for r in func.returns):
            return None
        holder = _plain_class(site, index)
        if holder is None:
            return None
        return Tier.T4, (f"per test: {holder.name} is a plain holder (no base class) of device tensors, bound "
                         f"to the local {local} of {func.qualname} and dropped when the test ends; "
                         f"was: {site.tier_reason}")

    return retier(sites, eligible, decide)


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
