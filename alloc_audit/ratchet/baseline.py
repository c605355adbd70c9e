"""Ratchet, findings baseline: the hazards a project had when it adopted
alloc-audit, so that `check` fails only on new ones (semgrep's baselines,
ruff's ``--add-noqa`` without touching the sources).

The baseline is one file beside the allowlist, ``<allowlist dir>/
alloc-audit.findings``, in the allowlist's manner: sorted, one entry per
line, no line numbers, a versioned header::

    # alloc-audit findings baseline v1
    <rule> <path> <scope> <subject> [x<count>] [# reason]

``rule path scope subject`` is the finding's line-free key (the same key
SARIF fingerprints and suppressions follow): ``subject`` is what the rule
reports on, the allocation's api (``torch.empty``) or the measured or
entered call; it is the stable fingerprint that tells two findings of one
rule in one scope apart without a line number. Fields are escaped like
allowlist keys (``keys.py``). ``count`` is written when above 1: a second
``torch.empty`` under capture in the same function is a new finding.

Findings without a key (the meta rules about annotations) are never
baselined: an unreadable annotation is fixed, not accepted.

Judging, like the allowlist: a finding whose key is not in the baseline is
**new**; more findings than the count is **grown**; an entry with fewer
findings than its count, or none, is **fixed** debt (the count must come down
with `alloc-audit allowlist update`, so a new finding cannot take the freed
place). A run over part of the tree (pre-commit) cannot see cross-file
findings, so it judges new and grown only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes
from ..errors import UsageError, display_path
from ..model import Finding
from .keys import escape, unescape

FORMAT_VERSION = 1
FILE_NAME = "alloc-audit.findings"
HEADER = (
    f"# alloc-audit findings baseline v{FORMAT_VERSION}\n"
    "# The rule findings this project accepts today (its hazard debt). It may only shrink: `alloc-audit check`\n"
    "# fails on findings not listed here and on fixed ones still listed; `alloc-audit allowlist update` prunes.\n"
    "# Format: <rule> <path> <scope> <subject> [x<count>] [# reason]\n"
)
_VERSION = re.compile(r"^#\s*alloc-audit findings baseline v(\d+)\s*$")
_COUNT = re.compile(r"^x(\d+)$")
_CONFLICT = re.compile(r"^(<{7}|={7}|>{7})(\s|$)")

FindingKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class BaselineEntry:
    rule: str
    path: str
    scope: str
    subject: str
    count: int = 1
    reason: str = ""
    file: str = ""
    line: int = 0

    @property
    def key(self) -> FindingKey:
        return (self.rule, self.path, self.scope, self.subject)

    def render(self) -> str:
        text = " ".join(escape(part) for part in self.key)
        if self.count != 1:
            text += f" x{self.count}"
        return f"{text} # {self.reason}" if self.reason else text


def key_display(key: FindingKey) -> str:
    return " ".join(escape(part) for part in key)


def finding_key(finding: Finding) -> FindingKey | None:
    """The finding's line-free key, or None for findings that are never
    baselined (no key: the meta rules)."""
    parts = finding.key.split(" ")
    if len(parts) != 4:
        return None
    return (unescape(parts[0]), unescape(parts[1]), unescape(parts[2]), unescape(parts[3]))


# ---------------------------------------------------------------- reading


def parse_baseline(text: str, filename: str) -> list[BaselineEntry]:
    """Parse a findings baseline; malformed input is a UsageError naming the line."""
    entries: list[BaselineEntry] = []
    seen: dict[FindingKey, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if _CONFLICT.match(line):
            raise UsageError("unresolved merge conflict (a conflict marker); resolve it, then run "
                             "`alloc-audit allowlist update`", filename, lineno)
        if line.startswith("#"):
            m = _VERSION.match(line)
            if m and int(m.group(1)) > FORMAT_VERSION:
                raise UsageError(f"findings baseline format v{m.group(1)} is newer than this alloc-audit "
                                 f"understands (v{FORMAT_VERSION}); upgrade alloc-audit", filename, lineno)
            continue
        body, _, reason = line.partition(" #")
        fields = body.split()
        if len(fields) not in (4, 5):
            raise UsageError(f"expected '<rule> <path> <scope> <subject> [x<count>] [# reason]', got "
                             f"{len(fields)} fields", filename, lineno)
        count = 1
        if len(fields) == 5:
            m = _COUNT.match(fields[4])
            if m is None or int(m.group(1)) < 1:
                raise UsageError(f"bad count {fields[4]!r}: write x<N> with N >= 1", filename, lineno)
            count = int(m.group(1))
        rule, path, scope, subject = (unescape(f) for f in fields[:4])
        entry = BaselineEntry(rule, path, scope, subject, count, reason.strip(), filename, lineno)
        if entry.key in seen:
            raise UsageError(f"duplicate entry for '{key_display(entry.key)}' (first at line {seen[entry.key]}); "
                             "merge them into one line with a count", filename, lineno)
        seen[entry.key] = lineno
        entries.append(entry)
    return entries


def baseline_path(directory: Path) -> Path:
    return directory / FILE_NAME


def load_baseline(directory: Path, root: Path) -> list[BaselineEntry] | None:
    """The baseline's entries; None when the project has none (then every
    finding counts, as before baselines existed)."""
    path = baseline_path(directory)
    if not path.is_file():
        return None
    name = display_path(path, root)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"findings baseline is not valid UTF-8 (byte offset {exc.start})", name) from None
    except OSError as exc:
        raise UsageError(f"cannot read findings baseline: {exc.strerror}", name) from None
    return parse_baseline(text, name)


# ---------------------------------------------------------------- comparing


@dataclass(frozen=True)
class FindingsComparison:
    """How the tree's open findings compare with the baseline."""

    new: tuple[tuple[FindingKey, tuple[Finding, ...]], ...]
    grown: tuple[tuple[BaselineEntry, tuple[Finding, ...]], ...]
    fixed: tuple[tuple[BaselineEntry, int], ...]  # (entry, findings left): stale (0) or a count to lower
    ok: tuple[tuple[BaselineEntry, tuple[Finding, ...]], ...]
    unkeyed: tuple[Finding, ...]  # never baselined: always judged
    entries: tuple[BaselineEntry, ...]

    @property
    def baselined(self) -> int:
        return sum(len(found) for _, found in self.ok)

    def open_findings(self) -> list[Finding]:
        """The findings the baseline does not accept: new ones, every finding
        of a grown key (which of them is the newcomer is unknowable without
        lines), and the unkeyed ones."""
        out = [f for _, found in self.new for f in found]
        out += [f for _, found in self.grown for f in found]
        out += self.unkeyed
        return sorted(out, key=lambda f: f.sort_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": len(self.entries),
            "baselined": self.baselined,
            "new": [{"key": key_display(k), "findings": len(f)} for k, f in self.new],
            "grown": [{"key": key_display(e.key), "allowed": e.count, "found": len(f)} for e, f in self.grown],
            "fixed": [{"key": key_display(e.key), "allowed": e.count, "found": left, "file": e.file,
                       "line": e.line} for e, left in self.fixed],
        }


