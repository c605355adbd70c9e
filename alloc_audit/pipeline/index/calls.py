"""The call graph: every call grouped by callee (read from the columnar
call tables, no objects), callers of a set of functions within N calls,
and the allocation sites a function reaches within N calls with a
shortest path to each."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...model import Call
from .memo import Memo
from .symbols import Func, Hop, Reach, Symbols, split_callee

# calls of one callee name up to which the reverse walk tests each call's
# targets against the frontier; above, it looks the frontier's ids up
_BY_TARGET_FROM = 16


class CallGraph:
    def __init__(self, symbols: Symbols, resolve: Callable[[Func, Call | str], tuple[Func, ...]]) -> None:
        self._symbols = symbols
        self._resolve = resolve
        self._calls_by_leaf: dict[str, list[tuple[Func, int]]] = {}
        self._by_callee: dict[str, list[str]] = {}  # callee -> ids of the functions calling it
        self._leaves: dict[str, str] = {}  # callee -> its last name
        self._calls_indexed: set[str] = set()
        self._callee_order: list[str] = []  # the keys of _by_callee, in the order they came
        # predicate -> (how many callees it was asked about, those it matched): the expansion's
        # root finder asks the same predicate each round, of the callees of the new files only
        self._matched: weakref.WeakKeyDictionary[Callable[[str], bool], tuple[int, list[str]]] = \
            weakref.WeakKeyDictionary()
        self._reach: Memo[tuple[str, int], tuple[Reach, ...]] = Memo(symbols.deps)
        # function id -> its calls that resolve, with their targets: a reach visits the same functions
        # again and again (each class's constructors, every round), each visit a resolution per call
        self._callees: Memo[str, tuple[tuple[Call, tuple[Func, ...]], ...]] = Memo(symbols.deps)
        # the reverse walk's memos, forgotten whole when a file or a site is added (the tier passes
        # ask the same callers again and again once nothing is added any more):
        # callee leaf -> its calls resolved, (calling function, ids of the targets), in calls_by_leaf order
        self._resolved_by_leaf: dict[str, list[tuple[Func, tuple[str, ...]]]] = {}
        self._within: dict[tuple[tuple[str, ...], int], dict[str, int]] = {}  # (seed ids, depth) -> distances
        # callee leaf -> target id -> places in _resolved_by_leaf[leaf] of the calls resolving to it
        self._targets_by_leaf: dict[str, dict[str, list[int]]] = {}

    def reset(self) -> None:
        self._reach.clear()
        self._callees.clear()
        self._forget_callers()

    def settle(self) -> None:
        self._reach.settle()
        self._callees.settle()

    def invalidate(self, touched: set[str]) -> None:
        """Files were added: forget the reaches that looked up a name they define (``memo``)."""
        self._reach.invalidate(touched)
        self._callees.invalidate(touched)
        self._forget_callers()

    def _forget_callers(self) -> None:
        self._resolved_by_leaf.clear()
        self._within.clear()
        self._targets_by_leaf.clear()

    def calls_by_leaf(self) -> dict[str, list[tuple[Func, int]]]:
        """Every call as (function, index in its file's CallTable), grouped
        by the last name of its callee; read from the columns, no objects.
        Kept up to date as files are added."""
        self._index_calls()
        return self._calls_by_leaf

    def callers_matching(self, predicate: Callable[[str], bool]) -> frozenset[str]:
        """Ids of the functions with a call whose callee satisfies
        ``predicate`` (a pure function of the callee). Each distinct callee
        is asked once: the rules ask this of every function, and callees
        repeat across thousands; asked again after files were added, only
        the new callees are asked."""
        self._index_calls()
        order, by_callee = self._callee_order, self._by_callee
        try:
            asked, matched = self._matched.get(predicate, (0, []))
        except TypeError:  # a predicate that cannot be weakly referenced: asked afresh
            asked, matched = 0, []
        if asked < len(order):
            matched = matched + [c for c in order[asked:] if predicate(c)]
            try:
                self._matched[predicate] = (len(order), matched)
            except TypeError:
                pass
        return frozenset(fid for callee in matched for fid in by_callee[callee])

    def _index_calls(self) -> None:
        """Group the calls of the files added since the last time by callee
        leaf and by callee (a file's functions never change once added)."""
        if len(self._calls_indexed) == len(self._symbols.files):
            return  # every file is indexed (the set holds only indexed paths, the files are only added)
        by_leaf, by_callee, leaves, order = self._calls_by_leaf, self._by_callee, self._leaves, self._callee_order
        # files are only added, in order (a dict): the new ones follow those indexed, no rescan
        for path in list(itertools.islice(self._symbols.files, len(self._calls_indexed), None)):
            self._calls_indexed.add(path)
            for func in self._symbols.by_path.get(path, {}).values():
                calls = func.table
                if calls is None:
                    continue
                callees = calls.callees
                seen: set[str] = set()
                for i in func.call_ix:
                    callee = callees[i]
                    leaf = leaves.get(callee)
                    if leaf is None:
                        leaf = leaves[callee] = split_callee(callee)[1]
                    by_leaf.setdefault(leaf, []).append((func, i))
                    if callee not in seen:
                        seen.add(callee)
                        callers = by_callee.get(callee)
                        if callers is None:
                            callers = by_callee[callee] = []
                            order.append(callee)
                        callers.append(func.id)

    def callers_within(self, seeds: Iterable[Func], depth: int) -> dict[str, int]:
        """Functions that reach one of ``seeds`` through at most ``depth``
        resolved calls -> their distance (seeds are 0), in the order the
        reverse breadth-first walk finds them: only calls whose name matches
        the frontier are looked at. Memoised until a file or site is added."""
        seeds = list(seeds)
        if self._symbols.deps.stack:  # inside a memoised computation: the resolutions must note their names
            return self._walk_callers(seeds, depth, memo=False)
        key = (tuple(f.id for f in seeds), depth)
        found = self._within.get(key)
        if found is None:
            found = self._within[key] = self._walk_callers(seeds, depth, memo=True)
        return dict(found)

    def _walk_callers(self, seeds: list[Func], depth: int, memo: bool) -> dict[str, int]:
        dist: dict[str, int] = {}
        frontier: list[Func] = []
        for f in seeds:
            if f.id not in dist:
                dist[f.id] = 0
                frontier.append(f)
        for level in range(1, depth + 1):
            ids = {f.id for f in frontier}
            names = {f.name for f in frontier}
            names |= {f.owner.name for f in frontier if f.owner is not None and f.scope is not None
                      and f.scope.role == "constructor"}
            next_frontier: list[Func] = []
            for name in sorted(names):
                found = self._resolved_calls(name, memo)
                if memo and len(found) > _BY_TARGET_FROM:
                    # a common name (`forward`, `__init__`): only the calls that reach the frontier, in order
                    by_target = self._by_target(name, found)
                    hits = [i for fid in ids for i in by_target.get(fid, ())]
                    if len(ids) > 1:
                        hits = sorted(set(hits))
                    for i in hits:
                        caller = found[i][0]
                        if caller.id not in dist:
                            dist[caller.id] = level
                            next_frontier.append(caller)
                    continue
                for caller, targets in found:
                    if caller.id not in dist and not ids.isdisjoint(targets):
                        dist[caller.id] = level
                        next_frontier.append(caller)
            if not next_frontier:
                break
            frontier = next_frontier
        return dist

    def _by_target(self, leaf: str, found: list[tuple[Func, tuple[str, ...]]]) -> dict[str, list[int]]:
        """``_resolved_calls(leaf)`` by target id -> the places of the calls
        resolving to it, ascending (each place once per target)."""
        table = self._targets_by_leaf.get(leaf)
        if table is None:
            table = self._targets_by_leaf[leaf] = {}
            for i, (_caller, targets) in enumerate(found):
                for t in dict.fromkeys(targets):
                    table.setdefault(t, []).append(i)
        return table

    def _resolved_calls(self, leaf: str, memo: bool) -> list[tuple[Func, tuple[str, ...]]]:
        """The calls whose callee's last name is ``leaf``, each with the ids of what it resolves to."""
        found = self._resolved_by_leaf.get(leaf) if memo else None
        if found is None:
            found = []
            for caller, i in self.calls_by_leaf().get(leaf, ()):
                assert caller.table is not None
                found.append((caller, tuple(t.id for t in self._resolve(caller, caller.table.callees[i]))))
            if memo:
                self._resolved_by_leaf[leaf] = found
        return found

    def callees(self, func: Func) -> Iterator[tuple[Call, tuple[Func, ...]]]:
        """``func``'s calls that resolve, in order, with their targets: kept per function with the names
        of its resolutions together (``memo``), as each resolution is kept with its own."""
        memo = self._callees
        found = memo.values.get(func.id)
        if found is not None:
            return iter(memo.hit(func.id))
        deps = self._symbols.deps
        deps.begin()
        resolve = self._resolve
        found = tuple((call, targets) for call in func.calls for targets in (resolve(func, call),) if targets)
        return iter(memo.store(func.id, found, deps.end()))

    def reach(self, func: Func, depth: int) -> tuple[Reach, ...]:
        """Allocation sites executed by ``func`` directly or through at most
        ``depth`` resolved calls, each with the shortest call path found
        (breadth first, so the first path to a site is a shortest one)."""
        key = (func.id, depth)
        if key in self._reach:
            return self._reach.hit(key)
        deps = self._symbols.deps
        deps.begin()
        names = deps.stack[-1]
        out: list[Reach] = []
        seen_sites: set[tuple[str, int, int]] = set()
        seen_funcs = {func.id}
        frontier: list[_Visit] = [[func, None, None, ()]]
        for level in range(depth + 1):
            next_frontier: list[_Visit] = []
            for visit in frontier:
                current = visit[0]
                names.add(current.id)  # sites_of(current)
                for site in current.sites:
                    if not site.acquires:
                        continue
                    skey = (site.path, site.span.line, site.span.col)
                    if skey not in seen_sites:
                        seen_sites.add(skey)
                        out.append(Reach(site, _hops(visit)))
                if level == depth:
                    continue
                for call, targets in self.callees(current):
                    for target in targets:
                        if target.id in seen_funcs:
                            continue
                        seen_funcs.add(target.id)
                        next_frontier.append([target, visit, call, None])
            frontier = next_frontier
        return self._reach.store(key, tuple(out), deps.end())


# a function the reach visits: [function, the visit it was called from, the call, its hops (None: not built yet)]
_Visit = list[Any]


def _hops(visit: _Visit) -> tuple[Hop, ...]:
    """The call path to a visit, built only for a visit with a site (most visits have none): each hop
    made once and shared by the paths through it, as the walk used to make them at every visit."""
    hops: tuple[Hop, ...] | None = visit[3]
    if hops is None:
        caller = visit[1][0]
        hops = visit[3] = (*_hops(visit[1]), Hop(visit[2], caller.path, caller.qualname, visit[0].qualname))
    return hops
