"""The CI gate's comparison: the allowlist at a base ref against the
working tree's. An added key or a raised count is growth; an entry that
moved with a renamed file is not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .allowlist import AllowlistEntry


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
