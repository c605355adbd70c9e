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

Only a re-allocation guarded by a size or capacity comparison of the same
buffer (`self._ws.numel() < n`) or of its recorded capacity (`n >
self._cap`, with `self._cap` set in the branch) counts: an upload of a new
batch (`if isinstance(self.ids, list) and len(self) > 1: self.ids =
torch.tensor(host)`) compares something else. Lazy initialisation (`if
self._ws is None: self._ws = torch.empty(n)`, the test compares no sizes)
allocates once and is not reported, nor is a move to
another device (`or self._ws.device != x.device`).

A buffer whose size is made of literals and module constants (allocated at
most once), and an `ensure_*` helper that the class's initialiser also calls
(sized once there from the planned maximum, then clamped), are not growth.
A buffer held in a container (`self._bufs[i]`, tested through the
container) is followed.

## Known false positives
Growth that provably happens only during warm-up (before serving starts) is
still reported; so is a lazily built cache keyed by shape, and a buffer
sized from a planned maximum that is read from configuration at run time.

## Known false negatives
Growth through a helper (`self._resize(n)` doing the free and the
allocation) is reported in the helper only when the helper itself holds the
conditional.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..globs import matcher
from ..model import Block, Finding, Language, Related, Severity, Site, SiteKind
from ..pipeline.index import Func
from ._lib.allocation import holds_no_memory
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
    """Whether a test reads the buffer; a container element (`self._bufs[i]`)
    is read through its container (`current_size(self._bufs[i])`)."""
    name = _SUBSCRIPT.sub("", target.lstrip("*&").replace("->", "."))
    return any(c == name or c.startswith(name + ".") for c in chains(_SUBSCRIPT.sub("", text)))


def _compares_size_of(test: str, target: str) -> bool:
    """Whether one operand of the test's `and`/`or` compares a size of the
    buffer itself (`self.buf.numel() < n`, `current_size(self._bufs[i]) < n`)
    or of its recorded capacity (`n > self._cap`, `self._cap` set in the branch).
    `isinstance(self.ids, list) and len(self) > 1` reads the buffer and
    compares a size, but not the buffer's: an upload of a new batch."""
    return any(_mentions(part, target) and _GROWS.search(part) for part in _CONNECTIVE.split(test))


_CONNECTIVE = re.compile(r"\band\b|\bor\b|&&|\|\|")
_SUBSCRIPT = re.compile(r"\[[^\[\]]*\]")
_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _sized_once(site: Site, constants: set[str]) -> bool:
    """A size made only of literals and module constants (`MAX_TOKENS`) is
    the same on every call: the buffer is re-allocated at most once."""
    if not site.shape:
        return False
    names = {n for dim in site.shape for n in _NAME.findall(dim)}
    names -= {"torch", "dtype", "device", "self.device"}
    return all(n in constants or (n.isupper() and len(n) > 1) for n in names)


def _set_up_by_initialiser(ctx: RuleContext, func: Func, is_initialiser: Callable[[str], bool]) -> bool:
    """An `ensure_*` helper that the class's initialiser also calls (with the
    planned maximum): the buffer is sized once there, later calls only clamp."""
    owner = func.owner
    if owner is None:
        return False
    for caller_id, distance in ctx.index.callers_within([func], 1).items():
        caller = ctx.index.funcs.get(caller_id)
        scope = caller.scope if caller is not None else None
        if distance == 1 and caller is not None and caller.owner is owner and scope is not None and \
                (scope.role == "constructor" or is_initialiser(scope.name)):
            return True
    return False


def _inside(block: Block, site: Site) -> bool:
    return block.span.line <= site.span.line and site.span.end_line <= block.span.end_line


def check(ctx: RuleContext) -> Iterator[Finding]:
    is_initialiser = matcher(ctx.pack.initialisers)
    for func in ctx.index.funcs.values():
        scope = func.scope
        if scope is None or scope.kind != "function" or scope.role == "constructor" or is_initialiser(scope.name):
            continue
        allocations = [s for s in func.sites if is_device_allocation(s) and s.target and _persistent(func, s.target)]
        if not allocations or _set_up_by_initialiser(ctx, func, is_initialiser):
            continue
        constants = set(ctx.index.module_constants(func.path))
        releases = [s for s in func.sites if s.kind is SiteKind.RELEASE and s.target]
        branches = [b for b in func.blocks if b.kind in ("if", "elif", "else")]
        for site in allocations:
            target = site.target or ""
            why: list[Related] = []
            if _sized_once(site, constants) or holds_no_memory(site):
                continue
            for block in branches:
                if not _inside(block, site):
                    continue
                recorded = [t for a in func.assigns if block.span.line <= a.line <= block.span.end_line
                            for t in a.targets if t != target and _persistent(func, t)]
                if block.test and any(_compares_size_of(block.test, t) for t in (target, *recorded)):
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
