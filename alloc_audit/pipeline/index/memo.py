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

from collections.abc import Collection, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# a computation that saw an entry still being computed (a cycle guard):
# what it found depends on the order of evaluation, so it never survives
UNSTABLE = "\0unstable"


class Deps:
    """The names the computations now running have looked up (a stack: a
    nested computation's names are its caller's too)."""

    __slots__ = ("_stack", "_interned")

    def __init__(self) -> None:
        self._stack: list[set[str]] = []
        self._interned: dict[frozenset[str], frozenset[str]] = {}

    def note(self, name: str) -> None:
        if self._stack:
            self._stack[-1].add(name)

    def used(self, names: frozenset[str]) -> None:
        """A memo hit: the entry's names are the caller's too."""
        if self._stack and names:
            self._stack[-1].update(names)

    def begin(self) -> None:
        self._stack.append(set())

    def end(self) -> frozenset[str]:
        names = self._stack.pop()
        if self._stack:
            self._stack[-1].update(names)
        frozen = frozenset(names)
        return self._interned.setdefault(frozen, frozen)  # most entries share a handful of sets

    def forget_interned(self) -> None:
        self._interned = {}


class Memo(Generic[K, V]):
    """A dict of computed values with the names each one used."""

    __slots__ = ("_deps", "values", "_names")

    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self.values: dict[K, V] = {}
        self._names: dict[K, frozenset[str]] = {}

    def __contains__(self, key: K) -> bool:
        return key in self.values

    def hit(self, key: K) -> V:
        """The stored value (the caller checked ``key in memo``); its names go to the running computation."""
        names = self._names.get(key)
        if names is None:  # still being computed: a cycle
            self._deps.note(UNSTABLE)
        else:
            self._deps.used(names)
        return self.values[key]

    def guard(self, key: K, value: V) -> None:
        """A provisional value while ``key`` is computed (a cycle guard)."""
        self.values[key] = value
        self._names.pop(key, None)

    def store(self, key: K, value: V, names: frozenset[str]) -> V:
        self.values[key] = value
        self._names[key] = names
        return value

    def clear(self) -> None:
        self.values = {}
        self._names = {}

    def __len__(self) -> int:
        return len(self.values)

    def invalidate(self, touched: Collection[str]) -> int:
        """Drop the entries that used a name in ``touched`` (and the unstable
        ones); how many were dropped."""
        touched = frozenset(touched)
        verdict: dict[frozenset[str], bool] = {}
        drop = []
        for key, names in self._names.items():
            bad = verdict.get(names)
            if bad is None:
                bad = verdict[names] = UNSTABLE in names or not names.isdisjoint(touched)
            if bad:
                drop.append(key)
        drop += [key for key in self.values if key not in self._names]  # guards left behind
        for key in drop:
            self.values.pop(key, None)
            self._names.pop(key, None)
        return len(drop)
