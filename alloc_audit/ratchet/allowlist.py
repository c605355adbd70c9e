"""Stage 7, allowlist: sites x entries -> new / grown / loose / stale, and the
deterministic (re)writing of the allowlist files.

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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..atomic import atomic_write_bytes
from ..errors import UsageError, display_path
from .keys import escape, key_text, site_key, unescape
from ..model import Site, Tier

FORMAT_VERSION = 1
SUFFIX = ".allowlist"
DEFAULT_FILE = "alloc-audit.allowlist"
HEADER = (
    f"# alloc-audit allowlist v{FORMAT_VERSION}\n"
    "# The allocation sites this project accepts today. It may only shrink: `alloc-audit check`\n"
    "# fails on new sites, grown or loose counts and stale entries; `alloc-audit allowlist update`\n"
    "# prunes and lowers. Format: <path> <scope> <api> [x<count>] <tier>[!] [# reason]\n"
)
_TIERS = {t.value for t in Tier if t is not Tier.UNKNOWN} | {"unknown"}
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
                raise UsageError(f"entry '{key_text(entry.key)}' is also in {other.file}:{other.line}", name, entry.line)
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


# ---------------------------------------------------------------- comparing


@dataclass(frozen=True)
class Comparison:
    """How the tree's sites compare with the allowlist, within ``coverage``."""

    new: tuple[tuple[Key, tuple[Site, ...]], ...]
    grown: tuple[tuple[AllowlistEntry, tuple[Site, ...]], ...]
    loose: tuple[tuple[AllowlistEntry, tuple[Site, ...]], ...]
    stale: tuple[AllowlistEntry, ...]
    ok: tuple[tuple[AllowlistEntry, tuple[Site, ...]], ...]
    entries: tuple[AllowlistEntry, ...]
    covered_keys: frozenset[Key] = field(default_factory=frozenset)

    @property
    def failed(self) -> bool:
        return bool(self.new or self.grown or self.loose or self.stale)

    def to_json(self) -> dict[str, Any]:
        def sites_json(sites: Iterable[Site]) -> list[dict[str, Any]]:
            return [{"path": s.path, "line": s.span.line, "scope": s.scope, "api": s.api} for s in sites]

        return {
            "entries": len(self.entries),
            "new": [{"key": key_text(k), "sites": sites_json(s)} for k, s in self.new],
            "grown": [{"key": key_text(e.key), "allowed": e.count, "found": len(s), "sites": sites_json(s)}
                      for e, s in self.grown],
            "loose": [{"key": key_text(e.key), "allowed": e.count, "found": len(s)} for e, s in self.loose],
            "stale": [{"key": key_text(e.key), "file": e.file, "line": e.line} for e in self.stale],
        }


def in_coverage(path: str, coverage: Sequence[str]) -> bool:
    """Whether ``path`` lies under one of the scanned roots ("" is the whole root)."""
    return coverage_test(coverage)(path)


def coverage_test(coverage: Sequence[str]) -> Callable[[str], bool]:
    """``in_coverage`` compiled once for many paths (an allowlist has thousands)."""
    if any(prefix in ("", ".") for prefix in coverage):
        return lambda _path: True
    exact = frozenset(coverage)
    prefixes = tuple(prefix.rstrip("/") + "/" for prefix in coverage)
    return lambda path: path in exact or path.startswith(prefixes)


def compare(sites: Iterable[Site], entries: Sequence[AllowlistEntry], scanned: Iterable[str],
            coverage: Sequence[str] = ("",), partial_apis: frozenset[str] | None = None) -> Comparison:
    """Entries are judged only where the run looked: a file that was scanned,
    or a path under the scanned roots that no longer exists (deleted or
    renamed: its entries are stale, not silently carried).

    ``partial_apis``: the run saw only some files (pre-commit), so a derived
    site (a call to a project factory defined elsewhere) may be invisible:
    entries whose api is not one of these direct-site apis can then be
    found grown or new, never loose or stale. Full runs judge them all."""
    scanned_set = set(scanned)
    by_key: dict[Key, list[Site]] = {}
    for site in sites:
        if site.acquires and site.path in scanned_set:  # releases pair with acquisitions, are not debt
            by_key.setdefault(site_key(site), []).append(site)
    entry_by_key = {e.key: e for e in entries}
    new, grown, loose, ok = [], [], [], []
    covered: set[Key] = set()
    for key in sorted(by_key):
        found = tuple(by_key[key])
        entry = entry_by_key.get(key)
        if entry is None:
            new.append((key, found))
        elif len(found) > entry.count:
            grown.append((entry, found))
        elif len(found) < entry.count and (partial_apis is None or entry.api in partial_apis):
            loose.append((entry, found))
            covered.add(key)
        else:
            ok.append((entry, found))
            covered.add(key)
    stale = []
    covers = coverage_test(coverage)
    for entry in sorted(entries, key=lambda e: e.key):
        if entry.key in by_key:
            continue
        if partial_apis is not None and entry.api not in partial_apis:
            continue
        if entry.path in scanned_set or covers(entry.path):
            stale.append(entry)
    return Comparison(tuple(new), tuple(grown), tuple(loose), tuple(stale), tuple(ok), tuple(entries),
                      frozenset(covered))


