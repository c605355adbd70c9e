"""`alloc-audit check`: sites against the allowlist and the rules' findings
(the pre-commit hook). Fails on new, grown, loose and stale entries and on
open findings of the --fail-on severity."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path

from ..model import FailOn
from .outcome import Text
from .project import Options, coverage, load_project, report_context, require_allowlist, scan_project


class CheckFormat(str, Enum):
    """How `check` and `gate` show their problems (json: the scan itself)."""

    text = "text"
    github = "github"
    json = "json"


def check(paths: list[Path] | None, options: Options, fail_on: FailOn = FailOn.ERROR, fmt: str = "text") -> Text:
    """Check sites against the allowlist and run the rules; exit 1 on failure (the pre-commit hook).

    Fails on sites not on the allowlist (new), entries whose count is exceeded
    (grown) or higher than what is left (loose), entries that match nothing
    (stale), and unsuppressed rule findings of --fail-on severity. With file
    paths (pre-commit passes the staged files) only those files' sites and
    entries are checked, and the rules see only those files; entries of
    derived sites (calls to project factories, which may be defined in
    files not given) are then checked for growth only.

    Examples:

      alloc-audit check

      alloc-audit check src/engine/runner.py src/engine/worker.py
    """
    from ..ratchet.checks import allowlist_problems, finding_problems, render
    from ..ratchet.compare import apply_pins, compare

    project = load_project(paths, options.config_path)
    entries = require_allowlist(project.config)
    result = scan_project(project, paths, options)
    covered = coverage(project.config, paths)
    # a run over part of the tree cannot see every factory a derived site calls
    partial = None if "" in covered else project.catalog.apis.api_names()
    comparison = compare(result.sites, entries, result.scanned_paths, covered, partial)
    problems = allowlist_problems(comparison)
    findings = [f for f in result.findings if not f.suppressed and fail_on is not FailOn.NEVER]
    problems += finding_problems(findings, fail_on is FailOn.WARNING)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    failed = any(p.level == "error" for p in problems) or any(fail_on.fails(f.severity) for f in findings)
    if fmt == "json":
        from ..report import json as json_report

        pinned = dataclasses.replace(result, sites=apply_pins(result.sites, entries))
        return Text(json_report.render(report_context(project, pinned, options, comparison)), failed=failed)
    out = render(problems, fmt)
    if fmt != "text":
        return Text(out, failed=failed)
    errors = sum(1 for p in problems if p.level == "error")
    summary = (f"alloc-audit check {'failed' if failed else 'passed'}: {len(comparison.entries)} allowlist entries, "
               f"{len(comparison.new)} new, {len(comparison.grown)} grown, {len(comparison.loose)} loose, "
               f"{len(comparison.stale)} stale; {len(findings)} rule findings; {errors} errors\n")
    return Text(out, summary, failed) if failed else Text(out + summary)
