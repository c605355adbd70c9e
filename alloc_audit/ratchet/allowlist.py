"""The allowlist's format: reading, writing (deterministic, atomic) and
merging the ``*.allowlist`` files. Comparing them with a scan is
``ratchet/compare.py``; with the allowlist at a base ref, ``ratchet/gate.py``.

Format (one entry per line, sorted, no line numbers, see README)::

    # alloc-audit allowlist v1
    <path> <scope> <api> [x<count>] <tier>[!] [# reason]

``count`` is written when above 1; ``!`` after the tier pins it (reports use
the entry's tier instead of the classifier's, and updates keep it). A key is
``path scope api`` (``keys.py``). Counts are per key, so a fixed site and a
new one in *another* scope can never cancel out; within one scope they can,
which is why a count that is higher than the sites it covers is a failure
too ("loose"): the list must stay an accurate picture of the remaining debt.

A project may split its allowlist into several ``*.allowlist`` files in the
directory; all are read, an entry stays in the file it is in, and new entries
go to the file whose entries share the longest path prefix with them.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_bytes, locked_directory
from ..errors import UsageError, display_path
from ..model import TIER_VALUES
from .keys import escape, key_text, unescape

FORMAT_VERSION = 1
SUFFIX = ".allowlist"
DEFAULT_FILE = "alloc-audit.allowlist"
HEADER = (
    f"# alloc-audit allowlist v{FORMAT_VERSION}\n"
    "# The allocation sites this project accepts today. It may only shrink: `alloc-audit check`\n"
    "# fails on new sites, grown or loose counts and stale entries; `alloc-audit allowlist update`\n"
    "# prunes and lowers. Format: <path> <scope> <api> [x<count>] <tier>[!] [# reason]\n"
)
_TIERS = frozenset(TIER_VALUES)
_VERSION = re.compile(r"^#\s*alloc-audit allowlist v(\d+)\s*$")
_COUNT = re.compile(r"^x(\d+)$")
_CONFLICT = re.compile(r"^(<{7}|={7}|>{7}|\|{7})(\s|$)")

Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class AllowlistEntry:
    path: str
    scope: str
    api: str
    count: int
    tier: str
    pinned: bool = False
    reason: str = ""
    file: str = ""
    line: int = 0

    @property
    def key(self) -> Key:
        return (self.path, self.scope, self.api)

    def render(self) -> str:
        parts = [escape(self.path), escape(self.scope), escape(self.api)]
        if self.count != 1:
            parts.append(f"x{self.count}")
        parts.append(self.tier + ("!" if self.pinned else ""))
        text = " ".join(parts)
        return f"{text} # {self.reason}" if self.reason else text


# ---------------------------------------------------------------- reading


def parse_allowlist(text: str, filename: str) -> list[AllowlistEntry]:
    """Parse one allowlist file; malformed input is a UsageError naming the line."""
    entries: list[AllowlistEntry] = []
    seen: dict[Key, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if _CONFLICT.match(line):
            raise UsageError(f"unresolved merge conflict ({line.split()[0][:7]} marker); resolve it by hand, or set up "
                             "the merge driver (README, 'The allowlist'), then run `alloc-audit allowlist update`",
                             filename, lineno)
        if line.startswith("#"):
            m = _VERSION.match(line)
            if m and int(m.group(1)) > FORMAT_VERSION:
                raise UsageError(
                    f"allowlist format v{m.group(1)} is newer than this alloc-audit understands (v{FORMAT_VERSION}); "
                    "upgrade alloc-audit", filename, lineno)
            continue
        body, _, reason = line.partition(" #")
        if body.startswith("#"):
            continue
        fields = body.split()
        if len(fields) not in (4, 5):
            raise UsageError(
                f"expected '<path> <scope> <api> [x<count>] <tier> [# reason]', got {len(fields)} fields",
                filename, lineno)
        path, scope, api = (unescape(f) for f in fields[:3])
        count = 1
        if len(fields) == 5:
            m = _COUNT.match(fields[3])
            if m is None or int(m.group(1)) < 1:
                raise UsageError(f"bad count {fields[3]!r}: write x<N> with N >= 1", filename, lineno)
            count = int(m.group(1))
        tier = fields[-1]
        pinned = tier.endswith("!")
        tier = tier.rstrip("!")
        if tier not in _TIERS:
            raise UsageError(f"unknown tier {tier!r}; use one of {', '.join(sorted(_TIERS))}", filename, lineno)
        key = (path, scope, api)
        if key in seen:
            raise UsageError(f"duplicate entry for '{key_text(key)}' (first at line {seen[key]}); merge them into one "
                             "line with a count", filename, lineno)
        seen[key] = lineno
        entries.append(AllowlistEntry(path, scope, api, count, tier, pinned, reason.strip(), filename, lineno))
    return entries


def allowlist_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(SUFFIX)
                  and not p.name.startswith("."))


def load_allowlist(directory: Path, root: Path) -> list[AllowlistEntry] | None:
    """All entries under ``directory``; None when it holds no allowlist file.
    A key listed in two files is an error naming both."""
    files = allowlist_files(directory)
    if not files:
        return None
    return load_texts([(display_path(p, root), _read(p, root)) for p in files])


def load_texts(texts: Sequence[tuple[str, str]]) -> list[AllowlistEntry]:
    out: list[AllowlistEntry] = []
    where: dict[Key, AllowlistEntry] = {}
    for name, text in texts:
        for entry in parse_allowlist(text, name):
            other = where.get(entry.key)
            if other is not None:
                raise UsageError(f"entry '{key_text(entry.key)}' is also in {other.file}:{other.line}", name,
                                 entry.line)
            where[entry.key] = entry
            out.append(entry)
    return out


def _read(path: Path, root: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"allowlist is not valid UTF-8 (byte offset {exc.start})", display_path(path, root)) from None
    except OSError as exc:
        raise UsageError(f"cannot read allowlist: {exc.strerror}", display_path(path, root)) from None


def render_file(entries: Iterable[AllowlistEntry]) -> str:
    lines = sorted(entries, key=lambda e: e.key)
    return HEADER + "".join(e.render() + "\n" for e in lines)


def assign_files(entries: Sequence[AllowlistEntry], existing: Sequence[str],
                 default: str) -> dict[str, list[AllowlistEntry]]:
    """Which file each entry is written to: the file it came from; for a new
    entry, the file whose entries share the longest path prefix with it
    (ties: the first file in order). Each file keeps its paths sorted, so the
    longest shared prefix is with a neighbour found by bisection."""
    out: dict[str, list[AllowlistEntry]] = {name: [] for name in existing}
    for entry in entries:
        if entry.file and entry.file in out:
            out[entry.file].append(entry)
    paths = {name: sorted({e.path for e in members}) for name, members in out.items()}
    for entry in entries:
        if entry.file and entry.file in out:
            continue
        best, best_len = default, -1
        for name, sorted_paths in paths.items():
            common = _longest_shared_prefix(sorted_paths, entry.path)
            if common > best_len:
                best, best_len = name, common
        out.setdefault(best, []).append(dataclasses.replace(entry, file=best))
        known = paths.setdefault(best, [])
        at = bisect.bisect_left(known, entry.path)
        if at == len(known) or known[at] != entry.path:
            known.insert(at, entry.path)
    return out


def _longest_shared_prefix(sorted_paths: list[str], path: str) -> int:
    """The longest common prefix of ``path`` with any of ``sorted_paths``
    (-1 when there are none): it is shared with a sorted neighbour."""
    if not sorted_paths:
        return -1
    at = bisect.bisect_left(sorted_paths, path)
    best = 0
    for neighbour in sorted_paths[max(0, at - 1):at + 1]:
        best = max(best, len(os.path.commonprefix([neighbour, path])))
    return best


class AllowlistChanged(Exception):
    """The allowlist files changed on disk since they were read (another
    run or an editor wrote them): plan again from what is there now."""


def snapshot(directory: Path) -> dict[str, bytes]:
    """The allowlist files' bytes by file name, to tell later whether
    anyone wrote them in between (compare-and-swap)."""
    out = {}
    for path in allowlist_files(directory):
        try:
            out[path.name] = path.read_bytes()
        except OSError:
            out[path.name] = b""
    return out


def write_allowlist(directory: Path, root: Path, entries: Sequence[AllowlistEntry],
                    split_top_level: bool = False, expected: Mapping[str, bytes] | None = None,
                    replace: bool = False) -> list[str]:
    """Write entries to their files atomically; returns the files written.
    Files whose content would not change are left untouched.

    Under a lock on the directory, and only if the files still hold
    ``expected`` (what the caller planned from; None: no check), else
    AllowlistChanged: a concurrent writer's entries are never overwritten.
    ``replace`` (``init --force``): the entries go to new files as if none
    existed, and the old files are removed only after every new one is
    complete, so a failing write leaves the old allowlist whole."""
    directory.mkdir(parents=True, exist_ok=True)
    with locked_directory(directory):
        if expected is not None and snapshot(directory) != dict(expected):
            raise AllowlistChanged(str(directory))
        old = [display_path(p, root) for p in allowlist_files(directory)]
        existing = [] if replace else old
        default = display_path(directory / DEFAULT_FILE, root)
        if split_top_level and not existing:
            groups: dict[str, list[AllowlistEntry]] = {}
            for e in entries:
                top = e.path.split("/", 1)[0] if "/" in e.path else "root"
                name = display_path(directory / f"{_safe(top)}{SUFFIX}", root)
                groups.setdefault(name, []).append(e)
        else:
            plain = [dataclasses.replace(e, file="") for e in entries] if replace else list(entries)
            groups = assign_files(plain, existing, default)
        written = []
        for name, members in sorted(groups.items()):
            path = root / name if not Path(name).is_absolute() else Path(name)
            text = render_file(members)
            try:
                if path.read_text(encoding="utf-8") == text:
                    continue
            except (OSError, UnicodeDecodeError):
                pass
            atomic_write_bytes(path, text.encode("utf-8"))
            written.append(name)
        if replace:
            for name in old:
                if name not in groups:
                    path = root / name if not Path(name).is_absolute() else Path(name)
                    path.unlink()
                    written.append(name)
    return written


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "root"


# ---------------------------------------------------------------- merging (git merge driver)


def merge_entries(base: Sequence[AllowlistEntry], ours: Sequence[AllowlistEntry],
                  theirs: Sequence[AllowlistEntry]) -> list[AllowlistEntry]:
    """Fail-closed three-way merge: an entry deleted on either side stays
    deleted; where both sides have it the smaller count wins; an entry added
    on one side (it passed that side's gate) is kept at the smaller count if
    both added it. Reasons are kept (ours first, theirs appended if different)."""
    b = {e.key: e for e in base}
    o = {e.key: e for e in ours}
    t = {e.key: e for e in theirs}
    out = []
    for key in sorted(set(o) | set(t)):
        mine, other = o.get(key), t.get(key)
        if key in b and (mine is None or other is None):
            continue  # deleted on one side: stays deleted
        present = [e for e in (mine, other) if e is not None]
        count = min(e.count for e in present)
        first = present[0]
        reasons = [e.reason for e in present if e.reason]
        reason = reasons[0] if reasons else ""
        if len(reasons) == 2 and reasons[0] != reasons[1]:
            reason = f"{reasons[0]}; {reasons[1]}"
        pinned = any(e.pinned for e in present)
        tier = next((e.tier for e in present if e.pinned), first.tier)
        out.append(dataclasses.replace(first, count=count, reason=reason, pinned=pinned, tier=tier, line=0))
    return out