def apply_pins(sites: Sequence[Site], entries: Sequence[AllowlistEntry]) -> tuple[Site, ...]:
    """Sites covered by a pinned entry (`T3!`) take the entry's tier."""
    pins = {e.key: e for e in entries if e.pinned}
    if not pins:
        return tuple(sites)
    out = []
    for site in sites:
        entry = pins.get(site_key(site))
        if entry is not None and site.tier.value != entry.tier:
            why = f"pinned in {entry.file}:{entry.line}" + (f": {entry.reason}" if entry.reason else "")
            site = dataclasses.replace(site, tier=Tier(entry.tier), tier_reason=why)
        out.append(site)
    return tuple(out)


# ---------------------------------------------------------------- updating


@dataclass(frozen=True)
class Rename:
    old: str
    new: str
    keys: tuple[tuple[Key, Key], ...]


@dataclass(frozen=True)
class UpdatePlan:
    entries: tuple[AllowlistEntry, ...]
    added: tuple[AllowlistEntry, ...]
    removed: tuple[AllowlistEntry, ...]
    lowered: tuple[tuple[AllowlistEntry, AllowlistEntry], ...]
    retiered: tuple[tuple[AllowlistEntry, AllowlistEntry], ...]
    renamed: tuple[Rename, ...]
    still_grown: tuple[tuple[AllowlistEntry, int], ...]
    not_added: tuple[tuple[Key, int], ...]

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.lowered or self.retiered or self.renamed)


def _tier_of(sites: Sequence[Site]) -> str:
    counts = Counter(s.tier.value for s in sites)
    order = [t.value for t in Tier]
    return sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0])))[0][0]


def entries_for(sites: Iterable[Site]) -> list[AllowlistEntry]:
    """A fresh allowlist for ``sites``: one entry per key, with its count and
    the most common tier."""
    groups: dict[Key, list[Site]] = {}
    for site in sites:
        if site.acquires:
            groups.setdefault(site_key(site), []).append(site)
    return [AllowlistEntry(k[0], k[1], k[2], len(v), _tier_of(v)) for k, v in sorted(groups.items())]


def detect_renames(stale: Sequence[AllowlistEntry], new: Mapping[Key, Sequence[Site]]) -> list[Rename]:
    """A stale file's entries that reappear (same scope and api) under one new
    path are a rename: at least 60 % of the union of both sets in common."""
    stale_by_path: dict[str, set[tuple[str, str]]] = {}
    for e in stale:
        stale_by_path.setdefault(e.path, set()).add((e.scope, e.api))
    new_by_path: dict[str, set[tuple[str, str]]] = {}
    for key in new:
        new_by_path.setdefault(key[0], set()).add((key[1], key[2]))
    renames = []
    taken: set[str] = set()
    for old in sorted(stale_by_path):
        best, best_score = None, 0.0
        for candidate in sorted(new_by_path):
            if candidate in taken:
                continue
            a, b = stale_by_path[old], new_by_path[candidate]
            score = len(a & b) / len(a | b)
            if score > best_score:
                best, best_score = candidate, score
        if best is not None and best_score >= 0.6:
            taken.add(best)
            common = sorted(stale_by_path[old] & new_by_path[best])
            renames.append(Rename(old, best, tuple(((old, s, a), (best, s, a)) for s, a in common)))
    return renames


def plan_update(comparison: Comparison, add_new: bool) -> UpdatePlan:
    """Rewrite the entries from the tree: prune stale ones, lower loose counts,
    refresh unpinned tiers, carry renamed files' entries (never above their
    old counts), and add new keys only when asked. Reasons and pins are kept."""
    kept: dict[Key, AllowlistEntry] = {}
    removed, lowered, retiered, still_grown, added, not_added = [], [], [], [], [], []
    for entry, sites in (*comparison.ok, *comparison.loose, *comparison.grown):
        count = entry.count
        if len(sites) < count:
            count = len(sites)
        elif len(sites) > count:
            if add_new:
                count = len(sites)
            else:
                still_grown.append((entry, len(sites)))
        tier = entry.tier if entry.pinned else _tier_of(sites)
        updated = dataclasses.replace(entry, count=count, tier=tier)
        if count < entry.count:
            lowered.append((entry, updated))
        if tier != entry.tier:
            retiered.append((entry, updated))
        kept[entry.key] = updated
    new = dict(comparison.new)
    renames = detect_renames(comparison.stale, new)
    moved_from: dict[Key, Key] = {}
    for rename in renames:
        for old_key, new_key in rename.keys:
            moved_from[new_key] = old_key
    stale_by_key = {e.key: e for e in comparison.stale}
    for entry in comparison.stale:
        if entry.key not in set(moved_from.values()):
            removed.append(entry)
    for key, sites in sorted(new.items()):
        origin = stale_by_key.get(moved_from[key]) if key in moved_from else None
        if origin is not None:
            count = min(origin.count, len(sites)) if not add_new else len(sites)
            tier = origin.tier if origin.pinned else _tier_of(sites)
            kept[key] = dataclasses.replace(origin, path=key[0], count=count, tier=tier, file=origin.file, line=0)
            if len(sites) > count:
                still_grown.append((kept[key], len(sites)))
        elif add_new:
            entry = AllowlistEntry(key[0], key[1], key[2], len(sites), _tier_of(sites))
            kept[key] = entry
            added.append(entry)
        else:
            not_added.append((key, len(sites)))
    return UpdatePlan(
        entries=tuple(sorted(kept.values(), key=lambda e: e.key)),
        added=tuple(added),
        removed=tuple(removed),
        lowered=tuple(lowered),
        retiered=tuple(retiered),
        renamed=tuple(renames),
        still_grown=tuple(still_grown),
        not_added=tuple(not_added),
    )


