"""`alloc-audit allowlist init|update|explain|merge-driver`: write the
allowlist from the tree, prune it, explain an entry or a site, merge it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .outcome import Text
from .project import Options, load_project, require_allowlist, scan_project

if TYPE_CHECKING:
    from ..ratchet.allowlist import AllowlistEntry
    from ..ratchet.compare import UpdatePlan


def init(options: Options, force: bool = False, split: bool = False) -> Text:
    """Write the allowlist from the current tree (every site, with its tier).

    Example:

      alloc-audit allowlist init && git add allowlists/
    """
    from ..ratchet.allowlist import allowlist_files, write_allowlist
    from ..ratchet.compare import entries_for

    project = load_project(None, options.config_path)
    config = project.config
    existing = allowlist_files(config.allowlist_dir)
    if existing and not force:
        raise UsageError(f"an allowlist already exists ({', '.join(p.name for p in existing)}); use "
                         "`alloc-audit allowlist update`, or --force to start over", str(config.allowlist_dir))
    result = scan_project(project, None, options)
    entries = entries_for(result.sites)
    if force:
        for path in existing:
            path.unlink()
    written = write_allowlist(config.allowlist_dir, config.root, entries, split_top_level=split)
    sites = sum(e.count for e in entries)
    return Text(f"alloc-audit: wrote {len(entries)} entries ({sites} sites) to {', '.join(written) or 'nothing'}\n")


def update(options: Options, add_new: bool = False, dry_run: bool = False) -> Text:
    """Rewrite the allowlist from the tree: prune stale entries, lower counts, keep reasons and pins.

    Adds nothing unless --add-new is given. A renamed file's entries move
    with it (never above their old counts). Prints what changed.

    Examples:

      alloc-audit allowlist update

      alloc-audit allowlist update --add-new --dry-run
    """
    from ..ratchet.allowlist import write_allowlist
    from ..ratchet.compare import compare, plan_update

    project = load_project(None, options.config_path)
    config = project.config
    entries = require_allowlist(config)
    result = scan_project(project, None, options)
    plan = plan_update(compare(result.sites, entries, result.scanned_paths, ("",)), add_new)
    lines = "".join(_update_summary(plan))
    if dry_run:
        return Text(lines + "alloc-audit: dry run, nothing written\n")
    written = write_allowlist(config.allowlist_dir, config.root, plan.entries)
    return Text(lines + (f"alloc-audit: wrote {', '.join(written)}\n" if written else
                         "alloc-audit: the allowlist is up to date\n"))


def _update_summary(plan: UpdatePlan) -> list[str]:
    from ..ratchet.keys import key_text

    out = []
    for e in plan.removed:
        out.append(f"- removed  {key_text(e.key)} (matches nothing)\n")
    for old, new in plan.lowered:
        out.append(f"- lowered  {key_text(old.key)} x{old.count} -> x{new.count}\n")
    for old, new in plan.retiered:
        out.append(f"~ retiered {key_text(old.key)} {old.tier} -> {new.tier}\n")
    for rename in plan.renamed:
        out.append(f"> renamed  {rename.old} -> {rename.new} ({len(rename.keys)} entries, reasons kept)\n")
    for e in plan.added:
        out.append(f"+ added    {key_text(e.key)} x{e.count} {e.tier}\n")
    for e, found in plan.still_grown:
        out.append(f"! grown    {key_text(e.key)} accepts {e.count}, the code has {found} (use --add-new to accept)\n")
    for key, found in plan.not_added:
        out.append(f"! new      {key_text(key)} x{found} not added (use --add-new to accept)\n")
    return out


def explain(what: str, options: Options) -> Text:
    """Show which entry covers a site, or which sites an entry covers.

    Examples:

      alloc-audit allowlist explain examples/minigen/worker.py:28

      alloc-audit allowlist explain "examples/minigen/kv_cache.py KVCachePool.__init__ torch.zeros"
    """
    from ..ratchet.checks import entry_line
    from ..ratchet.keys import key_text, parse_key, site_key

    project = load_project(None, options.config_path)
    entries = require_allowlist(project.config)
    result = scan_project(project, None, options)
    by_key = {e.key: e for e in entries}
    out: list[str] = []
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
            out.append(f"{site.path}:{site.span.line}: {site.api} in {site.scope} "
                       f"({site.tier.value}: {site.tier_reason})")
            out.append(f"  key: {key_text(key)}")
            if entry is None:
                out.append("  not on the allowlist (a new site)")
            else:
                state = "ok" if entry.count == len(siblings) else f"the code has {len(siblings)}"
                out.append(f"  covered by {entry_line(entry)}  ({state})")
            if len(siblings) > 1:
                out.append(f"  the key's sites: lines {', '.join(str(s.span.line) for s in siblings)}")
        return Text("".join(f"{line}\n" for line in out))
    parsed = parse_key(what)
    if parsed is None:
        raise UsageError(f"{what!r} is neither 'path scope api' nor PATH:LINE")
    found = by_key.get(parsed)
    sites = [s for s in result.sites if site_key(s) == parsed]
    out.append(f"{key_text(parsed)}: " + (entry_line(found) if found else "no allowlist entry"))
    for site in sites:
        out.append(f"  {site.path}:{site.span.line}: {site.api} ({site.tier.value}: {site.tier_reason})")
    if not sites:
        out.append("  no site matches it (stale)" if found else "  no site has this key")
    return Text("".join(f"{line}\n" for line in out))


def merge_driver(ancestor: Path, ours: Path, theirs: Path) -> Text:
    """A git merge driver that resolves allowlist conflicts fail-closed.

    Per key the smaller count wins, an entry deleted on either side stays
    deleted, reasons are kept. Set it up once per clone:

      git config merge.alloc-audit.driver "alloc-audit allowlist merge-driver %O %A %B"

    and in .gitattributes:

      allowlists/*.allowlist merge=alloc-audit
    """
    from ..atomic import atomic_write_bytes
    from ..ratchet.allowlist import merge_entries, parse_allowlist, render_file

    def read(path: Path, label: str) -> list[AllowlistEntry]:
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {label} version: {exc}", str(path)) from None
        return parse_allowlist(text, f"{label} ({path})")

    try:
        merged = merge_entries(read(ancestor, "base"), read(ours, "ours"), read(theirs, "theirs"))
    except UsageError as exc:
        # leave %A as it is: git reports a conflict for a hand merge
        return Text(err=f"alloc-audit merge-driver: {exc}\n", failed=True)
    atomic_write_bytes(ours, render_file(merged).encode("utf-8"))
    return Text()
