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
        pytest.param("exclude = ['a', 1]\n", 1, "'exclude' must be a list of strings; it holds an integer (1)",
                     id="a list with a number is not called a list"),
        pytest.param("jobs = 2\ndisable = ['alloc-in-captur']\n", 2,
                     "'disable' names an unknown rule 'alloc-in-captur'; did you mean 'alloc-in-capture'?",
                     id="disable typo"),
        pytest.param("enable = ['per-call-aloc']\n", 1, "did you mean 'per-call-alloc'?", id="enable typo"),
        pytest.param("[severity]\ngrow-on-demnd = 'error'\n", 2,
                     "'severity' names an unknown rule 'grow-on-demnd'; did you mean 'grow-on-demand'?",
                     id="severity typo"),
        pytest.param("jobs = 2\n\n[[apis]]\nname = ['my.alloc']\n", 4,
                     "unknown key 'name' in [[apis]] (entry 1); did you mean 'names'?", id="apis name typo"),
        pytest.param("[[apis]]\nnames = ['a']\n\n[[apis]]\nnames = ['b']\nknd = 'device'\n", 6,
                     "unknown key 'knd' in [[apis]] (entry 2); did you mean 'kind'?", id="second apis entry"),
        pytest.param("include = ['[']\n", 1, "the glob '[' has an unclosed '[' and can match nothing",
                     id="glob that cannot match"),
        pytest.param("jobs = 1\nexclude = ['build\\\\gen']\n", 2, "uses '\\' as a path separator",
                     id="backslash glob"),
        pytest.param("[[tiers]]\ntier = 'T2'\npattern = 5\n", 3, "unknown key 'pattern' in [[tiers]] (entry 1); "
                     "did you mean 'path'?", id="tiers pattern typo"),
        pytest.param("[[tiers]]\ntier = 'T2'\nfunction = 5\n", 3,
                     "'function' must be a glob or a list of globs, got an integer (5)", id="tiers wrong type"),
        pytest.param("# ours\n[tool.alloc-audit]\njobs = 2\n", 2,
                     "alloc-audit.toml holds the settings at its top level: drop the [tool.alloc-audit] header",
                     id="pyproject header in alloc-audit.toml"),
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


def test_a_users_loader_names_its_placement_keyword(tmp_path: Path) -> None:
    path = tmp_path / "alloc-audit.toml"
    path.write_text('[[apis]]\nnames = ["my.read"]\nkind = "device"\ndevice = "loader"\ndevice-keyword = "place"\n')
    spec = load_catalog(load_config(tmp_path, path)).apis.py_names["my.read"]
    assert (spec.device, spec.device_keyword) == ("loader", "place")
    path.write_text('[[apis]]\nnames = ["my.read"]\ndevice = "loader"\ndevice-keyword = "map location"\n')
    with pytest.raises(UsageError, match="device-keyword must be a keyword argument's name"):
        load_catalog(load_config(tmp_path, path))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_jobs_must_be_positive(tmp_path: Path, value: str) -> None:
    from clihelp import run_cli

    (tmp_path / "alloc-audit.toml").write_text("")
    for command in (["scan"], ["report"], ["check"], ["allowlist", "init"]):
        result = run_cli(*command, "--jobs", value, cwd=tmp_path)
        assert result.code == 2 and f"{value} is not in the range x>=1" in result.err, (command, result.err)
