"""Stage 5, after the tiers of derived sites: an object a test helper
builds and returns to the tests that call it.

Input: all sites and the project index. Output: the same sites, a derived
site (a construction whose class keeps device memory that is kept for the
object: T1 or T2 at the constructor) re-tiered T2 when it is in test code,
in a function that returns it (``return Rotary(config=cfg)``, ``return
Rotary(cfg), cfg``, or a local it returns), and every call of that
function is in a test function (``test_*``, which runs once per test)
outside any loop, or the helper is a value of a test's
``pytest.mark.parametrize`` (the test calls it once per case). A test built the object itself would have kept it for the
test (``classify_callers``: test code runs once per test); a helper the
test calls hands it the same object. A helper called in a loop, or by
another helper, is left per call. DESIGN.md ("Lifetime tiers"): set up
once and kept -> persistent.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..globs import test_path
from ..model import Language, Site, Tier
from .index import Func, ProjectIndex

_WORD = re.compile(r"[A-Za-z_]\w*")


def helper_built(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    if not any(s.via is not None and s.tier is Tier.T4 and test_path(s.path) for s in sites):
        return list(sites)
    kept = {(s.path, s.span.line) for s in sites if s.via is None and s.tier in (Tier.T1, Tier.T2)}
    return [_returned_to_tests(site, index) if _candidate(site, kept) else site for site in sites]


def _candidate(site: Site, kept: set[tuple[str, int]]) -> bool:
    via = site.via
    return (via is not None and site.tier is Tier.T4 and site.language is Language.PYTHON
            and test_path(site.path) and (via.path, via.line) in kept)


def _returned_to_tests(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role != "function" or func.name.startswith("test"):
        return site
    if not _returned(site, func):
        return site
    tests = _test_callers(func, index)
    if not tests:
        return site
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"built by the test helper {func.qualname} and returned to tests that run once "
        f"({', '.join(tests[:3])}): kept for the test; {site.api} keeps {site.via.api if site.via else ''} "
        f"(was: {site.tier_reason})"))


def _returned(site: Site, func: Func) -> bool:
    lines = {r.line for r in func.returns}
    if site.span.line in lines:
        return True
    local = (site.target or "").strip()
    if not local.isidentifier():
        return False
    return any(local in {p.strip() for p in r.value.strip().strip("()").split(",")}
               for r in func.returns if r.line > site.span.line)


def _test_callers(func: Func, index: ProjectIndex) -> list[str]:
    """The test functions that call ``func``, each outside a loop, when no
    other function calls it; else empty."""
    names: list[str] = []
    for caller, i in index.calls_named(func.name):
        if caller.table is None:
            return []
        call = caller.table[i]
        if func not in index.resolve(caller, call):
            continue
        if not (caller.name.startswith("test") and test_path(caller.path)) or caller.in_loop(call.span.line):
            return []
        names.append(caller.qualname)
    for caller, i in index.calls_named("parametrize"):  # `@pytest.mark.parametrize("build", [make_a, make_b])`
        if caller.path == func.path and caller.table is not None \
                and func.name in _WORD.findall(caller.table[i].arglist):
            names.append(f"the tests parametrized with {func.name}")
    return sorted(set(names))
