"""Parsing `alloc-audit:` comments (pure)."""

from __future__ import annotations

import pytest

from alloc_audit.model import Annotation
from alloc_audit.pipeline.extract.annotations import annotation_applies, next_code_line, parse_annotation


@pytest.mark.parametrize(
    ("comment", "kind", "rules", "tier", "reason", "problem"),
    [
        pytest.param("# alloc-audit: ignore[alloc-in-capture] static output", "ignore", ("alloc-in-capture",), None,
                     "static output", "", id="python ignore"),
        pytest.param("// alloc-audit: ignore[a-b, c-d] -- two rules", "ignore", ("a-b", "c-d"), None, "two rules", "",
                     id="c++ two rules"),
        pytest.param("/* alloc-audit: tier=T3 pooled KV blocks */", "tier", (), "T3", "pooled KV blocks", "",
                     id="block comment tier"),
        pytest.param("# alloc-audit: tier=T5a", "tier", (), "T5a", "", "", id="tier without reason"),
        pytest.param("# noqa: E501  # alloc-audit: ignore[grow-on-demand] warm-up only", "ignore",
                     ("grow-on-demand",), None, "warm-up only", "", id="after another tool's comment"),
        pytest.param("# alloc-audit: tier=T9 x", "tier", (), "T9", "x", "unknown tier", id="unknown tier"),
        pytest.param("# alloc-audit: ignore[] x", "ignore", (), None, "x", "names no rule", id="empty brackets"),
        pytest.param("# alloc-audit: ignore everything", "invalid", (), None, "", "must name its rules",
                     id="ignore without brackets"),
        pytest.param("# alloc-audit: hello", "invalid", (), None, "", "expected", id="unreadable"),
    ],
)
def test_parse(comment: str, kind: str, rules: tuple[str, ...], tier: str | None, reason: str, problem: str) -> None:
    found = parse_annotation(comment, 3, own_line=True)
    assert found is not None
    assert (found.kind, found.rules, found.tier, found.reason) == (kind, rules, tier, reason)
    assert problem in found.problem if problem else not found.problem


def test_not_an_annotation() -> None:
    assert parse_annotation("# an ordinary comment", 1, True) is None


@pytest.mark.parametrize(
    ("ann", "line", "stmt", "applies"),
    [
        pytest.param(Annotation(10, "ignore", own_line=False), 10, 10, True, id="trailing on the line"),
        pytest.param(Annotation(11, "ignore", own_line=False), 11, 10, True, id="trailing on a later line"),
        pytest.param(Annotation(9, "ignore", own_line=True, applies_to=10), 10, 10, True, id="line above"),
        pytest.param(Annotation(7, "ignore", own_line=True, applies_to=10), 10, 10, True,
                     id="above, comments between"),
        pytest.param(Annotation(7, "ignore", own_line=True, applies_to=8), 10, 10, False, id="above another line"),
        pytest.param(Annotation(12, "ignore", own_line=False), 10, 10, False, id="trailing on the next line"),
    ],
)
def test_applies(ann: Annotation, line: int, stmt: int, applies: bool) -> None:
    assert annotation_applies(ann, line, stmt) is applies


def test_next_code_line_skips_comments_and_blanks() -> None:
    lines = [b"# alloc-audit: tier=T2 x", b"# more", b"", b"    x = 1"]
    assert next_code_line(lines, 1, b"#") == 4
