"""Stage 5, after the shared fixtures: buffers test and benchmark code
returns to callers that run once (issue 11, round 16).

Input: classified sites, the project index and the ``[callers] once``
globs. Output: the same sites, a few re-tiered T2 with a reason naming the
callers.

Test and benchmark code is never T1-T3 by a function name (``classify``):
a benchmark's ``setup_*`` builds the inputs of one case. The callers say
more than the name: a device buffer a test or benchmark function returns,
where every caller is a run-once root (``main``, ``configure*``: ``[callers]
once``, or module-level code), calls it outside any loop and keeps what it
returns (binds it to a name), is allocated once and kept for the run: T2
(DESIGN.md, "Lifetime tiers": set up once and kept -> persistent). A caller
that runs per case (a test, a benchmark routine), one that calls it in a
loop, or one that drops the value keeps it T4. Helpers of shared pytest
fixtures are ``fixture_scoped``'s. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import BENCHMARK, Site, Tier
from .fixture_scoped import returned_value
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier
from .roles import conventional_role


def returned_once(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.once:
        return list(sites)
    once = matcher(globs.once)

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T4) and (
            test_path(site.path) or conventional_role(site.path) == BENCHMARK)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role != "function" or not returned_value(site, func):
            return None
        dist = index.callers_within([func], 1)
        callers = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
        if not callers or not all((c.qualname == "<module>" or once(c.name)) and _keeps_once(c, func)
                                  for c in callers):
            return None
        names = ", ".join(sorted({"module-level code" if c.qualname == "<module>" else c.qualname
                                  for c in callers})[:3])
        return Tier.T2, (f"set up once: {func.qualname} returns it only to {names}, which runs once and keeps "
                         f"it for the run; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _keeps_once(caller: Func, callee: Func) -> bool:
    """``caller`` calls ``callee`` by name outside any loop and binds each
    result to a name (``buf = allocate(n)``): kept, not dropped."""
    calls = caller.calls_of(callee.name)
    return bool(calls) and all(
        c.target is not None and c.target.strip().isidentifier() and not caller.in_loop(c.span.line)
        for c in calls)
