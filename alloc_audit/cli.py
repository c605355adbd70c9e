"""The command line (typer): options -> pipeline -> report -> exit code.

Only this module reads argv, prints, and chooses exit codes: 0 clean, 1
findings or gate failure, 2 usage, configuration or input error. Heavy
modules (rich, libcst, the pipeline) are imported inside the commands so that
``--version`` and the pre-commit path start fast.
"""

from __future__ import annotations

import os
import re
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


class CheckFormat(str, Enum):
    text = "text"
    github = "github"
    json = "json"


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
JOBS = typer.Option(None, "--jobs", "-j", min=1, help="Worker processes, 1 or more (default: the number of CPUs).",
                    show_default=False)
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
    # never in piped output: both streams must be a terminal
    bar = _progress_bar() if progress and sys.stderr.isatty() and sys.stdout.isatty() else None
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
    longer than a moment (0.5 s; ALLOC_AUDIT_PROGRESS_DELAY overrides it),
    and only on a terminal."""

    def __init__(self) -> None:
        import time

        try:
            self._delay = float(os.environ.get("ALLOC_AUDIT_PROGRESS_DELAY", "0.5"))
        except ValueError:
            self._delay = 0.5
        self._start = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def update(self, done: int, total: int) -> None:
        import time

        if self._progress is None:
            if time.monotonic() - self._start < self._delay or done >= total:
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
                 pivot: str = "tier", base: Any = None,
                 bindings: tuple[tuple[str, int], ...] = ()) -> ReportContext:
    from .report.context import ReportContext

    merged = dict(config.bindings)
    merged.update(bindings)
    return ReportContext(result=result, root_display=root_display(config.root), allowlist=comparison,
                         verbose=verbose, pivot=pivot, width=_width(), base=base,
                         bindings=tuple(sorted(merged.items())))


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


_EXTENSIONS = {".html": Format.html, ".htm": Format.html, ".md": Format.markdown, ".markdown": Format.markdown,
               ".sarif": Format.sarif, ".json": Format.json, ".txt": Format.table}


def output_format(fmt: Format | None, output: Path | None) -> Format:
    """The format asked for, or the one the output file's extension names
    (``report -o report.html``); a contradiction is refused rather than
    writing, say, a terminal table into an .html file."""
    implied = None
    if output is not None:
        name = output.name.lower()
        implied = Format.sarif if name.endswith(".sarif.json") else _EXTENSIONS.get(Path(name).suffix)
    if fmt is None:
        if output is not None and implied is None:
            raise UsageError(f"cannot tell the format from the file name; give --format "
                             f"({', '.join(f.value for f in Format)}) or use one of the extensions "
                             f"{', '.join(sorted(_EXTENSIONS))}", str(output))
        return implied or Format.table
    if implied is not None and implied is not fmt:
        raise UsageError(f"--format {fmt.value} does not match the file's extension, which means {implied.value}; "
                         f"drop --format or rename the file", str(output))
    return fmt


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
    return (f"alloc-audit: {_n(direct, 'site')} (+{derived} derived) in {result.stats.parsed} of "
            f"{_n(result.stats.files, 'file')}, {_n(len(open_findings), 'finding')}, "
            f"{_n(len(result.errors), 'file with problems', 'files with problems')}")


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
    fmt: Optional[Format] = typer.Option(None, "--format", "-f", show_default=False,
                                         help="table (the default), json, sarif, markdown, html or github; "
                                              "with -o FILE, taken from its extension."),
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
    rules: bool = typer.Option(True, "--rules/--no-rules", help="Run the hazard rules (--no-rules: the census only)."),
) -> None:
    """Census of allocation sites (tier, kind, reason) and hazard findings.

    Examples:

      alloc-audit scan examples

      alloc-audit scan src --format json -o alloc.json

      alloc-audit scan --changed-since origin/main --verbose
    """
    fmt = output_format(fmt, output)  # refused before the scan, not after
    config, catalog = load_project(paths, config_path)
    result = run_project_scan(config, catalog, paths, jobs, no_cache, cache_dir, changed_since, progress, debug,
                              with_rules=rules)
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


# ---------------------------------------------------------------- report


class Pivot(str, Enum):
    dir = "dir"
    file = "file"
    tier = "tier"
    rule = "rule"
    api = "api"


@app.command()
@_guard
def report(
    paths: Optional[List[Path]] = PATHS,
    by: Pivot = typer.Option(Pivot.dir, "--by", help="Pivot the main table by directory, file, tier, rule or API."),
    fmt: Optional[Format] = typer.Option(None, "--format", "-f", show_default=False,
                                         help="table (terminal, the default), markdown, html, sarif, github or "
                                              "json; with -o FILE, taken from its extension."),
    output: Optional[Path] = OUTPUT,
    base: Optional[str] = typer.Option(None, "--base", metavar="REF",
                                       help="Also scan REF (through git, no checkout) and show the delta: sites "
                                            "added/removed by tier, findings new/fixed.", show_default=False),
    bind: Optional[List[str]] = typer.Option(None, "--bind", metavar="NAME=VALUE",
                                             help="A value for a size symbol, for estimated bytes "
                                                  "(repeatable; adds to [tool.alloc-audit] bindings).",
                                             show_default=False),
    verbose: bool = VERBOSE,
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    progress: bool = PROGRESS,
    debug: bool = DEBUG,
) -> None:
    """The developer report: totals by tier and kind, top directories, hazards by rule, allowlist status, next steps.

    Examples:

      alloc-audit report examples

      alloc-audit report --by file --bind max_num_tokens=8192 --bind hidden_size=4096

      alloc-audit report --format markdown --base origin/main >> "$GITHUB_STEP_SUMMARY"

      alloc-audit report --format html -o alloc-report.html

      alloc-audit report --format sarif -o alloc-audit.sarif
    """
    from .sizes import parse_binding

    bindings = []
    for text in bind or ():
        try:
            bindings.append(parse_binding(text))
        except ValueError as exc:
            raise UsageError(f"--bind: {exc}") from None
    fmt = output_format(fmt, output)  # refused before the scan, not after
    config, catalog = load_project(paths, config_path)
    result = run_project_scan(config, catalog, paths, jobs, no_cache, cache_dir, changed_since, progress, debug)
    comparison = _comparison_if_present(config, result)
    delta = None
    if base is not None:
        delta = _delta_against(base, config, catalog, paths, result, jobs, no_cache, cache_dir)
    ctx = make_context(result, config, comparison, verbose, by.value, delta, tuple(bindings))
    emit(render(fmt, ctx, "report"), output, one_line_summary(result))


def _delta_against(ref: str, config: Config, catalog: Catalog, paths: list[Path] | None, result: ScanResult,
                   jobs: int | None, no_cache: bool, cache_dir: Path | None) -> Any:
    """Scan the tree at ``ref`` with today's configuration and rules (so the
    delta is the code's change, not the tool's) and compare."""
    import dataclasses
    import tempfile

    from .gitio import export_tree, require_ref
    from .pipeline import ScanOptions, run_scan
    from .report.delta import compute

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
                catalog,
                ScanOptions(paths=tuple(base_paths), jobs=jobs, use_cache=not no_cache,
                            cache_dir=cache_dir or config.root / config.cache_dir),
            )
    return compute(ref, commit, base_result.sites if base_result else (),
                   base_result.findings if base_result else (), result.sites, result.findings)


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
        import difflib

        names = [r.name for r in (*ALL_RULES, *META_RULES)]
        hint = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        if hint:
            raise UsageError(f"unknown rule '{name}'; did you mean '{hint[0]}'? (`alloc-audit rules list` lists them)")
        raise UsageError(f"unknown rule '{name}'; known rules: {', '.join(names)}")
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(force_terminal=_color(), no_color=not _color(), width=_width() or 100, highlight=False)
    console.print(Markdown(f"# {rule.name} ({rule.severity.value}{'' if rule.default_on else ', off by default'})\n\n"
                           + rule.doc))


# ---------------------------------------------------------------- check, gate and the allowlist



def _coverage(config: Config, paths: list[Path] | None) -> tuple[str, ...]:
    if not paths:
        return ("",)
    out = []
    for p in paths:
        try:
            out.append(Path(os.path.abspath(p)).relative_to(config.root.resolve()).as_posix())
        except ValueError:
            raise UsageError(f"{p} is outside the project root {config.root}") from None
    return tuple("" if c == "." else c for c in out)


def _require_allowlist(config: Config) -> list[Any]:
    from .allowlist import load_allowlist

    entries = load_allowlist(config.allowlist_dir, config.root)
    if entries is None:
        raise UsageError(
            f"no allowlist in {config.allowlist}/ (files named *.allowlist); create it with `alloc-audit allowlist init`",
            str(config.allowlist_dir),
        )
    return entries


def _n(count: int, singular: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``: a count with its noun in the right number."""
    return f"{count} {singular if count == 1 else (plural or singular + 's')}"


