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

    for path in paths or ():
        try:
            os.stat(path)
        except FileNotFoundError:
            pass  # a dangling link or a missing path: discovery names it
        except OSError as exc:  # a symlink loop, a path through a file, no permission
            raise UsageError(f"cannot read: {exc.strerror}", str(path)) from None
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
    return compare(result.sites, entries, result.scanned_paths, ("",), None, unanalysed(result))


def unanalysed(result: ScanResult) -> dict[str, str]:
    """Files whose sites are unknown, with the reason: their allowlist
    entries are "not checked" (never stale, never pruned)."""
    out: dict[str, str] = {}
    for problem in result.unchecked:
        out.setdefault(problem.path, problem.message)
    return out


def fails_unchecked(config: Config, option: str | None) -> bool:
    """Whether entries not checked fail check/gate: --unchecked, else the
    configuration's ``unchecked`` (default "fail")."""
    return (option or config.unchecked) == "fail"


def file_counts(result: ScanResult) -> str:
    """The file problems for a summary line: a skipped file must never look
    like a file without sites."""
    missing = len({e.path for e in result.unchecked})
    partly = len({e.path for e in result.errors}) - missing
    from ..report.words import plural

    parts = []
    if missing:
        parts.append(f"{plural(missing, 'file')} not analysed (listed above)")
    if partly > 0:
        parts.append(f"{plural(partly, 'file with problems', 'files with problems')} (`alloc-audit scan --format json` "
                     "lists them)")
    return "; " + ", ".join(parts) if parts else ""


def only_roles(result: ScanResult, roles: list[str] | None) -> ScanResult:
    """The result narrowed to the given code roles (`--role`); unchanged without."""
    if not roles:
        return result
    import dataclasses

    from ..model import ROLES

    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise UsageError(f"--role: unknown role {unknown[0]!r}; use one of {', '.join(ROLES)}")
    wanted = set(roles)
    return dataclasses.replace(result, sites=tuple(s for s in result.sites if s.role in wanted),
                               findings=tuple(f for f in result.findings if f.role in wanted))
