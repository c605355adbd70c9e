"""arglists.split_top_level jumps between the characters that change its
state (perf-r36b); it must split every text as the character loop it
replaced did: compared on generated texts (quotes, triple quotes,
backslashes, brackets, separators of any length) and on every argument
list of the Python fixtures."""

from __future__ import annotations

from pathlib import Path

from fixtures_harness import extracted_facts
from hypothesis import given, settings
from hypothesis import strategies as st

from alloc_audit.arglists import split_top_level

FIXTURES = Path(__file__).parent / "fixtures" / "python"


def _loop(text: str, sep: str = ",") -> list[str]:
    """``split_top_level`` as rounds 1-35 wrote it: one character at a time."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif ch in "'\"":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else ch
            i += len(quote)
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return [p for p in parts if p]


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab ,;'\"()[]{}\\\n\t=", max_size=40),
       st.sampled_from([",", ";", "(", ")", "'", '"', "\\", " ", "ab", ""]))
def test_generated(text: str, sep: str) -> None:
    assert split_top_level(text, sep) == _loop(text, sep)


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(["x", "f(a, b)", "'a,b'", '"""q,"\'"""', "'''t'''", "[1, 2]", "{k: v}", "\\'",
                                 "'\\'', y", ",", " ", "(", "]", '"', "'"]), max_size=12).map("".join))
def test_generated_tokens(text: str) -> None:
    assert split_top_level(text) == _loop(text)


def test_fixture_argument_lists() -> None:
    paths = tuple(sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py")))
    texts = {a for f in extracted_facts(FIXTURES, paths).values() for a in f.calls.arglists}
    assert len(texts) > 500
    for text in texts:
        assert split_top_level(text) == _loop(text)
