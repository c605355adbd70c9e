"""The command line (typer): options -> a command -> render -> exit code.

Only this module reads argv, prints and chooses exit codes (0 clean, 1 failed, 2 usage or input error, 130
interrupted; 3, an internal error, is ``__main__.entry``'s). Commands return outcome values; their docstrings
are the help. Heavy modules load inside the commands, so ``--version`` and the pre-commit path start fast."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from . import __version__, report
from .commands import allowlist, annotate, audit, check, gate, join, record, rules, scan
from .commands import report as report_cmd
from .commands.check import CheckFormat, Unchecked
from .commands.outcome import Report, Text, written
from .commands.project import Options
from .errors import UsageError
from .model import FailOn
from .report import Format, JoinFormat, Pivot, tty

app = typer.Typer(
    name="alloc-audit",
    help="Static audit of GPU memory allocation in Python/C++/CUDA engines: a census of every allocation site "
         "with its lifetime tier, hazard rules, and an allowlist that may only shrink.",
    epilog=("Exit codes: 0 clean; 1 findings, check or gate failed; 2 usage, configuration or input error; "
            "3 internal error (a bug in alloc-audit: the message says where to report it)."),
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
allowlist_app = typer.Typer(help="Create, update and query the allowlist (the ratchet).", no_args_is_help=True)
rules_app = typer.Typer(help="List the rules and read their documentation.", no_args_is_help=True)
app.add_typer(allowlist_app, name="allowlist")
app.add_typer(rules_app, name="rules")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"alloc-audit {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """The options before the command (typer shows the app's help, not this)."""


PATHS = typer.Argument(None, help="Files or directories to scan (default: the current directory).", show_default=False)
CONFIG = typer.Option(None, "--config", help="Config file (alloc-audit.toml or pyproject.toml).", show_default=False)
JOBS = typer.Option(None, "--jobs", "-j", min=1, help="Worker processes (1 or more; default: the CPUs).",
                    show_default=False)
NO_CACHE = typer.Option(False, "--no-cache", help="Neither read nor write the facts cache.")
CACHE_DIR = typer.Option(None, "--cache-dir", help="Cache directory (default: .alloc-audit-cache/ in the root).",
                         show_default=False)
CHANGED = typer.Option(None, "--changed-since", metavar="REF", show_default=False,
                       help="Report only files changed since a git ref (analysis still sees the whole tree).")
DEBUG = typer.Option(False, "--debug", help="Show internal tracebacks for files that fail.")
OUTPUT = typer.Option(None, "--output", "-o", help="Write the report to a file (atomically).", show_default=False)
VERBOSE = typer.Option(False, "--verbose", "-v", help="List every site and finding.")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bar on a terminal for long scans.")
FORMAT = typer.Option(None, "--format", "-f", show_default=False, help="table, json, sarif, markdown, html or github.")
UNCHECKED = typer.Option(None, "--unchecked", show_default=False, help="Entries of files not analysed (too large, "
                         "unreadable, a parser failure): fail (default; config 'unchecked') or warn; never pruned.")
ROLE = typer.Option(None, "--role", help="Only this code role: production, test, benchmark, example, tooling.")


def _guard(fn: Callable[..., None]) -> Callable[..., None]:
    """Turn a UsageError into `path:line: message` on stderr and exit 2."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except UsageError as exc:
            typer.echo(f"alloc-audit: error: {exc}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("alloc-audit: interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _options(config_path: Path | None, jobs: int | None = None, no_cache: bool = False, cache_dir: Path | None = None,
             changed_since: str | None = None, progress: bool = False, debug: bool = False) -> Options:
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    bar = tty.ProgressBar() if progress and tty.ProgressBar.wanted() else None
    return Options(config_path=config_path, jobs=jobs, no_cache=no_cache, cache_dir=cache_dir,
                   changed_since=changed_since, progress=bar.update if bar else None, width=tty.width())


def _print(outcome: Text) -> None:
    """Write an outcome; the one exit policy: 130 when interrupted, 1 when failed (usage errors: 2, ``_guard``)."""
    sys.stdout.write(outcome.out)
    sys.stdout.flush()
    sys.stderr.write(outcome.err)
    if outcome.interrupted or outcome.failed:
        raise typer.Exit(130 if outcome.interrupted else 1)


def _emit(outcome: Report, fmt: Format, output: Path | None, command: str) -> None:
    """Print a report, or write it atomically and print a one-line summary."""
    text = report.render(fmt.value, outcome.ctx, command, tty.color())
    _print(written(text, output, outcome.summary, outcome.failed))


@app.command("scan", help=scan.scan.__doc__)
@_guard
def scan_command(
    paths: Optional[List[Path]] = PATHS,
    fmt: Optional[Format] = FORMAT,
    output: Optional[Path] = OUTPUT,
    verbose: bool = VERBOSE,
    fail_on: FailOn = typer.Option(FailOn.NEVER, "--fail-on", help="Exit 1 when findings of this severity remain."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    progress: bool = PROGRESS,
    debug: bool = DEBUG,
    with_rules: bool = typer.Option(True, "--rules/--no-rules", help="Run the hazard rules (--no-rules: census only)."),
    role: Optional[List[str]] = ROLE,
) -> None:
    fmt = report.format_for(fmt, output)  # refused before the scan, not after
    outcome = scan.scan(paths, _options(config_path, jobs, no_cache, cache_dir, changed_since, progress, debug),
                        fail_on, verbose, with_rules, role)
    _emit(outcome, fmt, output, "scan")


@app.command("report", help=report_cmd.report.__doc__)
@_guard
def report_command(
    paths: Optional[List[Path]] = PATHS,
    by: Pivot = typer.Option(Pivot.dir, "--by", help="Pivot the main table by directory, file, tier, rule or API."),
    fmt: Optional[Format] = FORMAT,
    output: Optional[Path] = OUTPUT,
    base: Optional[str] = typer.Option(None, "--base", metavar="REF", show_default=False, help="Also scan REF "
                                       "(through git, no checkout): sites added/removed by tier, findings new/fixed."),
    bind: Optional[List[str]] = typer.Option(None, "--bind", metavar="NAME=VALUE", show_default=False,
                                             help="A value for a size symbol, for estimated bytes "
                                                  "(repeatable; adds to [tool.alloc-audit] bindings)."),
    verbose: bool = VERBOSE,
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    progress: bool = PROGRESS,
    debug: bool = DEBUG,
    role: Optional[List[str]] = ROLE,
) -> None:
    fmt = report.format_for(fmt, output)  # refused before the scan, not after
    options = _options(config_path, jobs, no_cache, cache_dir, changed_since, progress, debug)
    _emit(report_cmd.report(paths, options, by.value, base, bind, verbose, role), fmt, output, "report")


@rules_app.command("list", help=rules.list_rules.__doc__)
@_guard
def rules_list_command(config_path: Optional[Path] = CONFIG) -> None:
    _print(rules.list_rules(config_path))


@rules_app.command("explain", help=rules.explain.__doc__)
@_guard
def rules_explain_command(name: str = typer.Argument(..., help="Rule name, e.g. alloc-in-capture.")) -> None:
    _print(rules.explain(name, tty.color(), tty.width()))


@app.command("check", help=check.check.__doc__)
@_guard
def check_command(
    paths: Optional[List[Path]] = PATHS,
    fmt: CheckFormat = typer.Option(CheckFormat.text, "--format", "-f", help="text, github or json."),
    fail_on: FailOn = typer.Option(FailOn.ERROR, "--fail-on", help="Rule findings of this severity fail the check."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
    changed_since: Optional[str] = CHANGED,
    debug: bool = DEBUG,
    unchecked: Optional[Unchecked] = UNCHECKED,
    staged: bool = typer.Option(False, "--staged", help="Also judge files the staged change deletes or renames."),
) -> None:
    _print(check.check(paths, _options(config_path, jobs, no_cache, cache_dir, changed_since, False, debug), fail_on,
                       fmt.value, unchecked, staged))


@app.command("gate", help=gate.gate.__doc__)
@_guard
def gate_command(
    base: str = typer.Option(..., "--base", metavar="REF", help="The git ref to compare the allowlist with."),
    allow_growth: bool = typer.Option(False, "--allow-growth", help="Pass even if the allowlist grew (prints it)."),
    allow_new_allowlist: bool = typer.Option(False, "--allow-new-allowlist",
                                             help="Pass when the base has no allowlist yet (first introduction)."),
    fmt: CheckFormat = typer.Option(CheckFormat.text, "--format", "-f", help="text, github or json."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
    debug: bool = DEBUG,
    unchecked: Optional[Unchecked] = UNCHECKED,
) -> None:
    options = _options(config_path, jobs, no_cache, cache_dir, None, False, debug)
    _print(gate.gate(base, options, allow_growth, allow_new_allowlist, fmt.value, unchecked))


@allowlist_app.command("init", help=allowlist.init.__doc__)
@_guard
def allowlist_init_command(
    paths: Optional[List[Path]] = typer.Argument(None, help="Record only what is under these.", show_default=False),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing allowlist."),
    split: bool = typer.Option(False, "--split-by-directory", help="One file per top-level directory."),
    findings: bool = typer.Option(True, "--findings/--no-findings", help="Also write the findings baseline."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    options = _options(config_path, jobs, no_cache, cache_dir, progress=True)
    _print(allowlist.init(options, force, split, paths, findings))


@allowlist_app.command("update", help=allowlist.update.__doc__)
@_guard
def allowlist_update_command(
    add_new: bool = typer.Option(False, "--add-new", help="Also add new sites and findings, and raise grown counts."),
    reason: str = typer.Option("", "--reason", help="The reason written on the entries --add-new adds."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; write nothing."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    _print(allowlist.update(_options(config_path, jobs, no_cache, cache_dir, progress=True), add_new, dry_run, reason))


@allowlist_app.command("explain", help=allowlist.explain.__doc__)
@_guard
def allowlist_explain_command(
    what: str = typer.Argument(..., metavar="KEY|PATH:LINE",
                               help="An entry key ('path scope api') or a source location."),
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    _print(allowlist.explain(what, _options(config_path, jobs, no_cache, cache_dir)))


@allowlist_app.command("merge-driver", help=allowlist.merge_driver.__doc__)
@_guard
def allowlist_merge_driver_command(ancestor: Path = typer.Argument(..., metavar="%O"),
                                   ours: Path = typer.Argument(..., metavar="%A"),
                                   theirs: Path = typer.Argument(..., metavar="%B")) -> None:
    _print(allowlist.merge_driver(ancestor, ours, theirs))


@app.command("annotate", help=annotate.annotate.__doc__)
@_guard
def annotate_command(
    site: Optional[str] = typer.Option(None, "--site", metavar="PATH:LINE", help="The site to annotate."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Override the tier: T1, T2, T3, T4, T5a or T5b."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", metavar="RULE", help="Suppress a rule (repeatable)."),
    reason: str = typer.Option("", "--reason", help="Why (required)."),
    decisions: Optional[Path] = typer.Option(None, "--decisions", help="Apply decisions from a JSON or TOML file."),
    config_path: Optional[Path] = CONFIG,
    # --no-cache is accepted like on every scanning command (the files to rewrite are read afresh anyway)
    jobs: Optional[int] = JOBS, no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    _print(annotate.annotate(_options(config_path, jobs, no_cache, cache_dir), site, tier, ignore, reason, decisions))


@app.command("audit", help=audit.audit.__doc__)
@_guard
def audit_command(paths: Optional[List[Path]] = PATHS, config_path: Optional[Path] = CONFIG, jobs: Optional[int] = JOBS,
                  no_cache: bool = NO_CACHE, cache_dir: Optional[Path] = CACHE_DIR) -> None:
    _print(audit.audit(paths, _options(config_path, jobs, no_cache, cache_dir, progress=True)))


@app.command("join", help=join.join_records.__doc__)
@_guard
def join_command(
    args: List[Path] = typer.Argument(..., metavar="SNAPSHOT... [PATHS]", help=(
        "Memory snapshots or native records, then the tree to scan (default: the current project).")),
    fmt: JoinFormat = typer.Option(JoinFormat.table, "--format", "-f", help="Output format."),
    path_map: List[str] = typer.Option([], "--path-map", metavar="OLD=NEW",
                                       help="Rewrite recorded frame paths that start with OLD (repeatable)."),
    min_accounted: Optional[float] = typer.Option(None, "--min-accounted", metavar="PCT",
                                                  help="Exit 1 when less than PCT% of live bytes map to sites."),
    max_snapshot_mb: int = typer.Option(1024, "--max-snapshot-mb", help="Refuse larger records (unpacked)."),
    output: Optional[Path] = OUTPUT,
    config_path: Optional[Path] = CONFIG,
    jobs: Optional[int] = JOBS,
    no_cache: bool = NO_CACHE,
    cache_dir: Optional[Path] = CACHE_DIR,
) -> None:
    outcome = join.join_records(args, _options(config_path, jobs, no_cache, cache_dir), path_map, min_accounted,
                                max_snapshot_mb)
    text = report.render_join(fmt.value, outcome, tty.color(), tty.width())
    _print(written(text, output, "alloc-audit join", outcome.failed))


@app.command("record", help=record.record.__doc__,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record_command(ctx: typer.Context) -> None:
    raise typer.Exit(record.record(list(ctx.args)))
