"""What the pre-commit path loads (issue 15, `check` on staged files <= 0.25 s
warm): a `check` the stored result answers imports neither the report
renderers, nor the runtime join, nor the analysis stages and the parser; a
cold one does. Counted in modules, not timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from clihelp import make_repo, run_cli

FILES = {
    "eng/a.py": 'import torch\n\n\nclass A:\n    def __init__(self, n):\n        self.x = torch.empty(n, device="cuda")\n',
    "eng/b.py": "def pure(n):\n    return n + 1\n",
}

# never needed to check sites against an allowlist from a stored result
NOT_ON_THE_WARM_PATH = (
    "alloc_audit.report.html", "alloc_audit.report.sarif", "alloc_audit.report.markdown",
    "alloc_audit.report.terminal", "alloc_audit.report.json", "alloc_audit.report.join_html",
    "alloc_audit.runtime.join", "alloc_audit.runtime.snapshot",
    "alloc_audit.pipeline.index", "alloc_audit.pipeline.classify_callers", "alloc_audit.pipeline.lifetimes",
    "alloc_audit.pipeline.prefilter", "alloc_audit.pipeline.parse", "alloc_audit.rules", "tree_sitter",
    "importlib.metadata",
)


def modules_after(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    """Run the CLI in a fresh interpreter; its exit code and every module it imported."""
    code = ("import json, sys\n"
            f"sys.argv = ['alloc-audit', *{args!r}]\n"
            "from alloc_audit.__main__ import entry\n"
            "try:\n    entry()\nexcept SystemExit as exc:\n    rc = exc.code\nelse:\n    rc = 0\n"
            "sys.stderr.write('MODULES ' + json.dumps([rc, sorted(sys.modules)]) + '\\n')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"})
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    rc, modules = json.loads(line[len("MODULES "):])
    return rc, set(modules)


def test_a_warm_check_loads_no_renderer_and_no_stage(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", FILES)
    cache = str(tmp_path / "cache")
    assert run_cli("allowlist", "init", "--no-cache", cwd=root).code == 0
    cold_rc, cold = modules_after(["check", "eng/a.py", "eng/b.py", "--cache-dir", cache], root)
    warm_rc, warm = modules_after(["check", "eng/a.py", "eng/b.py", "--cache-dir", cache], root)
    assert cold_rc == warm_rc == 0
    # the cold run needs the stages (so the module names below are the real ones)
    assert {"alloc_audit.pipeline.index", "alloc_audit.pipeline.prefilter", "tree_sitter"} <= cold
    assert sorted(warm & set(NOT_ON_THE_WARM_PATH)) == []
    assert "alloc_audit.commands.check" in warm


def test_version_loads_no_runtime_and_no_stage(tmp_path: Path) -> None:
    rc, modules = modules_after(["--version"], tmp_path)
    assert rc == 0
    assert sorted(modules & set(NOT_ON_THE_WARM_PATH)) == []
    assert "alloc_audit.pipeline.run" not in modules


def test_grammar_versions_are_what_importlib_metadata_says() -> None:
    """The cache key's grammar versions, read from dist-info folder names, are the installed distributions'."""
    from alloc_audit.pipeline.cache import grammar_versions

    dists = ("tree-sitter", "tree-sitter-python", "tree-sitter-cpp", "tree-sitter-cuda")
    assert grammar_versions() == ";".join(f"{d}={version(d)}" for d in dists)