def compare_findings(findings: Iterable[Finding], entries: Sequence[BaselineEntry],
                     partial: bool = False, covers: Any = None,
                     unread: frozenset[str] = frozenset()) -> FindingsComparison:
    """``partial``: the run saw only some files, so fixed debt is not judged
    (a cross-file finding may be invisible). ``covers(path)``: which entries
    the run could see at all (default: every one). ``unread``: files the run
    could not fully read (too large, syntax errors): their findings may be
    missing, so their entries are never called fixed (nor pruned)."""
    by_key: dict[FindingKey, list[Finding]] = {}
    unkeyed: list[Finding] = []
    for f in findings:
        if f.suppressed:
            continue
        key = finding_key(f)
        if key is None:
            unkeyed.append(f)
        else:
            by_key.setdefault(key, []).append(f)
    entry_by_key = {e.key: e for e in entries}
    new, grown, ok = [], [], []
    fixed: list[tuple[BaselineEntry, int]] = []
    for key in sorted(by_key):
        found = tuple(sorted(by_key[key], key=lambda f: f.sort_key))
        entry = entry_by_key.get(key)
        if entry is None:
            new.append((key, found))
        elif len(found) > entry.count:
            grown.append((entry, found))
        else:
            ok.append((entry, found))
            if len(found) < entry.count and not partial and entry.path not in unread:
                fixed.append((entry, len(found)))
    if not partial:
        for entry in sorted(entries, key=lambda e: e.key):
            if entry.key not in by_key and entry.path not in unread and (covers is None or covers(entry.path)):
                fixed.append((entry, 0))
    fixed.sort(key=lambda pair: pair[0].key)
    return FindingsComparison(tuple(new), tuple(grown), tuple(fixed), tuple(ok), tuple(unkeyed), tuple(entries))


# ---------------------------------------------------------------- writing


