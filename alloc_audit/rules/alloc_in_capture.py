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
`cudaMalloc` or `cudaFree` during stream capture fails outright (the capture
is invalidated): an error. Under `torch.cuda.graph` an allocation succeeds,
but comes from the graph's private pool and stays there for the graph's
lifetime, once per captured batch size: memory no budget term counts, on
every step; a warning, with the bytes when the size is known. Memory reviews
find exactly this in kernel wrappers that take every buffer from a plan
except one `torch.empty` per call.

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

A path is followed only where its branches can run: what each call passes
(`out=buf`, a literal flag, a keyword default, a module constant, a literal
shape) decides `is None`/`is not None`/`if flag`/`if not x`/comparisons with
literals in the function it calls; a value that is not known keeps the
path. Each finding lists its witness path (capture, each call with its
file:line, the allocation) and the branch conditions assumed along it.
Zero-element tensors, outputs returned through a view, slice or alias, and
one-time initialisation kept on the object (`if self._buf is None`,
`if not hasattr(self, ...)`, `if (!buf.defined())`) are not reported. A
project context manager is read: one that only prepares a capture (sets a
stream, registers buffers) is not a capture; one that enters
`torch.cuda.graph` around its `yield` is, whatever its name. Asking whether
capture is active through a project helper that returns the answer counts
as asking. A literal `"cpu"` device on the path is host memory.

Findings in test, benchmark, example or tooling code are `info`; so is a
production finding whose only path into a capture starts in such code (the
message names where), and, with `capture-info-bytes = N` in the
configuration, an allocator tensor whose size is known to be under N bytes.

## Known false positives
Values that reach a branch through object state (`self.flag`, a struct
member set elsewhere) or through containers are unknown, so the branch is
kept. Calls are resolved by declared types, so an overridden method may be
followed into the base class's implementation.

## Known false negatives
Calls through receivers of unknown type (`self.model(...)`, callbacks,
`getattr`) end the path, as do paths deeper than `capture-depth`. Capture
begun in one function and ended in another is not seen, except through
`captured` in the configuration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..globs import matcher
from ..model import PRODUCTION, ROLE_ORDER, Finding, Related, Severity, Site, SiteKind
from ..pack import RulePack
from ..pipeline.index import Func, ProjectIndex
from ..pipeline.index.values import LITERAL, Value
from ._lib.allocation import holds_no_memory, is_one_time_init, returned_views
from ._lib.findings import (
    hop_notes,
    is_device_allocation,
    is_returned,
    is_tensor_factory,
    path_text,
    returned_names,
    site_finding,
)
from ._lib.paths import CAPTURING, PathReach, check_span, on_host
from ._lib.regions import calls_in, capture_regions
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "alloc-in-capture"


def _is_output(index: ProjectIndex, site: Site) -> bool:
    """A tensor an op returns to its caller is the op's output: allocating it
    under capture makes it a static graph output, which is how captured ops
    work. Scratch (not returned) and raw driver allocations are reported.
    Returned through an alias, a slice or a view counts (issue 16, shape 5)."""
    if not is_tensor_factory(site):
        return False
    func = index.func(site.path, site.scope)
    if func is None:
        return False
    names = returned_names(func)
    if is_returned(({r.line for r in func.returns}, names), site):
        return True
    return site.target is not None and site.target in returned_views(func, names)


def _capture_aware(index: ProjectIndex, func: Func, checks: Callable[[str], bool],
                   wrappers: dict[str, bool]) -> bool:
    """A function that asks whether capture is active (and raises, or takes
    another branch) knows about capture: its allocations are on the path it
    keeps for eager execution. Asking through a project function that
    returns the answer (``def _capturing(): return
    torch.cuda.is_current_stream_capturing()``) is asking (shape 7)."""
    for call in func.calls:
        if checks(call.callee):
            return True
        for target in index.resolve(func, call):
            if _is_check_wrapper(index, target, checks, wrappers, 2):
                return True
    return False


def _is_check_wrapper(index: ProjectIndex, func: Func, checks: Callable[[str], bool], memo: dict[str, bool],
                      depth: int) -> bool:
    found = memo.get(func.id)
    if found is not None:
        return found
    memo[func.id] = False  # cycle guard
    lines = {r.line for r in func.returns}
    found = False
    for call in func.calls:
        if call.span.line not in lines:
            continue
        if checks(call.callee) or (depth > 0 and any(
                _is_check_wrapper(index, t, checks, memo, depth - 1) for t in index.resolve(func, call))):
            found = True
            break
    memo[func.id] = found
    return found


def _under_capture_matters(site: Site) -> bool:
    """Device allocations, and driver frees (`cudaFree` under stream capture
    is as illegal as `cudaMalloc`)."""
    if site.kind is SiteKind.RELEASE:
        return site.via is None and not is_tensor_factory(site) and _DRIVER_FREE.search(site.api) is not None
    return is_device_allocation(site)


