"""The release: one source of the version, a changelog entry for it, and the
README's pre-commit snippet, GitHub Action and install line pinning that
very release; the snippet works as written with the real pre-commit
framework against a tag of a local clone (the tag need not exist here)."""

from __future__ import annotations

import os
import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from clihelp import REPO, Release, make_repo, pre_commit, run_cli, write

from alloc_audit import __version__

README = (REPO / "README.md").read_text()
TAG = f"v{__version__}"


def readme_block(heading: str, lang: str) -> str:
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"no ```{lang} block under '## {heading}'"
    return m.group(1)


def test_the_version_has_one_source() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert '[tool.hatch.version]\npath = "alloc_audit/__init__.py"' in pyproject
    assert version("alloc-audit") == __version__, "the installed metadata says another version: reinstall"
    assert run_cli("--version", cwd=REPO).out.strip() == f"alloc-audit {__version__}"


def test_the_changelog_has_the_release() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"\n## [{__version__}]\n" in changelog
    assert f"\n[{__version__}]: " in changelog, "a link for the release heading"
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{__version__}]")


def test_the_readme_pins_this_release() -> None:
    config = yaml.safe_load(readme_block("pre-commit", "yaml"))
    hook_repo = config["repos"][0]
    assert hook_repo["rev"] == TAG
    offered = {h["id"] for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert {h["id"] for h in hook_repo["hooks"]} <= offered
    workflow = yaml.safe_load(readme_block("GitHub Actions", "yaml"))
    uses = [s["uses"] for s in workflow["jobs"]["alloc-audit"]["steps"] if "uses" in s]
    assert uses[-1] == f"alloc-audit/alloc-audit@{TAG}"
    pins = set(re.findall(r"alloc-audit(?:\.git)?@(v[\d.]+)", README))
    assert pins == {TAG}, f"every pin in the README names this release: {pins}"
    assert f"rev: {TAG}" in README and "<you>" not in README and "<org>" not in README


def test_the_hook_definitions_agree_with_the_readme() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert hooks["alloc-audit"]["entry"] == "alloc-audit check --staged"
    assert hooks["alloc-audit"]["always_run"] is True, "a commit that only deletes must run the hook"
    assert hooks["alloc-audit-gate"]["stages"] == ["manual"]
    assert "alloc-audit-gate --hook-stage manual" in README


@pytest.mark.slow
def test_the_readme_snippet_works_against_a_tag(tmp_path: Path, release: Release) -> None:
    url, tag = release.url, release.tag
    snippet = readme_block("pre-commit", "yaml")
    root = make_repo(tmp_path / "proj", {"eng/runner.py": 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n'
                                         '        self.a = torch.zeros(n, device="cuda")\n'})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    write(root, ".pre-commit-config.yaml", snippet.replace("https://github.com/alloc-audit/alloc-audit", url))
    env = {**os.environ, **release.env}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*pre_commit(), *args], cwd=root, env=env, capture_output=True, text=True)

    assert run("install").returncode == 0
    clean = run("run", "--all-files")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    write(root, "eng/runner.py", 'import torch\n\n\nclass Runner:\n    def __init__(self, n):\n'
                                 '        self.a = torch.zeros(n, device="cuda")\n'
                                 '        self.b = torch.zeros(n, device="cuda")\n')
    grown = run("run", "--all-files")
    assert grown.returncode == 1 and "allowlist entry grew" in grown.stdout
    assert tag == TAG
