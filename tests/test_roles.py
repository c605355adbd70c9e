"""Code roles (DESIGN.md "Code roles", issue 16 shape 2): the role each path
gets, what the roles fixture reports (production first, test and benchmark
findings as info, a production finding reached only from a test saying so),
and that only production findings fail a scan's --fail-on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clihelp import run_cli
from fixtures_harness import FIXTURES, run_fixture

from alloc_audit.pipeline.roles import conventional_role, role_finder

ROLES_FIXTURE = FIXTURES / "python" / "alloc-in-capture-roles"


@pytest.mark.parametrize(
    ("path", "role"),
    [
        pytest.param("pkg/layers.py", "production", id="package module"),
        pytest.param("tests/test_layers.py", "test", id="tests dir"),
        pytest.param("pkg/ops/test_rope.py", "test", id="test_ file"),
        pytest.param("csrc/gemm_test.cc", "test", id="native _test file"),
        pytest.param("benchmarks/bench_layers.py", "benchmark", id="benchmarks dir"),
        pytest.param("pkg/bench_decode.py", "benchmark", id="bench_ file"),
        pytest.param("examples/serve.py", "example", id="examples dir"),
        pytest.param("docs/features/memory_usage_1_pytorch.py", "example", id="docs snippet is an example"),
        pytest.param("pkg/doc/quickstart.py", "example", id="doc dir is an example"),
        pytest.param("tools/convert.py", "tooling", id="tools dir"),
        pytest.param("scripts/launch.py", "tooling", id="scripts dir"),
        pytest.param("pkg/testing_utils.py", "production", id="test-like name, not a convention"),
        pytest.param("pkg/latest.py", "production", id="'test' inside a word"),
    ],
)
def test_conventional_role(path: str, role: str) -> None:
    assert conventional_role(path) == role


def test_configured_role_wins_over_convention() -> None:
    role_of = role_finder((("production", ("tests/fixtures_lib/*",)), ("test", ("qa/*",))))
    assert role_of("tests/fixtures_lib/mod.py") == "production"
    assert role_of("qa/check.py") == "test"
    assert role_of("tests/test_x.py") == "test"


def test_roles_fixture_severities_and_witness_start() -> None:
    _expected, result = run_fixture(ROLES_FIXTURE)
    by_line = {(f.path, f.line): f for f in result.findings}
    reached_from_test = by_line[("pkg/layers.py", 16)]
    assert reached_from_test.role == "production"
    assert reached_from_test.severity.value == "info"
    assert "reached only from test code: tests/test_layers.py:" in reached_from_test.message
    production = by_line[("pkg/layers.py", 24)]
    assert (production.role, production.severity.value) == ("production", "warning")
    in_test = by_line[("tests/test_layers.py", 15)]
    assert (in_test.role, in_test.severity.value) == ("test", "info")
    roles = {s.role for s in result.sites}
    assert roles == {"production", "test", "benchmark"}


def test_only_production_findings_fail_a_scan(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    shutil.copytree(ROLES_FIXTURE, tree)
    (tree / "alloc-audit.toml").write_text("")
    assert run_cli("scan", ".", "--no-cache", "--fail-on", "warning", cwd=tree).code == 1
    (tree / "pkg" / "runner.py").unlink()  # the production capture goes: test-only findings remain
    assert run_cli("scan", ".", "--no-cache", "--fail-on", "warning", cwd=tree).code == 0
    (tree / "alloc-audit.toml").write_text('fail-roles = ["production", "test"]\n')
    assert run_cli("scan", ".", "--no-cache", "--fail-on", "warning", cwd=tree).code == 0  # info never fails


def test_role_filter_keeps_one_role(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    shutil.copytree(ROLES_FIXTURE, tree)
    (tree / "alloc-audit.toml").write_text("")
    result = run_cli("scan", ".", "--no-cache", "--format", "json", "--role", "test", cwd=tree)
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert {f["role"] for f in doc["findings"]} == {"test"}
    assert {s["role"] for s in doc["sites"]} == {"test"}
    bad = run_cli("scan", ".", "--no-cache", "--role", "nightly", cwd=tree)
    assert bad.code == 2


def test_reports_lead_with_production(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    shutil.copytree(ROLES_FIXTURE, tree)
    (tree / "alloc-audit.toml").write_text("")
    result = run_cli("report", ".", "--no-cache", "--format", "markdown", "--by", "dir", cwd=tree)
    assert result.code == 0, result.err
    text = result.out
    # tests/ holds the most sites (5 to 3), but production directories come first
    assert text.index("`pkg`") < text.index("`tests`") < text.index("`benchmarks`")
    html = run_cli("report", ".", "--no-cache", "--format", "html", cwd=tree).out
    assert '<span class="role">test</span>' in html
