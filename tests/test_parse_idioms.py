"""Native parse idioms (issue 11): the fixtures below each failed to parse
with the v0.2.0 parse stage and must now parse without an error node; their
sites and tiers are checked by test_fixtures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import Language
from alloc_audit.pipeline.parse import _keep_one_branch, error_summary, parse_source, repair_idioms

FIXTURES = Path(__file__).parent / "fixtures"
IDIOM_FIXTURES = ["cuda/parse-idioms-conditionals.cu", "cuda/parse-idioms-macros.cu",
                  "cpp/parse-idioms-declarations.cpp", "cuda/parse-idioms-instantiations.cu",
                  "cpp/parse-idioms-tests.cpp"]


@pytest.mark.parametrize("name", IDIOM_FIXTURES)
def test_idiom_fixture_parses_without_errors(name: str) -> None:
    apis = load_catalog(load_config(FIXTURES, None)).apis
    data = (FIXTURES / name).read_bytes()
    parsed = parse_source(data, Language.CUDA, apis.attribute_macros, apis.specifier_macros,
                          apis.lone_macro_lines)
    assert error_summary(parsed) is None
    assert len(parsed.source) == len(data)
    assert [i for i, c in enumerate(parsed.source) if c == 10] == [i for i, c in enumerate(data) if c == 10]


def test_directive_on_a_last_line_without_newline_parses_at_the_same_positions() -> None:
    data = b"#pragma once\nvoid f(int n);\n#define ROUND_UP(x, y) (((x) + (y) - 1) / (y))"
    parsed = parse_source(data, Language.CUDA)
    assert error_summary(parsed) is None
    assert parsed.source == data + b"\n"  # every byte where it was, one newline after them
    ended = data + b"\n"
    assert parse_source(ended, Language.CUDA).source == ended  # a file with its newline is read as it is


def test_one_branch_kept_per_conditional_the_else_one_where_present() -> None:
    data = b"#if A && \\\n  B\nint a;\n#elif C\nint c;\n#else\nint e;\n#endif\n#ifdef D\nint d;\n#endif\n"
    kept = _keep_one_branch(data).split()
    assert kept == [b"int", b"e;", b"int", b"d;"]


def test_continued_condition_inside_parentheses_is_blanked_with_its_head() -> None:
    data = b"f(a,\n#if defined(X) && \\\n    (Y < 2)\n  b);\n#else\n  c);\n#endif\n"
    assert repair_idioms(data).split() == [b"f(a,", b"b);"]


def test_inline_macro_blanked_only_before_a_return_type_and_a_name() -> None:
    data = b"DS_D_INLINE void f(int x);\nMY_TYPE g(3);\n"
    assert repair_idioms(data).split() == [b"void", b"f(int", b"x);", b"MY_TYPE", b"g(3);"]


def test_explicit_class_instantiation_loses_only_its_keyword() -> None:
    data = b"template class X<float>;\nextern template struct ns::Y<T,\n  2>;\ntemplate <> class Z<int>;\n"
    assert repair_idioms(data).split() == [b"template", b"X<float>;", b"extern", b"template", b"ns::Y<T,", b"2>;",
                                           b"template", b"<>", b"class", b"Z<int>;"]


def test_type_keyword_argument_of_a_macro_in_an_expression_becomes_a_value() -> None:
    data = b"if (ALL_OF(p, n, unsigned long long, (float)x)) {}\n"
    assert repair_idioms(data) == b"if (ALL_OF(p, n, 0                 , (float)x)) {}\n"


def test_python_return_with_a_starred_element_parses_at_the_same_positions() -> None:
    # valid since Python 3.8, an error node to tree-sitter-python: the fixture
    # parse-return-starred.py checks its sites and tiers
    data = (FIXTURES / "python/parse-return-starred.py").read_bytes()
    parsed = parse_source(data, Language.PYTHON)
    assert error_summary(parsed) is None
    assert len(parsed.source) == len(data)
    assert parsed.source.count(b"\n") == data.count(b"\n")
    clean = b"def f(xs):\n    return (1, *xs)\n"
    assert parse_source(clean, Language.PYTHON).source == clean  # no error, no repair


def test_statement_macro_as_the_body_of_a_control_head_becomes_an_empty_statement() -> None:
    data = (b'if (a) TORCH_CHECK(b, "no (shape)")\nelse CHECK(c)\nif (d) CHECK(e) + 1;\n'
            b'if (f) CHECK(g)\n    || h;\n')
    assert repair_idioms(data) == (b'if (a) ;                           \nelse ;       \nif (d) CHECK(e) + 1;\n'
                                   b'if (f) CHECK(g)\n    || h;\n')


def test_digit_led_macro_argument_becomes_a_name_and_numbers_stay() -> None:
    data = b"TEST(Suite, 2dimtest) {}\nTEST(s, 3d_x) {}\nCALL(2u, 0x1F, 1.5f, 1e-3, 16_KiB, 7);\nf(2dim);\n"
    assert repair_idioms(data) == (b"TEST(Suite, _dimtest) {}\nTEST(s, _d_x) {}\n"
                                   b"CALL(2u, 0x1F, 1.5f, 1e-3, 16_KiB, 7);\nf(2dim);\n")
