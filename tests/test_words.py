"""The same numbers in the same words in every format (terminal, Markdown,
HTML, `check`), nouns in the right number, and the scan table at 100
columns with whole tier names and one "unknown"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clihelp import REPO, make_repo, run_cli

ONE = {"eng/step.py": 'import torch\n\n\ndef capture(g, n):\n    with torch.cuda.graph(g):\n'
                      '        out = torch.empty(n, device="cuda")\n    return out\n'}
TIER_NAMES = ("T1 model-resident", "T2 engine-persistent", "T3 pooled", "T4 forward-scratch", "T5a host-staging",
              "T5b host-pinned")


@pytest.fixture(scope="module")
def one_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_repo(tmp_path_factory.mktemp("words") / "p", ONE)
    assert run_cli("allowlist", "init", "--no-findings", cwd=root).code == 0
    return root


def test_singulars_everywhere(one_site: Path, tmp_path: Path) -> None:
    texts = {
        "scan": run_cli("scan", cwd=one_site).out,
        "report": run_cli("report", cwd=one_site).out,
        "markdown": run_cli("report", "--format", "markdown", cwd=one_site).out,
        "html": run_cli("report", "--format", "html", cwd=one_site).out,
        "check": run_cli("check", cwd=one_site).out + run_cli("check", cwd=one_site).err,
        "summary": run_cli("report", "-o", str(tmp_path / "r.md"), cwd=one_site).out,
    }
    wrong = re.compile(r"\b1 (files|sites|entries|errors|warnings|findings|directories|rule findings|"
                       r"open rule findings|file problems)\b")
    for name, text in texts.items():
        assert not wrong.search(text), f"{name}: {wrong.search(text).group(0)!r}"  # type: ignore[union-attr]
    assert "Findings: 0 errors, 1 warning" in texts["scan"]
    assert "Sites by directory (1 directory)" in texts["report"]
    assert "1 entry accept 1 site;" in texts["report"]
    assert "1 allowlist entry," in texts["check"] and "1 open rule finding;" in texts["check"]
    assert "alloc-audit: 1 site (+0 derived) in 1 file (1 of 1 file parsed), 1 finding, 0 files with problems" in texts["summary"]
    assert "1 directory)" in texts["html"] and "1 file," in texts["html"]


def test_the_demo_counts_agree_across_formats() -> None:
    terminal = run_cli("report", "examples", cwd=REPO).out
    markdown = run_cli("report", "examples", "--format", "markdown", cwd=REPO).out
    check = run_cli("check", "examples", "--fail-on", "never", cwd=REPO).out
    sites, derived = re.search(r"\*\*(\d+) allocation sites\*\* \(\+(\d+) derived\)", markdown).groups()  # type: ignore[union-attr]
    entries = re.search(r"(\d+) allowlist entries", check).group(1)  # type: ignore[union-attr]
    assert f"Allowlist clean: {entries} entries accept {sites} sites (+{derived} derived);" in terminal
    assert f"| {entries} | {sites} (+{derived} derived) | 0 | 0 | 0 | 0 |" in markdown
    for text in (terminal, markdown, check):
        assert "too-high" not in text and "too high" not in text, "one word for it: loose"


def test_scan_table_at_100_columns(one_site: Path) -> None:
    out = run_cli("scan", "examples", env={"COLUMNS": "100"}, cwd=REPO).out
    table = out.split("Allocation sites by tier and kind", 1)[1].split("\n\n", 1)[0]
    assert "…" not in table, table
    assert max(len(line) for line in table.splitlines()) <= 100
    rows = [line.split("│")[0].strip() for line in table.splitlines() if "│" in line]
    assert rows == ["T1", "T2", "T3", "T4", "T5a", "T5b", "unknown", "total"]
    legend = " · ".join(line.strip() for line in table.splitlines()[-2:])
    for name in TIER_NAMES:
        assert name in legend, f"{name!r} is cut in the legend"
    wide = run_cli("scan", "examples", env={"COLUMNS": "130"}, cwd=REPO).out
    wide_rows = [line.split("│")[0].strip() for line in wide.splitlines() if "│" in line][:8]
    assert wide_rows == [*TIER_NAMES, "unknown", "total"]


def test_wrapped_finding_lines_keep_their_indent() -> None:
    out = run_cli("scan", "examples", env={"COLUMNS": "80"}, cwd=REPO).out
    findings = out.split("Findings:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert findings and all(line.startswith(("warning ", "error ", "    ")) for line in findings), findings
