"""`alloc-audit gate --base REF`: the CI gate. Compares the allowlist and the
findings baseline with the ones at REF (read through git, no checkout), then
checks the whole project."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..model import Severity, Site
from .outcome import Text
from .project import Options, fails_unchecked, file_counts, load_project, require_allowlist, scan_project, unanalysed

if TYPE_CHECKING:
    from ..ratchet.baseline import BaselineGrowth


def gate(base: str, options: Options, allow_growth: bool = False, allow_new_allowlist: bool = False,
         fmt: str = "text", unchecked: str | None = None) -> Text:
    """CI gate: fail if the allowlist or the findings baseline grew since --base, listing what grew and why.

    Reads the allowlist and the findings baseline at REF through git (no
    checkout) and compares them with the working tree's: an added entry or
    a raised count fails; an entry that moved with a renamed file does not.
    Then runs `check` on the whole project. Run it on the merge result too:
    two green branches can merge into a red one without any textual conflict.

    Examples:

      alloc-audit gate --base origin/main

      alloc-audit gate --base HEAD~1 --format github

      alloc-audit gate --base origin/main --format json
    """
    from ..gitio import list_tree, require_ref, show
    from ..ratchet.allowlist import load_texts
    from ..ratchet.baseline import FILE_NAME, baseline_growth, load_baseline, parse_baseline
    from ..ratchet.checks import (
        allowlist_problems,
        baseline_growth_problems,
        file_problems,
        finding_problems,
        fixed_debt_problems,
        gate_problems,
        problems_json,
        render,
        unchecked_problems,
    )
    from ..ratchet.compare import compare
    from ..ratchet.gate import compare_allowlists
    from ..ratchet.keys import site_key
    from ..report.words import plural
    from .check import judge_findings

    project = load_project(None, options.config_path)
    config = project.config
    require_ref(config.root, base)
    names = [n for n in list_tree(config.root, base, config.allowlist) if n.endswith(".allowlist")
             and not Path(n).name.startswith(".")]
    now_entries = require_allowlist(config)
    head = ""
    if not names:
        message = (f"there is no allowlist under {config.allowlist}/ at {base}: this change introduces it "
                   f"({plural(len(now_entries), 'entry', 'entries')})")
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
    problems = []
    # the findings baseline may only shrink too (absent at the base: introduced with the allowlist)
    now_baseline = load_baseline(config.allowlist_dir, config.root)
    baseline_grown: list[BaselineGrowth] = []
    if now_baseline is not None and names:
        base_name = Path(config.allowlist, FILE_NAME).as_posix()
        blob = show(config.root, base, base_name)
        try:
            then = parse_baseline(blob.decode("utf-8", "replace"), f"{base}:{base_name}") if blob is not None else []
        except UsageError as exc:
            raise UsageError(f"the findings baseline at {base} cannot be read: {exc}") from None
        baseline_grown, baseline_moved = baseline_growth(then, now_baseline)
        problems += baseline_growth_problems(baseline_grown, baseline_moved, allow_growth)
    scan = scan_project(project, None, options)
    grew = bool(baseline_grown)
    if result is not None:
        sites_by_key: dict[tuple[str, str, str], list[Site]] = {}
        for site in scan.sites:
            sites_by_key.setdefault(site_key(site), []).append(site)
        problems += gate_problems(result, sites_by_key, allow_growth)
        grew = grew or result.failed
    comparison = compare(scan.sites, now_entries, scan.scanned_paths, ("",), None, unanalysed(scan))
    problems += allowlist_problems(comparison)
    not_checked = unchecked_problems(comparison, fails_unchecked(config, unchecked))
    problems += not_checked + file_problems(scan.unchecked)
    judged = judge_findings(project, scan, ("",), False)
    open_findings = judged.open_findings() if judged is not None else [f for f in scan.findings if not f.suppressed]
    findings = [f for f in open_findings if f.severity is Severity.ERROR]
    problems += finding_problems(findings, False)
    if judged is not None:
        problems += fixed_debt_problems(judged)
    problems.sort(key=lambda p: (p.path, p.line, p.title))
    check_failed = (comparison.failed or bool(findings) or any(p.level == "error" for p in not_checked)
                    or bool(judged is not None and judged.fixed))
    failed = (grew and not allow_growth) or check_failed
    if fmt == "json":
        import json

        doc = {
            "schema": "alloc-audit-gate/1",
            "base": base,
            "passed": not failed,
            "allowlist_grew": bool(result is not None and result.failed),
            "baseline_grew": bool(baseline_grown),
            "check_passed": not check_failed,
            "counts": None if result is None else {"grown": len(result.grown), "lowered": len(result.shrunk),
                                                   "removed": len(result.removed), "moved": len(result.moved)},
            "problems": problems_json(problems),
        }
        return Text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", failed=failed)
    out = head + render(problems, fmt)
    if fmt == "text":
        if result is not None:
            out += (f"alloc-audit gate against {base}: {len(result.grown)} grown, {len(result.shrunk)} lowered, "
                    f"{len(result.removed)} removed, {len(result.moved)} moved")
            if now_baseline is not None:
                out += f"; findings baseline: {len(baseline_grown)} grown"
            out += " — growth let through by --allow-growth\n" if grew and allow_growth else "\n"
        out += (f"alloc-audit check: {'failed' if check_failed else 'passed'}"
                + (f" ({len(comparison.unchecked)} entries not checked)" if comparison.unchecked else "")
                + file_counts(scan) + "\n")
    return Text(out, failed=failed)
