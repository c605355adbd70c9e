"""The command line (typer): options -> pipeline -> report -> exit code.

Only this module reads argv, prints, and chooses exit codes: 0 clean, 1
findings or gate failure, 2 usage, configuration or input error. Heavy
modules (rich, libcst, the pipeline) are imported inside the commands so that
``--version`` and the pre-commit path start fast.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, TypeVar

import typer

from . import __version__
from .errors import UsageError

if TYPE_CHECKING:
    from .allowlist import Comparison
    from .catalog import Catalog
    from .config import Config
    from .pipeline import ScanResult
    from .report.context import ReportContext

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="alloc-audit",
    help=(
        "Static audit of GPU memory allocation in Python/C++/CUDA engines: a census of every "
        "allocation site with its lifetime tier, hazard rules, and an allowlist that may only shrink."
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
allowlist_app = typer.Typer(help="Create, update and query the allowlist (the ratchet).", no_args_is_help=True)
rules_app = typer.Typer(help="List the rules and read their documentation.", no_args_is_help=True)
app.add_typer(allowlist_app, name="allowlist")
app.add_typer(rules_app, name="rules")


class Format(str, Enum):
    table = "table"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    html = "html"
    github = "github"


class FailOn(str, Enum):
    never = "never"
    warning = "warning"
    error = "error"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"alloc-audit {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Static audit of GPU memory allocation sites.

    Examples:

      alloc-audit scan examples                 # census summary in the terminal

      alloc-audit scan . --format json -o sites.json

      alloc-audit check                         # allowlist + rules; exit 1 on failure
    """


# ---------------------------------------------------------------- shared options

PATHS = typer.Argument(None, help="Files or directories to scan (default: the current directory).",
                       show_default=False)
CONFIG = typer.Option(None, "--config", help="Configuration file (alloc-audit.toml or pyproject.toml).",
                      show_default=False)
JOBS = typer.Option(None, "--jobs", "-j", help="Worker processes (default: the number of CPUs).", show_default=False)
NO_CACHE = typer.Option(False, "--no-cache", help="Neither read nor write the facts cache.")
CACHE_DIR = typer.Option(None, "--cache-dir", help="Cache directory (default: .alloc-audit-cache/ in the root).",
                         show_default=False)
CHANGED = typer.Option(None, "--changed-since", metavar="REF",
                       help="Report only files changed since a git ref (analysis still sees the whole tree).",
                       show_default=False)
DEBUG = typer.Option(False, "--debug", help="Show internal tracebacks for files that fail.")
OUTPUT = typer.Option(None, "--output", "-o", help="Write the report to a file (atomically).", show_default=False)
VERBOSE = typer.Option(False, "--verbose", "-v", help="List every site and finding.")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bar on a terminal for long scans.")


def _fail(exc: UsageError) -> None:
    typer.echo(f"alloc-audit: error: {exc}", err=True)
    raise typer.Exit(2)


