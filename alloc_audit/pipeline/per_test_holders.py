"""Stage 5, after the derived sites' callers: objects a test builds for
itself (issue 11, rounds 16, 29, 30).

Input: derived sites tiered by ``tiers_of_derived`` and ``built_per_call``,
and the project index. Output: the same sites, a few re-tiered T4 with a
reason naming the test.

A test function (``test*``: the runner calls it once per test case, many
cases in one process) that builds a project class, no torch module, into a
local that it neither returns, yields (a fixture), aliases nor hands to a
container or a keeping call, drops the object when it returns: the object
and whatever it holds (a constructor's T2, a pooled T3 slab) live for one
test, T4 (docs/tiers.md, section 3). A loop of the test that steps the
object (an optimizer stepped 100 times) runs inside that one call and
changes nothing. A torch module keeps its tier (its weights are T1 whoever
builds them, docs/tiers.md section 2). Pure.

    def test_pool():
        pool = KvPool(blocks=64, device="cuda")   # T4: dies with the test
    def make_pool():
        return KvPool(blocks=64, device="cuda")   # kept by the caller: not this pass
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..globs import test_path
from ..model import Language, Site, SiteKind, Tier
from .default_device import is_module
from .fixture_scoped import shared_fixture
from .index import ClassInfo, Func, ProjectIndex
from .names import has_name
from .retier import Decision, retier


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
        built = _built_by_test(site, func, local, index, modules) if site.kind is SiteKind.DEVICE else None
        if built is None:
            return None
        return Tier.T4, (f"per test: {func.qualname} builds {built.name} (no torch module) into the local {local}, "
                         "neither returned nor kept: it dies, with what it holds, "
                         f"when the test returns; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


# a call that keeps its argument: put into a container, registered, handed to a thread
_KEEPS = re.compile(r"(?:^|\.)(?:append|appendleft|extend|insert|add|put|setdefault|update|register_\w+|"
                    r"Thread|Process|submit|setattr)$")


def _built_by_test(site: Site, func: Func, local: str, index: ProjectIndex,
                   modules: dict[str, bool]) -> ClassInfo | None:
    """The project class (no torch module) a test function (``test*``, not a
    generator) builds into ``local``, when nothing after the build keeps the
    object (an alias, a container, a keeping call)."""
    scope = func.scope
    if scope is None or scope.yields or not func.name.startswith("test") or "<" in func.qualname:
        return None
    classes = index.classes_named(site.api.rsplit(".", 1)[-1])
    if not classes or any(is_module(index, c.qualname, c.bases, modules) for c in classes):
        return None
    line = site.span.end_line
    word = re.compile(rf"\b{re.escape(local)}\b")
    if any(a.line > line and a.value.strip() == local for a in func.assigns):
        return None  # aliased (`other = obj`)
    for c in func.calls:
        if c.span.line <= line or not (word.search(c.arglist) or word.match(c.callee)):
            continue
        if _KEEPS.search(c.callee) or re.search(rf"[\[{{][^\]}}]*\b{re.escape(local)}\b", c.arglist):
            return None  # handed to a container (`jit(m, transforms=[t])`) or a keeping call
    return classes[0]


# set-up a test runner runs once for many tests (unittest's and pytest's class and module set-up)
_SHARED_SET_UP = frozenset({"setUpClass", "setup_class", "setUpModule", "setup_module"})


def builds_per_test(builder: Func, index: ProjectIndex) -> bool:
    """A function of test code that builds an object for one test case: a
    test, a helper or a function-scoped fixture, not module-level code nor
    a class's or module's set-up, nor a fixture shared by a wider scope
    (docs/tiers.md, section 3). ``built_per_call`` asks it for classes of
    test code only: a production class only tests build is code the tree
    does not use, judged as a user would build it (its constructor's
    tier)."""
    scope = builder.scope
    if scope is None or scope.role not in ("function", "method") or builder.name in _SHARED_SET_UP:
        return False
    if shared_fixture(builder, index):
        return False
    callers = (index.funcs.get(fid) for fid, d in index.callers_within([builder], 1).items() if d == 1)
    return not any(c is not None and c.name in _SHARED_SET_UP for c in callers)  # a helper of a class's set-up
