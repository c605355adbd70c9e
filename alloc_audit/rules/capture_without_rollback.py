"""
## What it flags
A throwaway capture (one that destroys its graphs before returning, as in
`throwaway-graph-pool`) entered through a capture context that mints
resources on entry (`minting-contexts`, by default `graph_capture`), with no
rollback guaranteed on exit: no call matching `rollback-names` (`rollback*`,
`restore*`) in a `finally` block or as a context manager around the capture.

## Why it matters
A capture context that mints a resource per entry (a fresh IPC channel, a
communicator buffer) keeps it until the owner closes. The production captures
account for what they mint; an extra profiling capture mints one more and,
without a rollback, leaks it for the process lifetime.

## Example
```python
def profile_cudagraph_memory(self):
    with graph_capture(self.comm):          # mints a channel per entry
        for w in self.wrappers:
            w.capture(self._dummy_run)
    CUDAGraphWrapper.clear_all_graphs()
```

## How to fix
Record a checkpoint before and roll back in a `finally`:
```python
mark = self.comm.checkpoint()
try:
    with graph_capture(self.comm):
        ...
finally:
    self.comm.rollback(mark)
```

## How to suppress
`# alloc-audit: ignore[capture-without-rollback] the channel is reused by the production capture`
on the `with` line or the line above.

## Known false positives
A minting context that already releases on exit is still reported unless
its name is removed from `minting-contexts`.

A release in a helper called from the `finally` is recognised when the
helper (or a helper it calls) rolls back (`rollback-names`), resets a pool,
or calls `gc.collect()` and `torch.cuda.empty_cache()`; other ways of
releasing are not.

## Known false negatives
A throwaway capture whose minting context is entered in a helper
(`self._capture_once()`, then `clear_graphs()` in the caller) is not
connected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..globs import matcher
from ..model import Finding, Language, Related, Severity
from ..pack import RulePack
from ..pipeline.index import Func, ProjectIndex
from ._lib.findings import finding_at
from ._lib.regions import with_items
from ._lib.throwaway import inside_finally, throwaway_evidence
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "capture-without-rollback"


def _releases(index: ProjectIndex, func: Func, is_rollback: Callable[[str], bool], depth: int) -> bool:
    """A helper that releases what the capture minted: it rolls back, resets
    a pool, or drops references and returns the memory (`gc.collect()` with
    `torch.cuda.empty_cache()`), itself or through a helper of its own."""
    callees = func.callees
    if any(is_rollback(c) or _POOL_RESET.search(c) for c in callees):
        return True
    if "gc.collect" in callees and any(c.endswith("empty_cache") for c in callees):
        return True
    return depth > 0 and any(_releases(index, t, is_rollback, depth - 1)
                             for c in func.calls for t in index.resolve(func, c) if t is not func)


_POOL_RESET = re.compile(r"(?:pool|Pool)\w*\.(?:reset|release|clear)\w*$|\.reset_pool\w*$")


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    is_minting = matcher(pack.minting_contexts)
    is_rollback = matcher(pack.rollback_names)
    for func in ctx.index.funcs.values():
        if func.scope is None or not func.withs:
            continue
        entered = list(with_items(func, is_minting))
        if not entered:
            continue
        evidence = throwaway_evidence(func, pack)
        if evidence is None:
            continue
        guarded = any(inside_finally(func, c.span) and (is_rollback(c.callee) or any(
            _releases(ctx.index, t, is_rollback, 2) for t in ctx.index.resolve(func, c))) for c in func.calls) or any(
            is_rollback(item.callee) for w in func.withs for item in w.items)
        if guarded:
            continue
        w, name = entered[0]
        yield finding_at(
            NAME, Severity.WARNING, func.path, w.span.line, w.span.col, func.qualname, name,
            f"{func.qualname} enters {name}, which mints resources per entry, for a throwaway capture "
            f"({evidence[0]}) and never rolls back: whatever it minted stays for the process lifetime; take a "
            "checkpoint before and roll back in a finally",
            (Related(func.path, evidence[1], evidence[0]),),
        )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(contexts=pack.minting_contexts)


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=pack.minting_contexts)

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a throwaway capture through a resource-minting context without rollback",
    doc=__doc__ or "",
    check=check,
    languages=frozenset({Language.PYTHON}),
    starts=starts,
    triggers=triggers,
)