def _guard(fn: F) -> F:
    """Turn a UsageError into `path:line: message` on stderr and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            typer.echo("alloc-audit: interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def load_project(paths: list[Path] | None, config_path: Path | None) -> tuple[Config, Catalog]:
    from .catalog import load_catalog
    from .config import find_project, load_config

    if config_path is not None:
        if not config_path.is_file():
            raise UsageError("no such configuration file", str(config_path))
        root, found = config_path.resolve().parent, config_path.resolve()
    else:
        start = Path(os.path.commonpath([os.path.abspath(p) for p in paths])) if paths else Path.cwd()
        root, found = find_project(start)
    config = load_config(root, found)
    return config, load_catalog(config)


def root_display(root: Path) -> str:
    cwd = Path.cwd().resolve()
    root = root.resolve()
    if root == cwd:
        return "."
    try:
        return root.relative_to(cwd).as_posix()
    except ValueError:
        return root.as_posix()


def _color() -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return sys.stdout.isatty()


def _width() -> int | None:
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size((100, 24)).columns
    env = os.environ.get("COLUMNS")
    return int(env) if env and env.isdigit() else None


def run_project_scan(
    config: Config,
    catalog: Catalog,
    paths: list[Path] | None,
    jobs: int | None = None,
    no_cache: bool = False,
    cache_dir: Path | None = None,
    changed_since: str | None = None,
    progress: bool = True,
    debug: bool = False,
    with_rules: bool = True,
) -> ScanResult:
    import logging

    from .pipeline import ScanOptions, run_scan

    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    report_paths = None
    if changed_since is not None:
        from .gitio import changed_since as changed

        report_paths = changed(config.root, changed_since)
    bar = _progress_bar() if progress and sys.stderr.isatty() else None
    try:
        return run_scan(
            config,
            catalog,
            ScanOptions(
                paths=tuple(paths or ()),
                jobs=jobs,
                use_cache=not no_cache,
                cache_dir=cache_dir,
                report_paths=report_paths,
                with_rules=with_rules,
                progress=bar.update if bar else None,
            ),
        )
    finally:
        if bar:
            bar.close()


class _progress_bar:
    """A rich progress bar on stderr that appears only when a scan takes
    longer than a moment (0.5 s), and only on a terminal."""

    def __init__(self) -> None:
        import time

        self._start = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def update(self, done: int, total: int) -> None:
        import time

        if self._progress is None:
            if time.monotonic() - self._start < 0.5 or done >= total:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("scan", total=total)
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def make_context(result: ScanResult, config: Config, comparison: Comparison | None = None, verbose: bool = False,
                 pivot: str = "tier", base: Any = None) -> ReportContext:
    from .report.context import ReportContext

    return ReportContext(result=result, root_display=root_display(config.root), allowlist=comparison,
                         verbose=verbose, pivot=pivot, width=_width(), base=base)


def render(fmt: Format, ctx: ReportContext, command: str = "scan") -> str:
    if fmt is Format.json:
        from .report import json as json_report

        return json_report.render(ctx)
    if fmt is Format.sarif:
        from .report import sarif

        return sarif.render(ctx)
    if fmt is Format.markdown:
        from .report import markdown

        return markdown.render(ctx)
    if fmt is Format.html:
        from .report import html

        return html.render(ctx)
    if fmt is Format.github:
        from .report import github

        return github.render(ctx)
    from .report import terminal

    if command == "report":
        return terminal.render_report(ctx, _color())
    return terminal.render_scan(ctx, _color())


def emit(text: str, output: Path | None, summary: str) -> None:
    """Print a report, or write it atomically and print a one-line summary."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from .cache import atomic_write_bytes

    try:
        atomic_write_bytes(output, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write report: {exc.strerror}", str(output)) from None
    typer.echo(f"{summary}; report written to {output}")


def one_line_summary(result: ScanResult) -> str:
    direct = sum(1 for s in result.sites if s.via is None and s.kind.value != "release")
    derived = sum(1 for s in result.sites if s.via is not None)
    open_findings = [f for f in result.findings if not f.suppressed]
    return (f"alloc-audit: {direct} sites (+{derived} derived) in {result.stats.parsed} of {result.stats.files} files,"
            f" {len(open_findings)} findings, {len(result.errors)} file problems")


def _fails(result: ScanResult, fail_on: FailOn) -> bool:
    if fail_on is FailOn.never:
        return False
    levels = {"error"} if fail_on is FailOn.error else {"error", "warning"}
    return any(f.severity.value in levels and not f.suppressed for f in result.findings)


# ---------------------------------------------------------------- scan


@app.command()
@_guard
def scan(
    paths: Optional[List[Path]] = PATHS,
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    output: Optional[Path] = OUTPUT,
    verbose: bool = VERBOSE,
    fail_on: FailOn = typer.Option(FailOn.never, "--fail-on", help="Exit 1 when findings of this severity remain."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    progress: bool = PROGRESS,
    debug: bool = DEBUG,
) -> None:
    """Census of allocation sites (tier, kind, reason) and hazard findings.

    Examples:

      alloc-audit scan examples

      alloc-audit scan src --format json -o alloc.json

      alloc-audit scan --changed-since origin/main --verbose
    """
    config, catalog = load_project(paths, config_path)
    result = run_project_scan(config, catalog, paths, jobs, no_cache, cache_dir, changed_since, progress, debug)
    comparison = _comparison_if_present(config, result)
    ctx = make_context(result, config, comparison, verbose)
    emit(render(fmt, ctx), output, one_line_summary(result))
    if _fails(result, fail_on):
        raise typer.Exit(1)


def _comparison_if_present(config: Config, result: ScanResult) -> Comparison | None:
    from .allowlist import compare, load_allowlist

    if not config.allowlist_dir.is_dir():
        return None
    entries = load_allowlist(config.allowlist_dir, config.root)
    if entries is None:
        return None
    return compare(result.sites, entries, result.scanned_paths)


# ---------------------------------------------------------------- rules


@rules_app.command("list")
@_guard
def rules_list(config_path: Optional[Path] = CONFIG) -> None:
    """List every rule with its severity, whether it is on, and a summary.

    Example:

      alloc-audit rules list
    """
    from .rules import ALL_RULES, enabled_rules
    from .suppress import META_RULES

    try:
        config, _ = load_project(None, config_path)
        on = {r.name for r in enabled_rules(config)}
        severities = dict(config.severity)
    except UsageError:
        on, severities = {r.name for r in ALL_RULES if r.default_on}, {}
    width = max([len(r.name) for r in (*ALL_RULES, *META_RULES)] or [10])
    for rule in ALL_RULES:
        state = "on " if rule.name in on else "off"
        severity = severities.get(rule.name, rule.severity.value)
        typer.echo(f"{rule.name:<{width}}  {severity:<7}  {state}  {rule.summary}")
    for meta in META_RULES:
        typer.echo(f"{meta.name:<{width}}  {meta.severity.value:<7}  on   {meta.summary}")


@rules_app.command("explain")
@_guard
def rules_explain(name: str = typer.Argument(..., help="Rule name, e.g. alloc-in-capture.")) -> None:
    """Print a rule's documentation: what it flags, why, an example, how to fix and suppress it.

    Example:

      alloc-audit rules explain snapshot-before-construction
    """
    from .rules import ALL_RULES, rule_by_name
    from .suppress import META_RULES

    rule = rule_by_name(name) or next((m for m in META_RULES if m.name == name), None)
    if rule is None:
        known = ", ".join(r.name for r in (*ALL_RULES, *META_RULES))
        raise UsageError(f"unknown rule '{name}'; known rules: {known}")
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(force_terminal=_color(), no_color=not _color(), width=_width() or 100, highlight=False)
    console.print(Markdown(f"# {rule.name} ({rule.severity.value}{'' if rule.default_on else ', off by default'})\n\n"
                           + rule.doc))


def entry() -> None:
    """Console-script entry point."""
    app(prog_name="alloc-audit")