def _rename_notes(renames: tuple[tuple[str, str], ...], entries: list[Any]) -> list[Any]:
    from .report.checks import Problem

    listed = {e.path for e in entries}
    return [Problem(new, 1, "notice", "renamed file",
                    f"{old} -> {new} holds allowlisted sites: `alloc-audit allowlist update` moves its entries "
                    "(reasons kept)") for old, new in renames if old in listed]


def _judge_findings(config: Config, result: ScanResult, coverage: tuple[str, ...], changed: bool) -> Any:
    """Compare open findings with the findings baseline; None without one."""
    from .allowlist import coverage_test
    from .baseline import compare_findings, load_baseline

    baseline = load_baseline(config.allowlist_dir, config.root)
    if baseline is None:
        return None
    partial = changed or "" not in coverage
    return compare_findings(result.findings, baseline, partial=partial, covers=coverage_test(coverage))


@app.command()
@_guard
def check(
    paths: Optional[List[Path]] = PATHS,
    fmt: CheckFormat = typer.Option(CheckFormat.text, "--format", "-f", help="text, github (workflow commands) or json."),
    fail_on: FailOn = typer.Option(FailOn.error, "--fail-on", help="Rule findings of this severity fail the check."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    debug: bool = DEBUG,
    staged: bool = typer.Option(False, "--staged",
                                help="Also judge the entries of files the staged change deletes or renames "
                                     "(the pre-commit hook; git is asked, as pre-commit passes only files that "
                                     "still exist)."),
) -> None:
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

      alloc-audit check --staged $(git diff --cached --name-only --diff-filter=d)
    """
    from .allowlist import apply_pins, compare
    from .report.checks import allowlist_problems, finding_problems, fixed_debt_problems, render as render_checks

    config, catalog = load_project(paths, config_path)
    entries = _require_allowlist(config)
    gone: list[str] = []
    renames: tuple[tuple[str, str], ...] = ()
    if staged:
        from .gitio import staged_removals

        deleted, renames = staged_removals(config.root)
        gone = sorted(deleted | {old for old, _ in renames})
        if not paths and not gone:
            typer.echo("alloc-audit check: nothing staged to check")
            return
    if staged and not paths:
        from .pipeline import ScanResult, Stats

        # only deletions are staged: nothing to scan, the gone files' entries are judged
        result = ScanResult(root=config.root, sites=(), findings=(), errors=(), stats=Stats(0, 0, 0, 0.0))
    else:
        result = run_project_scan(config, catalog, paths, jobs, no_cache, cache_dir, changed_since, False, debug)
    coverage = (*(_coverage(config, paths) if paths else ()), *gone) if staged else _coverage(config, paths)
    # a run over part of the tree cannot see every factory a derived site calls
    partial = None if "" in coverage else catalog.apis.api_names()
    comparison = compare(result.sites, entries, result.scanned_paths, coverage, partial)
    problems = allowlist_problems(comparison)
    problems += _rename_notes(renames, entries)
    severities = {"error"} if fail_on is FailOn.error else {"error", "warning"}
    # the findings baseline (baseline.py): only findings it does not accept count
    fcomp = _judge_findings(config, result, coverage, changed_since is not None)
    open_findings = fcomp.open_findings() if fcomp is not None else [f for f in result.findings if not f.suppressed]
    findings = [f for f in open_findings if fail_on is not FailOn.never]
    problems += finding_problems(findings, fail_on is FailOn.warning)
    if fcomp is not None and fail_on is not FailOn.never:
        problems += fixed_debt_problems(fcomp)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    failed = any(p.level == "error" for p in problems) or any(
        f.severity.value in severities for f in findings)
    if fmt is CheckFormat.json:
        import dataclasses as _dc
        import json as _json

        from .report.checks import problems_json
        from .report.json import document

        ctx = make_context(_dc.replace(result, sites=apply_pins(result.sites, entries)), config, comparison)
        doc = document(ctx)
        if fcomp is not None:
            doc["baseline"] = fcomp.to_json()
        doc["check"] = {"passed": not failed, "problems": problems_json(problems)}
        sys.stdout.write(_json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render_checks(problems, fmt.value))
        if fmt is CheckFormat.text:
            errors = sum(1 for p in problems if p.level == "error")
            status = "failed" if failed else "passed"
            in_baseline = f" ({fcomp.baselined} in the baseline)" if fcomp is not None else ""
            typer.echo(f"alloc-audit check {status}: {_n(len(comparison.entries), 'allowlist entry', 'allowlist entries')}, "
                       f"{len(comparison.new)} new, {len(comparison.grown)} grown, {len(comparison.loose)} loose, "
                       f"{len(comparison.stale)} stale; {_n(len(findings), 'open rule finding')}{in_baseline}; "
                       f"{_n(errors, 'error')}",
                       err=failed)
    if failed:
        raise typer.Exit(1)


@app.command()
@_guard
def gate(
    base: str = typer.Option(..., "--base", metavar="REF", help="The git ref to compare the allowlist with."),
    allow_growth: bool = typer.Option(False, "--allow-growth", help="Pass even if the allowlist grew (prints it)."),
    allow_new_allowlist: bool = typer.Option(False, "--allow-new-allowlist",
                                             help="Pass when the base has no allowlist yet (first introduction)."),
    fmt: CheckFormat = typer.Option(CheckFormat.text, "--format", "-f",
                                    help="text, github (workflow commands) or json."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
    debug: bool = DEBUG,
) -> None:
    """CI gate: fail if the allowlist grew since --base, listing what grew and the sites that need it.

    Reads the allowlist at REF through git (no checkout) and compares it
    with the working tree's: an added entry or a raised count fails; an
    entry that moved with a renamed file does not. Then runs `check` on the
    whole project. Run it on the merge result too: two green branches can
    merge into a red one without any textual conflict.

    Examples:

      alloc-audit gate --base origin/main

      alloc-audit gate --base HEAD~1 --format github
    """
    from .allowlist import compare, compare_allowlists, load_texts
    from .baseline import FILE_NAME, baseline_growth, load_baseline, parse_baseline
    from .gitio import list_tree, require_ref, show
    from .keys import site_key
    from .report.checks import (allowlist_problems, baseline_growth_problems, finding_problems, fixed_debt_problems,
                                gate_problems, problems_json, render as render_checks)

    config, catalog = load_project(None, config_path)
    require_ref(config.root, base)
    names = [n for n in list_tree(config.root, base, config.allowlist) if n.endswith(".allowlist")
             and not Path(n).name.startswith(".")]
    now_entries = _require_allowlist(config)
    out: list[str] = []
    problems = []
    grew = False
    if not names:
        message = (f"there is no allowlist under {config.allowlist}/ at {base}: this change introduces it "
                   f"({_n(len(now_entries), 'entry', 'entries')})")
        if not allow_new_allowlist:
            typer.echo(f"alloc-audit gate: {message}; pass --allow-new-allowlist to accept the introduction",
                       err=True)
            raise typer.Exit(1)
        out.append(f"alloc-audit gate: {message}; accepted (--allow-new-allowlist)\n")
        result = None
    else:
        texts = []
        for name in names:
            blob = show(config.root, base, name)
            texts.append((f"{base}:{name}", (blob or b"").decode("utf-8", "replace")))
        try:
            base_entries = load_texts(texts)
        except UsageError as exc:
            raise UsageError(f"the allowlist at {base} cannot be read: {exc}") from None
        result = compare_allowlists(base_entries, now_entries)
    # the findings baseline may only shrink too (absent at the base: an introduction, like the allowlist's)
    now_baseline = load_baseline(config.allowlist_dir, config.root)
    baseline_grown: list[Any] = []
    baseline_moved: list[Any] = []
    if now_baseline is not None and names:
        base_name = Path(config.allowlist, FILE_NAME).as_posix()
        blob = show(config.root, base, base_name)
        try:
            then = parse_baseline(blob.decode("utf-8", "replace"), f"{base}:{base_name}") if blob is not None else []
        except UsageError as exc:
            raise UsageError(f"the findings baseline at {base} cannot be read: {exc}") from None
        baseline_grown, baseline_moved = baseline_growth(then, now_baseline)
        problems += baseline_growth_problems(baseline_grown, baseline_moved, allow_growth)
    scan = run_project_scan(config, catalog, None, jobs, no_cache, cache_dir, None, False, debug)
    if result is not None:
        sites_by_key: dict[tuple[str, str, str], list[Any]] = {}
        for site in scan.sites:
            sites_by_key.setdefault(site_key(site), []).append(site)
        problems += gate_problems(result, sites_by_key, allow_growth)
        grew = result.failed
    grew = grew or bool(baseline_grown)
    comparison = compare(scan.sites, now_entries, scan.scanned_paths, ("",))
    problems += allowlist_problems(comparison)
    fcomp = _judge_findings(config, scan, ("",), False)
    open_findings = fcomp.open_findings() if fcomp is not None else [f for f in scan.findings if not f.suppressed]
    findings = [f for f in open_findings if f.severity.value == "error"]
    problems += finding_problems(findings, False)
    if fcomp is not None:
        problems += fixed_debt_problems(fcomp)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    check_failed = comparison.failed or bool(findings) or bool(fcomp is not None and fcomp.fixed)
    failed = (grew and not allow_growth) or check_failed
    if fmt is CheckFormat.json:
        import json as _json

        doc = {
            "schema": "alloc-audit-gate/1",
            "base": base,
            "passed": not failed,
            "allowlist_grew": bool(result is not None and result.failed),
            "baseline_grew": bool(baseline_grown),
            "check_passed": not check_failed,
            "counts": None if result is None else {"grown": len(result.grown), "lowered": len(result.shrunk),
                                                   "removed": len(result.removed), "moved": len(result.moved)},
            "problems": problems_json(problems),
        }
        sys.stdout.write(_json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        if failed:
            raise typer.Exit(1)
        return
    sys.stdout.write("".join(out) + render_checks(problems, fmt.value))
    if fmt is CheckFormat.text:
        if result is not None:
            summary = (f"alloc-audit gate against {base}: {len(result.grown)} grown, {len(result.shrunk)} lowered, "
                       f"{len(result.removed)} removed, {len(result.moved)} moved")
            if now_baseline is not None:
                summary += f"; findings baseline: {len(baseline_grown)} grown"
            if grew and allow_growth:
                summary += " — growth let through by --allow-growth"
            typer.echo(summary)
        typer.echo(f"alloc-audit check: {'failed' if check_failed else 'passed'}")
    if failed:
        raise typer.Exit(1)


@allowlist_app.command("init")
@_guard
def allowlist_init(
    paths: Optional[List[Path]] = PATHS,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing allowlist."),
    split: bool = typer.Option(False, "--split-by-directory",
                               help="One file per top-level directory, to keep merges apart."),
    findings: bool = typer.Option(True, "--findings/--no-findings",
                                  help="Also record today's rule findings in the findings baseline."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    """Write the allowlist from the current tree (every site, with its tier),
    and the findings baseline (the hazards that exist today).

    With PATHS only the sites and findings under them are recorded (the rest
    of the tree is still analysed). Afterwards `check` fails only on what is
    new: sites not on the allowlist, findings not in the baseline.

    Examples:

      alloc-audit allowlist init && git add allowlists/

      alloc-audit allowlist init src          # leave tests/ and benchmarks/ out
    """
    from .allowlist import AllowlistEntry, _tier_of, allowlist_files, coverage_test, write_allowlist
    from .baseline import baseline_path, entries_from, write_baseline
    from .keys import site_key

    config, catalog = load_project(paths, config_path)
    existing = allowlist_files(config.allowlist_dir)
    if baseline_path(config.allowlist_dir).is_file() and findings:
        existing.append(baseline_path(config.allowlist_dir))
    if existing and not force:
        raise UsageError(f"an allowlist already exists ({', '.join(p.name for p in existing)}); use "
                         "`alloc-audit allowlist update`, or --force to start over", str(config.allowlist_dir))
    result = run_project_scan(config, catalog, None, jobs, no_cache, cache_dir, None, True, False)
    covers = coverage_test(_coverage(config, paths))
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for site in result.sites:
        if site.kind.value != "release" and covers(site.path):
            groups.setdefault(site_key(site), []).append(site)
    entries = [AllowlistEntry(k[0], k[1], k[2], len(v), _tier_of(v)) for k, v in sorted(groups.items())]
    baseline = entries_from(f for f in result.findings if covers(f.path)) if findings else []
    if force:
        for path in existing:
            path.unlink()
    written = write_allowlist(config.allowlist_dir, config.root, entries, split_top_level=split)
    if findings:
        name = write_baseline(config.allowlist_dir, config.root, baseline)
        written += [name] if name else []
    sites = sum(e.count for e in entries)
    recorded = sum(e.count for e in baseline)
    typer.echo(f"alloc-audit: wrote {_n(len(entries), 'entry', 'entries')} ({_n(sites, 'site')})"
               + (f" and a findings baseline of {_n(recorded, 'finding')}" if findings else "")
               + f" to {', '.join(written) or 'nothing'}")
    hint = _tests_hint([e.path for e in entries for _ in range(e.count)])
    if hint:
        typer.echo(hint)


_NOT_PRODUCTION = re.compile(r"(^|/)(tests?|testing|benchmarks?|bench)(/|$)|(^|/)(test_[^/]*|[^/]*_test\.[^/]*"
                             r"|bench_[^/]*)$")


def _tests_hint(paths: list[str]) -> str | None:
    """Most allowlists of real libraries are mostly tests and benchmarks:
    say so once, with the way to leave them out."""
    if not paths:
        return None
    tops = sorted({m.group(2) for p in paths if (m := _NOT_PRODUCTION.search(p)) and m.group(2)})
    share = sum(1 for p in paths if _NOT_PRODUCTION.search(p)) / len(paths)
    if share < 0.2:
        return None
    dirs = ", ".join(f'"**/{t}/**"' for t in tops) or '"**/test_*.py"'
    return (f"hint: {share:.0%} of these sites are in tests or benchmarks; to keep them out of the allowlist, add "
            f"exclude = [{dirs}] to [tool.alloc-audit] (or pass the production paths: "
            "`alloc-audit allowlist init --force src`)")


@allowlist_app.command("update")
@_guard
def allowlist_update(
    add_new: bool = typer.Option(False, "--add-new", help="Also add new sites and findings, and raise grown counts."),
    reason: str = typer.Option("", "--reason", help="The reason written on entries --add-new adds."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; write nothing."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    """Rewrite the allowlist from the tree: prune stale entries, lower counts, keep reasons and pins.

    The findings baseline is brought up to date the same way (fixed findings
    pruned). Adds nothing unless --add-new is given. A renamed file's entries
    move with it (never above their old counts). Prints what changed.

    Examples:

      alloc-audit allowlist update

      alloc-audit allowlist update --add-new --reason "staging buffer, freed after load"

      alloc-audit allowlist update --add-new --dry-run
    """
    import dataclasses

    from .allowlist import compare, plan_update, write_allowlist
    from .baseline import compare_findings, load_baseline, plan_baseline_update, write_baseline

    config, catalog = load_project(None, config_path)
    entries = _require_allowlist(config)
    if reason and not add_new:
        raise UsageError("--reason is written on the entries --add-new adds; give --add-new too")
    result = run_project_scan(config, catalog, None, jobs, no_cache, cache_dir, None, True, False)
    plan = plan_update(compare(result.sites, entries, result.scanned_paths, ("",)), add_new)
    if reason:
        added = {e.key for e in plan.added}
        plan = dataclasses.replace(
            plan, entries=tuple(dataclasses.replace(e, reason=e.reason or reason) if e.key in added else e
                                for e in plan.entries),
            added=tuple(dataclasses.replace(e, reason=reason) for e in plan.added))
    lines = _update_summary(plan)
    baseline = load_baseline(config.allowlist_dir, config.root)
    bplan = None
    if baseline is not None:
        bplan = plan_baseline_update(compare_findings(result.findings, baseline), add_new, reason)
        lines += _baseline_update_summary(bplan)
    if dry_run:
        typer.echo("".join(lines) + "alloc-audit: dry run, nothing written")
        return
    written = write_allowlist(config.allowlist_dir, config.root, plan.entries)
    if bplan is not None:
        name = write_baseline(config.allowlist_dir, config.root, bplan.entries)
        written += [name] if name else []
    typer.echo("".join(lines) + (f"alloc-audit: wrote {', '.join(written)}" if written else
                                 "alloc-audit: the allowlist is up to date"))


def _baseline_update_summary(plan: Any) -> list[str]:
    from .baseline import key_display

    out = []
    for e in plan.removed:
        out.append(f"- fixed    {key_display(e.key)} (the finding is gone: debt paid)\n")
    for e, left in plan.lowered:
        if left:
            out.append(f"- lowered  {key_display(e.key)} x{e.count} -> x{left} (findings fixed)\n")
    for e in plan.added:
        out.append(f"+ accepted {key_display(e.key)} x{e.count} (finding)\n")
    for key, found in plan.not_added:
        out.append(f"! finding  {key_display(key)} x{found} not accepted (use --add-new to accept)\n")
    return out


def _update_summary(plan: Any) -> list[str]:
    from .keys import key_text

    out = []
    for e in plan.removed:
        out.append(f"- removed  {key_text(e.key)} (matches nothing)\n")
    for old, new in plan.lowered:
        out.append(f"- lowered  {key_text(old.key)} x{old.count} -> x{new.count}\n")
    for old, new in plan.retiered:
        out.append(f"~ retiered {key_text(old.key)} {old.tier} -> {new.tier}\n")
    for rename in plan.renamed:
        out.append(f"> renamed  {rename.old} -> {rename.new} ({_n(len(rename.keys), 'entry', 'entries')}, reasons kept)\n")
    for e in plan.added:
        out.append(f"+ added    {key_text(e.key)} x{e.count} {e.tier}\n")
    for e, found in plan.still_grown:
        out.append(f"! grown    {key_text(e.key)} accepts {e.count}, the code has {found} (use --add-new to accept)\n")
    for key, found in plan.not_added:
        out.append(f"! new      {key_text(key)} x{found} not added (use --add-new to accept)\n")
    return out


@allowlist_app.command("explain")
@_guard
def allowlist_explain(
    what: str = typer.Argument(..., metavar="KEY|PATH:LINE",
                               help="An entry key ('path scope api') or a source location."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    """Show which entry covers a site, or which sites an entry covers.

    Examples:

      alloc-audit allowlist explain examples/minigen/worker.py:28

      alloc-audit allowlist explain "examples/minigen/kv_cache.py KVCachePool.__init__ torch.zeros"
    """
    from .keys import key_text, parse_key, site_key
    from .report.checks import entry_line

    config, catalog = load_project(None, config_path)
    entries = _require_allowlist(config)
    result = run_project_scan(config, catalog, None, jobs, no_cache, cache_dir, None, False, False)
    by_key = {e.key: e for e in entries}
    location = re.fullmatch(r"(.+):(\d+)", what.strip())
    if location and parse_key(what) is None:
        path = location.group(1).replace("\\", "/")
        line = int(location.group(2))
        hits = [s for s in result.sites if s.path == path and s.span.line <= line <= s.span.end_line]
        if not hits:
            raise UsageError(f"no allocation site at {path}:{line}")
        for site in hits:
            key = site_key(site)
            siblings = [s for s in result.sites if site_key(s) == key]
            entry = by_key.get(key)
            typer.echo(f"{site.path}:{site.span.line}: {site.api} in {site.scope} ({site.tier.value}: {site.tier_reason})")
            typer.echo(f"  key: {key_text(key)}")
            if entry is None:
                typer.echo("  not on the allowlist (a new site)")
            else:
                state = "ok" if entry.count == len(siblings) else f"the code has {len(siblings)}"
                typer.echo(f"  covered by {entry_line(entry)}  ({state})")
            if len(siblings) > 1:
                typer.echo(f"  the key's sites: lines {', '.join(str(s.span.line) for s in siblings)}")
        return
    key = parse_key(what)
    if key is None:
        raise UsageError(f"{what!r} is neither 'path scope api' nor PATH:LINE")
    entry = by_key.get(key)
    sites = [s for s in result.sites if site_key(s) == key]
    typer.echo(f"{key_text(key)}: " + (entry_line(entry) if entry else "no allowlist entry"))
    for site in sites:
        typer.echo(f"  {site.path}:{site.span.line}: {site.api} ({site.tier.value}: {site.tier_reason})")
    if not sites:
        typer.echo("  no site matches it (stale)" if entry else "  no site has this key")


@allowlist_app.command("merge-driver")
@_guard
def allowlist_merge_driver(
    ancestor: Path = typer.Argument(..., metavar="%O"),
    ours: Path = typer.Argument(..., metavar="%A"),
    theirs: Path = typer.Argument(..., metavar="%B"),
) -> None:
    """A git merge driver that resolves allowlist conflicts fail-closed.

    Per key the smaller count wins, an entry deleted on either side stays
    deleted, reasons are kept. Set it up once per clone:

      git config merge.alloc-audit.driver "alloc-audit allowlist merge-driver %O %A %B"

    and in .gitattributes:

      allowlists/*.allowlist merge=alloc-audit
    """
    from .allowlist import merge_entries, parse_allowlist, render_file
    from .cache import atomic_write_bytes

    def read(path: Path, label: str) -> list[Any]:
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {label} version: {exc}", str(path)) from None
        return parse_allowlist(text, f"{label} ({path})")

    try:
        merged = merge_entries(read(ancestor, "base"), read(ours, "ours"), read(theirs, "theirs"))
    except UsageError as exc:
        # leave %A as it is: git reports a conflict for a hand merge
        typer.echo(f"alloc-audit merge-driver: {exc}", err=True)
        raise typer.Exit(1) from None
    atomic_write_bytes(ours, render_file(merged).encode("utf-8"))



# ---------------------------------------------------------------- annotate and audit


def _apply_decisions(config: Config, catalog: Catalog, decisions: list[Any], jobs: int | None = None,
                     cache_dir: Path | None = None) -> list[str]:
    """Write decisions into the sources; returns what was written."""
    from .annotate import Edit, apply_edits, validate
    from .discover import language_of
    from .rules import known_rule_names

    known = known_rule_names()
    for decision in decisions:
        validate(decision, known)
    files = sorted({d.path for d in decisions})
    for rel in files:
        if not (config.root / rel).is_file():
            raise UsageError(f"no such file in the project: {rel}")
    # the files about to be rewritten are read afresh: never from the cache
    result = run_project_scan(config, catalog, [config.root / f for f in files], jobs, True, cache_dir, None, False,
                              False)
    by_file: dict[str, list[Edit]] = {}
    written: list[str] = []
    for d in decisions:
        covering = [s for s in result.sites if s.path == d.path and s.stmt_line <= d.line <= s.span.end_line]
        finding = next((f for f in result.findings if f.path == d.path and f.line == d.line), None)
        line = covering[0].stmt_line if covering else (finding.stmt_line if finding else d.line)
        by_file.setdefault(d.path, []).append(Edit(line, d.comment_body(), d.kind, d.ignore))
        written.append(f"{d.path}:{line}: # {d.comment_body()}")
    for rel, edits in sorted(by_file.items()):
        lang = language_of(rel)
        apply_edits(config.root / rel, "python" if lang is not None and lang.value == "python" else "native", edits)
    return written


@app.command()
@_guard
def annotate(
    site: Optional[str] = typer.Option(None, "--site", metavar="PATH:LINE", help="The site to annotate."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Override the tier: T1, T2, T3, T4, T5a or T5b."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", metavar="RULE", help="Suppress a rule (repeatable)."),
    reason: str = typer.Option("", "--reason", help="Why (required)."),
    decisions: Optional[Path] = typer.Option(None, "--decisions", help="Apply decisions from a JSON or TOML file."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,  # the files to rewrite are read afresh anyway: accepted like every scanning command
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    """Write a tier override or a suppression, with its reason, into the source above a site.

    Python is rewritten with libcst (formatting and encoding kept); C++/CUDA
    gets a // line at the statement's indentation.

    Examples:

      alloc-audit annotate --site src/kv.py:42 --tier T3 --reason "pooled KV blocks"

      alloc-audit annotate --site src/ops.cu:88 --ignore grow-on-demand --reason "warm-up only"

      alloc-audit annotate --decisions decisions.json
    """
    from .annotate import load_decisions, parse_decision

    config, catalog = load_project(None, config_path)
    items = []
    if decisions is not None:
        items += load_decisions(decisions)
    if site is not None:
        items.append(parse_decision(site, reason, tier, list(ignore or ())))
    if not items:
        raise UsageError("nothing to do: give --site with --tier or --ignore and --reason, or --decisions FILE")
    for line in _apply_decisions(config, catalog, items, jobs, cache_dir):
        typer.echo(f"annotated {line}")


@app.command()
@_guard
def audit(
    paths: Optional[List[Path]] = PATHS,
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    """Walk the sites that are not on the allowlist or have an unknown tier, one by one.

    For each: the code, the proposed tier and its reason, and any findings.
    Accept it (onto the allowlist), set its tier, suppress a finding with a
    reason, skip, or quit. Each decision is saved as it is made (tiers and
    suppressions with `annotate`); a blank reason asks again; Ctrl-C stops
    and keeps what is saved. Needs a terminal.

    Example:

      alloc-audit audit src/engine
    """
    from .audit import run_audit

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("audit asks a question per site and needs a terminal (stdin and stdout are not both one); "
                         "in scripts, write decisions with `alloc-audit annotate --decisions FILE` or accept sites "
                         "with `alloc-audit allowlist update --add-new --reason \"...\"`")
    config, catalog = load_project(paths, config_path)
    result = run_project_scan(config, catalog, paths, jobs, no_cache, cache_dir, None, True, False)
    outcome = run_audit(config, result, lambda decisions: _apply_decisions(config, catalog, decisions, jobs, cache_dir))
    saved = _n(len(outcome.written), "decision")
    if outcome.interrupted:
        typer.echo(f"\nalloc-audit audit: interrupted after {outcome.reviewed} of {_n(outcome.total, 'site')}; "
                   f"{saved} already saved and kept", err=True)
        raise typer.Exit(130)
    if outcome.total:
        typer.echo(f"alloc-audit audit: reviewed {outcome.reviewed} of {_n(outcome.total, 'site')}; {saved} saved")


def entry() -> None:
    """Console-script entry point."""
    app(prog_name="alloc-audit")

