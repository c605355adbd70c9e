"""Inline decisions written as comments: ``alloc-audit: ignore[rule] reason``
and ``alloc-audit: tier=T2 reason`` (after ``#`` in Python, ``//`` or ``/*`` in
C++/CUDA). Parsing is pure and shared by every language; whether a
suppression is used, or names a known rule, is decided later (suppress.py)."""

from __future__ import annotations

import re

from ...model import ASSIGNABLE_TIERS, Annotation

MARKER = "alloc-audit:"
_TIERS = frozenset(ASSIGNABLE_TIERS)
_IGNORE = re.compile(r"ignore\[(?P<rules>[^\]]*)\]\s*(?P<reason>.*)", re.S)
_TIER = re.compile(r"tier\s*=\s*(?P<tier>\S+)\s*(?P<reason>.*)", re.S)


def parse_annotation(comment: str, line: int, own_line: bool) -> Annotation | None:
    """The annotation in one comment's text, or None when it has none."""
    at = comment.find(MARKER)
    if at < 0:
        return None
    body = comment[at + len(MARKER):].strip()
    if body.endswith("*/"):
        body = body[:-2].rstrip()
    reason = ""
    if (m := _IGNORE.match(body)) is not None:
        rules = tuple(r.strip() for r in m.group("rules").split(",") if r.strip())
        reason = _clean(m.group("reason"))
        problem = "" if rules else "ignore[] names no rule; write ignore[rule-name] and a reason"
        return Annotation(line=line, kind="ignore", rules=rules, reason=reason, own_line=own_line, problem=problem)
    if (m := _TIER.match(body)) is not None:
        tier = m.group("tier")
        reason = _clean(m.group("reason"))
        problem = "" if tier in _TIERS else f"unknown tier {tier!r}; use one of {', '.join(sorted(_TIERS))}"
        return Annotation(line=line, kind="tier", tier=tier, reason=reason, own_line=own_line, problem=problem)
    if body.startswith("ignore"):
        problem = "a suppression must name its rules: ignore[rule-name] reason"
    else:
        problem = "expected 'ignore[rule-name] reason' or 'tier=T<n> reason' after 'alloc-audit:'"
    return Annotation(line=line, kind="invalid", own_line=own_line, problem=problem)


def _clean(reason: str) -> str:
    reason = reason.strip()
    for lead in ("--", "-", ":", "—"):
        if reason.startswith(lead):
            reason = reason[len(lead):].strip()
    return " ".join(reason.split())


def annotation_applies(ann: Annotation, line: int, stmt_line: int) -> bool:
    """Whether an annotation covers code that ends at ``line`` and whose
    statement starts at ``stmt_line``: a trailing comment anywhere on those
    lines, or an own-line comment inside them or above the statement (with
    only comments and blank lines in between)."""
    start = min(stmt_line or line, line)
    if start <= ann.line <= line:
        return True
    return ann.own_line and ann.line < start and start <= ann.applies_to <= line


def next_code_line(lines: list[bytes], line: int, comment: bytes | tuple[bytes, ...]) -> int:
    """The first line after ``line`` (1-based) that is neither blank nor a
    comment, or 0."""
    for number in range(line, len(lines)):
        text = lines[number].strip()
        if text and not text.startswith(comment):
            return number + 1
    return 0
