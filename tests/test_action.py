"""The GitHub Action (action.yml) run locally: its `run:` steps are taken from
the file, their `${{ }}` expressions filled in as the runner would, and run
with bash in a real git repository, with GITHUB_OUTPUT and
GITHUB_STEP_SUMMARY files. No network: the install step's `pip install` of
the action's checkout is answered by a stand-in `python` that records what it
was asked to install (alloc-audit itself is the one under test)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from clihelp import REPO, git, make_repo, run_cli, write

from alloc_audit import __version__

ACTION = yaml.safe_load((REPO / "action.yml").read_text())
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

CAPTURE = '''
import torch


def capture(g, n):
    with torch.cuda.graph(g):
        out = torch.empty(n, device="cuda")
    return out
'''


def read_outputs(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, value = line.partition("=")
        out[name] = value
    return out


class Runner:
    """Just enough of the Actions runner for a composite action of bash steps."""

    def __init__(self, tmp_path: Path, workspace: Path, inputs: dict[str, str]) -> None:
        self.tmp = tmp_path
        self.workspace = workspace
        self.inputs = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
        self.inputs.update(inputs)
        self.outputs: dict[str, dict[str, str]] = {}
        self.summary = tmp_path / "summary.md"
        self.installed = tmp_path / "pip-install.log"
        shims = tmp_path / "shims"
        shims.mkdir()
        real = sys.executable
        (shims / "python").write_text(
            f'#!/bin/sh\nif [ "$1 $2 $3" = "-m pip install" ]; then echo "$@" >> "{self.installed}"; exit 0; fi\n'
            f'exec "{real}" "$@"\n')
        (shims / "alloc-audit").write_text(f'#!/bin/sh\nexec "{real}" -m alloc_audit "$@"\n')
        for shim in shims.iterdir():
            shim.chmod(0o755)
        self.path = f"{shims}{os.pathsep}{os.environ['PATH']}"

    def value(self, expression: str) -> str:
        if m := re.fullmatch(r"inputs\.([\w-]+)", expression):
            return self.inputs[m.group(1)]
        if m := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expression):
            return self.outputs.get(m.group(1), {}).get(m.group(2), "")
        if expression == "github.action_path":
            return str(REPO)
        if expression == "runner.os":
            return "Linux"
        if expression == "github.sha":
            return "0" * 40
        raise AssertionError(f"the local runner does not know the expression {expression!r}: teach it")

    def fill(self, text: str) -> str:
        return EXPR.sub(lambda m: self.value(m.group(1)), str(text))

    def condition(self, text: str | None) -> bool:
        if text is None:
            return True
        m = re.fullmatch(r"inputs\.([\w-]+) (==|!=) '([^']*)'", text.strip())
        assert m, f"the local runner does not know the condition {text!r}"
        equal = self.inputs[m.group(1)] == m.group(3)
        return equal if m.group(2) == "==" else not equal

    def run(self, base_ref: str = "") -> tuple[list[str], int]:
        """Run every step; returns the names of the steps run and the last exit code."""
        ran = []
        code = 0
        for number, step in enumerate(ACTION["runs"]["steps"]):
            if not self.condition(step.get("if")):
                continue
            if "uses" in step:
                ran.append(f"uses {step['uses']}")
                continue
            assert step["shell"] == "bash"
            output = self.tmp / f"output-{number}"
            env = {**os.environ, "PATH": self.path, "GITHUB_OUTPUT": str(output),
                   "GITHUB_STEP_SUMMARY": str(self.summary), "GITHUB_BASE_REF": base_ref, "NO_COLOR": "1"}
            env.update({k: self.fill(v) for k, v in (step.get("env") or {}).items()})
            cwd = self.workspace / self.fill(step.get("working-directory", "."))
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=cwd,
                                  env=env, capture_output=True, text=True)
            ran.append(step["name"])
            if "id" in step:
                self.outputs[step["id"]] = read_outputs(output)
            code = proc.returncode
            if code != 0:
                break
        return ran, code


def test_the_action_declares_what_it_promises() -> None:
    steps = {s.get("name"): s for s in ACTION["runs"]["steps"]}
    assert ACTION["runs"]["using"] == "composite"
    cache = next(s for s in steps.values() if s.get("uses", "").startswith("actions/cache@"))
    assert "steps.install.outputs.version" in cache["with"]["key"] and "runner.os" in cache["with"]["key"]
    assert cache["with"]["path"].endswith(".alloc-audit-cache")
    upload = next(s for s in steps.values() if s.get("uses", "").startswith("github/codeql-action/upload-sarif@"))
    assert upload["with"]["sarif_file"] == "${{ steps.sarif.outputs.file }}"
    assert "github.action_path" in json.dumps(steps["Install alloc-audit (the version this action is pinned to)"])


def adopted_repository(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "proj", {"eng/step.py": CAPTURE})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "adopt alloc-audit")
    git(root, "remote", "add", "origin", str(root))  # the pull request's base is origin/main, as on GitHub
    git(root, "fetch", "-q", "origin")
    git(root, "checkout", "-q", "-b", "feature")
    return root


@pytest.mark.parametrize("grow", [pytest.param(False, id="clean change"), pytest.param(True, id="allowlist grew")])
def test_the_action_runs_locally(tmp_path: Path, grow: bool) -> None:
    root = adopted_repository(tmp_path)
    if grow:
        write(root, "eng/more.py", 'import torch\n\n\ndef more(n):\n    return torch.zeros(n, device="cuda")\n')
        assert run_cli("allowlist", "update", "--add-new", "--reason", "reviewed", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "change", "--allow-empty")
    runner = Runner(tmp_path, root, {"python-version": ""})
    ran, code = runner.run(base_ref="main")
    assert runner.installed.read_text().split() == ["-m", "pip", "install", "--disable-pip-version-check", "-q",
                                                     str(REPO)]
    assert runner.outputs["install"]["version"] == __version__
    assert runner.outputs["gate"] == {"base": "origin/main", "status": "1" if grow else "0"}
    summary = runner.summary.read_text()
    assert summary.startswith("## alloc-audit"), summary[:200]
    assert "origin/main" in summary, "the summary shows the delta against the base"
    sarif = json.loads(Path(runner.outputs["sarif"]["file"]).read_text())
    assert sarif["version"] == "2.1.0"
    assert "uses github/codeql-action/upload-sarif@v3" in ran
    assert ran[-1] == "Fail when the gate failed"
    assert code == (1 if grow else 0)
