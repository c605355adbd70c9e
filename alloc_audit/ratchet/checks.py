"""Rendering the outcome of `check` and `gate`: one line per failure, naming
the file, line, scope and api, and saying what to do. Plain text (what
pre-commit shows) or GitHub workflow commands."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model import FileError, Finding, Severity, Site
from .allowlist import AllowlistEntry
from .baseline import BaselineEntry, BaselineGrowth, FindingsComparison, key_display
from .compare import Comparison
from .gate import GateResult
from .keys import key_text

UPDATE = "alloc-audit allowlist update"


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    level: str  # "error" | "warning" | "notice"
    title: str
    message: str

    def text(self) -> str:
        return f"{self.path}:{self.line}: {self.level}: {self.title}: {self.message}"

    def github(self) -> str:
        command = {"error": "error", "warning": "warning"}.get(self.level, "notice")
        where = f"file={_escape_property(self.path)},line={self.line},title={_escape_property(self.title)}"
        return f"::{command} {where}::{_escape_data(self.message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _lines(sites: Iterable[Site]) -> str:
    """'line 7' or 'lines 7, 9'."""
    numbers = [str(s.span.line) for s in sites]
    return ("line " if len(numbers) == 1 else "lines ") + ", ".join(numbers)


def allowlist_problems(comparison: Comparison) -> list[Problem]:
    out: list[Problem] = []
    for key, sites in comparison.new:
        first = sites[0]
        where = f"{len(sites)} sites" if len(sites) > 1 else "a site"
        out.append(Problem(
            first.path, first.span.line, "error", "new allocation site",
            f"{where} of {key[2]} in {key[1]} ({first.tier.value}, {first.kind.value}; {_lines(sites)}) "
            f"is not on the allowlist: move the allocation to a planned tier, or accept it with "
            f"`{UPDATE} --add-new` and say why in the entry",
        ))
    for entry, sites in comparison.grown:
        first = sites[0]
        out.append(Problem(
            first.path, first.span.line, "error", "allowlist entry grew",
            f"{entry.api} in {entry.scope}: the allowlist accepts {entry.count}, the code has {len(sites)} "
            f"({_lines(sites)}); remove the new one, or accept it with `{UPDATE} --add-new`",
        ))
    for entry, sites in comparison.loose:
        out.append(Problem(
            entry.file, entry.line, "error", "loose allowlist entry",
            f"{key_text(entry.key)} accepts {entry.count} but only {len(sites)} remain; lower it with `{UPDATE}` "
            "so a new site cannot take the freed place unnoticed",
        ))
    for entry in comparison.stale:
        out.append(Problem(
            entry.file, entry.line, "error", "stale allowlist entry",
            f"{key_text(entry.key)} matches nothing; delete it (`{UPDATE}`): the list must stay an accurate "
            "picture of the remaining debt",
        ))
    return out


def unchecked_problems(comparison: Comparison, fail: bool) -> list[Problem]:
    """Entries of files the run could not analyse: their sites are unknown,
    so the entry is neither confirmed nor stale. They fail unless the run
    was told to accept them (``--unchecked warn``)."""
    return [Problem(entry.file, entry.line, "error" if fail else "warning", "allowlist entry not checked",
                    f"{key_text(entry.key)} was not checked: {entry.path} could not be analysed ({why}); "
                    "fix the file problem, or pass --unchecked warn to accept it for now")
            for entry, why in comparison.unchecked]


def file_problems(unchecked: Iterable[FileError]) -> list[Problem]:
    """Files that were not analysed: a skipped or failed file must never
    look like a file without sites. (Files analysed around syntax errors
    are counted in the summary line, not listed: there can be hundreds.)"""
    return [Problem(e.path, 1, "warning", "file not analysed", e.message) for e in unchecked]


def finding_problems(findings: Iterable[Finding], fail_warnings: bool,
                     fail_roles: tuple[str, ...] = ("production",)) -> list[Problem]:
    """Open findings as check problems: errors (and warnings with
    ``fail_warnings``) in a failing role fail; `info` and findings in other
    roles (tests, benchmarks) are notices."""
    out = []
    for f in findings:
        if f.suppressed:
            continue
        if f.severity is Severity.INFO or f.role not in fail_roles:
            level = "notice"
        else:
            level = "error" if f.severity is Severity.ERROR or fail_warnings else "warning"
        out.append(Problem(f.path, f.line, level, f.rule, f.message))
    return out


def gate_problems(result: GateResult, sites_by_key: dict[tuple[str, str, str], list[Site]],
                  allowed: bool) -> list[Problem]:
    out = []
    level = "warning" if allowed else "error"
    for growth in result.grown:
        entry = growth.entry
        sites = sites_by_key.get(entry.key, [])
        where = f"; needed by {_lines(sites)}" if sites else ""
        what = "added" if growth.before == 0 else f"raised from {growth.before} to {entry.count}"
        reason = f" (reason: {entry.reason})" if entry.reason else " (no reason given)"
        out.append(Problem(
            entry.file, entry.line, level, "allowlist grew",
            f"{key_text(entry.key)} {what}{reason}{where}",
        ))
    for base, now in result.moved:
        out.append(Problem(now.file, now.line, "notice", "allowlist entry moved",
                           f"{base.path} -> {now.path}: {base.scope} {base.api} (a renamed file; not growth)"))
    return out


def render(problems: list[Problem], fmt: str) -> str:
    if fmt == "github":
        return "".join(p.github() + "\n" for p in problems)
    return "".join(p.text() + "\n" for p in problems)


def entry_line(entry: AllowlistEntry) -> str:
    return f"{entry.file}:{entry.line}: {entry.render()}" if entry.line else entry.render()


# ---------------------------------------------------------------- the findings baseline (baseline.py)


def fixed_debt_problems(comparison: FindingsComparison, level: str = "error") -> list[Problem]:
    """Baseline entries whose findings are gone (fixed debt): good news that
    must be written down, so a new finding cannot take the freed place."""
    out = []
    for entry, left in comparison.fixed:
        what = "is fixed" if left == 0 else f"has {left} of {entry.count} left"
        out.append(Problem(entry.file, entry.line, level, "fixed finding still in the baseline",
                           f"{key_display(entry.key)} {what}: prune it with `{UPDATE}`"))
    return out


def baseline_growth_problems(grown: Iterable[BaselineGrowth], moved: Iterable[tuple[BaselineEntry, BaselineEntry]],
                             allowed: bool) -> list[Problem]:
    out = []
    level = "warning" if allowed else "error"
    for growth in grown:
        entry = growth.entry
        what = "added" if growth.before == 0 else f"raised from {growth.before} to {entry.count}"
        reason = f" (reason: {entry.reason})" if entry.reason else " (no reason given)"
        out.append(Problem(entry.file, entry.line, level, "findings baseline grew",
                           f"{key_display(entry.key)} {what}{reason}"))
    for base, now in moved:
        out.append(Problem(now.file, now.line, "notice", "baseline entry moved",
                           f"{base.path} -> {now.path}: {base.rule} in {base.scope} (a renamed file; not growth)"))
    return out


def problems_json(problems: Iterable[Problem]) -> list[dict[str, object]]:
    return [{"path": p.path, "line": p.line, "level": p.level, "title": p.title, "message": p.message}
            for p in problems]
