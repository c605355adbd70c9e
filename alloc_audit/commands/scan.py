"""`alloc-audit scan`: the census and the hazard findings of one scan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..model import FailOn
from .outcome import Report
from .project import Options, comparison_if_present, load_project, only_roles, report_context, scan_project

if TYPE_CHECKING:
    from ..model import ScanResult


def scan(paths: list[Path] | None, options: Options, fail_on: FailOn = FailOn.NEVER, verbose: bool = False,
         with_rules: bool = True, roles: list[str] | None = None) -> Report:
    """Census of allocation sites (tier, kind, reason) and hazard findings.

    Examples:

      alloc-audit scan examples

      alloc-audit scan src --format json -o alloc.json

      alloc-audit scan --changed-since origin/main --verbose
    """
    project = load_project(paths, options.config_path)
    result = scan_project(project, paths, options, with_rules=with_rules)
    comparison = comparison_if_present(project.config, result)
    result = only_roles(result, roles)
    ctx = report_context(project, result, options, comparison, verbose)
    return Report(ctx, one_line_summary(result), fails(result, fail_on, project.config.fail_roles))


def one_line_summary(result: ScanResult) -> str:
    direct = sum(1 for s in result.sites if s.counted)
    derived = sum(1 for s in result.sites if s.via is not None)
    open_findings = [f for f in result.findings if not f.suppressed]
    from ..report.words import plural

    holding = len({s.path for s in result.sites if s.counted or s.via is not None})
    return (f"alloc-audit: {plural(direct, 'site')} (+{derived} derived) in {plural(holding, 'file')} "
            f"({result.stats.parsed} of {plural(result.stats.files, 'file')} parsed), "
            f"{plural(len(open_findings), 'finding')}, "
            f"{plural(len(result.errors), 'file with problems', 'files with problems')}")


def fails(result: ScanResult, fail_on: FailOn, fail_roles: tuple[str, ...] = ("production",)) -> bool:
    """Whether unsuppressed findings at or above ``fail_on`` remain in the
    roles that fail (configuration `fail-roles`, production by default);
    `info` never fails."""
    return any(fail_on.fails(f.severity) and not f.suppressed and f.role in fail_roles for f in result.findings)
