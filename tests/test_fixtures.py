"""Every fixture, compared exactly with what alloc-audit reports: findings by
(line, rule) and census sites by (line, api, tier, kind), counted (two
identical sites on a line need two annotations). An unannotated finding or
site fails, and so does a `todo-expect`, `todo-ok` or `todo-site` that starts
passing (strict, like xfail: promote it). One test per fixture; the
single-file fixtures of a language are scanned together once per run (the
first worker to need the scan makes it, the other reads it) and each test
reads its own file's part (fixtures_harness.run_fixture_batched)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from fixtures_harness import (
    FIXTURES,
    compare_sites,
    fixture_cases,
    reported_findings,
    reported_sites,
    run_fixture,
    run_fixture_batched,
)

CASES = fixture_cases()


def _show(items: Iterable[tuple[str, int, str]], lines: dict[tuple[str, int], str]) -> str:
    return "\n".join(f"  {p}:{n}: {rule}    | {lines.get((p, n), '')}" for p, n, rule in sorted(items))


@pytest.mark.parametrize("case", CASES, ids=[c.relative_to(FIXTURES).as_posix() for c in CASES])
def test_fixture(case: Path, shared_batches: Path) -> None:
    check_fixture(case, batched=shared_batches)


def check_fixture(case: Path, batched: Path | None = None) -> None:
    """``batched``: the fixture's file cut from one scan of its language
    folder's single-file fixtures (fixtures_harness.run_fixture_batched;
    the scan shared by the workers through that folder), else scanned alone."""
    expected, result = run_fixture_batched(case, batched) if batched is not None else run_fixture(case)
    internal = [e for e in result.errors if e.message.startswith("internal error")]
    assert not internal, f"the tool failed on a fixture: {internal}"
    found = reported_findings(result)
    promoted = expected.todo_findings & set(found)
    assert not promoted, "todo-expect now reported; promote it to expect:\n" + _show(promoted, expected.lines)
    fixed = expected.todo_ok - set(found)
    assert not fixed, "todo-ok no longer reported; turn it into ok:\n" + _show(fixed, expected.lines)
    for key in expected.todo_findings | expected.todo_ok:
        del found[key]
    missing = expected.findings - found
    unexpected = found - expected.findings
    problems = []
    if missing:
        problems.append("missing findings:\n" + _show(missing.elements(), expected.lines))
    if unexpected:
        problems.append("unexpected findings:\n" + _show(unexpected.elements(), expected.lines))
    near = expected.near_misses & set(found)
    if near:
        problems.append("reported on an ok line:\n" + _show(near, expected.lines))
    missing_sites, unexpected_sites, left = compare_sites(expected.sites, reported_sites(result))
    # a todo-site names a site that is not found yet: one found now must be promoted
    todo_missing, _, _ = compare_sites(expected.todo_sites, left)
    now_found = len(expected.todo_sites) - len(todo_missing)
    assert not now_found, ("todo-site now found; promote it to expect-site:\n  "
                           + "\n  ".join(f"{p}:{n}: {a} {t}" for p, n, a, t, _ in expected.todo_sites))
    if missing_sites:
        problems.append("missing sites:\n  " + "\n  ".join(missing_sites))
    if unexpected_sites:
        problems.append("unexpected sites:\n  " + "\n  ".join(unexpected_sites))
    assert not problems, "\n".join(problems)


TWO_ON_ONE_LINE = """\
import torch


def okay_two_buffers(n):
    # expect-site: torch.empty T4 device
    a, b = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    return a, b
"""


def test_two_sites_on_a_line_need_two_annotations(tmp_path: Path) -> None:
    case = tmp_path / "sites-two.py"
    case.write_text(TWO_ON_ONE_LINE)
    with pytest.raises(AssertionError, match="unexpected sites"):
        check_fixture(case)
    case.write_text(TWO_ON_ONE_LINE.replace("    # expect-site", "    # expect-site: torch.empty T4 device\n    # expect-site", 1))
    check_fixture(case)


def test_a_todo_site_that_is_found_must_be_promoted(tmp_path: Path) -> None:
    case = tmp_path / "sites-todo.py"
    case.write_text(TWO_ON_ONE_LINE.replace("    # expect-site", "    # todo-site: torch.empty T4 device\n    # expect-site", 1))
    with pytest.raises(AssertionError, match="promote it to expect-site"):
        check_fixture(case)
