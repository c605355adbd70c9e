"""Stage 5, after the run-once returns: a buffer a function sets up for the
closure it returns (issue 11, round 24).

    def func(dev, n=1):
        b1 = boxes1.to(device=dev)        # set up once for the closure
        def bench():
            for _ in range(n):
                pairwise_iou_rotated(b1, b2)
        return bench

Input: classified sites, the project index and the ``[callers] per-step``
globs. Output: the same sites, a per-call device buffer re-tiered T2 when
the function binds it to a local that a function nested in it reads (a
free name: not its parameter, never bound in it) and returns that nested
function, and the function is handed by name to a runner (``benchmark(func,
"iou", args)``) that no project code stands in for: the buffer lives as
long as the closure, which the runner keeps to run it again and again (a
benchmark's set-up and its timed body). A function the project calls
itself is left to what that caller does (``bench = get_bench(d)``, run and
dropped per case: per call); one reached from a per-step function within
two calls builds a new closure each step and keeps T4; so does a buffer
the closure never reads, and a nested function not returned. DESIGN.md ("Lifetime tiers"): set up
once and kept -> persistent. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Site, Tier
from .index import Func, ProjectIndex
from .names import has_name, has_word
from .retier import Decision, python_device_site, retier

_UP = 2  # calls up from the set-up function to a per-step function


def closure_kept(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T4) and (site.target or "").strip().isidentifier()

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role not in ("function", "method"):
            return None
        local = (site.target or "").strip()
        if local in func.scope.params or not func.returns:
            return None
        runner = _handed_to_runner(func, index)
        if not runner:
            return None
        closures = _returned_closures(func, index)
        reader = next((c for c in closures if reads_free(c, local)), None)
        if reader is None:
            return None
        if per_step is not None:
            dist = index.callers_within([func], _UP)
            stepper = next((f for fid, d in dist.items() if d > 0 and (f := index.funcs.get(fid)) is not None
                            and per_step(f.name)), None)
            if stepper is not None or per_step(func.name):
                return None
        return Tier.T2, (f"set up for a closure: {func.qualname} binds it to {local}, which the nested "
                         f"{reader.name} it returns reads on every run; {func.name} is handed to {runner}, "
                         f"which keeps the closure for its runs; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _handed_to_runner(func: Func, index: ProjectIndex) -> str:
    """The call the enclosing scope (the function ``func`` is nested in,
    or module level) hands ``func`` to by name (``benchmark(func, "iou",
    args)``), when no project code calls ``func`` itself: ""
    otherwise. A caller the project shows decides by what it does with the
    closure (``bench = get_bench(d)`` run and dropped per case: per call)."""
    if any(d == 1 for d in index.callers_within([func], 1).values()):
        return ""
    parent = func.qualname.rpartition(".")[0] or "<module>"
    scope = index.func(func.path, parent)
    calls = scope.calls if scope is not None else []
    return next((c.callee for c in calls if has_name(c.arglist, func.name, not_before=".", not_after="(.[")), "")


def _returned_closures(func: Func, index: ProjectIndex) -> list[Func]:
    """The functions defined directly in ``func`` that it returns by name."""
    prefix = f"{func.qualname}."
    returned = {r.value.strip() for r in func.returns}
    return [f for f in index.functions_in(func.path)
            if f.qualname.startswith(prefix) and "." not in f.qualname[len(prefix):] and f.name in returned]


def reads_free(closure: Func, name: str) -> bool:
    """``closure`` reads ``name`` of the enclosing function: not its own
    parameter, never bound in it, and named in a call, a value or a return."""
    params = closure.scope.params if closure.scope is not None else ()
    if name in params or any(name in (t.strip() for t in a.targets) for a in closure.assigns):
        return False
    return any(has_word(c.arglist, name) or has_word(c.callee, name) for c in closure.calls) or any(
        has_word(a.value, name) for a in closure.assigns) or any(has_word(r.value, name) for r in closure.returns)
