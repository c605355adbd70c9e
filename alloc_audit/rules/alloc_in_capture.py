"""
## What it flags
A device allocation that executes while CUDA-graph capture is active:
lexically inside `with torch.cuda.graph(...)`, `with graph_capture(...)` or
another configured capture context; between `cudaStreamBeginCapture` (or
`...BeginCaptureToGraph`, `capture_begin()`) and the matching end call in
C++/CUDA or Python; in a function reached from such a region through
resolved calls (`self.method()`, imported functions, C++ member calls through
typed pointers and references such as `exec_->run()`), up to
`capture-depth` calls deep (default 3); or anywhere in a function the
configuration declares as captured (`captured = ["pkg.ops.*"]`), such as a
custom op that a framework captures.

## Why it matters
`cudaMalloc` during stream capture fails outright (the capture is
invalidated). Under `torch.cuda.graph` an allocation succeeds, but comes from
the graph's private pool and stays there for the graph's lifetime, once per
captured batch size: memory no budget term counts, on every step. Memory
reviews find exactly this in kernel wrappers that take every buffer from a
plan except one `torch.empty` per call.

## Example
```python
def capture_model(self):
    with torch.cuda.graph(self.graph, pool=self.pool):
        self._dummy_run(n)          # _dummy_run does torch.empty(n, hidden, device=...)
```

## How to fix
Allocate before capture and reuse a static buffer (or take it from the
planned workspace); in native code, use `cudaMallocAsync` from a pool set up
before capture, or move the allocation out of the captured path.

## How to suppress
On the allocation's line or the line above:
`# alloc-audit: ignore[alloc-in-capture] output buffer owned by the graph, sized once`
(`//` in C++/CUDA).

A tensor that a function reached from the region allocates and *returns*
(an op's output) is not reported: it becomes a static output of the graph,
which is how captured ops work. Scratch it allocates and drops is reported.

A function reached from the region that asks whether capture is active
(`torch.cuda.is_current_stream_capturing()`, `ensure_not_capturing()`,
`cudaStreamIsCapturing`; the `capture-checks` list) is capture-aware: it
raises or takes another branch under capture, so its allocations are not
reported. A returned tuple or list, either branch of a conditional
(`return out, (lse if lse is not None else lse_k)`) and a name with `out` in
it that the return passes on (`return op(output, x)`) count as returned.

## Known false positives
Inside the capture region itself, a branch that never runs during capture is
still reported (the region is lexical). Calls are resolved by declared types, so an overridden
method may be followed into the base class's implementation.

## Known false negatives
Calls through receivers of unknown type (`self.model(...)`, callbacks,
`getattr`) end the path, as do paths deeper than `capture-depth`. Capture
begun in one function and ended in another is not seen, except through
`captured` in the configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..globs import matcher
from ..model import Finding, Related, Severity, Site
from ..pack import RulePack
from ..pipeline.index import Func, ProjectIndex
from ._lib.findings import (
    hop_notes,
    is_device_allocation,
    is_returned,
    is_tensor_factory,
    path_text,
    returned_names,
    site_finding,
)
from ._lib.regions import calls_in, capture_regions
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "alloc-in-capture"


def _is_output(index: ProjectIndex, site: Site) -> bool:
    """A tensor an op returns to its caller is the op's output: allocating it
    under capture makes it a static graph output, which is how captured ops
    work. Scratch (not returned) and raw driver allocations are reported."""
    if not is_tensor_factory(site):
        return False
    func = index.func(site.path, site.scope)
    if func is None:
        return False
    return is_returned(({r.line for r in func.returns}, returned_names(func)), site)


def _capture_aware(func: Func, checks: Callable[[str], bool]) -> bool:
    """A function that asks whether capture is active (and raises, or takes
    another branch) knows about capture: its allocations are on the path it
    keeps for eager execution."""
    return any(checks(c) for c in func.callees)


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    index = ctx.index
    regions = capture_regions(index, pack.capture_contexts, pack.capture_begin, pack.capture_end, pack.captured)
    checks = matcher(pack.capture_checks)
    aware: dict[str, bool] = {}
    reported: set[tuple[str, int, int]] = set()
    for region in regions:
        func = region.func
        start = Related(func.path, region.start.line, f"capture starts here ({region.name})")
        declared = region.name == "captured by configuration"
        for site in func.sites:
            if is_device_allocation(site) and region.contains(site.span) and not (declared and _is_output(index, site)):
                key = (site.path, site.span.line, site.span.col)
                if key in reported:
                    continue
                reported.add(key)
                yield site_finding(
                    NAME, Severity.ERROR, site,
                    f"{site.api} allocates device memory while CUDA-graph capture is active ({region.name} at "
                    f"line {region.start.line}); allocate it before capture and reuse a static buffer",
                    (start,),
                )
        for call in calls_in(func, region):
            for target in index.resolve(func, call):
                for reach in index.reach(target, pack.capture_depth - 1):
                    site = reach.site
                    if not is_device_allocation(site) or _is_output(index, site):
                        continue
                    owner = index.func(site.path, site.scope)
                    if owner is not None:
                        if owner.id not in aware:
                            aware[owner.id] = _capture_aware(owner, checks)
                        if aware[owner.id]:
                            continue
                    key = (site.path, site.span.line, site.span.col)
                    if key in reported:
                        continue
                    reported.add(key)
                    first = Related(func.path, call.span.line, f"{func.qualname} calls {call.callee} under capture")
                    chain = path_text(reach.hops, site.api)
                    yield site_finding(
                        NAME, Severity.ERROR, site,
                        f"{site.api} in {site.scope} runs under CUDA-graph capture ({region.name} at "
                        f"{func.path}:{region.start.line}, via {call.callee} -> {chain}); allocate it before "
                        "capture and reuse a static buffer",
                        (start, first, *hop_notes(reach.hops)),
                    )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(calls=pack.capture_begin, contexts=pack.capture_contexts, declared=pack.captured)


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=(*pack.capture_contexts, *pack.capture_begin, *pack.capture_end))

RULE = Rule(
    name=NAME,
    severity=Severity.ERROR,
    summary="a device allocation executed under CUDA-graph capture",
    doc=__doc__ or "",
    check=check,
    starts=starts,
    triggers=triggers,
)
