"""Messages that point the right way, and the smaller manners of issue 12:
outside a git repository, a ref past the history, conflict markers in the
allowlist, a named symlink or FIFO, `rules explain` with a typo, `--jobs`
and `--no-cache` on every command that scans, `allowlist init PATHS` and
its hint about tests and benchmarks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer
from clihelp import git, make_repo, run_cli, write

from alloc_audit.cli import app
from alloc_audit.errors import UsageError
from alloc_audit.ratchet.allowlist import parse_allowlist

SITE = 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n'


def test_outside_a_git_repository_says_so(tmp_path: Path) -> None:
    write(tmp_path, "alloc-audit.toml", "")
    write(tmp_path, "a.py", SITE)
    assert run_cli("allowlist", "init", cwd=tmp_path).code == 0
    for args in (["gate", "--base", "main"], ["check", "--changed-since", "main"], ["report", "--base", "main"]):
        result = run_cli(*args, cwd=tmp_path)
        assert result.code == 2, args
        assert "is not inside a git repository" in result.err and "fetch" not in result.err, result.err


def test_a_ref_past_the_history_is_not_a_ref_to_fetch(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"a.py": SITE})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    result = run_cli("gate", "--base", "HEAD~999", cwd=root)
    assert result.code == 2
    assert "git ref 'HEAD~999' goes back further than the history here (HEAD has 1 commit)" in result.err
    assert "git fetch origin" not in result.err
    missing = run_cli("gate", "--base", "origin/main", cwd=root)
    assert missing.code == 2 and "fetch it first, e.g. `git fetch origin main`" in missing.err


@pytest.mark.parametrize("marker", ["<<<<<<< HEAD", "=======", ">>>>>>> feature", "||||||| base"])
def test_conflict_markers_are_an_unresolved_merge_conflict(marker: str) -> None:
    text = f"# alloc-audit allowlist v1\na.py f torch.empty T4\n{marker}\n"
    with pytest.raises(UsageError, match="unresolved merge conflict") as info:
        parse_allowlist(text, "allowlists/a.allowlist")
    assert info.value.line == 3


def test_a_conflicted_allowlist_through_the_cli(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"a.py": SITE})
    write(root, "allowlists/alloc-audit.allowlist", "# alloc-audit allowlist v1\n<<<<<<< HEAD\n"
                                                    "a.py f torch.empty T4\n=======\na.py f torch.empty x2 T4\n"
                                                    ">>>>>>> other\n")
    result = run_cli("check", cwd=root)
    assert result.code == 2
    assert "allowlists/alloc-audit.allowlist:2: unresolved merge conflict (<<<<<<< marker)" in result.err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_named_symlink_or_fifo_is_reported(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"real.py": SITE})
    (root / "link.py").symlink_to("real.py")
    os.mkfifo(root / "pipe.py")
    result = run_cli("scan", "link.py", "pipe.py", "real.py", "--format", "json", cwd=root)
    assert result.code == 0, result.err
    import json

    errors = {e["path"]: e["message"] for e in json.loads(result.out)["errors"]}
    assert errors["link.py"].startswith("a symbolic link; links are not followed")
    assert errors["pipe.py"] == "not a regular file (a FIFO); not scanned"
    walked = run_cli("scan", ".", "--format", "json", cwd=root)
    assert json.loads(walked.out)["errors"] == [], "found by walking, links and FIFOs are skipped quietly"


def test_rules_explain_did_you_mean(tmp_path: Path) -> None:
    result = run_cli("rules", "explain", "alloc-in-captur", cwd=tmp_path)
    assert result.code == 2 and "did you mean 'alloc-in-capture'?" in result.err


def _options(command: Any) -> set[str]:
    return {opt for p in command.params for opt in getattr(p, "opts", ())}


SCANNING = [("scan",), ("report",), ("check",), ("gate",), ("allowlist", "init"), ("allowlist", "update"),
            ("allowlist", "explain"), ("annotate",), ("audit",)]


@pytest.mark.parametrize("path", SCANNING, ids=[" ".join(p) for p in SCANNING])
def test_every_scanning_command_takes_jobs_and_no_cache(path: tuple[str, ...]) -> None:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    assert {"--jobs", "--no-cache", "--cache-dir"} <= _options(command)


def test_allowlist_init_paths_and_the_tests_hint(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE, "tests/test_a.py": SITE, "tests/test_b.py": SITE,
                                      "benchmarks/bench_a.py": SITE})
    whole = run_cli("allowlist", "init", cwd=root)
    assert whole.code == 0
    assert "hint: 75% of these sites are in tests or benchmarks" in whole.out
    assert 'exclude = ["**/benchmarks/**", "**/tests/**"]' in whole.out
    only_src = run_cli("allowlist", "init", "--force", "src", cwd=root)
    assert only_src.code == 0 and "hint" not in only_src.out
    text = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    assert "src/a.py f torch.empty" in text and "tests/" not in text
    git(root, "add", "-A")
    git(root, "commit", "-qm", "adopt")
    # the rest of the tree is not judged by a check of src/, and not called new there
    assert run_cli("check", "src", cwd=root).code == 0