_DRIVER_FREE = re.compile(r"^(?:cudaFree|cuMemFree|cudaFreeAsync|cuMemFreeAsync|cudaFreeHost|cuMemRelease)")


def _not_scratch(index: ProjectIndex, site: Site) -> bool:
    """Allocations that are not per-call memory under capture: zero-element
    tensors (shape 6), one-time initialisation kept on the object (shape 3)."""
    if holds_no_memory(site):
        return True
    func = index.func(site.path, site.scope)
    return func is not None and is_one_time_init(func, site) is not None


def _severity_and_cost(site: Site, size: tuple[int, str] | None, info_below: int = 0) -> tuple[Severity, str]:
    """A driver allocation or free under stream capture breaks the capture:
    an error. A caching-allocator tensor inside a graph capture is legal and
    comes from the graph's pool, which keeps it for the graph's lifetime: a
    warning about memory retained per graph, with bytes when known."""
    if site.kind is SiteKind.RELEASE:
        return Severity.ERROR, "a driver free under stream capture invalidates the capture"
    if not is_tensor_factory(site):
        return Severity.ERROR, "a driver allocation under stream capture invalidates the capture"
    amount = size[1] if size else "this memory"
    severity = Severity.INFO if size is not None and size[0] < info_below else Severity.WARNING
    return severity, f"the graph's private pool retains {amount} per captured graph"


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    index = ctx.index
    regions = capture_regions(index, pack.capture_contexts, pack.capture_begin, pack.capture_end, pack.captured)
    checks = matcher(pack.capture_checks)
    aware: dict[str, bool] = {}
    wrappers: dict[str, bool] = {}
    reported: set[tuple[str, int, int]] = set()
    paths = PathReach(index)
    # production captures first: a site reached from one is reported with
    # that witness; one reached only from tests or benchmarks says so
    regions.sort(key=lambda r: ROLE_ORDER.get(ctx.role_of(r.func.path), 0))
    for region in regions:
        func = region.func
        region_role = ctx.role_of(func.path)
        start = Related(func.path, region.start.line, f"capture starts here ({region.name})")
        declared = region.name == "captured by configuration"
        # inside the region, asking whether capture is active answers yes
        constants = {**paths.constants(func), CAPTURING: Value(LITERAL, checks)}
        for site in func.sites:
            if not (_under_capture_matters(site) and region.contains(site.span)):
                continue
            if (declared and _is_output(index, site)) or holds_no_memory(site):
                continue
            if not check_span(func, site.span, {}, constants).live or on_host(func, site, {}, constants):
                continue
            key = (site.path, site.span.line, site.span.col)
            if key in reported:
                continue
            reported.add(key)
            severity, cost = _severity_and_cost(site, ctx.bytes_of(site), pack.capture_info_bytes)
            what, fix = ("frees device memory", "free it outside the captured region") \
                if site.kind is SiteKind.RELEASE else \
                ("allocates device memory", "allocate it before capture and reuse a static buffer")
            yield site_finding(
                NAME, severity, site,
                f"{site.api} {what} while CUDA-graph capture is active ({region.name} at "
                f"line {region.start.line}): {cost}; {fix}",
                (start,),
            )
        for call, _verdict in paths.live_calls(func, calls_in(func, region), {}, constants):
            for _target, witness in paths.from_call(func, call, {}, pack.capture_depth - 1):
                site = witness.site
                if not _under_capture_matters(site) or _is_output(index, site) or _not_scratch(index, site):
                    continue
                owner = index.func(site.path, site.scope)
                if owner is not None:
                    if owner.id not in aware:
                        aware[owner.id] = _capture_aware(index, owner, checks, wrappers)
                    if aware[owner.id]:
                        continue
                key = (site.path, site.span.line, site.span.col)
                if key in reported:
                    continue
                reported.add(key)
                first = Related(func.path, call.span.line, f"{func.qualname} calls {call.callee} under capture")
                chain = path_text(witness.hops[1:], site.api)
                severity, cost = _severity_and_cost(site, ctx.bytes_of(site), pack.capture_info_bytes)
                if region_role != PRODUCTION and ctx.role_of(site.path) == PRODUCTION:
                    severity = Severity.INFO
                    cost += f" (reached only from {region_role} code: {func.path}:{region.start.line})"
                fix = "free it outside the captured path" if site.kind is SiteKind.RELEASE else \
                    "allocate it before capture and reuse a static buffer"
                yield site_finding(
                    NAME, severity, site,
                    f"{site.api} in {site.scope} runs under CUDA-graph capture ({region.name} at "
                    f"{func.path}:{region.start.line}, via {call.callee} -> {chain}): {cost}; {fix}",
                    (start, first, *hop_notes(witness.hops[1:]), *witness.assumptions),
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
