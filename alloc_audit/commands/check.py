"""`alloc-audit check`: sites against the allowlist and the rules' findings
against the findings baseline (the pre-commit hook). Fails on new, grown,
loose and stale entries, on open findings of the --fail-on severity that
the baseline does not accept, and on fixed findings still in the baseline."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ..model import FailOn
from .outcome import Text
from .project import (
    Options,
    Project,
    coverage,
    fails_unchecked,
    file_counts,
    load_project,
    report_context,
    require_allowlist,
    scan_project,
    unanalysed,
)

if TYPE_CHECKING:
    from ..model import ScanResult
    from ..ratchet.allowlist import AllowlistEntry
    from ..ratchet.baseline import FindingsComparison
    from ..ratchet.checks import Problem


class CheckFormat(str, Enum):
    """How `check` and `gate` show their problems (json: check prints the scan with its verdict and problems,
    gate its own document)."""

    text = "text"
    github = "github"
    json = "json"


class Unchecked(str, Enum):
    """What allowlist entries of files that could not be analysed do (``--unchecked``)."""

    fail = "fail"
    warn = "warn"


def check(paths: list[Path] | None, options: Options, fail_on: FailOn = FailOn.ERROR, fmt: str = "text",
          unchecked: str | None = None, staged: bool = False) -> Text:
    """Check sites against the allowlist and run the rules; exit 1 on failure (the pre-commit hook).

    Fails on sites not on the allowlist (new), entries whose count is exceeded
    (grown) or higher than what is left (loose), entries that match nothing
    (stale), entries of files that could not be analysed (not checked;
    --unchecked warn lets them pass), unsuppressed rule findings of
    --fail-on severity that the findings baseline does not accept, and (on a
    whole-tree run) baseline entries whose findings are fixed. With file
    paths (pre-commit passes the staged files) only those files' sites and
    entries are checked, and the rules see only those files; entries of
    derived sites (calls to project factories, which may be defined in
    files not given) are then checked for growth only. --staged also judges
    the entries of files the staged change deletes or renames (git is asked:
    pre-commit passes only the files that still exist).

    Examples:

      alloc-audit check

      alloc-audit check src/engine/runner.py src/engine/worker.py

      alloc-audit check --staged $(git diff --cached --name-only --diff-filter=d)
    """
    from ..ratchet.checks import (
        allowlist_problems,
        file_problems,
        finding_problems,
        fixed_debt_problems,
        problems_json,
        render,
        unchecked_problems,
    )
    from ..ratchet.compare import apply_pins, compare
    from ..report.words import plural

    project = load_project(paths, options.config_path)
    entries = require_allowlist(project.config)
    gone: list[str] = []
    renames: tuple[tuple[str, str], ...] = ()
    if staged:
        from ..gitio import staged_removals

        deleted, renames = staged_removals(project.config.root)
        gone = sorted(deleted | {old for old, _ in renames})
        if not paths and not gone:
            if fmt == "json":
                return Text('{"check": {"passed": true, "problems": [], "note": "nothing staged to check"}}\n')
            return Text("alloc-audit check: nothing staged to check\n" if fmt == "text" else "")
    if staged and not paths:
        from ..model import ScanResult, Stats

        # only deletions are staged: nothing to scan, the gone files' entries are judged
        result = ScanResult(root=project.config.root, sites=(), findings=(), errors=(), stats=Stats(0, 0, 0, 0.0))
    else:
        result = scan_project(project, paths, options)
    covered = coverage(project.config, paths)
    if staged:
        covered = (*(covered if paths else ()), *gone)
    # a run over part of the tree cannot see every factory a derived site calls
    partial = None if "" in covered else project.catalog.apis.api_names()
    comparison = compare(result.sites, entries, result.scanned_paths, covered, partial, unanalysed(result))
    problems = allowlist_problems(comparison) + rename_notes(renames, entries)
    problems += unchecked_problems(comparison, fails_unchecked(project.config, unchecked))
    problems += file_problems(result.unchecked)
    # the findings baseline (ratchet/baseline.py): only findings it does not accept count
    judged = judge_findings(project, result, covered, options.changed_since is not None)
    open_findings = judged.open_findings() if judged is not None else [f for f in result.findings if not f.suppressed]
    findings = [f for f in open_findings if fail_on is not FailOn.NEVER]
    fail_roles = project.config.fail_roles
    problems += finding_problems(findings, fail_on is FailOn.WARNING, fail_roles)
    if judged is not None and fail_on is not FailOn.NEVER:
        problems += fixed_debt_problems(judged)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    failed = any(p.level == "error" for p in problems) or any(
        fail_on.fails(f.severity) and f.role in fail_roles for f in findings)
    if fmt == "json":
        import json

        from ..report.json import document

        pinned = dataclasses.replace(result, sites=apply_pins(result.sites, entries))
        doc = document(report_context(project, pinned, options, comparison))
        if judged is not None:
            doc["baseline"] = judged.to_json()
        doc["check"] = {"passed": not failed, "problems": problems_json(problems)}
        return Text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", failed=failed)
    out = render(problems, fmt)
    if fmt != "text":
        return Text(out, failed=failed)
    errors = sum(1 for p in problems if p.level == "error")
    in_baseline = f" ({judged.baselined} in the baseline)" if judged is not None else ""
    summary = (f"alloc-audit check {'failed' if failed else 'passed'}: "
               f"{plural(len(comparison.entries), 'allowlist entry', 'allowlist entries')}, "
               f"{len(comparison.new)} new, {len(comparison.grown)} grown, {len(comparison.loose)} loose, "
               f"{len(comparison.stale)} stale, {len(comparison.unchecked)} not checked; "
               f"{plural(len(findings), 'open rule finding')}{in_baseline}; {plural(errors, 'error')}"
               f"{file_counts(result)}\n")
    return Text(out, summary, failed) if failed else Text(out + summary)


def judge_findings(project: Project, result: ScanResult, covered: tuple[str, ...],
                   changed: bool) -> FindingsComparison | None:
    """Open findings against the findings baseline; None without one. A run
    over part of the tree (paths, --changed-since) judges new and grown
    only; files the run could not fully read keep their entries."""
    from ..ratchet.baseline import compare_findings, load_baseline
    from ..ratchet.compare import coverage_test

    baseline = load_baseline(project.config.allowlist_dir, project.config.root)
    if baseline is None:
        return None
    partial = changed or "" not in covered
    unread = frozenset(e.path for e in result.errors) | frozenset(unanalysed(result))
    return compare_findings(result.findings, baseline, partial=partial, covers=coverage_test(covered), unread=unread)


def rename_notes(renames: tuple[tuple[str, str], ...], entries: list[AllowlistEntry]) -> list[Problem]:
    """A staged rename of a file with allowlisted sites: say what fixes it."""
    from ..ratchet.checks import Problem

    listed = {e.path for e in entries}
    return [Problem(new, 1, "notice", "renamed file",
                    f"{old} -> {new} holds allowlisted sites: `alloc-audit allowlist update` moves its entries "
                    "(reasons kept)") for old, new in renames if old in listed]
