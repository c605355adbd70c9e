"""Stage 5, after the callers: what a test helper keeps on its object when
one test runs the helper several times (issue 11, round 27).

Input: sites tiered by ``classify_callers`` and the project index. Output:
the same sites, a few re-tiered T4 with a reason naming the repeated calls.

``classify_callers`` gives a buffer a test-code method keeps on its object
(``self.x = torch.rand(...)``) T2 because test code "runs once per test".
That premise is false when the project itself calls the method more than
once in one run of its caller: in a loop, from two statements that can
both run (not sibling branches of one ``if``/``try``, not one after a
guard clause that returns), or from a caller that is itself run so (up to
``_DEPTH`` calls up, through test code only)::

    def init_data(self, use_cuda):
        self.inputs = torch.rand(n, device=dev)     # T4: bound anew by each call
    def check(self, use_cuda):
        self.init_data(use_cuda)
    def test_layer(self):
        self.check(use_cuda=False)
        self.check(use_cuda=True)

Each run binds the member anew, so the previous value is dropped when the
next call replaces it: it lives for one call, T4 (DESIGN.md, "Lifetime
tiers": per call). An entry of a container counts only when the function
binds the container anew above it (``self.inputs = []``); entries added
to a container that outlives the call accumulate and keep their tier.
Only calls resolved to the method count; a method no project code calls
(``setUp``, run by the framework once per test), or that each test calls
once, keeps its T2. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..globs import test_path
from ..model import Call, Site, Tier
from .index import Func, ProjectIndex
from .index.values import sibling_branches
from .per_test_holders import ONCE_PER_TEST
from .retier import Decision, python_device_site, retier

_DEPTH = 3  # calls up from the keeping method to the repeated call
_KEPT = "kept in "  # the reason classify_callers._kept_once gives


def repeated_test_calls(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        return (python_device_site(site, Tier.T2) and site.tier_reason.startswith(_KEPT)
                and ONCE_PER_TEST in site.tier_reason and site.kept.startswith("self.") and test_path(site.path))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or not _bound_anew(site, func):
            return None
        why = repeated(func, index, memo, _DEPTH)
        if not why:
            return None
        return Tier.T4, (f"per call: {func.qualname} runs more than once per test ({why}) and each run binds "
                         f"{site.kept} anew, dropping the previous value; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _bound_anew(site: Site, func: Func) -> bool:
    """Each run replaces what the site is kept in: a member (``self.x``), or
    an entry of a container the function itself binds anew above it
    (``self.inputs = []`` ... ``self.inputs.append(x)``); entries added to
    a container another run filled stay with it."""
    kept = site.kept
    if "[" not in kept:
        return True
    holder = kept.split("[", 1)[0]
    return any(a.op == "=" and a.line < site.span.line and holder in (t.strip() for t in a.targets)
               for a in func.assigns)


def repeated(func: Func, index: ProjectIndex, memo: dict[str, str], depth: int) -> str:
    """Why the project runs ``func`` more than once per run of a caller, or "":
    a resolved call in a loop, two resolved calls in one caller that can both
    run, or a caller in test code that is itself run so."""
    if func.id in memo:
        return memo[func.id]
    memo[func.id] = ""  # a cycle proves nothing
    by_caller: dict[str, tuple[Func, list[Call]]] = {}
    for caller, call, resolved in index.calls_reaching(func):
        if resolved and caller is not func:
            by_caller.setdefault(caller.id, (caller, []))[1].append(call)
    found = ""
    for caller, calls in by_caller.values():
        looped = next((c for c in calls if caller.in_loop(c.span.line)), None)
        if looped is not None:
            found = f"called in a loop by {caller.qualname} ({caller.path}:{looped.span.line})"
            break
        both = _both_run(caller, calls)
        if both is not None:
            found = f"called by {caller.qualname} at lines {both[0]} and {both[1]}"
            break
    if not found and depth > 1:
        for caller, _ in by_caller.values():
            if caller.qualname != "<module>" and test_path(caller.path):
                up = repeated(caller, index, memo, depth - 1)
                if up:
                    found = f"called by {caller.qualname}, {up}"
                    break
    memo[func.id] = found
    return found


def _both_run(caller: Func, calls: list[Call]) -> tuple[int, int] | None:
    """Two of ``calls`` that one run of ``caller`` can both make: not in
    sibling branches of one statement (``if``/``else``, ``try``/``except``),
    and the first not in a branch that leaves the function."""
    lines = sorted({c.span.line for c in calls})
    for i, first in enumerate(lines):
        for second in lines[i + 1:]:
            if not _exclusive(caller, first, second):
                return first, second
    return None


def _exclusive(caller: Func, first: int, second: int) -> bool:
    # `if cond: f(); return` then `f()`: one or the other
    return any(block.exits and block.kind != "loop" and block.span.contains_line(first)
               and not block.span.contains_line(second) for block in caller.blocks) \
        or sibling_branches(caller, first, second, kinds=None)
