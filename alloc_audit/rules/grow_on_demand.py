"""
## What it flags
Inside a conditional, in a function that is not an initialiser (its name
does not match `initialisers`, it is not a constructor), a persistent buffer
(an attribute `self._ws`, a C++ member or a `static` local) is dropped or
freed and allocated again, larger:

- `if self._ws is None or self._ws.numel() < n: self._ws = torch.empty(n, ...)`
  (the test mentions the buffer being replaced);
- `if (need > cap_) { cudaFree(buf_); cudaMalloc(&buf_, need); }` (freed and
  allocated in the same branch);
- `if (need <= cap_) return; cudaFree(buf_); cudaMalloc(&buf_, need);`
  (a guard clause, then free and allocate).

## Why it matters
It puts a driver allocation on a path that runs per call: latency spikes at
unpredictable steps, fragmentation, peaks no budget expected, and under
CUDA-graph capture a freed-and-reallocated pointer breaks the graph (or the
capture fails). Reviews find it as workspaces grown lazily with
`cudaFree`+`cudaMalloc`.

## Example
```cpp
void Workspace::reserve(size_t need) {
  if (need <= cap_) return;
  cudaFree(buf_);
  cudaMalloc(&buf_, need);
  cap_ = need;
}
```

## How to fix
Size the buffer once, at initialisation, from the planned maximum (and fail
loudly if a call needs more).

## How to suppress
`// alloc-audit: ignore[grow-on-demand] only grows during warm-up, before capture`
on the allocation's line or the line above.

Lazy initialisation (`if self._ws is None: self._ws = torch.empty(n)`, the
test compares no sizes) allocates once and is not reported, nor is a move to
another device (`or self._ws.device != x.device`).

## Known false positives
Growth that provably happens only during warm-up (before serving starts) is
still reported; so is a lazily built cache keyed by shape.

## Known false negatives
Growth through a helper (`self._resize(n)` doing the free and the
allocation) is reported in the helper only when the helper itself holds the
conditional; buffers held in containers (`self.bufs[k]`) are not followed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..globs import matcher
from ..model import Block, Finding, Language, Related, Severity, Site, SiteKind
from ..pipeline.index import Func
from ._lib.findings import is_device_allocation, site_finding
from ._lib.taint import chains
from .base import Rule, RuleContext

NAME = "grow-on-demand"
# a test that compares sizes: `if self._ws is None` alone is lazy
# initialisation (allocated once), and neither is a device check
# (`self._ws.device != x.device`); `->` is a C++ member access, not a comparison
_GROWS = re.compile(r"<|(?<!-)>|\bnumel\b|\bshape\b|\bsize\b|\blen\(|\bcapacity\b")


def _persistent(func: Func, target: str) -> bool:
    """An attribute, a member or a static local: it outlives the call."""
    name = target.lstrip("*&")
    if func.language is Language.PYTHON:
        return name.startswith(("self.", "cls."))
    scope = func.scope
    if scope is not None and name in {p.lstrip("*&") for p in scope.params}:
        return False
    declared = [a for a in func.assigns if a.type is not None and name in a.targets]
    if not declared:
        return name.startswith(("this.", "this->")) or "." not in name or "->" not in name
    return any((a.type or "").startswith("static ") for a in declared)


def _mentions(text: str, target: str) -> bool:
    name = target.lstrip("*&").replace("->", ".")
    return any(c == name or c.startswith(name + ".") for c in chains(text))


def _inside(block: Block, site: Site) -> bool:
    return block.span.line <= site.span.line and site.span.end_line <= block.span.end_line


def check(ctx: RuleContext) -> Iterator[Finding]:
    is_initialiser = matcher(ctx.pack.initialisers)
    for func in ctx.index.funcs.values():
        scope = func.scope
        if scope is None or scope.kind != "function" or scope.role == "constructor" or is_initialiser(scope.name):
            continue
        allocations = [s for s in func.sites if is_device_allocation(s) and s.target and _persistent(func, s.target)]
        if not allocations:
            continue
        releases = [s for s in func.sites if s.kind is SiteKind.RELEASE and s.target]
        branches = [b for b in func.blocks if b.kind in ("if", "elif", "else")]
        for site in allocations:
            target = site.target or ""
            why: list[Related] = []
            for block in branches:
                if not _inside(block, site):
                    continue
                if block.test and _mentions(block.test, target) and _GROWS.search(block.test):
                    why.append(Related(func.path, block.stmt.line if block.stmt else block.span.line,
                                       f"re-allocated when `{block.test}`"))
                    break
                freed = [r for r in releases if _inside(block, r) and _mentions(r.target or "", target)
                         and r.span.line < site.span.line]
                if freed:
                    why.append(Related(func.path, freed[0].span.line, f"{freed[0].api}({freed[0].target}) first"))
                    break
            if not why:
                for guard in branches:
                    if not (guard.exits and guard.kind == "if" and guard.span.end_line < site.span.line):
                        continue
                    freed = [r for r in releases if guard.span.end_line < r.span.line < site.span.line
                             and _mentions(r.target or "", target)]
                    if freed:
                        why = [Related(func.path, guard.stmt.line if guard.stmt else guard.span.line,
                                       f"guard `{guard.test}` returns early"),
                               Related(func.path, freed[0].span.line, f"{freed[0].api}({freed[0].target}) first")]
                        break
            if why:
                yield site_finding(
                    NAME, Severity.WARNING, site,
                    f"{target} is dropped and re-allocated larger by {site.api} on demand in {func.qualname}, "
                    "a function that is not an initialiser: a driver allocation on a per-call path; size it once "
                    "at initialisation from the planned maximum",
                    tuple(why),
                )


RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a persistent buffer freed and re-allocated larger on a per-call path",
    doc=__doc__ or "",
    check=check,
)