def render_file(entries: Iterable[AllowlistEntry]) -> str:
    lines = sorted(entries, key=lambda e: e.key)
    return HEADER + "".join(e.render() + "\n" for e in lines)


def assign_files(entries: Sequence[AllowlistEntry], existing: Sequence[str], default: str) -> dict[str, list[AllowlistEntry]]:
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


def write_allowlist(directory: Path, root: Path, entries: Sequence[AllowlistEntry],
                    split_top_level: bool = False) -> list[str]:
    """Write entries to their files atomically; returns the files written.
    Files whose content would not change are left untouched."""
    directory.mkdir(parents=True, exist_ok=True)
    existing = [display_path(p, root) for p in allowlist_files(directory)]
    default = display_path(directory / DEFAULT_FILE, root)
    if split_top_level and not existing:
        groups: dict[str, list[AllowlistEntry]] = {}
        for e in entries:
            top = e.path.split("/", 1)[0] if "/" in e.path else "root"
            name = display_path(directory / f"{_safe(top)}{SUFFIX}", root)
            groups.setdefault(name, []).append(e)
    else:
        groups = assign_files(entries, existing, default)
    written = []
    for name, members in sorted(groups.items()):
        path = root / name if not Path(name).is_absolute() else Path(name)
        text = render_file(members)
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
        except OSError:
            pass
        atomic_write_bytes(path, text.encode("utf-8"))
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


# ---------------------------------------------------------------- the gate (allowlist at a base ref vs now)


@dataclass(frozen=True)
class Growth:
    entry: AllowlistEntry  # as it is now
    before: int  # its count at the base (0: added)


@dataclass(frozen=True)
class GateResult:
    grown: tuple[Growth, ...]
    moved: tuple[tuple[AllowlistEntry, AllowlistEntry], ...]  # (base, now): a renamed file's entry
    shrunk: tuple[tuple[AllowlistEntry, int], ...]  # (now, base count)
    removed: tuple[AllowlistEntry, ...]

    @property
    def failed(self) -> bool:
        return bool(self.grown)


def compare_allowlists(base: Sequence[AllowlistEntry], now: Sequence[AllowlistEntry]) -> GateResult:
    """What changed between the allowlist at a base ref and now. Growth is an
    added key or a raised count; an entry whose file was renamed (same scope
    and api under a new path, at most its old count) has moved, not grown."""
    before = {e.key: e for e in base}
    after = {e.key: e for e in now}
    added = [e for k, e in sorted(after.items()) if k not in before]
    gone = [e for k, e in sorted(before.items()) if k not in after]
    # renames: whole files whose entries reappear under another path
    by_scope_api: dict[tuple[str, str], list[AllowlistEntry]] = {}
    for e in gone:
        by_scope_api.setdefault((e.scope, e.api), []).append(e)
    old_paths = {e.path for e in gone}
    moved: list[tuple[AllowlistEntry, AllowlistEntry]] = []
    still_added: list[AllowlistEntry] = []
    for entry in added:
        candidates = [e for e in by_scope_api.get((entry.scope, entry.api), ()) if e.path in old_paths
                      and e.count >= entry.count]
        if candidates:
            origin = candidates[0]
            by_scope_api[(entry.scope, entry.api)].remove(origin)
            moved.append((origin, entry))
        else:
            still_added.append(entry)
    moved_away = {m[0].key for m in moved}
    grown = [Growth(e, 0) for e in still_added]
    shrunk = []
    for key, entry in sorted(after.items()):
        old = before.get(key)
        if old is None:
            continue
        if entry.count > old.count:
            grown.append(Growth(entry, old.count))
        elif entry.count < old.count:
            shrunk.append((entry, old.count))
    removed = tuple(e for e in gone if e.key not in moved_away)
    return GateResult(tuple(sorted(grown, key=lambda g: g.entry.key)), tuple(moved), tuple(shrunk), removed)
