"""Round 34: the repair parse's shared answers (``parse_macros.MacroCalls``),
its two variants from one pass (``parse._repairs``) and its patterns tried
only where a literal shows a match can start (``parse_macros.literal_led``)
against the plain computations they replace, on every native fixture."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.pipeline import parse, parse_declarations, prefilter
from alloc_audit.pipeline.parse import _blank_conditionals_in_parens, _repairs, repair_idioms
from alloc_audit.pipeline.parse_macros import (
    MACRO_CALL,
    MacroCalls,
    close_paren,
    digit_led_macro_names,
    guarded_statement_macros,
    juxtaposed_macro_arguments,
    literal_led,
)

FIXTURES = Path(__file__).parent / "fixtures"
NATIVE = [p for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")]
_APIS = load_catalog(load_config(FIXTURES, None)).apis
_MADE = [b'ALL_OF(p, (q), "(", \')\', f(x)) AT_CASE(a) AT_CASE(b)\nif (a) CHECK(b, "m(")\nTEST(S, 2d) {}\n',
         b"M((((x)))\nN(y\n", b"", b"(" * 50 + b")" * 49]


def _sources() -> list[bytes]:
    return [p.read_bytes() for p in NATIVE] + _MADE


def test_the_fixtures_are_found() -> None:
    assert len(NATIVE) > 20


@pytest.mark.parametrize("data", _sources())
def test_macro_calls_answer_as_close_paren(data: bytes) -> None:
    known = MacroCalls(data)
    assert [m.span() for m in known.calls()] == [m.span() for m in MACRO_CALL.finditer(data)]
    opens = [i for i, c in enumerate(data) if c == 40]
    for at in opens + opens[::-1]:  # every `(`, each asked twice
        assert known.close(at) == close_paren(data, at)


@pytest.mark.parametrize("data", _sources())
def test_passes_sharing_the_calls_write_what_each_writes_alone(data: bytes) -> None:
    known = MacroCalls(data)
    for repair in (guarded_statement_macros, juxtaposed_macro_arguments, digit_led_macro_names):
        alone, shared = bytearray(data), bytearray(data)
        repair(data, alone)
        repair(data, shared, known)  # ``known`` already holds the earlier passes' answers
        assert shared == alone


@pytest.mark.parametrize("data", _sources())
def test_both_repairs_come_from_one_pass(data: bytes) -> None:
    with_conditionals, without = _repairs(data, _APIS.attribute_macros)
    assert repair_idioms(data, True, _APIS.attribute_macros) == with_conditionals
    assert repair_idioms(data, False, _APIS.attribute_macros) == without
    out = bytearray(without)
    _blank_conditionals_in_parens(data, out)  # the last repair, the only one the flag decides
    assert bytes(out) == with_conditionals
    assert len(without) == len(data) and [i for i, c in enumerate(without) if c == 10] == \
        [i for i, c in enumerate(data) if c == 10]


_PIECES = [b"using", b" typename", b"typename", b"enum", b" : int", b" :", b" {", b"template", b" class", b" struct",
           b" X<int>;", b"extern ", b"#", b"pragma", b" unroll", b"\n", b'"', b" HINT(128)", b" A_B", b" ", b"\t",
           b"delete", b"[]", b" (", b"T::A", b"{", b"(", b")", b";", b"]", b"__device__", b"__host__", b"x", b"_",
           # whole idioms, so that every pattern matches in some sources (and matches meet)
           b"\ntemplate class X<float>;", b"\n  extern template struct ns::Y<T, 2>;", b"\n#pragma unroll",
           b"\n # pragma once\n", b'"a" HINT(128) "b"', b'" A_B "', b"delete[] (", b"delete [ ] (",
           b"enum : int {", b"enum:x::y\n{", b"using typename Base::T;", b"typename T::Args{", b"typename F<T>::C("]


def _generated(count: int = 2000) -> list[bytes]:
    rng = random.Random(34)
    return [b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def test_literal_led_finds_what_finditer_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pattern the repairs look for through ``literal_led``, with the
    literal and place they give it, against ``finditer`` on every native
    fixture and 2,000 generated sources made of the literals, blanks, lines
    and brackets the patterns read."""
    asked: list[bytes] = []

    def both(regex: re.Pattern[bytes], data: bytes, literal: bytes, where: str) -> Iterator[re.Match[bytes]]:
        found = list(literal_led(regex, data, literal, where))
        assert [m.span() for m in found] == [m.span() for m in regex.finditer(data)], (regex.pattern, data)
        asked.append(literal)
        return iter(found)

    monkeypatch.setattr(parse, "literal_led", both)
    monkeypatch.setattr(parse_declarations, "literal_led", both)
    for data in _sources() + _generated():
        repair_idioms(data, True, _APIS.attribute_macros)
    assert set(asked) == {b"typename", b"template", b"enum", b"pragma", b'"', b"using", b"delete"}


_PY_PIECES = [b"import", b" import", b"from", b" x.y", b" as", b" as ", b"as", b" E", b"\n", b" ", b"\t", b"#", b"empty",
              b"from torch import empty as E\n", b"import numpy as np\n", b"  from . import a, b as c\n",
              b"important = 1\n", b"x = 'import y as z'\n", b"from a import (b as c,\n d)\n"]


def test_alias_imports_are_the_pattern_s_matches() -> None:
    """``prefilter._alias_imports`` (tried at lines saying ``import``) against
    ``_ALIAS_IMPORT.findall``, on every Python fixture and 2,000 generated
    sources (``screen`` and ``passes`` both use it, so their comparison in
    test_prefilter.py cannot tell)."""
    rng = random.Random(34)
    sources = [p.read_bytes() for p in sorted(FIXTURES.rglob("*.py"))]
    sources += [b"".join(rng.choice(_PY_PIECES) for _ in range(rng.randint(1, 30))) for _ in range(2000)]
    matched = 0
    for data in sources:
        expected = prefilter._ALIAS_IMPORT.findall(data)
        assert prefilter._alias_imports(data) == expected, data
        matched += len(expected) > 1
    assert matched > 200
