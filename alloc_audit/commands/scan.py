"""`alloc-audit scan`: the census and the hazard findings of one scan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..model import FailOn
from .outcome import Report
from .project import Options, comparison_if_present, load_project, report_context, scan_project

if TYPE_CHECKING:
    from ..model import ScanResult


def scan(paths: list[Path] | None, options: Options, fail_on: FailOn = FailOn.NEVER, verbose: bool = False,
         with_rules: bool = True) -> Report:
    """Census of allocation sites (tier, kind, reason) and hazard findings.

    Examples:

      alloc-audit scan examples

      alloc-audit scan src --format json -o alloc.json

      alloc-audit scan --changed-since origin/main --verbose
    """
    project = load_project(paths, options.config_path)
    result = scan_project(project, paths, options, with_rules=with_rules)
    comparison = comparison_if_present(project.config, result)
    ctx = report_context(project, result, options, comparison, verbose)
    return Report(ctx, one_line_summary(result), fails(result, fail_on))


def one_line_summary(result: ScanResult) -> str:
    direct = sum(1 for s in result.sites if s.counted)
    derived = sum(1 for s in result.sites if s.via is not None)
    open_findings = [f for f in result.findings if not f.suppressed]
    from ..report.words import plural

    return (f"alloc-audit: {plural(direct, 'site')} (+{derived} derived) in {result.stats.parsed} of "
            f"{plural(result.stats.files, 'file')}, {plural(len(open_findings), 'finding')}, "
            f"{plural(len(result.errors), 'file with problems', 'files with problems')}")


def fails(result: ScanResult, fail_on: FailOn) -> bool:
    """Whether unsuppressed findings at or above ``fail_on`` remain."""
    return any(fail_on.fails(f.severity) and not f.suppressed for f in result.findings)
