"""
## What it flags
A scope that is entered again and again (a `@contextmanager` generator, an
`__enter__` method, or a function listed in `per-entry-hooks`) that creates
something that allocates (a direct allocation, or a call to an allocating
constructor or factory such as `self._new_channel(...)`) and stores it in a
long-lived container on the object (`self._all.append(x)`,
`self._by_key[k] = x`), with no removal from that container on the way out
(after the `yield`, in a `finally`, or in `__exit__`). Stores made by
same-object helpers the scope calls (`self._new_channel` doing the append)
count as the scope's own; the scope undoing unrelated bookkeeping in its
`finally` does not hide them.

## Why it matters
Memory grows with every entry and is only returned when the owner closes:
a communication pool whose `capture()` mints an 8-14 MiB IPC channel per
capture keeps them all, and one extra profiling capture leaks one more slab
for the process lifetime.

## Example
```python
@contextmanager
def capture(self):
    channel = self._new_channel(key)      # IpcChannel(): cudaMalloc + IPC export,
    yield channel                         # and self._channels.append(channel)
```

## How to fix
Remove (and release) what the entry added when it exits, in a `finally`; or
reuse one channel per key instead of minting one per entry.

## How to suppress
`# alloc-audit: ignore[retained-per-entry-alloc] one channel per graph, freed in close()`
on the flagged line or the line above.

## Known false positives
A container that is bounded elsewhere (an LRU that evicts on insert) is still
reported.

## Known false negatives
Stores into containers more than one attribute away
(`self.owner.registry.items.append(x)`), and removals in other methods than
`__exit__`, are not connected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..globs import matcher
from ..model import Call, Finding, Language, Related, Severity
from ..pack import RulePack
from ..pipeline.index import Func, ProjectIndex
from ._lib.construction import constructed_allocation
from ._lib.findings import finding_at
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "retained-per-entry-alloc"
_SUBSCRIPT_STORE = re.compile(r"^((?:self|cls)\.[A-Za-z_]\w*)\s*\[")
_ATTR_CALL = re.compile(r"^((?:self|cls)\.[A-Za-z_]\w*)\.([A-Za-z_]\w*)$")


@dataclass(frozen=True)
class Store:
    func: Func
    line: int
    container: str
    value: str


def _stores(func: Func, add: set[str]) -> list[Store]:
    out: list[Store] = []
    for call in func.calls:
        m = _ATTR_CALL.match(call.callee)
        if m and m.group(2) in add:
            out.append(Store(func, call.span.line, m.group(1), call.arglist.split(",")[0].strip()))
        if call.target:
            m2 = _SUBSCRIPT_STORE.match(call.target)
            if m2:
                out.append(Store(func, call.span.line, m2.group(1), call.callee))
    for assign in func.assigns:
        if assign.op != "=":
            continue
        for target in assign.targets:
            m2 = _SUBSCRIPT_STORE.match(target)
            if m2:
                out.append(Store(func, assign.line, m2.group(1), assign.value))
    return out


def _allocating_value(index: ProjectIndex, store: Store, depth: int) -> tuple[Call, str] | None:
    """The allocating call whose result is what the store keeps."""
    func = store.func
    for call in func.calls:
        same = call.span.line == store.line or (call.target is not None and call.target == store.value)
        if not same:
            continue
        if any(s.span.line == call.span.line and s.acquires for s in func.sites):
            return call, call.callee
        reach = constructed_allocation(index, func, call, depth)
        if reach is not None:
            return call, f"{call.callee} ({reach.site.api} at {reach.site.path}:{reach.site.span.line})"
    return None


def _exit_lines(func: Func) -> list[tuple[int, int]]:
    """Line ranges that run when the scope exits: after the first yield, and
    every finally block."""
    ranges = [(b.span.line, b.span.end_line) for b in func.blocks if b.kind == "finally"]
    scope = func.scope
    if scope is not None and scope.yields:
        ranges.append((min(scope.yields) + 1, scope.span.end_line))
    return ranges


def _removes(func: Func, container: str, remove: set[str], lines: list[tuple[int, int]] | None) -> bool:
    def inside(line: int) -> bool:
        return lines is None or any(a <= line <= b for a, b in lines)

    for call in func.calls:
        m = _ATTR_CALL.match(call.callee)
        if m and m.group(1) == container and m.group(2) in remove and inside(call.span.line):
            return True
    for assign in func.assigns:
        if not inside(assign.line):
            continue
        for target in assign.targets:
            if assign.op == "del" and (target == container or target.startswith(container + "[")):
                return True
            if assign.op == "=" and target == container:
                return True
    return False


def check(ctx: RuleContext) -> Iterator[Finding]:
    pack = ctx.pack
    index = ctx.index
    is_cm = matcher(pack.contextmanagers)
    is_hook = matcher(("__enter__", *pack.per_entry_hooks))
    add, remove = set(pack.container_add), set(pack.container_remove)
    depth = max(pack.capture_depth, 3)
    for entry in index.funcs.values():
        scope = entry.scope
        if scope is None or scope.kind != "function":
            continue
        if not ((any(is_cm(d) for d in scope.decorators) and scope.yields) or is_hook(scope.name)
                or is_hook(entry.qualname.replace("::", "."))):
            continue
        # the entry's own stores, and those of same-object helpers it calls
        paths: list[tuple[Call | None, Func]] = [(None, entry)]
        for call in entry.calls:
            if call.callee.startswith(("self.", "cls.")) and call.callee.count(".") == 1:
                for helper in index.resolve(entry, call):
                    if helper is not entry and helper.owner is entry.owner:
                        paths.append((call, helper))
        exit_lines = _exit_lines(entry)
        exit_method = None
        if scope.name == "__enter__" and entry.owner is not None:
            exits = index.method_lookup(entry.owner, "__exit__")
            exit_method = exits[0] if exits else None
        retained: list[tuple[Call | None, Func, Store, tuple[Call, str]]] = []
        seen: set[str] = set()
        for via, func in paths:
            for store in _stores(func, add):
                if store.container in seen:
                    continue
                minted = _allocating_value(index, store, depth)
                if minted is None:
                    continue
                if _removes(entry, store.container, remove, exit_lines):
                    continue
                if exit_method is not None and _removes(exit_method, store.container, remove, None):
                    continue
                seen.add(store.container)
                retained.append((via, func, store, minted))
        if not retained:
            continue
        via, func, store, minted = retained[0]
        line = via.span.line if via is not None else minted[0].span.line
        related: list[Related] = []
        if via is not None:
            related.append(Related(entry.path, via.span.line, f"{entry.qualname} calls {via.callee}"))
        related.append(Related(func.path, minted[0].span.line, f"allocated by {minted[1]}"))
        for _via, holder, kept, _minted in retained:
            related.append(Related(holder.path, kept.line, f"{holder.qualname} stores it in {kept.container}"))
        containers = " and ".join(r[2].container for r in retained)
        yield finding_at(
            NAME, Severity.WARNING, entry.path, line, 1, entry.qualname, containers,
            f"every entry of {entry.qualname} keeps a new allocation ({minted[1]}) in {containers} and nothing "
            "removes it on exit, so memory grows with each entry until the owner closes; remove and release it in "
            "a finally, or reuse one per key",
            tuple(related),
        )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(decorators=pack.contextmanagers, hooks=("__enter__", *pack.per_entry_hooks))


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=pack.per_entry_hooks, named=("__enter__", *pack.contextmanagers))

RULE = Rule(
    name=NAME,
    severity=Severity.WARNING,
    summary="a repeatedly entered scope keeps a new allocation in a long-lived container",
    doc=__doc__ or "",
    check=check,
    languages=frozenset({Language.PYTHON}),
    starts=starts,
    triggers=triggers,
)
