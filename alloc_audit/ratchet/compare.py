"""Stage 7, ratchet: sites x allowlist entries -> new / grown / loose /
stale (``compare``), and what ``allowlist update`` would write
(``plan_update``: prune, lower, keep reasons and pins, follow renames).
``count`` is per key, so a fixed site and a new one in *another* scope can
never cancel out; within one scope they can, which is why a count higher
than the sites it covers fails too ("loose")."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import Site, Tier
from .allowlist import AllowlistEntry, Key
from .keys import key_text, site_key


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
    # entries of files the run could not analyse completely, with the
    # reason: neither confirmed nor stale, and never pruned
    unchecked: tuple[tuple[AllowlistEntry, str], ...] = ()

    @property
    def failed(self) -> bool:
        """New, grown, loose or stale; entries not checked are the caller's
        call (``check --unchecked``)."""
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
            "not_checked": [{"key": key_text(e.key), "file": e.file, "line": e.line, "reason": why}
                            for e, why in self.unchecked],
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
            coverage: Sequence[str] = ("",), partial_apis: frozenset[str] | None = None,
            unchecked: Mapping[str, str] | None = None) -> Comparison:
    """Entries are judged only where the run looked: a file that was scanned,
    or a path under the scanned roots that no longer exists (deleted or
    renamed: its entries are stale, not silently carried).

    ``unchecked``: path -> why the run could not analyse that file
    completely (too large, unreadable, a parser failure). A file that was
    not analysed has unknown sites, not zero: its entries are set apart as
    "not checked", never stale or loose, and its sites (if any) are not
    judged either.

    ``partial_apis``: the run saw only some files (pre-commit), so a derived
    site (a call to a project factory defined elsewhere) may be invisible:
    entries whose api is not one of these direct-site apis can then be
    found grown or new, never loose or stale. Full runs judge them all."""
    unanalysed = dict(unchecked or {})
    scanned_set = set(scanned) - set(unanalysed)
    by_key: dict[Key, list[Site]] = {}
    for site in sites:
        if site.acquires and site.path in scanned_set:  # releases pair with acquisitions, are not debt
            by_key.setdefault(site_key(site), []).append(site)
    not_checked = tuple((e, unanalysed[e.path]) for e in sorted(entries, key=lambda e: e.key)
                        if e.path in unanalysed)
    entries_judged = [e for e in entries if e.path not in unanalysed]
    entry_by_key = {e.key: e for e in entries_judged}
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
    for entry in sorted(entries_judged, key=lambda e: e.key):
        if entry.key in by_key:
            continue
        if partial_apis is not None and entry.api not in partial_apis:
            continue
        if entry.path in scanned_set or covers(entry.path):
            stale.append(entry)
    return Comparison(tuple(new), tuple(grown), tuple(loose), tuple(stale), tuple(ok), tuple(entries),
                      frozenset(covered), not_checked)


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
    unchecked: tuple[tuple[AllowlistEntry, str], ...] = ()

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
    for entry, _why in comparison.unchecked:
        kept[entry.key] = entry  # not analysed: kept exactly as it is
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
        unchecked=comparison.unchecked,
    )
