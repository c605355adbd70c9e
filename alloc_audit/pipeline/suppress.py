"""Inline suppressions: ``alloc-audit: ignore[rule] reason`` comments ->
findings marked suppressed, plus findings about the annotations themselves.

A suppression applies to a finding on its own line (trailing comment), or on
the next code line when it stands alone on its line (stacked annotation lines
all apply to the line below them). Three meta rules keep annotations honest,
like ruff's RUF100: a suppression or tier override must say why
(``annotation-without-reason``), must be well-formed and name known rules
(``invalid-annotation``), and must still do something (``unused-suppression``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

from ..model import Annotation, FileFacts, Finding, Site
from ..rules.base import Rule
from ..rules.meta import INVALID, NO_REASON, UNUSED
from .extract.annotations import annotation_applies as applies


def apply_suppressions(
    findings: Sequence[Finding],
    files: Mapping[str, FileFacts],
    sites: Sequence[Site],
    known_rules: Mapping[str, str],
    enabled: Collection[str],
    complete: bool,
) -> tuple[Finding, ...]:
    """Mark suppressed findings and add the meta findings.

    ``known_rules`` maps every accepted name (aliases included) to the rule's
    current name; ``complete`` is false when only some files were analysed,
    where "unused" cannot be told and is not reported."""
    by_path: dict[str, list[Annotation]] = {}
    for path, facts in files.items():
        if facts.annotations:
            by_path[path] = list(facts.annotations)
    used: set[tuple[str, int, str]] = set()
    out: list[Finding] = []
    for finding in findings:
        annotations = by_path.get(finding.path, ())
        reason = None
        for ann in annotations:
            if ann.kind != "ignore" or ann.problem:
                continue
            names = {known_rules.get(r, r) for r in ann.rules}
            if finding.rule in names and applies(ann, finding.line, finding.stmt_line):
                for r in ann.rules:
                    if known_rules.get(r, r) == finding.rule:
                        used.add((finding.path, ann.line, r))
                reason = ann.reason or "(no reason given)"
                break
        out.append(dataclasses.replace(finding, suppressed=reason) if reason is not None else finding)
    site_lines: dict[str, list[Site]] = {}
    for site in sites:
        site_lines.setdefault(site.path, []).append(site)
    for path in sorted(by_path):
        for ann in by_path[path]:
            out.extend(_check_annotation(path, ann, site_lines.get(path, ()), used, known_rules, enabled, complete))
    return tuple(sorted(out, key=lambda f: f.sort_key))


def _meta(rule: Rule, path: str, ann: Annotation, message: str) -> Finding:
    return Finding(rule=rule.name, severity=rule.severity, path=path, line=ann.line, col=1, scope="",
                   message=message, stmt_line=ann.line)


def _check_annotation(path: str, ann: Annotation, sites: Iterable[Site], used: set[tuple[str, int, str]],
                      known_rules: Mapping[str, str], enabled: Collection[str], complete: bool) -> Iterable[Finding]:
    if ann.problem:
        yield _meta(INVALID, path, ann, f"unreadable alloc-audit comment: {ann.problem}")
        return
    if ann.kind == "ignore":
        unknown = [r for r in ann.rules if r not in known_rules]
        for rule in unknown:
            yield _meta(INVALID, path, ann, f"ignore[{rule}] names no known rule; see `alloc-audit rules list`")
        if not ann.reason:
            yield _meta(NO_REASON, path, ann,
                        f"suppression of {', '.join(ann.rules)} has no reason; write why after the bracket")
        if complete:
            for rule in ann.rules:
                if rule in unknown or known_rules.get(rule, rule) not in enabled:
                    continue
                if (path, ann.line, rule) not in used:
                    yield _meta(UNUSED, path, ann, f"ignore[{rule}] suppresses nothing here; delete it")
    elif ann.kind == "tier":
        if not ann.reason:
            yield _meta(NO_REASON, path, ann, f"tier={ann.tier} override has no reason; write why after the tier")
        if not any(applies(ann, s.span.end_line, s.stmt_line) for s in sites):
            yield _meta(UNUSED, path, ann, f"tier={ann.tier} applies to no allocation site; move or delete it")
