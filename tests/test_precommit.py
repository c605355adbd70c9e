"""The real pre-commit framework installs this repository's hook into a
temporary project and uses it to block and to allow commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clihelp import Release, git, make_repo, pre_commit, run_cli, write

pytestmark = pytest.mark.slow

RUNNER = 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n        self.a = torch.zeros(n, device="cuda")\n'


def test_hook_blocks_a_new_allocation_and_allows_removing_one(tmp_path: Path, release: Release) -> None:
    url, rev = release.url, release.tag
    root = make_repo(tmp_path / "proj", {"eng/runner.py": RUNNER})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    write(root, ".pre-commit-config.yaml", f"repos:\n  - repo: {url}\n    rev: {rev}\n    hooks:\n      - id: alloc-audit\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "allowlist and hook config")
    env = release.env
    install = subprocess.run([*pre_commit(), "install"], cwd=root, capture_output=True, text=True,
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
