"""
## What it flags
An allocation whose size is derived from a live reading of free device
memory (`torch.cuda.mem_get_info()`, `cudaMemGetInfo(&free, &total)`, the
`.free_memory` of a snapshot; the lists are `free-memory-readings` and
`free-memory-attributes`). The value is followed through assignments and
arithmetic, into the parameters of project functions and constructors it is
passed to, and back out of functions that return it, up to `flow-depth`
calls away (default 3); the finding lists each hop. A tensor filled with
values derived from a reading (`torch.ones(bs) * max_tokens`, a block
table passed on as contents) does not have a shape derived from it:
`x.shape[0]`, `x.size(0)`, `len(x)` and `x.numel()` of it are not tainted,
while `torch.arange(max_tokens)` and `[0] * max_tokens` are. Branches that
a call rules out by what it passes (`prefill=None` into `if prefill is not
None:`) are not followed; a value the call does not know keeps the branch.

## Why it matters
Capacity discovered from whatever happens to be free at startup is not
planned: it changes with the driver, other processes, fragmentation and the
order things were initialised in, and it silently takes memory other
components were counting on. Reviews find it as a KV cache or pool sized
`free * 0.9`.

## Example
```python
free = query_free_bytes(device)                  # torch.cuda.mem_get_info() inside
num_blocks = plan_kv_blocks(free, block_bytes)   # returns budget // block_bytes
self.kv_cache = KVCachePool(config, num_blocks)  # torch.zeros((2, num_blocks, ...))
```

## How to fix
Size from a configured budget (utilisation times total memory, minus the
measured model and activation peaks), computed once and logged; keep the
free-memory reading for a sanity check.

## How to suppress
`# alloc-audit: ignore[live-free-memory-sizing] bounded by max_kv_bytes below`
on the allocation's line or the line above.

## Known false positives
A reading used only to clamp a planned size (`min(planned, free)`) is
reported as if it sized the allocation.

## Known false negatives
A shape taken from a tensor whose shape the analysis judged untainted but
that a call outside the short lists of shape-keeping operations changed
(a project helper returning `x.repeat(n)` is followed; a library call that
resizes from a tensor argument's values is not). Values carried in object attributes from one method to another
(`self.budget` set in one method, used in another), and flows deeper than
`flow-depth`, are not followed.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..globs import matcher
from ..model import Finding, Severity
from ..pack import RulePack
from ..pipeline.index import Func
from ._lib.findings import site_finding
from ._lib.taint import TaintAnalysis, reading_roots
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "live-free-memory-sizing"


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    index = ctx.index
    is_reading = matcher(pack.free_memory_readings)
    analysis = TaintAnalysis(index, is_reading, pack.free_memory_attributes, pack.flow_depth)
    reported: set[tuple[str, int, int]] = set()
    frontier: list[Func] = reading_roots(index, is_reading, pack.free_memory_attributes)
    seen: set[str] = set()
    for _level in range(pack.flow_depth + 1):
        next_frontier: list[Func] = []
        for func in frontier:
            if func.id in seen:
                continue
            seen.add(func.id)
            flow = analysis.analyse(func)
            for site, why in flow.sinks:
                key = (site.path, site.span.line, site.span.col)
                if key in reported:
                    continue
                reported.add(key)
                hops = " -> ".join(r.note for r in why[:6])
                yield site_finding(
                    NAME, Severity.WARNING, site,
                    f"the size of {site.api} ({site.size}) comes from a live free-memory reading ({hops}); "
                    "capacity discovered at run time, not planned: size it from a configured budget",
                    why,
                )
            if flow.returns is not None:
                # whoever calls a function that returns a reading reads it too
                callers = index.callers_within([func], 1)
                next_frontier += [index.funcs[fid] for fid, d in sorted(callers.items()) if d == 1]
        frontier = next_frontier



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(calls=pack.free_memory_readings)


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=pack.free_memory_readings, named=pack.free_memory_attributes)

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="an allocation sized from a live free-memory reading",
    doc=__doc__ or "",
    check=check,
    starts=starts,
    triggers=triggers,
)
