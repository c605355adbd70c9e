"""pipeline/index: the reverse walk of ``callers_within`` looks a common
callee name's calls up by target id (perf-r27) instead of testing every
call's targets against the frontier; it must find the same callers at the
same distances in the same order as the plain walk, for one seed or several,
before and after the on-demand expansion adds files."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from fixtures_harness import extracted_facts

from alloc_audit.pipeline.index import ProjectIndex, calls

PROJECT = Path(__file__).parent / "fixtures" / "python" / "project-expansion-rounds"
FIRST = ("csrc/engine.cc", "csrc/pool.cc", "pkg/__init__.py", "pkg/engine.py", "pkg/raw.py")
ON_DEMAND = ("csrc/pool.h", "pkg/pools.py")


def _walks(index: ProjectIndex) -> None:
    graph = index._calls
    funcs = sorted(index.funcs.values(), key=lambda f: f.id)
    assert funcs
    seeds = [[f] for f in funcs] + [list(pair) for pair in itertools.combinations(funcs, 2)]
    for group in seeds:
        for depth in (1, 2, 3):
            plain = graph._walk_callers(group, depth, memo=False)
            looked_up = graph._walk_callers(group, depth, memo=True)
            assert list(looked_up.items()) == list(plain.items()), ([f.id for f in group], depth)
            assert list(index.callers_within(group, depth).items()) == list(plain.items())


@pytest.mark.parametrize("from_size", [-1, 0, 1, 16])
def test_callers_by_target_walk_as_the_plain_one(monkeypatch: pytest.MonkeyPatch, from_size: int) -> None:
    monkeypatch.setattr(calls, "_BY_TARGET_FROM", from_size)
    index = ProjectIndex(extracted_facts(PROJECT, FIRST))
    _walks(index)
    index.add(extracted_facts(PROJECT, ON_DEMAND))
    _walks(index)
    index.settle()
    _walks(index)
