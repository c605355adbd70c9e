"""Every command's `--format` is honest: each choice a command's --help
offers gives output of that format (found by walking the CLI, so a new
choice or command is covered without editing this test), and `-o FILE`
takes the format from the extension and refuses a contradiction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from clihelp import REPO, git, make_repo, run_cli, write

from alloc_audit.cli import app


def commands_with_format() -> list[tuple[tuple[str, ...], str]]:
    out: list[tuple[tuple[str, ...], str]] = []

    # typer's click (vendored in some versions) is walked by its attributes
    def walk(command: Any, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
            return
        for param in command.params:
            if "--format" in getattr(param, "opts", ()) and hasattr(param.type, "choices"):
                out.extend((path, choice) for choice in param.type.choices)

    walk(typer.main.get_command(app), ())
    return out


def looks_like(fmt: str, text: str) -> None:
    if fmt in ("json", "sarif"):
        doc = json.loads(text)
        assert (doc.get("version") == "2.1.0") == (fmt == "sarif")
    elif fmt == "html":
        assert text.lstrip().lower().startswith("<!doctype html>")
    elif fmt == "markdown":
        assert text.startswith("#") and "┃" not in text
    elif fmt == "github":
        assert all(line.startswith("::") for line in text.splitlines() if line.strip()), text[:300]
    else:  # table / text: for people, so not JSON and not HTML
        assert not text.lstrip().startswith(("{", "<")), text[:300]


@pytest.fixture(scope="module")
def gated_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_repo(tmp_path_factory.mktemp("fmt") / "proj",
                     {"eng/step.py": 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n'})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "adopt")
    write(root, "eng/step.py", 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n\n\n'
                               'def g(n):\n    return torch.empty(n, device="cuda")\n')
    return root


CASES = commands_with_format()


def test_the_walk_found_the_commands() -> None:
    assert {c for c, _ in CASES} >= {("scan",), ("report",), ("check",), ("gate",)}


@pytest.mark.parametrize("command,fmt", CASES, ids=[f"{' '.join(c)} {f}" for c, f in CASES])
def test_every_format_choice_is_honest(gated_repo: Path, command: tuple[str, ...], fmt: str) -> None:
    extra = {("gate",): ["--base", "HEAD"],
             ("join",): [str(REPO / "tests" / "data" / "runtime" / "minigen-python.pickle.gz"), "."]}.get(command, [])
    result = run_cli(*command, *extra, "--format", fmt, cwd=gated_repo)
    assert result.code in (0, 1), result.err
    if fmt in ("json", "sarif", "html", "markdown", "github"):
        assert result.err == "" or fmt != "json", "machine formats keep stdout clean"
    looks_like(fmt, result.out)


@pytest.mark.parametrize("name,fmt", [
    pytest.param("report.html", "html", id="html"),
    pytest.param("report.md", "markdown", id="markdown"),
    pytest.param("report.sarif", "sarif", id="sarif"),
    pytest.param("alloc.sarif.json", "sarif", id="sarif.json"),
    pytest.param("report.json", "json", id="json"),
])
def test_the_output_extension_picks_the_format(tmp_path: Path, name: str, fmt: str) -> None:
    out = tmp_path / name
    result = run_cli("report", "examples", "-o", str(out), cwd=REPO)
    assert result.code == 0, result.err
    looks_like(fmt, out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("args,message", [
    pytest.param(["--format", "json", "-o", "r.html"], "--format json does not match the file's extension, which "
                 "means html", id="mismatch"),
    pytest.param(["-o", "r.out"], "cannot tell the format from the file name", id="unknown extension"),
])
def test_a_contradiction_is_refused_and_nothing_written(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli("report", "examples", *[str(tmp_path / a) if a.startswith("r.") else a for a in args], cwd=REPO)
    assert result.code == 2 and message in result.err
    assert list(tmp_path.iterdir()) == []


def test_gate_json_is_json_even_when_it_fails(gated_repo: Path) -> None:
    result = run_cli("gate", "--base", "HEAD", "--format", "json", cwd=gated_repo)
    doc = json.loads(result.out)
    assert result.code == 1 and doc["passed"] is False and doc["check_passed"] is False
    assert any(p["title"] == "new allocation site" for p in doc["problems"])
