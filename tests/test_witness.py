"""Evidence with every finding (issue 16): the witness path from the trigger
to the allocation, file:line per hop, and the branch conditions assumed
along it, in JSON `related`, SARIF `codeFlows` and the terminal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from clihelp import run_cli
from fixtures_harness import FIXTURES, run_fixture

PATHS = FIXTURES / "python" / "alloc-in-capture-paths.py"


def _line_of(needle: str, after: int = 0) -> int:
    """The first fixture line after ``after`` that holds ``needle``."""
    lines = PATHS.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if i > after and needle in line)


def test_witness_lists_hops_and_assumed_branches() -> None:
    _expected, result = run_fixture(PATHS)
    site_line = _line_of("workspace = torch.empty(1024", 0)
    finding = next(f for f in result.findings if f.line == site_line)
    notes = [(r.line, r.note) for r in finding.related]
    capture = _line_of("def bad_capture_without_workspace") + 1
    assert notes[0] == (capture, "capture starts here (torch.cuda.graph)")
    assert notes[1] == (capture + 1, "bad_capture_without_workspace calls _scratch_op under capture")
    assert any("workspace = None" in n and "passes no workspace (default None)" in n for _l, n in notes), notes
    assert any(n == "branch `workspace is None` holds" for _l, n in notes), notes


def test_unknown_value_is_said_to_be_assumed() -> None:
    _expected, result = run_fixture(PATHS)
    site_line = _line_of("workspace = torch.empty(1024", _line_of("def _scratch_op_unknown"))
    finding = next(f for f in result.findings if f.line == site_line)
    assert any(r.note == "branch `workspace is None` assumed (not decided by the call)" for r in finding.related)


def test_sarif_carries_the_witness_as_a_code_flow(tmp_path: Path) -> None:
    shutil.copy(PATHS, tmp_path / "ops.py")
    (tmp_path / "alloc-audit.toml").write_text("")
    result = run_cli("scan", ".", "--no-cache", "--format", "sarif", cwd=tmp_path)
    assert result.code == 0, result.err
    results = json.loads(result.out)["runs"][0]["results"]
    flows = [r["codeFlows"][0]["threadFlows"][0]["locations"] for r in results if r["ruleId"] == "alloc-in-capture"]
    assert flows and all(len(steps) >= 3 for steps in flows)
    first = flows[0]
    assert first[0]["location"]["message"]["text"].startswith("capture starts here")
    assert first[-1]["location"]["message"]["text"] == "alloc-in-capture"


def test_terminal_verbose_shows_the_assumptions(tmp_path: Path) -> None:
    shutil.copy(PATHS, tmp_path / "ops.py")
    (tmp_path / "alloc-audit.toml").write_text("")
    result = run_cli("scan", ".", "--no-cache", "--verbose", cwd=tmp_path, env={"COLUMNS": "200"})
    assert result.code == 0, result.err
    assert "branch `workspace is None` holds" in result.out


def test_free_memory_witness_runs_from_the_reading_through_the_calls() -> None:
    """The KV cache sized from a free-memory reading two calls away: the
    finding lists the reading, each call that passes the value, and the
    allocation's own line is the finding's."""
    case = FIXTURES / "python" / "live-free-memory-sizing-vendored"
    _expected, result = run_fixture(case)
    finding = next(f for f in result.findings if f.rule == "live-free-memory-sizing"
                   and f.path == "server/engine/layers/kv_cache.py" and f.line == 11)
    notes = [(r.path, r.note) for r in finding.related]
    assert notes[0] == ("server/engine/models/causal.py", "live free-memory reading engine.utils.memory.get_free_memory")
    assert any(n == "passed to self.init_kv_cache" for _p, n in notes), notes
    assert notes[-1][0] == "server/engine/models/causal.py" and notes[-1][1].startswith("passed to ")
    assert notes[-1][1].endswith("KVCache"), notes
