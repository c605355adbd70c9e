"""The findings baseline (baseline.py): the hazards a project has when it
adopts alloc-audit are recorded by `allowlist init`, `check` fails only on
new ones, fixed ones are reported and pruned, and the gate fails when the
baseline grew. Unit cases for the format, then the round trip through the
installed CLI in a real git repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clihelp import git, make_repo, run_cli, write

from alloc_audit.errors import UsageError
from alloc_audit.model import Finding, Severity
from alloc_audit.ratchet.baseline import (
    BaselineEntry,
    baseline_growth,
    compare_findings,
    entries_from,
    finding_key,
    parse_baseline,
    plan_baseline_update,
    render_baseline,
)

CAPTURE = '''
import torch


def capture(g, n):
    with torch.cuda.graph(g):
        out = torch.empty(n, device="cuda")
    return out
'''

CAPTURE_TWICE = '''
import torch


def capture(g, n):
    with torch.cuda.graph(g):
        out = torch.empty(n, device="cuda")
        extra = torch.empty(n, device="cuda")
    return out, extra
'''

CAPTURE_FIXED = '''
import torch


def capture(g, n):
    out = torch.empty(n, device="cuda")
    with torch.cuda.graph(g):
        out.zero_()
    return out
'''


def finding(rule: str, path: str, scope: str, subject: str, line: int = 1) -> Finding:
    return Finding(rule=rule, severity=Severity.ERROR, path=path, line=line, col=1, scope=scope, message="m",
                   key=f"{rule} {path} {scope} {subject}")


# ---------------------------------------------------------------- the format


@pytest.mark.parametrize("text,expected", [
    pytest.param("alloc-in-capture a.py f torch.empty\n",
                 [BaselineEntry("alloc-in-capture", "a.py", "f", "torch.empty", 1, "", "b", 1)], id="one entry"),
    pytest.param("# alloc-audit findings baseline v1\n\ngrow-on-demand a.cu A::grow cudaMalloc x2 # warm-up only\n",
                 [BaselineEntry("grow-on-demand", "a.cu", "A::grow", "cudaMalloc", 2, "warm-up only", "b", 3)],
                 id="count and reason"),
    pytest.param("retained-per-entry-alloc p.py P.capture self._a%20and%20self._b\n",
                 [BaselineEntry("retained-per-entry-alloc", "p.py", "P.capture", "self._a and self._b", 1, "",
                                "b", 1)], id="escaped subject"),
])
def test_parse_baseline(text: str, expected: list[BaselineEntry]) -> None:
    assert parse_baseline(text, "b") == expected


@pytest.mark.parametrize("text,message", [
    pytest.param("alloc-in-capture a.py f\n", "got 3 fields", id="missing subject"),
    pytest.param("alloc-in-capture a.py f torch.empty x0\n", "bad count", id="zero count"),
    pytest.param("r a f s\nr a f s\n", "duplicate entry", id="duplicate"),
    pytest.param("# alloc-audit findings baseline v9\n", "newer than this alloc-audit", id="newer format"),
    pytest.param("r a f s\n<<<<<<< HEAD\nr a g s\n=======\n", "unresolved merge conflict", id="conflict markers"),
])
def test_malformed_baseline_names_the_line(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_baseline(text, "b")
    assert info.value.line is not None and info.value.path == "b"


def test_render_round_trips() -> None:
    entries = [BaselineEntry("r", "p.py", "S.f", "a b", 3, "why"), BaselineEntry("a", "p.py", "g", "x")]
    text = render_baseline(entries)
    assert text.splitlines()[0] == "# alloc-audit findings baseline v1"
    parsed = parse_baseline(text, "b")
    assert [(e.key, e.count, e.reason) for e in parsed] == sorted((e.key, e.count, e.reason) for e in entries)


def test_keys_ignore_lines_and_meta_findings_are_never_baselined() -> None:
    moved = finding("alloc-in-capture", "a.py", "f", "torch.empty", line=40)
    assert finding_key(moved) == finding_key(finding("alloc-in-capture", "a.py", "f", "torch.empty", line=3))
    meta = Finding(rule="unused-suppression", severity=Severity.WARNING, path="a.py", line=2, col=1, scope="",
                   message="m")
    assert finding_key(meta) is None
    assert entries_from([moved, meta]) == [BaselineEntry("alloc-in-capture", "a.py", "f", "torch.empty")]
    comparison = compare_findings([moved, meta], entries_from([moved]))
    assert comparison.open_findings() == [meta]


def test_compare_new_grown_fixed_and_the_partial_run() -> None:
    entries = [BaselineEntry("r", "a.py", "f", "x", 2), BaselineEntry("r", "a.py", "g", "x"),
               BaselineEntry("r", "b.py", "h", "x")]
    found = [finding("r", "a.py", "f", "x"), finding("r", "a.py", "g", "x", 2), finding("r", "a.py", "g", "x", 3),
             finding("r", "c.py", "k", "x")]
    full = compare_findings(found, entries)
    assert [k for k, _ in full.new] == [("r", "c.py", "k", "x")]
    assert [(e.key, len(f)) for e, f in full.grown] == [(("r", "a.py", "g", "x"), 2)]
    assert [(e.key, left) for e, left in full.fixed] == [(("r", "a.py", "f", "x"), 1), (("r", "b.py", "h", "x"), 0)]
    partial = compare_findings(found, entries, partial=True)
    assert partial.fixed == () and len(partial.new) == 1 and len(partial.grown) == 1
    plan = plan_baseline_update(full, add_new=False)
    assert {e.key: e.count for e in plan.entries} == {("r", "a.py", "f", "x"): 1, ("r", "a.py", "g", "x"): 1}
    accepted = plan_baseline_update(full, add_new=True, reason="reviewed")
    assert {e.key: (e.count, e.reason) for e in accepted.entries}[("r", "c.py", "k", "x")] == (1, "reviewed")
    assert {e.key: e.count for e in accepted.entries}[("r", "a.py", "g", "x")] == 2


def test_a_file_that_could_not_be_read_keeps_its_debt() -> None:
    """Findings of a file with a syntax error or over the size limit may be
    missing from the run: its entries are neither fixed nor pruned."""
    entries = [BaselineEntry("r", "broken.py", "f", "x", 2), BaselineEntry("r", "gone.py", "g", "x")]
    found = [finding("r", "broken.py", "f", "x")]
    comparison = compare_findings(found, entries, unread=frozenset({"broken.py"}))
    assert [(e.path, left) for e, left in comparison.fixed] == [("gone.py", 0)]
    plan = plan_baseline_update(comparison, add_new=False)
    assert [(e.path, e.count) for e in plan.entries] == [("broken.py", 2)]


def test_gate_growth_and_moves() -> None:
    base = [BaselineEntry("r", "old.py", "f", "x"), BaselineEntry("r", "a.py", "g", "x")]
    now = [BaselineEntry("r", "new.py", "f", "x"), BaselineEntry("r", "a.py", "g", "x", 2),
           BaselineEntry("q", "a.py", "g", "y")]
    grown, moved = baseline_growth(base, now)
    assert [(g.entry.key, g.before) for g in grown] == [(("q", "a.py", "g", "y"), 0), (("r", "a.py", "g", "x"), 1)]
    assert [(b.path, n.path) for b, n in moved] == [("old.py", "new.py")]
    assert baseline_growth(now, base)[0] == []


# ---------------------------------------------------------------- the round trip, through the CLI


def test_round_trip_init_check_new_fix_stale_update(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "proj", {"eng/step.py": CAPTURE})
    before = run_cli("check", cwd=root)
    assert before.code == 2 and "allowlist init" in before.err

    init = run_cli("allowlist", "init", cwd=root)
    assert init.code == 0, init.err
    assert "findings baseline of 1 finding " in init.out
    baseline = (root / "allowlists" / "alloc-audit.findings").read_text()
    assert "alloc-in-capture eng/step.py capture torch.empty\n" in baseline
    passed = run_cli("check", cwd=root)
    assert passed.code == 0, passed.out + passed.err
    assert "0 open rule findings (1 in the baseline)" in passed.out

    write(root, "eng/step.py", CAPTURE_TWICE)
    # torch.empty under torch.cuda.graph is a warning (memory retained per graph): --fail-on warning judges it
    grown = run_cli("check", "--no-cache", "--fail-on", "warning", cwd=root)
    assert grown.code == 1
    assert "eng/step.py:6: error: alloc-in-capture" in grown.out and "eng/step.py:7: error: alloc-in-capture" in grown.out
    staged_only = run_cli("check", "eng/step.py", "--fail-on", "warning", cwd=root)
    assert staged_only.code == 1, "a partial run (the hook) judges new findings too"

    write(root, "eng/step.py", CAPTURE_FIXED)
    fixed = run_cli("check", cwd=root)
    assert fixed.code == 1
    assert ("allowlists/alloc-audit.findings:5: error: fixed finding still in the baseline: "
            "alloc-in-capture eng/step.py capture torch.empty is fixed") in fixed.out
    assert run_cli("check", "eng/step.py", cwd=root).code == 0, "a partial run cannot tell fixed from unseen"

    update = run_cli("allowlist", "update", cwd=root)
    assert update.code == 0, update.err
    assert "- fixed    alloc-in-capture eng/step.py capture torch.empty" in update.out
    assert "alloc-in-capture" not in (root / "allowlists" / "alloc-audit.findings").read_text()
    assert run_cli("check", cwd=root).code == 0


def test_gate_fails_when_the_baseline_grew(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "proj", {"eng/step.py": CAPTURE})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "adopt")
    assert run_cli("gate", "--base", "HEAD", cwd=root).code == 0

    write(root, "eng/other.py", CAPTURE.replace("def capture", "def warmup"))
    added = run_cli("allowlist", "update", "--add-new", "--reason", "warm-up, reviewed", cwd=root)
    assert added.code == 0, added.err
    assert "+ accepted alloc-in-capture eng/other.py warmup torch.empty x1 (finding)" in added.out
    assert "eng/other.py warmup torch.empty T4 # warm-up, reviewed" in (
        root / "allowlists" / "alloc-audit.allowlist").read_text()
    assert run_cli("check", cwd=root).code == 0
    gate = run_cli("gate", "--base", "HEAD", "--format", "json", cwd=root)
    assert gate.code == 1
    doc = json.loads(gate.out)
    assert doc["passed"] is False and doc["baseline_grew"] is True and doc["check_passed"] is True
    titles = {(p["title"], p["message"].split(" (")[0]) for p in doc["problems"]}
    assert ("findings baseline grew", "alloc-in-capture eng/other.py warmup torch.empty added") in titles


def test_without_a_baseline_every_finding_counts(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "proj", {"eng/step.py": CAPTURE})
    assert run_cli("allowlist", "init", "--no-findings", cwd=root).code == 0
    assert not (root / "allowlists" / "alloc-audit.findings").exists()
    result = run_cli("check", "--format", "json", "--fail-on", "warning", cwd=root)
    assert result.code == 1
    doc = json.loads(result.out)
    assert doc["check"]["passed"] is False and "baseline" not in doc
    assert [p["title"] for p in doc["check"]["problems"]] == ["alloc-in-capture"]
