"""`alloc-audit gate --base REF`: the CI gate. Compares the allowlist with
the one at REF (read through git, no checkout), then checks the whole project."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..model import Severity, Site
from .outcome import Text
from .project import Options, load_project, require_allowlist, scan_project


def gate(base: str, options: Options, allow_growth: bool = False, allow_new_allowlist: bool = False,
         fmt: str = "text") -> Text:
    """CI gate: fail if the allowlist grew since --base, listing what grew and the sites that need it.

    Reads the allowlist at REF through git (no checkout) and compares it
    with the working tree's: an added entry or a raised count fails; an
    entry that moved with a renamed file does not. Then runs `check` on the
    whole project. Run it on the merge result too: two green branches can
    merge into a red one without any textual conflict.

    Examples:

      alloc-audit gate --base origin/main

      alloc-audit gate --base HEAD~1 --format github
    """
    from ..gitio import list_tree, require_ref, show
    from ..ratchet.allowlist import load_texts
    from ..ratchet.checks import allowlist_problems, finding_problems, gate_problems, render
    from ..ratchet.compare import compare
    from ..ratchet.gate import compare_allowlists
    from ..ratchet.keys import site_key

    project = load_project(None, options.config_path)
    config = project.config
    require_ref(config.root, base)
    names = [n for n in list_tree(config.root, base, config.allowlist) if n.endswith(".allowlist")
             and not Path(n).name.startswith(".")]
    now_entries = require_allowlist(config)
    head = ""
    if not names:
        message = (f"there is no allowlist under {config.allowlist}/ at {base}: this change introduces it "
                   f"({len(now_entries)} entries)")
        if not allow_new_allowlist:
            return Text(err=f"alloc-audit gate: {message}; pass --allow-new-allowlist to accept the introduction\n",
                        failed=True)
        head = f"alloc-audit gate: {message}; accepted (--allow-new-allowlist)\n"
        result = None
    else:
        texts = [(f"{base}:{name}", (show(config.root, base, name) or b"").decode("utf-8", "replace"))
                 for name in names]
        try:
            base_entries = load_texts(texts)
        except UsageError as exc:
            raise UsageError(f"the allowlist at {base} cannot be read: {exc}") from None
        result = compare_allowlists(base_entries, now_entries)
    scan = scan_project(project, None, options)
    problems = []
    grew = False
    if result is not None:
        sites_by_key: dict[tuple[str, str, str], list[Site]] = {}
        for site in scan.sites:
            sites_by_key.setdefault(site_key(site), []).append(site)
        problems += gate_problems(result, sites_by_key, allow_growth)
        grew = result.failed
    comparison = compare(scan.sites, now_entries, scan.scanned_paths, ("",))
    problems += allowlist_problems(comparison)
    findings = [f for f in scan.findings if not f.suppressed and f.severity is Severity.ERROR]
    problems += finding_problems(findings, False)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    out = head + render(problems, fmt)
    check_failed = comparison.failed or bool(findings)
    if fmt == "text":
        if result is not None:
            out += (f"alloc-audit gate against {base}: {len(result.grown)} grown, {len(result.shrunk)} lowered, "
                    f"{len(result.removed)} removed, {len(result.moved)} moved")
            out += " — growth let through by --allow-growth\n" if grew and allow_growth else "\n"
        out += f"alloc-audit check: {'failed' if check_failed else 'passed'}\n"
    return Text(out, failed=(grew and not allow_growth) or check_failed)
