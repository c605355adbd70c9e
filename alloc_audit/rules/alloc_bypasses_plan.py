"""
## What it flags
A function that takes its buffers from a planned scratch or workspace
(calls matching `scratch-accessors`, by default `scratch.get_*(...)`,
`workspace.get_simultaneous(...)`, `*_workspace(...)`, `arena.take(...)`) and,
in the same function, also allocates device memory directly.

## Why it matters
A scratch plan exists so that the forward pass asks the allocator for
nothing: its size is known, budgeted and reused. A direct allocation next to
the planned ones escapes the plan: it is sized per call, it is in no budget
term, and under CUDA-graph capture it lands in the graph pool. Reviews find
it as the one `torch.empty` in a wrapper whose other buffers are all planned.

## Example
```python
def sparse_attention(q, scratch, rows, slices):
    scores = scratch.get_scores(rows)
    partial = torch.empty((rows * slices, topk), dtype=torch.float32, device=q.device)
```

## How to fix
Add the buffer to the plan (give the plan a `get_partial(rows)`), sized for
the largest call.

## How to suppress
`# alloc-audit: ignore[alloc-bypasses-plan] written into the caller's batch, kept across steps`
on the allocation's line or the line above.

The op's output is the caller's, not scratch: an allocation the function
returns (directly, in a tuple or list, or passed to the returned call as an
`out`-named argument) is not reported. Data creation (`torch.randn`,
`torch.arange`, `torch.tensor`) is not counted as a buffer.

## Known false positives
An output handed to the caller in another way (stored into a structure the
caller passed in) still looks like scratch; say so in a suppression.

## Known false negatives
Plans reached through other names than the configured accessor patterns, and
allocations made in a helper the wrapper calls, are not seen.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..globs import matcher
from ..model import Finding, Related, Severity
from ..pack import RulePack
from ._lib.allocation import holds_no_memory, is_one_time_init, returned_views
from ._lib.findings import is_buffer_allocation, is_returned, returned_names, site_finding
from .base import Rule, RuleContext, StartPoints

NAME = "alloc-bypasses-plan"


def check(ctx: RuleContext) -> Iterator[Finding]:
    is_accessor = matcher(ctx.pack.scratch_accessors)
    planning = ctx.index.callers_matching(is_accessor)
    for func in ctx.index.funcs.values():
        if not func.sites or func.scope is None or func.id not in planning:
            continue
        direct = [s for s in func.sites if is_buffer_allocation(s)]
        if not direct:
            continue
        planned = [c for c in func.calls if is_accessor(c.callee)]
        if not planned:
            continue
        # the op's output is the caller's, not scratch: only scratch belongs in the plan
        names_out = returned_names(func)
        returned = ({r.line for r in func.returns}, names_out)
        views = returned_views(func, names_out)
        # outputs (also through a view or alias), zero-element tensors and
        # one-time initialisation are not per-call scratch (issue 16)
        direct = [s for s in direct if not is_returned(returned, s) and not (s.target and s.target in views)
                  and not holds_no_memory(s) and is_one_time_init(func, s) is None]
        names = ", ".join(sorted({c.callee for c in planned}))
        related = tuple(Related(func.path, c.span.line, f"planned buffer from {c.callee}") for c in planned[:5])
        for site in direct:
            yield site_finding(
                NAME, Severity.WARNING, site,
                f"{site.api} in {site.scope} allocates directly while the function takes its other buffers from a "
                f"plan ({names}); add this buffer to the plan",
                related,
            )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(calls=pack.scratch_accessors)

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a function that uses a scratch plan also allocates device memory directly",
    doc=__doc__ or "",
    check=check,
    starts=starts,
)