def entries_from(findings: Iterable[Finding]) -> list[BaselineEntry]:
    """A baseline accepting every open, keyed finding (``allowlist init``)."""
    counts: dict[FindingKey, int] = {}
    for f in findings:
        key = finding_key(f)
        if key is not None and not f.suppressed:
            counts[key] = counts.get(key, 0) + 1
    return [BaselineEntry(*key, count=n) for key, n in sorted(counts.items())]


@dataclass(frozen=True)
class BaselineUpdate:
    entries: tuple[BaselineEntry, ...]
    removed: tuple[BaselineEntry, ...]
    lowered: tuple[tuple[BaselineEntry, int], ...]
    added: tuple[BaselineEntry, ...]  # new keys, or raised counts (the entry as it is now)
    not_added: tuple[tuple[FindingKey, int], ...]


def plan_baseline_update(comparison: FindingsComparison, add_new: bool, reason: str = "") -> BaselineUpdate:
    """Prune fixed debt and lower counts (reasons kept); accept new and grown
    findings only with ``add_new``."""
    kept: dict[FindingKey, BaselineEntry] = {}
    removed, lowered, added, not_added = [], [], [], []
    fixed = {e.key: left for e, left in comparison.fixed}
    for entry, _found in comparison.ok:
        left = fixed.get(entry.key, entry.count)  # not judged fixed (partial or unread): the count stands
        if left < entry.count:
            lowered.append((entry, left))
        kept[entry.key] = dataclasses.replace(entry, count=left)
    for entry, left in comparison.fixed:
        if left == 0:
            removed.append(entry)
    for entry, found in comparison.grown:
        if add_new:
            raised = dataclasses.replace(entry, count=len(found), reason=entry.reason or reason)
            kept[entry.key] = raised
            added.append(raised)
        else:
            kept[entry.key] = entry
            not_added.append((entry.key, len(found)))
    for key, found in comparison.new:
        if add_new:
            entry = BaselineEntry(*key, count=len(found), reason=reason)
            kept[key] = entry
            added.append(entry)
        else:
            not_added.append((key, len(found)))
    # entries the run could not judge (outside its coverage) stay as they are
    for entry in comparison.entries:
        if entry.key not in kept and entry.key not in fixed:
            kept[entry.key] = entry
    return BaselineUpdate(tuple(sorted(kept.values(), key=lambda e: e.key)), tuple(removed), tuple(lowered),
                          tuple(added), tuple(not_added))


def render_baseline(entries: Iterable[BaselineEntry]) -> str:
    return HEADER + "".join(e.render() + "\n" for e in sorted(entries, key=lambda e: e.key))


def write_baseline(directory: Path, root: Path, entries: Sequence[BaselineEntry]) -> str | None:
    """Write the baseline atomically; returns its name, or None when the
    file already says exactly this."""
    path = baseline_path(directory)
    text = render_baseline(entries)
    try:
        if path.read_text(encoding="utf-8") == text:
            return None
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"))
    return display_path(path, root)


# ---------------------------------------------------------------- the gate


@dataclass(frozen=True)
class BaselineGrowth:
    entry: BaselineEntry  # as it is now
    before: int  # its count at the base (0: added)


def baseline_growth(base: Sequence[BaselineEntry], now: Sequence[BaselineEntry]
                    ) -> tuple[list[BaselineGrowth], list[tuple[BaselineEntry, BaselineEntry]]]:
    """Entries added or counts raised since the base (the gate fails on
    them), and entries that moved with a renamed file: a gone path's entry
    reappearing with the same rule, scope and subject under a new path, at
    most at its old count, is a move, not growth."""
    before = {e.key: e for e in base}
    after = {e.key for e in now}
    gone: dict[tuple[str, str, str], list[BaselineEntry]] = {}
    for e in base:
        if e.key not in after:
            gone.setdefault((e.rule, e.scope, e.subject), []).append(e)
    grown: list[BaselineGrowth] = []
    moved: list[tuple[BaselineEntry, BaselineEntry]] = []
    for entry in sorted(now, key=lambda e: e.key):
        old = before.get(entry.key)
        if old is None:
            candidates = [e for e in gone.get((entry.rule, entry.scope, entry.subject), ()) if e.count >= entry.count]
            if candidates:
                gone[(entry.rule, entry.scope, entry.subject)].remove(candidates[0])
                moved.append((candidates[0], entry))
            else:
                grown.append(BaselineGrowth(entry, 0))
        elif entry.count > old.count:
            grown.append(BaselineGrowth(entry, old.count))
    return grown, moved
