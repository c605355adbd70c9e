"""Memos that survive the expansion's rounds: each entry remembers the
names its computation looked up in the symbol tables, and adding files
forgets only the entries that looked up a name the new files define.

Why that is enough: a file, once indexed, never changes (its functions,
calls, sites and imports stay as they are), so a resolution can change
only through a lookup by name in the tables new files extend: a module by
its leaf, a class by its last name (new, or given more paths, bases,
fields or methods), a native free function by name, the subclasses of a
base name. ``Symbols`` notes each such lookup here (``note``) and reports
the names an ``add`` touched; a memo that used a name the new files touch
is dropped, and so is everything computed from it (a computation inherits
the names of the entries it used, memo hits included). The
``tests/test_index_memo.py`` tests check the incremental index against one
built from scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# the names of every entry once the index is settled (shared, never changed)
SETTLED: set[str] = set()

# a computation that saw an entry still being computed (a cycle guard):
# what it found depends on the order of evaluation, so it never survives
UNSTABLE = "\0unstable"


class Deps:
    """The names the computations now running have looked up (a stack: a
    nested computation's names are its caller's too). Hot paths read
    ``stack`` themselves: nothing is noted outside a memoised computation."""

    __slots__ = ("stack", "settled")

    def __init__(self) -> None:
        self.stack: list[set[str]] = []
        self.settled = False  # no file will be added: entries keep no names (``ProjectIndex.settle``)

    def note(self, name: str) -> None:
        if self.stack:
            self.stack[-1].add(name)

    def used(self, names: set[str]) -> None:
        """A memo hit: the entry's names are the caller's too (no matter once settled)."""
        if self.stack and names and not self.settled:
            self.stack[-1].update(names)

    def begin(self) -> None:
        self.stack.append(set())

    def end(self) -> set[str]:
        """The names of the computation that ends (never changed afterwards)."""
        names = self.stack.pop()
        if self.settled:
            return SETTLED
        if self.stack:
            self.stack[-1].update(names)
        return names


class Memo(Generic[K, V]):
    """A dict of computed values with the names each one used."""

    __slots__ = ("_deps", "values", "names")

    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self.values: dict[K, V] = {}
        self.names: dict[K, set[str]] = {}

    def __contains__(self, key: K) -> bool:
        return key in self.values

    def hit(self, key: K) -> V:
        """The stored value (the caller checked ``key in memo``); its names go to the running computation."""
        names = self.names.get(key)
        if names is None:  # still being computed: a cycle
            self._deps.note(UNSTABLE)
        else:
            self._deps.used(names)
        return self.values[key]

    def guard(self, key: K, value: V) -> None:
        """A provisional value while ``key`` is computed (a cycle guard)."""
        self.values[key] = value
        self.names.pop(key, None)

    def store(self, key: K, value: V, names: set[str]) -> V:
        self.values[key] = value
        self.names[key] = names
        return value

    def clear(self) -> None:
        self.values = {}
        self.names = {}

    def discard(self, drop: Callable[[K], bool], touched: Collection[str]) -> None:
        """Forget the entries whose key ``drop`` says and that used a name in
        ``touched`` (the factories' weight uploads changed), the unstable ones, and
        those whose names are not known (computed once the index settled)."""
        touched = frozenset(touched)
        names = self.names
        for key in [k for k in self.values if drop(k)]:
            used = names.get(key)
            if used is None or used is SETTLED or UNSTABLE in used or not touched.isdisjoint(used):
                del self.values[key]
                names.pop(key, None)

    def settle(self) -> None:
        """Keep the values, forget the names (no file will be added)."""
        self.names = dict.fromkeys(self.names, SETTLED)

    def __len__(self) -> int:
        return len(self.values)

    def invalidate(self, touched: Collection[str]) -> int:
        """Drop the entries that used a name in ``touched`` (and the unstable
        ones); how many were dropped."""
        touched = frozenset(touched)
        drop = [key for key, names in self.names.items() if not touched.isdisjoint(names) or UNSTABLE in names]
        if len(self.values) != len(self.names):  # every key with names has a value: equal sizes, no guard left
            drop += [key for key in self.values if key not in self.names]  # guards left behind
        for key in drop:
            self.values.pop(key, None)
            self.names.pop(key, None)
        return len(drop)


class CutOff(Generic[K, V]):
    """A memo whose entries stand in for the names they looked up (early
    cut-off): a computation that uses an entry notes the entry's token, not
    its names. Adding files recomputes the entries they touch (``recheck``)
    and reports the tokens of those whose value changed: a lookup that
    finds what it found before keeps what was built on it (a new module
    named like a stdlib one, a package ``__init__`` that defines nothing
    the lookup asked for). The value must be all a caller takes from it.
    An entry computed inside another notes names, not a token."""

    __slots__ = ("_deps", "_compute", "_prefix", "_memo", "_tokens", "_running", "_settled")

    def __init__(self, deps: Deps, compute: Callable[[K], V], prefix: str) -> None:
        self._deps = deps
        self._compute = compute
        self._prefix = prefix  # a token is the prefix and the key's repr: no other name noted starts so
        self._memo: Memo[K, V] = Memo(deps)
        self._tokens: dict[K, str] = {}
        self._running = 0
        # once settled (nothing will be added), values alone: no names, no tokens (``clear`` empties it)
        self._settled: dict[K, V] = {}

    def get(self, key: K) -> V:
        deps = self._deps
        if deps.settled:  # nothing will be added: the value, once
            settled = self._settled
            if key in settled:
                return settled[key]
            value = settled[key] = self._compute(key)
            return value
        if self._running:  # inside an entry: its names are the entry's
            return self._compute(key)
        memo = self._memo
        if key in memo.values:
            value = memo.values[key]
        else:
            value = memo.store(key, self._run(key), deps.stack.pop())
        if deps.stack:
            token = self._tokens.get(key)
            if token is None:
                token = self._tokens[key] = self._prefix + repr(key)
            deps.stack[-1].add(token)
        return value

    def _run(self, key: K) -> V:
        """``compute(key)`` with a fresh set of names on the stack (left there for the caller to pop)."""
        self._deps.stack.append(set())
        self._running += 1
        try:
            return self._compute(key)
        finally:
            self._running -= 1

    def recheck(self, touched: Collection[str]) -> set[str]:
        """Files were added: recompute the entries that used a name in
        ``touched``; the tokens of those whose value is another one now."""
        touched = frozenset(touched)
        memo = self._memo
        stale = [(key, memo.values[key]) for key, names in memo.names.items() if not touched.isdisjoint(names)]
        for key, _value in stale:
            del memo.values[key], memo.names[key]
        changed: set[str] = set()
        for key, value in stale:
            if memo.store(key, self._run(key), self._deps.stack.pop()) is not value:
                changed.add(self._tokens.get(key) or self._prefix + repr(key))
        return changed

    def clear(self) -> None:
        self._memo.clear()
        self._tokens = {}
        self._settled = {}
