"""
## What it flags
Any device allocation in a function matched by the project's `hot-paths`
globs (qualified names such as `"*.forward"`, `"pkg.ops.*"`). Off by default:
turn it on with `enable = ["per-call-alloc"]` once `hot-paths` says which
functions serve requests.

## Why it matters
It is the switch projects use to enforce "no allocation while serving":
every step's memory comes from planned, persistent buffers, so step latency
and peak memory are predictable and graph capture is safe.

## Example
```toml
[tool.alloc-audit]
enable = ["per-call-alloc"]
hot-paths = ["*.forward", "pkg.ops.*"]
```
```python
def forward(self, x):
    out = torch.empty_like(x)       # flagged
```

## How to fix
Take the buffer from a plan or a persistent buffer sized at start-up.

## How to suppress
`# alloc-audit: ignore[per-call-alloc] output handed to the caller, freed by it`
on the allocation's line or the line above.

## Known false positives
Outputs that must be fresh tensors (returned to user code) are reported too.

## Known false negatives
Allocations in helpers that a hot path calls are reported only when the
helper matches `hot-paths` itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..globs import matcher
from ..model import Finding, Severity
from ..pack import RulePack
from ._lib.findings import is_device_allocation, site_finding
from ._lib.regions import dotted_id
from .base import Rule, RuleContext, StartPoints

NAME = "per-call-alloc"


def check(ctx: RuleContext) -> Iterator[Finding]:
    if not ctx.pack.hot_paths:
        return
    is_hot = matcher(ctx.pack.hot_paths)
    for func in ctx.index.funcs.values():
        if func.scope is None or not func.sites:
            continue
        name = func.qualname.replace("::", ".")
        if not (is_hot(name) or is_hot(dotted_id(func))):
            continue
        for site in func.sites:
            if is_device_allocation(site):
                yield site_finding(
                    NAME, Severity.WARNING, site,
                    f"{site.api} allocates device memory per call in {func.qualname}, a hot path "
                    "(hot-paths); take it from a plan or a persistent buffer",
                )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(declared=pack.hot_paths)

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a device allocation in a function declared a hot path (off by default)",
    doc=__doc__ or "",
    check=check,
    default_on=False,
    starts=starts,
)
