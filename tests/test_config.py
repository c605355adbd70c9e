"""Configuration: discovery and validation, errors naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from alloc_audit.catalog import load_catalog
from alloc_audit.config import find_project, load_config
from alloc_audit.errors import UsageError


def test_alloc_audit_toml_wins_over_git(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    sub = tmp_path / "pkg" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "pkg" / "alloc-audit.toml").write_text("exclude = ['tests/']\n")
    root, found = find_project(sub)
    assert root == (tmp_path / "pkg").resolve() and found is not None and found.name == "alloc-audit.toml"


def test_pyproject_needs_the_tool_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / ".git").mkdir()
    root, found = find_project(tmp_path)
    assert found is None and root == tmp_path.resolve()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.alloc-audit]\njobs = 2\n")
    config = load_config(*find_project(tmp_path))
    assert config.jobs == 2


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param("exclud = ['x']\n", 1, "unknown key 'exclud' in alloc-audit.toml; did you mean 'exclude'?",
                     id="typo"),
        pytest.param("jobs = 2\nexclude = 'tests'\n", 2, "'exclude' must be a list of strings, got a string",
                     id="wrong type"),
        pytest.param("max-file-size = -1\n", 1, "must be an integer >= 1", id="negative size"),
        pytest.param("[class-tiers]\nKVPool = 'T8'\n", None, "unknown tier 'T8'", id="bad class tier"),
        pytest.param("[severity]\nalloc-in-capture = 'fatal'\n", None, "use \"error\" or \"warning\"",
                     id="bad severity"),
        pytest.param("jobs = 2\nexclude = = 1\n", 2, "invalid TOML", id="broken toml"),
    ],
)
def test_invalid_configuration(tmp_path: Path, text: str, line: int | None, message: str) -> None:
    path = tmp_path / "alloc-audit.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_config(tmp_path, path)
    assert message in err.value.message
    assert err.value.path == "alloc-audit.toml"
    if line is not None:
        assert err.value.line == line


def test_pack_knobs_extend_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "alloc-audit.toml"
    path.write_text('capture-contexts = ["*.my_capture"]\ncapture-depth = 5\nallocators = ["vram_alloc"]\n')
    catalog = load_catalog(load_config(tmp_path, path))
    assert "*.my_capture" in catalog.pack.capture_contexts and "torch.cuda.graph" in catalog.pack.capture_contexts
    assert catalog.pack.capture_depth == 5
    assert "vram_alloc" in catalog.apis.cpp_names and "vram_alloc" in catalog.apis.py_leaf


def test_bad_api_entry_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "alloc-audit.toml"
    path.write_text('[[apis]]\nnames = ["my.alloc"]\nkind = "gpu"\n')
    with pytest.raises(UsageError, match="unknown kind 'gpu'"):
        load_catalog(load_config(tmp_path, path))
