"""The interactive review (`alloc-audit audit`), like detect-secrets' audit:
walk the sites that need a decision, ask, and write the answers through
`annotate` (tiers, suppressions) and the allowlist (accepted sites)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config
from ..model import ASSIGNABLE_TIERS, Site, Tier
from ..ratchet.allowlist import AllowlistEntry, load_allowlist, write_allowlist
from ..ratchet.compare import compare
from ..ratchet.keys import site_key
from .annotate import Decision
from .project import Options, load_project, scan_project

TIERS = ASSIGNABLE_TIERS


def candidates(result: Any, entries: list[AllowlistEntry] | None) -> list[Site]:
    covered = compare(result.sites, entries or [], result.scanned_paths).covered_keys if entries is not None else set()
    out = [s for s in result.sites if s.kind.value != "release"
           and (site_key(s) not in covered or s.tier is Tier.UNKNOWN)]
    return sorted(out, key=lambda s: s.sort_key)


def run_audit(config: Config, result: Any, write: Callable[[list[Decision]], list[str]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.prompt import Prompt
    from rich.syntax import Syntax

    console = Console(highlight=False)
    entries = load_allowlist(config.allowlist_dir, config.root)
    todo = candidates(result, entries)
    if not todo:
        console.print("Nothing to review: every site is on the allowlist with a known tier.")
        return
    decisions: list[Decision] = []
    accepted: list[tuple[Site, str, str]] = []
    findings_at: dict[tuple[str, int], list[Any]] = {}
    for f in result.findings:
        if not f.suppressed:
            findings_at.setdefault((f.path, f.line), []).append(f)
    for number, site in enumerate(todo, 1):
        console.rule(escape(f"[{number}/{len(todo)}] {site.path}:{site.span.line}"))
        source = (config.root / site.path).read_text(encoding="utf-8", errors="replace").splitlines()
        first = max(1, site.span.line - 3)
        last = min(len(source), site.span.end_line + 3)
        lexer = "python" if site.path.endswith(".py") else "cpp"
        console.print(Syntax("\n".join(source[first - 1:last]), lexer, line_numbers=True, start_line=first,
                             highlight_lines={site.span.line}, theme="ansi_dark"))
        console.print(escape(f"{site.api} ({site.kind.value}) in {site.scope}"))
        console.print(escape(f"proposed tier: {site.tier.value} — {site.tier_reason}"))
        here = findings_at.get((site.path, site.span.line), [])
        for f in here:
            console.print(escape(f"{f.severity.value} {f.rule}: {f.message}"))
        choice = Prompt.ask(escape("[a]ccept / [t]ier / [s]uppress / s[k]ip / [q]uit"),
                            choices=["a", "t", "s", "k", "q"], default="k", console=console)
        if choice == "q":
            break
        if choice == "k":
            continue
        if choice == "a":
            if site.tier is Tier.UNKNOWN:
                console.print("an unknown tier cannot be accepted: set one with [t]")
                choice = "t"
            else:
                reason = Prompt.ask("reason", console=console, default="reviewed")
                accepted.append((site, reason, site.tier.value))
                continue
        if choice == "t":
            tier = Prompt.ask("tier", choices=list(TIERS), console=console)
            reason = Prompt.ask("reason", console=console)
            decisions.append(Decision(site.path, site.span.line, reason, tier=tier))
            accepted.append((site, reason, tier))
        elif choice == "s":
            rules = [f.rule for f in here] or ["per-call-alloc"]
            rule = Prompt.ask("rule", choices=sorted(set(rules)), default=rules[0], console=console)
            reason = Prompt.ask("reason", console=console)
            decisions.append(Decision(site.path, site.span.line, reason, ignore=(rule,)))
    for line in write(decisions) if decisions else []:
        console.print(f"annotated {line}")
    if accepted:
        _accept(config, result, entries or [], accepted)
        console.print(f"added {len(accepted)} site(s) to the allowlist")


def _accept(config: Config, result: Any, entries: list[AllowlistEntry],
            accepted: list[tuple[Site, str, str]]) -> None:
    counts = Counter(site_key(s) for s in result.sites if s.kind.value != "release")
    by_key = {e.key: e for e in entries}
    for site, reason, tier in accepted:
        key = site_key(site)
        old = by_key.get(key)
        by_key[key] = AllowlistEntry(key[0], key[1], key[2], counts[key], tier,
                                     old.pinned if old else False, (old.reason if old and old.reason else reason),
                                     old.file if old else "", old.line if old else 0)
    write_allowlist(Path(config.allowlist_dir), config.root, list(by_key.values()))


def audit(paths: list[Path] | None, options: Options) -> None:
    """Walk the sites that are not on the allowlist or have an unknown tier, one by one.

    For each: the code, the proposed tier and its reason, and any findings.
    Accept it (onto the allowlist), set its tier, suppress a finding with a
    reason, skip, or quit; decisions are written with `annotate`.

    Example:

      alloc-audit audit src/engine
    """
    from .annotate import apply_decisions

    project = load_project(paths, options.config_path)
    result = scan_project(project, paths, options)
    run_audit(project.config, result, lambda decisions: apply_decisions(project, decisions))
