"""Running the CLI, and building small projects in real git repositories.

``run_cli`` runs the command line in this process (typer's test runner, in
``cwd``, with the environment given): the same code from argv to exit code,
without a Python start-up per call. ``run_cli_subprocess`` runs the installed
entry point, for the few tests whose subject is the real surface (the console
script, ``python -m``, pre-commit, git hooks, terminals)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import Distribution
from pathlib import Path
from typing import Any


def cli_command() -> list[str]:
    exe = shutil.which("alloc-audit")
    return [exe] if exe else [sys.executable, "-m", "alloc_audit"]


@dataclass
class Run:
    code: int
    out: str
    err: str


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """The CLI in this process; ALLOC_AUDIT_TEST_SUBPROCESS=1 runs every call
    through the installed entry point instead."""
    if os.environ.get("ALLOC_AUDIT_TEST_SUBPROCESS"):
        return run_cli_subprocess(*args, cwd=cwd, env=env)
    from typer.testing import CliRunner

    from alloc_audit.cli import app

    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        runner = CliRunner()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with _built_once():
            result = runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "120", **(env or {})},
                                   prog_name="alloc-audit")
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug: show its traceback, as the subprocess would
    return Run(result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def _built_once() -> Iterator[None]:
    """typer's test runner builds the click command from the app's
    signatures on every call (~18 ms, ~370 calls a suite run); the entry
    point builds it once per process, and so does this: the same command
    object, reused. Where typer's runner has no ``_get_command`` to reuse
    through, it builds per call as before."""
    import typer.testing

    if not hasattr(typer.testing, "_get_command"):
        yield
        return
    built = _command()
    original = typer.testing._get_command
    typer.testing._get_command = lambda _app: built
    try:
        yield
    finally:
        typer.testing._get_command = original


@functools.cache
def _command() -> Any:
    import typer.main

    from alloc_audit.cli import app

    return typer.main.get_command(app)


def scan_json(root: Path, *args: str) -> dict:
    """``scan --format json ARGS`` in ``root``, which must succeed; the
    document without its timings, to compare runs."""
    result = run_cli("scan", "--format", "json", *args, cwd=root)
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    doc["stats"].pop("seconds")
    return doc  # type: ignore[no-any-return]


def run_cli_subprocess(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """The installed entry point, in a subprocess."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **(env or {})}
    proc = subprocess.run([*cli_command(), *args], cwd=cwd, capture_output=True, text=True, env=full_env)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"})
    assert proc.returncode == 0, f"git {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def make_repo(root: Path, files: dict[str, str], config: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    write(root, "alloc-audit.toml", config or "# alloc-audit configuration\n")
    for rel, text in files.items():
        write(root, rel, text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    return root


REPO = Path(__file__).resolve().parent.parent


def pre_commit() -> list[str]:
    exe = shutil.which("pre-commit")
    return [exe] if exe else [sys.executable, "-m", "pre_commit"]


def tagged_snapshot(tmp_path: Path) -> tuple[str, str]:
    """A local clone of this repository holding its current tree (uncommitted
    work included), tagged ``v<version>`` there as a release would be: the
    hook is installed by tag, exactly as the README pins it, and the tests
    do not depend on the tag existing in this repository."""
    from alloc_audit import __version__

    snapshot = tmp_path / "alloc-audit-release"
    if not snapshot.exists():  # made aside and renamed: a clone that failed halfway is never reused
        partial = tmp_path / "alloc-audit-release.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(REPO, partial, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".alloc-audit-cache", "__pycache__", "*.egg-info", ".hypothesis", ".pytest_cache",
            ".mypy_cache", ".ruff_cache", "dist", "build"))
        git(partial, "init", "-q", "-b", "main")
        # objects stored and packed without zlib or a delta search: pre-commit
        # still clones the tag over file:// with real git, but the clone's
        # pack-objects (~1 s of CPU for this tree) and `git add` skip work
        # that only saves bytes on a local disk
        for key, value in (("core.compression", "0"), ("pack.window", "0")):
            git(partial, "config", key, value)
        git(partial, "add", "-A")
        git(partial, "commit", "-qm", f"release {__version__}")
        git(partial, "tag", f"v{__version__}")
        partial.rename(snapshot)
    return f"file://{snapshot}", f"v{__version__}"


@dataclass
class Release:
    """A tagged local clone (``url`` at ``tag``), the PRE_COMMIT_HOME its hook
    environment lives in, and what pip builds that environment with."""

    url: str
    tag: str
    pre_commit_home: Path
    pip: dict[str, str]  # shared_dependencies(): the hook environment's dependencies, and pip's settings

    @property
    def env(self) -> dict[str, str]:
        """What a test adds to the environment of the pre-commit (or git) it runs."""
        return {"PRE_COMMIT_HOME": str(self.pre_commit_home), **self.pip}


def _requirement_closure(roots: tuple[str, ...]) -> list[Distribution]:
    """The installed distributions ``roots`` need to run (their requirements,
    recursively, markers evaluated for this Python; extras left out)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, Distribution] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # the hook then fails on the import, and the test with it
        seen[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def shared_dependencies(into: Path) -> dict[str, str]:
    """The hook environment's dependencies shared from this Python, not
    installed again: ``into`` becomes a folder of links to the installed
    distributions that alloc-audit's declared requirements and its build
    backend (hatchling, in the test extras) need, recursively (their
    packages, modules and metadata; not alloc-audit itself, not pip), and
    the environment returned puts it on the hook environment's PYTHONPATH
    and has pip install with ``--no-deps --no-build-isolation``, from no
    index. pre-commit still clones the tag, makes the virtualenv and runs
    ``pip install .`` in it: the package is built from the clone by its real
    backend into a wheel, and the hook runs that wheel's entry point; what is
    shared is only the dependencies, and only the declared ones (a
    requirement missing from pyproject.toml still fails the hook on its
    import). Installing them from a wheelhouse cost ~6 s of CPU a run
    (unpacking libcst, pygments, rich... and a build environment with
    hatchling), from the index ~19 s."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("hatchling")
    except PackageNotFoundError:  # an environment from before the test extras named it: pip's defaults
        return {}
    partial = into.with_name(into.name + ".partial")
    if not into.exists():  # made aside and renamed, as the clone
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for dist in _requirement_closure(("alloc-audit", "hatchling")):
            if dist.metadata["Name"] == "alloc-audit":  # built from the clone, not taken from here
                continue
            tops = {file.parts[0] for file in dist.files or () if file.parts[0] not in ("..", "__pycache__")}
            for top in sorted(tops):
                if top.endswith(".pth"):
                    continue  # read only in site folders; what it adds is no dependency's code
                link = partial / top
                if not link.exists():
                    link.symlink_to(Path(str(dist.locate_file(top))))
        partial.rename(into)
    path = os.pathsep.join(p for p in (str(into), os.environ.get("PYTHONPATH", "")) if p)
    # PIP_NO_BUILD_ISOLATION=0 is pip's spelling of --no-build-isolation;
    # PIP_COMPILE=0: pip does not byte-compile what it installs, the hook's
    # Python compiles the modules it imports on its first run
    return {"PYTHONPATH": path, "PIP_NO_DEPS": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_NO_INDEX": "1",
            "PIP_COMPILE": "0"}
