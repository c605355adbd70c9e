"""The interactive review (`alloc-audit audit`), like detect-secrets' audit:
walk the sites that need a decision, ask, and write the answers through
`annotate` (tiers, suppressions) and the allowlist (accepted sites)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config
from ..model import ASSIGNABLE_TIERS, Site, Tier
from ..ratchet.allowlist import AllowlistEntry, load_allowlist, write_allowlist
from ..ratchet.compare import compare
from ..ratchet.keys import site_key
from .annotate import Decision
from .outcome import Text
from .project import Options, load_project, scan_project

TIERS = ASSIGNABLE_TIERS


def candidates(result: Any, entries: list[AllowlistEntry] | None) -> list[Site]:
    covered = compare(result.sites, entries or [], result.scanned_paths).covered_keys if entries is not None else set()
    out = [s for s in result.sites if s.kind.value != "release"
           and (site_key(s) not in covered or s.tier is Tier.UNKNOWN)]
    return sorted(out, key=lambda s: s.sort_key)


@dataclass
class AuditOutcome:
    """What the walk did; every decision in it is already written."""

    written: list[str] = field(default_factory=list)  # one line per decision, as shown
    reviewed: int = 0
    total: int = 0
    interrupted: bool = False


def run_audit(config: Config, result: Any, write: Callable[[list[Decision]], list[str]]) -> AuditOutcome:
    """Walk the sites, writing each decision as it is made (a later Ctrl-C or
    crash loses nothing already decided). A blank reason asks again; Ctrl-C
    or end of input stops the walk and says what was kept."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    entries = load_allowlist(config.allowlist_dir, config.root)
    todo = candidates(result, entries)
    outcome = AuditOutcome(total=len(todo))
    if not todo:
        console.print("Nothing to review: every site is on the allowlist with a known tier.")
        return outcome
    findings_at: dict[tuple[str, int], list[Any]] = {}
    for f in result.findings:
        if not f.suppressed:
            findings_at.setdefault((f.path, f.line), []).append(f)
    shifts: dict[str, list[tuple[int, int]]] = {}  # lines added to a file by our own annotations, and where
    try:
        for number, site in enumerate(todo, 1):
            line = site.span.line + sum(n for at, n in shifts.get(site.path, ()) if at <= site.stmt_line)
            _show(console, config, site, line, number, len(todo), findings_at.get((site.path, site.span.line), []))
            choice = _ask(console, escape("[a]ccept / [t]ier / [s]uppress / s[k]ip / [q]uit"),
                          ["a", "t", "s", "k", "q"], "k")
            if choice == "q":
                break
            outcome.reviewed += 1
            if choice == "k":
                continue
            if choice == "a" and site.tier is Tier.UNKNOWN:
                console.print("an unknown tier cannot be accepted: set one with [t]")
                choice = "t"
            if choice == "a":
                reason = _ask_reason(console)
                _accept(config, result, site, reason, site.tier.value)
                outcome.written.append(f"accepted {site.path}:{line} {site.api} in {site.scope} ({site.tier.value})")
                console.print(escape(f"saved: {outcome.written[-1]}"))
                continue
            before = _line_count(config.root / site.path)
            if choice == "t":
                tier = _ask(console, "tier", list(TIERS), None)
                reason = _ask_reason(console)
                done = write([Decision(site.path, line, reason, tier=tier)])
                _accept(config, result, site, reason, tier)
            else:
                here = findings_at.get((site.path, site.span.line), [])
                rules = sorted({f.rule for f in here}) or ["per-call-alloc"]
                rule = _ask(console, "rule", rules, rules[0])
                reason = _ask_reason(console)
                done = write([Decision(site.path, line, reason, ignore=(rule,))])
            added = _line_count(config.root / site.path) - before
            if added:
                shifts.setdefault(site.path, []).append((site.stmt_line, added))
            outcome.written += [f"annotated {d}" for d in done]
            for d in done:
                console.print(escape(f"saved: annotated {d}"))
    except (KeyboardInterrupt, EOFError):
        outcome.interrupted = True
    return outcome


