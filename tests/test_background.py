"""The rules run in a forked child while the parent runs the tier passes
(``pipeline/background``): the value comes back, one job computes it at
once in the parent (no fork), a failing or dying child leaves the work to
the parent, and the findings are the same whether a child or the parent
computes them, for any ``--jobs``.
Nothing here is timed."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from clihelp import scan_json

from alloc_audit.pipeline import background
from alloc_audit.pipeline.background import Background

FIXTURES = Path(__file__).parent / "fixtures" / "python"

forks = pytest.mark.skipif(not background.can_fork(), reason="processes cannot be forked here")


@forks
def test_the_value_is_computed_in_a_child() -> None:
    assert Background(os.getpid, concurrent=True).result() != os.getpid()
    assert Background(lambda: ("a", 1), concurrent=True).result() == ("a", 1)


def _wait_for(flag: Path, tries: int = 400) -> str:
    for _ in range(tries):
        if flag.exists():
            return "saw the flag"
        time.sleep(0.025)
    return "no flag"


@forks
def test_the_parent_goes_on_while_the_child_computes(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    work = Background(lambda: _wait_for(flag), concurrent=True)
    flag.touch()  # only after the constructor returned: it did not wait for the child
    assert work.result() == "saw the flag"


def test_one_job_computes_at_once_in_this_process(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    # computed in the constructor, before the flag exists: a short look is as
    # sure as a long one (the flag cannot appear until the constructor returns)
    work = Background(lambda: (_wait_for(flag, tries=20), os.getpid()), concurrent=False)
    flag.touch()
    assert work.result() == ("no flag", os.getpid())


def _fail() -> None:
    raise ValueError("a bug in a rule")


@forks
def test_an_error_in_the_child_is_raised_by_the_parent() -> None:
    work = Background(_fail, concurrent=True)
    with pytest.raises(ValueError, match="a bug in a rule"):
        work.result()


@forks
def test_a_child_that_dies_or_cannot_send_leaves_the_work_to_the_parent() -> None:
    parent = os.getpid()

    def dies() -> str:
        if os.getpid() != parent:
            os._exit(9)
        return "computed by the parent"

    assert Background(dies, concurrent=True).result() == "computed by the parent"
    made = Background(lambda: lambda: "not picklable", concurrent=True).result()
    assert made() == "not picklable"


def test_without_fork_the_parent_computes_it_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "can_fork", lambda: False)
    calls: list[int] = []
    work = Background(lambda: calls.append(os.getpid()) or len(calls), concurrent=True)
    assert calls == []
    assert work.result() == 1 and work.result() == 1
    assert calls == [os.getpid()]


def _scan(root: Path, *args: str) -> dict:
    return scan_json(root, ".", "--no-cache", *args)


@forks
def test_findings_are_the_same_from_a_child_and_from_the_parent(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the rule fixtures as one project (the repository's configuration leaves
    # them out); the census and tier fixtures hold no findings, so they only
    # made this slower
    root = tmp_path / "project"
    shutil.copytree(FIXTURES, root, ignore=lambda _dir, names: [
        name for name in names if name.startswith(("sites-", "tiers-", "project-"))])
    (root / "alloc-audit.toml").write_text("# alloc-audit configuration\n")
    in_child = _scan(root, "--jobs", "1")
    assert _scan(root, "--jobs", "2") == in_child
    assert len(in_child["findings"]) > 50 and len({f["rule"] for f in in_child["findings"]}) >= 5
    monkeypatch.setattr(background, "can_fork", lambda: False)
    assert _scan(root, "--jobs", "2") == in_child
