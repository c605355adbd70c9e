"""The installed command line, in a subprocess: scan output and schema,
exit codes, help, version, configuration errors, piping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from clihelp import make_repo, run_cli, write

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((Path(__file__).parent / "data" / "alloc-audit-1.schema.json").read_text())


def scan_json(*args: str, cwd: Path = REPO) -> dict:
    result = run_cli("scan", *args, "--format", "json", "--no-cache", cwd=cwd)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_demo_json_is_schema_valid_with_every_kind_and_tier() -> None:
    doc = scan_json("examples")
    jsonschema.validate(doc, SCHEMA)
    kinds = {s["kind"] for s in doc["sites"]}
    tiers = {s["tier"] for s in doc["sites"]}
    assert kinds == {"device", "pinned-host", "managed", "ipc", "virtual", "graph-pool", "workspace", "release"}
    assert tiers == {"T1", "T2", "T3", "T4", "T5a", "T5b", "unknown"}
    assert doc["root"] == "."
    assert all(not s["path"].startswith("/") for s in doc["sites"])
    derived = [s for s in doc["sites"] if s["via"]]
    assert any(s["api"] == "self._make_buffer" and s["scope"] == "GPUModelRunner.__init__" for s in derived)


def test_json_is_byte_identical_across_runs_except_seconds() -> None:
    def normalised() -> str:
        doc = scan_json("examples")
        doc["stats"]["seconds"] = 0
        return json.dumps(doc)

    assert normalised() == normalised()


def test_version_and_module_entry_point() -> None:
    assert run_cli("--version", cwd=REPO).out.startswith("alloc-audit ")
    proc = subprocess.run([sys.executable, "-m", "alloc_audit", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("alloc-audit ")


@pytest.mark.parametrize("command", [["scan"], ["check"], ["gate"], ["report"], ["rules", "list"], ["rules", "explain"],
                                     ["allowlist", "init"], ["allowlist", "update"], ["allowlist", "explain"],
                                     ["annotate"], ["audit"]])
def test_every_command_explains_itself_with_an_example(command: list[str]) -> None:
    result = run_cli(*command, "--help", cwd=REPO)
    assert result.code == 0, result.err
    assert "Example" in result.out


def test_rules_list_and_explain() -> None:
    listing = run_cli("rules", "list", cwd=REPO).out
    for name in ("alloc-in-capture", "per-call-alloc", "unused-suppression"):
        assert name in listing
    assert "per-call-alloc" in listing and " off " in listing.split("per-call-alloc")[1].splitlines()[0]
    doc = run_cli("rules", "explain", "snapshot-before-construction", cwd=REPO)
    assert doc.code == 0 and "What it flags" in doc.out and "How to suppress" in doc.out
    unknown = run_cli("rules", "explain", "no-such-rule", cwd=REPO)
    assert unknown.code == 2 and "unknown rule" in unknown.err


def test_piped_output_has_no_escape_codes() -> None:
    result = run_cli("scan", "examples", "--no-cache", cwd=REPO, env={"NO_COLOR": ""})
    assert result.code == 0
    assert "\x1b[" not in result.out
    assert "Allocation sites by tier and kind" in result.out


def test_configuration_errors_exit_2_naming_the_key(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"a.py": "import torch\n"}, config="exclud = ['x']\n")
    result = run_cli("scan", cwd=root)
    assert result.code == 2
    assert "alloc-audit.toml:1: unknown key 'exclud'" in result.err


def test_fail_on_makes_findings_fail_scan() -> None:
    assert run_cli("scan", "examples", "--no-cache", cwd=REPO).code == 0
    assert run_cli("scan", "examples", "--no-cache", "--fail-on", "error", cwd=REPO).code == 1


def test_missing_path_is_a_usage_error() -> None:
    result = run_cli("scan", "no/such/dir", cwd=REPO)
    assert result.code == 2 and "no such file or directory" in result.err


def test_output_file_is_written_and_a_summary_printed(tmp_path: Path) -> None:
    out = tmp_path / "sites.json"
    result = run_cli("scan", "examples", "--no-cache", "--format", "json", "-o", str(out), cwd=REPO)
    assert result.code == 0 and "report written to" in result.out
    jsonschema.validate(json.loads(out.read_text()), SCHEMA)


def test_changed_since_reports_only_changed_files(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {
        "a.py": 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n',
        "b.py": 'import torch\n\n\ndef g(n):\n    return torch.zeros(n, device="cuda")\n',
    })
    write(root, "b.py", 'import torch\n\n\ndef g(n):\n    return torch.ones(n, device="cuda")\n')
    doc = scan_json("--changed-since", "HEAD", cwd=root)
    assert {s["path"] for s in doc["sites"]} == {"b.py"}
