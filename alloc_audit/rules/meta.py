"""The meta rules: findings about the annotations themselves, reported by
the suppression stage (``pipeline/suppress.py``), not by a ``check`` of
their own. They are in ``ALL_RULES`` like every rule (listed, explained,
named in suppressions), are always on, and keep their severity.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Finding, Severity
from .base import Rule, RuleContext


def _reported_by_suppress(ctx: RuleContext) -> Iterator[Finding]:
    return iter(())


def _meta_rule(name: str, severity: Severity, summary: str, doc: str) -> Rule:
    return Rule(name=name, severity=severity, summary=summary, doc=doc, check=_reported_by_suppress, meta=True)


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


UNUSED = _meta_rule("unused-suppression", Severity.WARNING,
                  "an alloc-audit suppression or tier comment that no longer applies to anything", _DOC_UNUSED)
NO_REASON = _meta_rule("annotation-without-reason", Severity.ERROR,
                     "an alloc-audit suppression or tier comment without a reason", _DOC_REASON)
INVALID = _meta_rule("invalid-annotation", Severity.ERROR,
                   "an alloc-audit comment with an unknown rule or tier, or an unreadable form", _DOC_INVALID)
META_RULES = (UNUSED, NO_REASON, INVALID)
