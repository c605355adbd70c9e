"""Glob matching for names and paths, compiled once per pattern list.

Patterns are fnmatch-style and case-sensitive (``*`` also crosses ``.`` and
``/``), which is what users of ruff/pre-commit globs expect for qualified
names like ``pkg.ops.*``. Rules match callee names by the hundred thousand,
so a matcher first looks at the name's last component: patterns whose last
component is literal are a set lookup, and only names that pass that test
(or a pattern with a wildcard in its last component) reach the full regex.
Answers are memoised per pattern list: the same callee names recur across
thousands of functions.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from functools import lru_cache

_LAST = re.compile(r"(?:\.|::|->|/)")


def _last(name: str) -> str:
    parts = _LAST.split(name)
    return parts[-1]


@lru_cache(maxsize=512)
def _compile(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    if not patterns:
        return lambda _name: False
    full = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    literal_leaves = set()
    wild_leaves = []
    for p in patterns:
        leaf = _last(p)
        if any(ch in leaf for ch in "*?[") or not leaf:
            wild_leaves.append(leaf or "*")
        else:
            literal_leaves.add(leaf)
    leaf_regex = re.compile("|".join(f"(?:{fnmatch.translate(w)})" for w in wild_leaves)) if wild_leaves else None

    memo: dict[str, bool] = {}

    def match(name: str) -> bool:
        found = memo.get(name)
        if found is not None:
            return found
        if len(memo) > 500_000:  # a bound, for very long-lived processes
            memo.clear()
        key = name
        if "->" in name:  # a C++ member call through a pointer matches `.` patterns
            name = name.replace("->", ".")
        leaf = _last(name)
        if leaf not in literal_leaves and (leaf_regex is None or leaf_regex.match(leaf) is None):
            found = False
        else:
            found = full.match(name) is not None
        memo[key] = found
        return found

    return match


def matcher(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A predicate that is true when a name matches any of ``patterns``."""
    return _compile(tuple(patterns))


def matches(name: str, patterns: Iterable[str]) -> bool:
    return _compile(tuple(patterns))(name)


@lru_cache(maxsize=65536)
def test_path(path: str) -> bool:
    """Test code by path convention (tests/, test_*.py, *_test.py, conftest.py). Remembered per path
    (perf-r29: the tier passes ask it of each caller they walk, ~175,000 times on aphrodite)."""
    parts = path.split("/")
    name = parts[-1]
    return any(p in ("tests", "test", "testing", "unit_tests") for p in parts[:-1]) or name.startswith("test_") \
        or name.rsplit(".", 1)[0].endswith("_test") or name == "conftest.py"
