"""Code roles (DESIGN.md "Code roles"): every file is `production`, `test`,
`benchmark`, `example` or `tooling`, from path conventions, overridable in
configuration (``[tool.alloc-audit.roles]``: role = [path globs]). Sites and
findings carry the role; only the configured roles (`fail-roles`,
production by default) fail `check`, and findings in other roles are shown
as `info`. Pure: a path and the overrides -> a role."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from ..globs import matcher
from ..model import BENCHMARK, EXAMPLE, PRODUCTION, TEST, TOOLING, Site
from ..slots import replacer

# Directory names and file-name patterns, by role; checked in this order
# (a benchmark under tests/ is test code; an example's tests are tests).
_DIRS: tuple[tuple[str, frozenset[str]], ...] = (
    (TEST, frozenset({"tests", "test", "testing", "unit_tests", "unittests", "unittest", "integration_tests",
                      "__tests__", "testdata", "test_data", "conftest"})),
    (BENCHMARK, frozenset({"benchmarks", "benchmark", "bench", "benches", "perf", "profiling"})),
    (EXAMPLE, frozenset({"examples", "example", "demo", "demos", "samples", "tutorials", "notebooks",
                         "docs", "doc"})),  # documentation snippets are examples
    (TOOLING, frozenset({"tools", "tool", "scripts", "script", "ci", ".github"})),
)
_FILES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (TEST, re.compile(r"^(?:test_.*\.py|.*_test\.(?:py|cc|cpp|cu|cxx)|.*_tests?\.(?:cc|cpp|cu)|conftest\.py|"
                      r"test\.(?:cc|cpp|cu|py))$")),
    (BENCHMARK, re.compile(r"^(?:bench_.*|benchmark_.*|.*_bench(?:mark)?\.(?:py|cc|cpp|cu))$")),
    (EXAMPLE, re.compile(r"^example_.*\.py$")),
)


@lru_cache(maxsize=65536)
def conventional_role(path: str) -> str:
    """The role a path's conventions give it (``tests/``, ``test_*.py``,
    ``*_test.cc``, ``benchmarks/``, ``bench_*``, ``examples/``, ``docs/``, ``tools/``,
    ``scripts/``)."""
    parts = path.split("/")
    name = parts[-1]
    directories = {p.lower() for p in parts[:-1]}
    for role, pattern in _FILES:
        if pattern.match(name):
            return role
    for role, names in _DIRS:
        if not directories.isdisjoint(names):
            return role
    return PRODUCTION


def role_finder(overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Callable[[str], str]:
    """A path -> role function: configured globs first, then conventions."""
    compiled = [(role, matcher(globs)) for role, globs in overrides]

    def role_of(path: str) -> str:
        for role, matches in compiled:
            if matches(path):
                return role
        return conventional_role(path)

    return role_of


def with_roles(sites: list[Site], overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> list[Site]:
    """Each site with its file's code role; production is the default."""
    role_of = role_finder(overrides)
    return [s if (role := role_of(s.path)) == PRODUCTION else _with_role(s, role) for s in sites]


# `dataclasses.replace(site, role=role)` through the slots (`slots.replacer`): ~10 k sites of a flashinfer
# scan lie in test or benchmark files, and `replace` reads the fields and calls the class by keyword
_with_role = replacer(Site, ("role",))
