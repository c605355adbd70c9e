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
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from .extract.annotations import annotation_applies as applies
from ..model import Annotation, FileFacts, Finding, Severity, Site

_DOC_UNUSED = """\
## What it flags
An `alloc-audit: ignore[rule]` comment that suppresses no finding, or an
`alloc-audit: tier=...` comment that applies to no allocation site.

## Why it matters
A suppression that outlives its finding hides the next real finding on that
line. Like ruff's RUF100 (unused `noqa`).

## Example
```python
# alloc-audit: ignore[alloc-in-capture] warm-up buffer, freed before capture
x = compute(y)          # nothing here allocates any more
```

## How to fix
Delete the comment, or move it to the line it was meant for.

## How to suppress
It cannot be suppressed; it is only reported when the whole project was
analysed (not in the per-file pre-commit run).

## Known false positives
None known.

## Known false negatives
Suppressions of rules that are disabled in the configuration are not reported.
"""

_DOC_REASON = """\
## What it flags
An `alloc-audit: ignore[rule]` or `alloc-audit: tier=T<n>` comment without a reason.

## Why it matters
The allowlist and the suppressions are the project's record of memory
decisions; a decision without its reason cannot be reviewed or revisited.

## Example
```python
buf = torch.empty(n, device="cuda")  # alloc-audit: ignore[per-call-alloc]
```

## How to fix
Say why after the bracket or the tier:
`# alloc-audit: ignore[per-call-alloc] output buffer, handed to the caller`.

## How to suppress
It cannot be suppressed.

## Known false positives
None known.

## Known false negatives
A reason of one word passes.
"""

_DOC_INVALID = """\
## What it flags
An `alloc-audit:` comment that cannot be read: an unknown rule name in
`ignore[...]`, an unknown tier in `tier=`, or neither form.

## Why it matters
A misspelt suppression suppresses nothing and a misspelt tier changes
nothing, silently.

## Example
```cpp
// alloc-audit: ignore[alloc-in-captur] typo: suppresses nothing
```

## How to fix
Use `ignore[rule-name] reason` with a name from `alloc-audit rules list`, or
`tier=T1|T2|T3|T4|T5a|T5b reason`.

## How to suppress
It cannot be suppressed.

## Known false positives
None known.

## Known false negatives
None known.
"""


@dataclass(frozen=True)
class MetaRule:
    name: str
    severity: Severity
    summary: str
    doc: str
    default_on: bool = True


UNUSED = MetaRule("unused-suppression", Severity.WARNING,
                  "an alloc-audit suppression or tier comment that no longer applies to anything", _DOC_UNUSED)
NO_REASON = MetaRule("annotation-without-reason", Severity.ERROR,
                     "an alloc-audit suppression or tier comment without a reason", _DOC_REASON)
INVALID = MetaRule("invalid-annotation", Severity.ERROR,
                   "an alloc-audit comment with an unknown rule or tier, or an unreadable form", _DOC_INVALID)
META_RULES = (UNUSED, NO_REASON, INVALID)
META_NAMES = frozenset(m.name for m in META_RULES)


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


def _meta(rule: MetaRule, path: str, ann: Annotation, message: str) -> Finding:
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
