"""What every command starts from: the project (configuration and catalogue)
found from the paths, one scan of it with the options all commands share,
and the allowlist when there is one."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..config import Config
    from ..model import ScanResult
    from ..ratchet.allowlist import AllowlistEntry
    from ..ratchet.compare import Comparison
    from ..report.context import ReportContext


@dataclass(frozen=True)
class Options:
    """The options every command shares (the CLI builds one per run)."""

    config_path: Path | None = None
    jobs: int | None = None
    no_cache: bool = False
    cache_dir: Path | None = None
    changed_since: str | None = None
    progress: Callable[[int, int], None] | None = None
    width: int | None = None  # the terminal's, for tables


@dataclass(frozen=True)
class Project:
    config: Config
    catalog: Catalog


def load_project(paths: list[Path] | None, config_path: Path | None) -> Project:
    from ..catalog import load_catalog
    from ..config import find_project, load_config

    found: Path | None
    if config_path is not None:
        if not config_path.is_file():
            raise UsageError("no such configuration file", str(config_path))
        root, found = config_path.resolve().parent, config_path.resolve()
    else:
        start = Path(os.path.commonpath([os.path.abspath(p) for p in paths])) if paths else Path.cwd()
        root, found = find_project(start)
    config = load_config(root, found)
    return Project(config, load_catalog(config))


def scan_project(project: Project, paths: list[Path] | None, options: Options,
                 with_rules: bool = True) -> ScanResult:
    """Run the pipeline over ``paths`` (default: the project)."""
    from ..gitio import changed_since as changed
    from ..pipeline.run import ScanOptions, run_scan

    report_paths = None
    if options.changed_since is not None:
        report_paths = changed(project.config.root, options.changed_since)
    return run_scan(
        project.config,
        project.catalog,
        ScanOptions(
            paths=tuple(paths or ()),
            jobs=options.jobs,
            use_cache=not options.no_cache,
            cache_dir=options.cache_dir,
            report_paths=report_paths,
            with_rules=with_rules,
            progress=options.progress,
        ),
    )


def root_display(root: Path) -> str:
    cwd = Path.cwd().resolve()
    root = root.resolve()
    if root == cwd:
        return "."
    try:
        return root.relative_to(cwd).as_posix()
    except ValueError:
        return root.as_posix()


def report_context(project: Project, result: ScanResult, options: Options, comparison: Comparison | None = None,
                   verbose: bool = False, pivot: str = "tier", base: object = None,
                   bindings: tuple[tuple[str, int], ...] = ()) -> ReportContext:
    from ..report.context import ReportContext

    merged = dict(project.config.bindings)
    merged.update(bindings)
    return ReportContext(result=result, root_display=root_display(project.config.root), allowlist=comparison,
                         verbose=verbose, pivot=pivot, width=options.width, base=base,
                         bindings=tuple(sorted(merged.items())))


def coverage(config: Config, paths: list[Path] | None) -> tuple[str, ...]:
    """The project-relative prefixes a run over ``paths`` covers ("" = all)."""
    if not paths:
        return ("",)
    out = []
    for p in paths:
        try:
            out.append(Path(os.path.abspath(p)).relative_to(config.root.resolve()).as_posix())
        except ValueError:
            raise UsageError(f"{p} is outside the project root {config.root}") from None
    return tuple("" if c == "." else c for c in out)


def require_allowlist(config: Config) -> list[AllowlistEntry]:
    from ..ratchet.allowlist import load_allowlist

    entries = load_allowlist(config.allowlist_dir, config.root)
    if entries is None:
        raise UsageError(
            f"no allowlist in {config.allowlist}/ (files named *.allowlist); "
            "create it with `alloc-audit allowlist init`",
            str(config.allowlist_dir),
        )
    return entries


def comparison_if_present(config: Config, result: ScanResult) -> Comparison | None:
    from ..ratchet.allowlist import load_allowlist
    from ..ratchet.compare import compare

    if not config.allowlist_dir.is_dir():
        return None
    entries = load_allowlist(config.allowlist_dir, config.root)
    if entries is None:
        return None
    return compare(result.sites, entries, result.scanned_paths)
