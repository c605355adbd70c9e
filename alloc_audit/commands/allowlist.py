"""`alloc-audit allowlist init|update|explain|merge-driver`: write the
allowlist from the tree, prune it, explain an entry or a site, merge it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .outcome import Text
from .project import Options, coverage, file_counts, load_project, require_allowlist, scan_project, unanalysed

if TYPE_CHECKING:
    from ..ratchet.allowlist import AllowlistEntry
    from ..ratchet.baseline import BaselineUpdate
    from ..ratchet.compare import UpdatePlan


def init(options: Options, force: bool = False, split: bool = False, paths: list[Path] | None = None,
         findings: bool = True) -> Text:
    """Write the allowlist from the current tree (every site, with its tier),
    and the findings baseline (the hazards that exist today).

    With PATHS only the sites and findings under them are recorded (the whole
    tree is still analysed). Afterwards `check` fails only on what is new:
    sites not on the allowlist, findings not in the baseline.

    Examples:

      alloc-audit allowlist init && git add allowlists/

      alloc-audit allowlist init src          # leave tests/ and benchmarks/ out
    """
    from ..ratchet.allowlist import allowlist_files, load_allowlist, write_allowlist
    from ..ratchet.baseline import baseline_path, entries_from, write_baseline
    from ..ratchet.compare import coverage_test, entries_for
    from ..report.words import plural

    project = load_project(paths, options.config_path)
    config = project.config
    existing = allowlist_files(config.allowlist_dir)
    if findings and baseline_path(config.allowlist_dir).is_file():
        existing.append(baseline_path(config.allowlist_dir))
    if existing and not force:
        raise UsageError(f"an allowlist already exists ({', '.join(p.name for p in existing)}); use "
                         "`alloc-audit allowlist update`, or --force to start over", str(config.allowlist_dir))
    covers = coverage_test(coverage(config, paths))
    result = scan_project(project, None, options)
    entries = list(entries_for(s for s in result.sites if covers(s.path)))
    baseline = entries_from(f for f in result.findings if covers(f.path)) if findings else []
    missing = unanalysed(result)
    kept = []
    if force and missing:
        # the old entries of files this run could not analyse stay as they are
        kept = [e for e in load_allowlist(config.allowlist_dir, config.root) or () if e.path in missing]
        entries += kept
    try:
        # --force: the old files go only once the new ones are complete
        written = write_allowlist(config.allowlist_dir, config.root, entries, split_top_level=split, replace=force)
        if findings:
            name = write_baseline(config.allowlist_dir, config.root, baseline)
            written += [name] if name else []
    except OSError as exc:
        raise UsageError(f"cannot write the allowlist ({exc.strerror or exc}); the old one is unchanged",
                         str(config.allowlist_dir)) from None
    sites = sum(e.count for e in entries)
    recorded = sum(e.count for e in baseline)
    err = "".join(f"! not analysed  {p.path}: {p.message}; its sites are not on the allowlist\n"
                  for p in result.unchecked)
    hint = tests_hint([e.path for e in entries for _ in range(e.count)])
    return Text(f"alloc-audit: wrote {plural(len(entries), 'entry', 'entries')} ({plural(sites, 'site')})"
                + (f" and a findings baseline of {plural(recorded, 'finding')}" if findings else "")
                + f" to {', '.join(written) or 'nothing'}"
                + (f"; kept {len(kept)} entries of files not analysed" if kept else "") + file_counts(result) + "\n"
                + (hint + "\n" if hint else ""), err)


_NOT_PRODUCTION = re.compile(r"(^|/)(tests?|testing|benchmarks?|bench)(/|$)|(^|/)(test_[^/]*|[^/]*_test\.[^/]*"
                             r"|bench_[^/]*)$")


def tests_hint(paths: list[str]) -> str | None:
    """Most of a real library's allowlist can be tests and benchmarks (81 %
    of flashinfer's sites): say so once, with the way to leave them out."""
    if not paths:
        return None
    tops = sorted({m.group(2) for p in paths if (m := _NOT_PRODUCTION.search(p)) and m.group(2)})
    share = sum(1 for p in paths if _NOT_PRODUCTION.search(p)) / len(paths)
    if share < 0.2:
        return None
    dirs = ", ".join(f'"**/{t}/**"' for t in tops) or '"**/test_*.py"'
    return (f"hint: {share:.0%} of these sites are in tests or benchmarks; to keep them out of the allowlist, add "
            f"exclude = [{dirs}] to [tool.alloc-audit] (or pass the production paths: "
            "`alloc-audit allowlist init --force src`)")


