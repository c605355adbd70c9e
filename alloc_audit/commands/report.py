"""`alloc-audit report`: the developer report, optionally with the delta
against a git ref scanned with today's configuration and rules."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .outcome import Report
from .project import Options, Project, comparison_if_present, load_project, only_roles, report_context, scan_project
from .scan import one_line_summary

if TYPE_CHECKING:
    from ..model import ScanResult
    from ..ratchet.delta import Delta


def report(paths: list[Path] | None, options: Options, pivot: str = "dir", base: str | None = None,
           bind: list[str] | None = None, verbose: bool = False, roles: list[str] | None = None) -> Report:
    """The developer report: totals by tier and kind, top directories, hazards by rule, allowlist status, next steps.

    Examples:

      alloc-audit report examples

      alloc-audit report --by file --bind max_num_tokens=8192 --bind hidden_size=4096

      alloc-audit report --format markdown --base origin/main >> "$GITHUB_STEP_SUMMARY"

      alloc-audit report --format html -o alloc-report.html

      alloc-audit report --format sarif -o alloc-audit.sarif
    """
    from ..report.sizes import parse_binding

    bindings = []
    for text in bind or ():
        try:
            bindings.append(parse_binding(text))
        except ValueError as exc:
            raise UsageError(f"--bind: {exc}") from None
    project = load_project(paths, options.config_path)
    result = scan_project(project, paths, options, with_rules=True)
    comparison = comparison_if_present(project.config, result)
    result = only_roles(result, roles)
    delta = None if base is None else delta_against(base, project, paths, result, options)
    ctx = report_context(project, result, options, comparison, verbose, pivot, delta, tuple(bindings))
    return Report(ctx, one_line_summary(result))


def delta_against(ref: str, project: Project, paths: list[Path] | None, result: ScanResult,
                  options: Options) -> Delta:
    """Scan the tree at ``ref`` with today's configuration and rules (so the
    delta is the code's change, not the tool's) and compare."""
    from ..gitio import export_tree, require_ref
    from ..pipeline.run import ScanOptions, run_scan
    from ..ratchet.delta import compute

    config = project.config
    commit = require_ref(config.root, ref)
    with tempfile.TemporaryDirectory(prefix="alloc-audit-base-") as tmp:
        base_root = export_tree(config.root, ref, Path(tmp))
        base_paths = []
        for p in paths or ():
            rel = p.resolve().relative_to(config.root.resolve())
            if (base_root / rel).exists():
                base_paths.append(base_root / rel)
        if paths and not base_paths:
            base_result = None
        else:
            base_result = run_scan(
                dataclasses.replace(config, root=base_root),
                project.catalog,
                ScanOptions(paths=tuple(base_paths), jobs=options.jobs, use_cache=not options.no_cache,
                            cache_dir=options.cache_dir or config.root / config.cache_dir),
            )
    return compute(ref, commit, base_result.sites if base_result else (),
                   base_result.findings if base_result else (), result.sites, result.findings)