def _show(console: Any, config: Config, site: Site, line: int, number: int, total: int, here: list[Any]) -> None:
    from rich.markup import escape
    from rich.syntax import Syntax

    console.rule(escape(f"[{number}/{total}] {site.path}:{line}"))
    source = (config.root / site.path).read_text(encoding="utf-8", errors="replace").splitlines()
    first = max(1, line - 3)
    last = min(len(source), line + (site.span.end_line - site.span.line) + 3)
    lexer = "python" if site.path.endswith(".py") else "cpp"
    console.print(Syntax("\n".join(source[first - 1:last]), lexer, line_numbers=True, start_line=first,
                         highlight_lines={line}, theme="ansi_dark"))
    console.print(escape(f"{site.api} ({site.kind.value}) in {site.scope}"))
    console.print(escape(f"proposed tier: {site.tier.value} — {site.tier_reason}"))
    for f in here:
        console.print(escape(f"{f.severity.value} {f.rule}: {f.message}"))


def _ask(console: Any, prompt: str, choices: list[str], default: str | None) -> str:
    from rich.prompt import Prompt

    if default is None:
        return str(Prompt.ask(prompt, choices=choices, console=console))
    return str(Prompt.ask(prompt, choices=choices, default=default, console=console))


def _ask_reason(console: Any) -> str:
    """A reason is required: a blank answer asks again (it never aborts)."""
    from rich.prompt import Prompt

    while True:
        reason = str(Prompt.ask("reason", console=console, default="", show_default=False)).strip()
        if reason:
            return reason
        console.print("a reason is required (why this site is acceptable); Ctrl-C stops the walk and keeps "
                      "what is saved")


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _accept(config: Config, result: Any, site: Site, reason: str, tier: str) -> None:
    """Put the site's key on the allowlist now (read again each time: the
    walk writes as it goes), keeping an existing entry's reason and pin."""
    entries = load_allowlist(config.allowlist_dir, config.root) or []
    counts = Counter(site_key(s) for s in result.sites if s.kind.value != "release")
    by_key = {e.key: e for e in entries}
    key = site_key(site)
    old = by_key.get(key)
    by_key[key] = AllowlistEntry(key[0], key[1], key[2], counts[key], tier,
                                 old.pinned if old else False, (old.reason if old and old.reason else reason),
                                 old.file if old else "", old.line if old else 0)
    write_allowlist(Path(config.allowlist_dir), config.root, list(by_key.values()))


def audit(paths: list[Path] | None, options: Options) -> Text:
    """Walk the sites that are not on the allowlist or have an unknown tier, one by one.

    For each: the code, the proposed tier and its reason, and any findings.
    Accept it (onto the allowlist), set its tier, suppress a finding with a
    reason, skip, or quit. Each decision is saved as it is made (tiers and
    suppressions with `annotate`); a blank reason asks again; Ctrl-C stops
    and keeps what is saved. Needs a terminal.

    Example:

      alloc-audit audit src/engine
    """
    import sys

    from ..errors import UsageError
    from ..report.words import plural
    from .annotate import apply_decisions

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("audit asks a question per site and needs a terminal (stdin and stdout are not both one); "
                         "in scripts, write decisions with `alloc-audit annotate --decisions FILE` or accept sites "
                         "with `alloc-audit allowlist update --add-new --reason \"...\"`")
    project = load_project(paths, options.config_path)
    result = scan_project(project, paths, options)
    outcome = run_audit(project.config, result, lambda decisions: apply_decisions(project, decisions, options))
    saved = plural(len(outcome.written), "decision")
    of = f"{outcome.reviewed} of {plural(outcome.total, 'site')}"
    if outcome.interrupted:
        return Text(err=f"\nalloc-audit audit: interrupted after {of}; {saved} already saved and kept\n",
                    interrupted=True)
    if not outcome.total:
        return Text()
    return Text(f"alloc-audit audit: reviewed {outcome.reviewed} of {plural(outcome.total, 'site')}; {saved} saved\n")