def update(options: Options, add_new: bool = False, dry_run: bool = False, reason: str = "") -> Text:
    """Rewrite the allowlist from the tree: prune stale entries, lower counts, keep reasons and pins.

    The findings baseline is brought up to date the same way (fixed findings
    pruned, counts lowered). Adds nothing unless --add-new is given (new
    sites and new findings; --reason is written on what it adds). A renamed
    file's entries move with it (never above their old counts). Prints what
    changed.

    Examples:

      alloc-audit allowlist update

      alloc-audit allowlist update --add-new --reason "staging buffer, freed after load"

      alloc-audit allowlist update --add-new --dry-run
    """
    from ..ratchet.allowlist import AllowlistChanged, snapshot, write_allowlist
    from ..ratchet.baseline import compare_findings, load_baseline, plan_baseline_update, write_baseline
    from ..ratchet.compare import compare, plan_update

    project = load_project(None, options.config_path)
    config = project.config
    if reason and not add_new:
        raise UsageError("--reason is written on the entries --add-new adds; give --add-new too")
    before = snapshot(config.allowlist_dir)
    entries = require_allowlist(config)
    result = scan_project(project, None, options)
    missing = unanalysed(result)
    baseline = load_baseline(config.allowlist_dir, config.root)
    bplan = None
    if baseline is not None:
        unread = frozenset(e.path for e in result.errors) | frozenset(missing)  # findings may be missing: kept
        bplan = plan_baseline_update(compare_findings(result.findings, baseline, unread=unread), add_new, reason)
    for _attempt in range(20):
        plan = _with_reason(plan_update(compare(result.sites, entries, result.scanned_paths, ("",), None, missing),
                                        add_new), reason)
        lines = "".join(_update_summary(plan)) + "".join(_baseline_update_summary(bplan) if bplan else ())
        if dry_run:
            return Text(lines + "alloc-audit: dry run, nothing written" + file_counts(result) + "\n")
        try:
            written = write_allowlist(config.allowlist_dir, config.root, plan.entries, expected=before)
            break
        except OSError as exc:
            raise UsageError(f"cannot write the allowlist ({exc.strerror or exc}); the old one is unchanged",
                             str(config.allowlist_dir)) from None
        except AllowlistChanged:
            # another run (or an editor) wrote the allowlist while we scanned:
            # plan again from its version, so its entries are not lost
            before = snapshot(config.allowlist_dir)
            entries = require_allowlist(config)
    else:
        raise UsageError("the allowlist kept changing while it was being updated; nothing written",
                         str(config.allowlist_dir))
    if bplan is not None:
        try:
            name = write_baseline(config.allowlist_dir, config.root, bplan.entries)
        except OSError as exc:
            raise UsageError(f"cannot write the findings baseline ({exc.strerror or exc}); it is unchanged",
                             str(config.allowlist_dir)) from None
        written += [name] if name else []
    return Text(lines + (f"alloc-audit: wrote {', '.join(written)}" if written else
                         "alloc-audit: the allowlist is up to date") + file_counts(result) + "\n")


def _with_reason(plan: UpdatePlan, reason: str) -> UpdatePlan:
    """``--reason`` on the entries --add-new adds (an entry keeps a reason it had)."""
    import dataclasses

    if not reason:
        return plan
    added = {e.key for e in plan.added}
    return dataclasses.replace(
        plan, entries=tuple(dataclasses.replace(e, reason=e.reason or reason) if e.key in added else e
                            for e in plan.entries),
        added=tuple(dataclasses.replace(e, reason=reason) for e in plan.added))


def _baseline_update_summary(plan: BaselineUpdate) -> list[str]:
    from ..ratchet.baseline import key_display

    out = []
    for e in plan.removed:
        out.append(f"- fixed    {key_display(e.key)} (the finding is gone: debt paid)\n")
    for e, left in plan.lowered:
        if left:
            out.append(f"- lowered  {key_display(e.key)} x{e.count} -> x{left} (findings fixed)\n")
    for e in plan.added:
        out.append(f"+ accepted {key_display(e.key)} x{e.count} (finding)\n")
    for key, found in plan.not_added:
        out.append(f"! finding  {key_display(key)} x{found} not accepted (use --add-new to accept)\n")
    return out


def _update_summary(plan: UpdatePlan) -> list[str]:
    from ..ratchet.keys import key_text
    from ..report.words import plural

    out = []
    for e in plan.removed:
        out.append(f"- removed  {key_text(e.key)} (matches nothing)\n")
    for old, new in plan.lowered:
        out.append(f"- lowered  {key_text(old.key)} x{old.count} -> x{new.count}\n")
    for old, new in plan.retiered:
        out.append(f"~ retiered {key_text(old.key)} {old.tier} -> {new.tier}\n")
    for rename in plan.renamed:
        out.append(f"> renamed  {rename.old} -> {rename.new} ({plural(len(rename.keys), 'entry', 'entries')}, "
                   "reasons kept)\n")
    for e in plan.added:
        out.append(f"+ added    {key_text(e.key)} x{e.count} {e.tier}\n")
    for e, found in plan.still_grown:
        out.append(f"! grown    {key_text(e.key)} accepts {e.count}, the code has {found} (use --add-new to accept)\n")
    for key, found in plan.not_added:
        out.append(f"! new      {key_text(key)} x{found} not added (use --add-new to accept)\n")
    for e, why in plan.unchecked:
        out.append(f"? not checked {key_text(e.key)} kept as it is: {e.path} could not be analysed ({why})\n")
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
    missing = unanalysed(result)
    if not sites and parsed[0] in missing:
        out.append(f"  not checked: {parsed[0]} could not be analysed ({missing[parsed[0]]})")
    elif not sites:
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
    try:
        # %A may be a link or a device: atomic_write_bytes writes through, never replaces
        atomic_write_bytes(ours, render_file(merged).encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write the merge result: {exc.strerror or exc}", str(ours)) from None
    return Text()
