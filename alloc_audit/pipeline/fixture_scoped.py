"""Stage 5, after the callers' lifetimes: buffers a shared pytest fixture
builds are set up once (issue 11, round 10).

A device buffer tiered per call (T4) in a function whose result is the
value of a pytest fixture scoped wider than one test
(``@pytest.fixture(scope="module")``, ``"session"``, ``"package"``,
``"class"``) is built once per module (or session) and shared by its
tests: T2, set-up (DESIGN.md, "Lifetime tiers"; the role does not change
the tier). The buffer must be returned: by the fixture itself, or by a
helper every caller of which is such a fixture. A function-scoped fixture
(the default) runs per test and stays T4. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .index import Func, ProjectIndex
from .names import has_name
from .retier import Decision, python_device_site, retier

_FIXTURE = re.compile(r"(?:^|\.)fixture$")
_SHARED = re.compile(r"""\bscope\s*=\s*["'](?:module|session|package|class)["']""")


def fixture_scoped(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role != "function" or not returned_value(site, func):
            return None
        if shared_fixture(func, index):
            return Tier.T2, (f"set up once: {func.qualname} is a pytest fixture shared by the tests of its "
                             f"scope, and returns it; was: {site.tier_reason}")
        dist = index.callers_within([func], 1)
        callers = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
        if not callers or not all(shared_fixture(c, index) for c in callers):
            return None
        return Tier.T2, (f"set up once: {func.qualname} returns it, called only by pytest fixtures shared by "
                         f"the tests of their scope ({', '.join(c.qualname for c in callers[:2])}); "
                         f"was: {site.tier_reason}")

    return retier(sites, lambda s: python_device_site(s, Tier.T4), decide)


def returned_value(site: Site, func: Func) -> bool:
    """The allocation is a return value, or its target, or the local
    container it is an entry of (``modules["auc"] = ...``), is named by one."""
    if site.span.line in {r.line for r in func.returns}:
        return True
    target = (site.target or "").strip()
    if target.endswith("]"):
        target = target.split("[", 1)[0]
    if not target.isidentifier():
        return False
    return any(has_name(r.value, target, ".", "([.") for r in func.returns)


def shared_fixture(func: Func, index: ProjectIndex) -> bool:
    """Decorated ``@pytest.fixture(scope=...)`` with a scope wider than a
    test: the decorator's call sits in the enclosing scope, just above the
    ``def`` (within one line per decorator)."""
    if func.scope is None or not any(_FIXTURE.search(d) for d in func.scope.decorators):
        return False
    enclosing = func.qualname.rsplit(".", 1)[0] if "." in func.qualname else "<module>"
    outer = index.func(func.path, enclosing)
    line = func.scope.span.line
    lowest = line - len(func.scope.decorators)
    for call in outer.calls if outer is not None else ():
        if _FIXTURE.search(call.callee) and lowest <= call.span.end_line < line:
            return bool(_SHARED.search(call.arglist))
    return False
