"""
## What it flags
A function that creates a fresh private graph pool (`graph_pool_handle()`,
`torch.cuda.graph_pool_handle()`, `torch.cuda.MemPool()`, also through a
platform object such as `current_platform.graph_pool_handle()`; the list is
`fresh-pools`), captures into it (passes it as `pool=`, installs it on graph
wrappers by assignment such as `w.graph_pool = pool`, or hands it to a
capture call), and destroys its graphs before returning (`clear_all_graphs()`,
`reset()`, `del`, or the function's name or docstring says profile, estimate
or measure).

## Why it matters
A profiling capture into a private pool leaves that pool's pages reserved by
the caching allocator after the graphs are gone; the production capture then
uses the shared pool and cannot reuse them. The profiling run costs its peak
for the rest of the process.

## Example
```python
def profile_cudagraph_memory(self):
    pool = torch.cuda.graph_pool_handle()
    for w in self.wrappers:
        w.graph_pool = pool
    ...                                  # capture every batch size
    CUDAGraphWrapper.clear_all_graphs()
```

## How to fix
Capture the profiling run into the same shared pool the production capture
uses, or release the private pool (`torch.cuda.empty_cache()` after dropping
every reference to it) before the production capture.

## How to suppress
`# alloc-audit: ignore[throwaway-graph-pool] pool released by release_profiling_pool()`
on the pool's line or the line above.

## Known false positives
A pool that is released later by other code (kept in an attribute and
emptied elsewhere) is still reported.

## Known false negatives
A pool created in one function and captured into and destroyed in another is
not connected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..globs import matcher
from ..model import Call, Finding, Language, Related, Severity
from ..pack import RulePack
from ..pipeline.index import Func
from ._lib.findings import finding_at
from ._lib.throwaway import throwaway_evidence
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "throwaway-graph-pool"


def _captured_into(func: Func, pool: Call, attributes: tuple[str, ...]) -> tuple[str, int] | None:
    """How the fresh pool reaches a capture, if it does."""
    target = pool.target
    if target is None:
        # created inline: `torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle())`
        for w in func.withs:
            if w.span.line <= pool.span.line <= w.span.end_line and w.body.line > pool.span.line:
                return f"passed to {w.items[0].callee}", w.span.line
        return None
    word = re.compile(rf"(?<![\w.]){re.escape(target)}(?![\w])")
    for w in func.withs:
        for item in w.items:
            if any(word.search(a.text) for a in item.args):
                return f"passed to {item.callee}", w.span.line
    attr_names = set(attributes)
    for assign in func.assigns:
        if assign.op == "=" and word.fullmatch(assign.value.strip()):
            for t in assign.targets:
                if "." in t and t.rsplit(".", 1)[1] in attr_names:
                    return f"installed as {t}", assign.line
    for call in func.calls:
        if call is pool or call.span.line <= pool.span.line:
            continue
        if word.search(call.arglist) and ("pool" in call.arglist or "capture" in call.callee or "graph" in call.callee):
            return f"passed to {call.callee}", call.span.line
    return None


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    is_fresh = matcher(pack.fresh_pools)
    minting = ctx.index.callers_matching(is_fresh)
    for func in ctx.index.funcs.values():
        if func.scope is None or func.id not in minting:
            continue
        evidence = None
        for call in sorted(func.calls, key=lambda c: (c.span.line, c.span.col)):
            if not is_fresh(call.callee):
                continue
            captured = _captured_into(func, call, pack.pool_attributes)
            if captured is None:
                continue
            evidence = evidence or throwaway_evidence(func, pack)
            if evidence is None:
                break
            yield finding_at(
                NAME, Severity.WARNING, func.path, call.span.line, call.span.col, func.qualname, call.callee,
                f"{func.qualname} captures into a fresh private pool ({call.callee}) and then throws the graphs "
                f"away ({evidence[0]}); the pages that pool keeps cannot be reused by the production capture: "
                "capture into the shared pool, or release this one",
                (Related(func.path, captured[1], f"the pool is {captured[0]}"),
                 Related(func.path, evidence[1], evidence[0])),
            )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(calls=pack.fresh_pools)


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=pack.fresh_pools)

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a throwaway capture into a freshly created private graph pool",
    doc=__doc__ or "",
    check=check,
    languages=frozenset({Language.PYTHON}),
    starts=starts,
    triggers=triggers,
)
