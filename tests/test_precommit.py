"""The real pre-commit framework installs this repository's hook into a
temporary project and uses it to block and to allow commits."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import git, make_repo, run_cli, write

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

RUNNER = 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n        self.a = torch.zeros(n, device="cuda")\n'


def _pre_commit() -> list[str]:
    exe = shutil.which("pre-commit")
    return [exe] if exe else [sys.executable, "-m", "pre_commit"]


def _head_of_this_repository(tmp_path: Path) -> tuple[str, str]:
    """A commit holding this repository's current tree (the hook is installed
    from a commit, so uncommitted work is snapshotted into a throwaway one)."""
    snapshot = tmp_path / "hook-repo"
    # what git would commit: no virtual environment or tool caches (copying
    # a .venv alone took most of this test's minute and a half)
    shutil.copytree(REPO, snapshot, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", ".alloc-audit-cache", "__pycache__", "*.egg-info", ".hypothesis", ".pytest_cache",
        ".mypy_cache", ".ruff_cache", "build", "dist"))
    git(snapshot, "init", "-q", "-b", "main")
    git(snapshot, "add", "-A")
    git(snapshot, "commit", "-qm", "snapshot")
    return f"file://{snapshot}", git(snapshot, "rev-parse", "HEAD").strip()


def test_hook_blocks_a_new_allocation_and_allows_removing_one(tmp_path: Path) -> None:
    url, rev = _head_of_this_repository(tmp_path)
    root = make_repo(tmp_path / "proj", {"eng/runner.py": RUNNER})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    write(root, ".pre-commit-config.yaml", f"repos:\n  - repo: {url}\n    rev: {rev}\n    hooks:\n      - id: alloc-audit\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "allowlist and hook config")
    env = {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    install = subprocess.run([*_pre_commit(), "install"], cwd=root, capture_output=True, text=True,
                             env={**__import__("os").environ, **env})
    assert install.returncode == 0, install.stderr

    def commit(message: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "commit", "-m", message], cwd=root, capture_output=True, text=True,
                              env={**__import__("os").environ, **env, "GIT_AUTHOR_NAME": "t",
                                   "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                                   "GIT_COMMITTER_EMAIL": "t@example.com"})

    write(root, "eng/runner.py", RUNNER + '        self.b = torch.zeros(n, device="cuda")\n')
    git(root, "add", "-A")
    blocked = commit("add a buffer")
    assert blocked.returncode != 0, blocked.stdout + blocked.stderr
    assert "allowlist entry grew" in blocked.stdout + blocked.stderr

    write(root, "eng/runner.py", 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n        self.a = None\n')
    assert run_cli("allowlist", "update", cwd=root).code == 0
    git(root, "add", "-A")
    allowed = commit("remove the buffer")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
