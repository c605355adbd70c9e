"""Every fixture, compared exactly with what alloc-audit reports: findings by
(line, rule) and census sites by (line, api, tier, kind). An unannotated
finding or site fails, and so does a `todo-expect` that starts passing."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_harness import (
    FIXTURES,
    compare_sites,
    fixture_cases,
    reported_findings,
    reported_sites,
    run_fixture,
)

CASES = fixture_cases()


def _show(items: set[tuple[str, int, str]], lines: dict[tuple[str, int], str]) -> str:
    return "\n".join(f"  {p}:{n}: {rule}    | {lines.get((p, n), '')}" for p, n, rule in sorted(items))


@pytest.mark.parametrize("case", CASES, ids=[c.relative_to(FIXTURES).as_posix() for c in CASES])
def test_fixture(case: Path) -> None:
    expected, result = run_fixture(case)
    internal = [e for e in result.errors if e.message.startswith("internal error")]
    assert not internal, f"the tool failed on a fixture: {internal}"
    found = reported_findings(result)
    todo = expected.todo_findings | expected.todo_ok
    promoted = expected.todo_findings & found
    assert not promoted, "todo-expect now reported; promote it to expect:\n" + _show(promoted, expected.lines)
    fixed = expected.todo_ok - found
    assert not fixed, "todo-ok no longer reported; turn it into ok:\n" + _show(fixed, expected.lines)
    found -= todo
    missing = expected.findings - found
    unexpected = found - expected.findings
    problems = []
    if missing:
        problems.append("missing findings:\n" + _show(missing, expected.lines))
    if unexpected:
        problems.append("unexpected findings:\n" + _show(unexpected, expected.lines))
    near = expected.near_misses & found
    if near:
        problems.append("reported on an ok line:\n" + _show(near, expected.lines))
    todo_sites = {s[:4] for s in expected.todo_sites}
    sites = {s for s in reported_sites(result) if s[:4] not in todo_sites}
    missing_sites, unexpected_sites = compare_sites(expected.sites, sites)
    if missing_sites:
        problems.append("missing sites:\n  " + "\n  ".join(missing_sites))
    if unexpected_sites:
        problems.append("unexpected sites:\n  " + "\n  ".join(unexpected_sites))
    assert not problems, "\n".join(problems)
