"""`check --staged` (the pre-commit hook's entry) sees what the staged change
takes away: a `git rm` of a file with allowlisted sites, or a rename, is
judged at commit time, not by the next full check. Real git repositories,
the installed CLI, and the real pre-commit framework for the hook."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from clihelp import Release, git, make_repo, run_cli

from alloc_audit.gitio import staged_removals

RUNNER = 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n        self.a = torch.zeros(n, device="cuda")\n'
OTHER = 'import torch\n\n\ndef k(n):\n    return torch.empty(n, device="cuda")\n'


def adopted(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "proj", {"eng/runner.py": RUNNER, "eng/other.py": OTHER})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "adopt")
    return root


def test_staged_removals_lists_deletions_and_renames(tmp_path: Path) -> None:
    root = adopted(tmp_path)
    git(root, "rm", "-q", "eng/runner.py")
    git(root, "mv", "eng/other.py", "eng/kernels.py")
    deleted, renamed = staged_removals(root)
    assert deleted == {"eng/runner.py"}
    assert renamed == (("eng/other.py", "eng/kernels.py"),)


def test_git_rm_of_an_allowlisted_file_fails_the_staged_check(tmp_path: Path) -> None:
    root = adopted(tmp_path)
    git(root, "rm", "-q", "eng/runner.py")
    # what pre-commit runs for a commit that only deletes: no file names
    result = run_cli("check", "--staged", cwd=root)
    assert result.code == 1, result.out + result.err
    assert "stale allowlist entry: eng/runner.py Runner.__init__ torch.zeros matches nothing" in result.out
    assert "eng/other.py" not in result.out, "only the deleted file's entries are judged"
    assert run_cli("allowlist", "update", cwd=root).code == 0
    git(root, "add", "-A")
    assert run_cli("check", "--staged", cwd=root).code == 0


def test_a_staged_rename_says_update_moves_the_entries(tmp_path: Path) -> None:
    root = adopted(tmp_path)
    git(root, "mv", "eng/other.py", "eng/kernels.py")
    result = run_cli("check", "--staged", "eng/kernels.py", cwd=root)
    assert result.code == 1
    assert "stale allowlist entry: eng/other.py k torch.empty" in result.out
    assert "eng/kernels.py:1: notice: renamed file: eng/other.py -> eng/kernels.py" in result.out
    update = run_cli("allowlist", "update", cwd=root)
    assert "> renamed  eng/other.py -> eng/kernels.py" in update.out
    git(root, "add", "-A")
    assert run_cli("check", "--staged", "eng/kernels.py", cwd=root).code == 0


def test_nothing_staged_is_quick_and_clean(tmp_path: Path) -> None:
    root = adopted(tmp_path)
    result = run_cli("check", "--staged", cwd=root)
    assert (result.code, result.out.strip()) == (0, "alloc-audit check: nothing staged to check")
    import json

    as_json = run_cli("check", "--staged", "--format", "json", cwd=root)
    assert json.loads(as_json.out)["check"]["passed"] is True
    assert run_cli("check", "--staged", "--format", "github", cwd=root).out == ""


@pytest.mark.slow
def test_the_real_hook_blocks_a_commit_that_only_deletes(tmp_path: Path, release: Release) -> None:
    url, tag = release.url, release.tag
    root = adopted(tmp_path)
    (root / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {url}\n    rev: {tag}\n    hooks:\n      - id: alloc-audit\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "hook config")
    env = {**os.environ, **release.env, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    from clihelp import pre_commit

    assert subprocess.run([*pre_commit(), "install"], cwd=root, env=env, capture_output=True).returncode == 0
    git(root, "rm", "-q", "eng/runner.py")
    blocked = subprocess.run(["git", "commit", "-m", "drop the runner"], cwd=root, env=env, capture_output=True,
                             text=True)
    assert blocked.returncode != 0, blocked.stdout + blocked.stderr
    assert "stale allowlist entry: eng/runner.py" in blocked.stdout + blocked.stderr
    assert run_cli("allowlist", "update", cwd=root).code == 0
    git(root, "add", "-A")
    allowed = subprocess.run(["git", "commit", "-m", "drop the runner"], cwd=root, env=env, capture_output=True,
                             text=True)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
