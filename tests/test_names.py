"""pipeline/names.py answers what the per-name patterns it replaced answered
(issue 11): each function against its pattern, on random texts over an
alphabet of word characters (ASCII, non-ASCII letters and digits), dots,
brackets, spaces and a combining mark; and python_host's `_bound_else`,
which now searches only the lines that spell the name, against its search
of the whole function."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alloc_audit.pipeline.names import has_name, has_word, starts_with_word

_ALPHABET = "ab_1.([ )\u00e9\u0661\u0301\n*"
texts = st.text(alphabet=_ALPHABET, max_size=14)
names = st.text(alphabet=_ALPHABET, min_size=1, max_size=3)


@settings(max_examples=600, deadline=None)
@given(texts, names)
def test_has_word_is_the_word_pattern(text: str, name: str) -> None:
    assert has_word(text, name) == (re.search(r"\b" + re.escape(name) + r"\b", text) is not None)


@settings(max_examples=600, deadline=None)
@given(texts, names)
def test_has_name_is_the_lookaround_pattern(text: str, name: str) -> None:
    pattern = rf"(?<![\w.]){re.escape(name)}(?![\w(\[.])"
    assert has_name(text, name, ".", "([.") == (re.search(pattern, text) is not None)
    assert has_name(text, name) == (re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None)


@settings(max_examples=400, deadline=None)
@given(texts, names)
def test_starts_with_word_is_the_anchored_pattern(text: str, name: str) -> None:
    assert starts_with_word(text, name) == (re.match(re.escape(name) + r"\b", text) is not None)


def test_examples() -> None:
    assert has_word("copy_(buf, x)", "buf") and not has_word("copy_(buffer)", "buf")
    assert has_name("return buf, n", "buf", ".", "([.") and not has_name("return self.buf", "buf", ".", "([.")
    assert not has_name("return buf[0]", "buf", ".", "([.") and has_name("x.buf + buf", "buf", ".", "([.")
    assert starts_with_word("merged.reshape(-1)", "merged") and not starts_with_word("merged2.view()", "merged")


def _bound_else_whole(source: str, name: str) -> bool:
    """python_host._bound_else before issue 11's cut: the pattern searched over the whole function."""
    n = re.escape(name)
    return re.search(rf"^[ \t]*[^\n=#(]*,[ \t]*{n}\b[^\n=(]*=(?!=)|\bfor\b[^\n:]*\b{n}\b[^\n:]*\bin\b|"
                     rf"\bas[ \t]+{n}\b|\b{n}[ \t]*:=|^[ \t]*{n}[ \t]*,[^\n=(]*=(?!=)|"
                     rf"\b(?:global|nonlocal)\b[^\n]*\b{n}\b",
                     source, re.M) is not None


_TOKENS = ["x", "xs", "y", " ", "\t", "\n", ",", "=", "==", ":", ":=", "#", "(", "for ", " in ", "as ", "global ", "."]


@pytest.mark.slow  # run first (conftest.py)
@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=16).map("".join), st.sampled_from(["x", "xs", "x.y", "\nx"]))
def test_bound_else_searches_only_the_lines_with_the_name(source: str, name: str) -> None:
    from alloc_audit.pipeline.extract.python_host import _bound_else

    assert _bound_else(source, name) == _bound_else_whole(source, name)
