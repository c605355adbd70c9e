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
                  "cpp/parse-idioms-tests.cpp", "cuda/parse-idioms-kernels.cu", "cpp/parse-idioms-modern.cpp",
                  "cpp/parse-idioms-r31.cpp"]


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


def test_brace_default_blanked_only_in_a_parameter_after_a_type() -> None:
    data = (b"void f(Dims d = {1, 1, 1}, number<N> = {},\n       typename T::P p = {}\n);\n"
            b"Dims e = {1, 2, 3};\nP q = {.x = {1, 2}, .y = 3};\ng(a, b = {1});\n")
    assert repair_idioms(data) == (b"void f(Dims d            , number<N>     ,\n       typename T::P p     \n);\n"
                                   b"Dims e = {1, 2, 3};\nP q = {.x = {1, 2}, .y = 3};\ng(a, b = {1});\n")


def test_bit_cast_loses_its_type_argument_and_one_argument_calls_stay() -> None:
    data = (b"x = __builtin_bit_cast(unsigned short, y) + __builtin_bit_cast(T<A, 2>, z);\n"
            b"w = __builtin_bit_cast(v);\n// __builtin_bit_cast(\n//   float, v)\n")
    assert repair_idioms(data) == (b"x = __builtin_bit_cast(                y) + __builtin_bit_cast(         z);\n"
                                   b"w = __builtin_bit_cast(v);\n// __builtin_bit_cast(\n//   float, v)\n")


def test_operator_call_template_arguments_blanked_other_templates_kept() -> None:
    data = (b"template <> void operator()<F16, float>(F16& e) const;\nbool b = a < c;\nf<int>(x);\n"
            b"call.template operator()<true, hasZ>();\n")
    assert repair_idioms(data) == (b"template <> void operator()            (F16& e) const;\nbool b = a < c;\nf<int>(x);\n"
                                   b"call.template operator()<true, hasZ>();\n")


def test_new_pointer_array_becomes_one_name_plain_arrays_stay() -> None:
    data = b"p = new char const *[n];\nq = new const Foo*[n];\nr = new int[n];\ns = new (buf) T*[n];\n"
    assert repair_idioms(data) == b"p = new char_const__[n];\nq = new       Foo_[n];\nr = new int[n];\ns = new (buf) T*[n];\n"


def test_using_declarator_list_keeps_its_first_name_aliases_stay() -> None:
    data = b"using std::cout, std::cerr,\n    std::endl;\nusing V = std::pair<int, int>;\nusing std::swap;\n"
    assert repair_idioms(data) == b"using std::cout            \n             ;\nusing V = std::pair<int, int>;\nusing std::swap;\n"


def test_triple_template_close_joins_the_innermost_list_launches_stay() -> None:
    data = b"g(X<Y<Z<A>>>{});\nk<<<grid, block>>>(x);\nk<<<N>>>(x);\nT<U<V<W>>>(x);\n"
    assert repair_idioms(data) == b"g(X<Y<Z_A_>>{});\nk<<<grid, block>>>(x);\nk<<<N>>>(x);\nT<U<V<W>>>(x);\n"


def test_macro_before_a_constructor_initialiser_list_only() -> None:
    data = (b"  OPUS_D Foo(void* p) : inner(p) {}\n  __q_inline__ constexpr Foo()\n      : a(0) {}\n"
            b"  MY_TYPE f(int a);\n  int x = c ? F(a) : b;\n  UINT x : 4;\n")
    assert repair_idioms(data) == (b"         Foo(void* p) : inner(p) {}\n               constexpr Foo()\n      : a(0) {}\n"
                                   b"  MY_TYPE f(int a);\n  int x = c ? F(a) : b;\n  UINT x : 4;\n")


def test_attribute_macro_over_lines_blanked_one_line_calls_left_to_the_mask() -> None:
    data = b"extern __shared__ __align__(\n    alignof(S<A, 4>))\n    char smem[];\n__align__(16) int x;\n"
    assert repair_idioms(data, attribute_macros=("__align__",)) == (
        b"extern __shared__           \n                     \n    char smem[];\n__align__(16) int x;\n")


def test_comments_in_a_define_blanked_with_their_continuations_kept() -> None:
    data = b"#define T(X) \\\n  /* a \\\n  b */ \\\n  X(1) /* c */  \nint y; /* kept */\n"
    assert repair_idioms(data) == b"#define T(X) \\\n       \\\n       \\\n  X(1)          \nint y; /* kept */\n"


def test_lone_macro_line_kept_as_the_last_template_argument() -> None:
    data = b"f(kernel<\n    float,\n    EMIT_RELU\n  >, attr);\nCUTLASS_PRAGMA_UNROLL\nfor (;;) {}\n"
    masked = parse_source(data, Language.CUDA, (), (), True).source
    assert masked == data.replace(b"CUTLASS_PRAGMA_UNROLL", b" " * 21)


@pytest.mark.parametrize("line", [b"    disallowed_tokens: list[int] or None\n", b"    x: dict[str, int] or None = None\n"])
def test_subscripted_annotation_or_none_reads_as_a_union(line: bytes) -> None:
    # exllama v1's generator.py: a subscript then `or` is an error to the grammar (`int or None` is not)
    data = b"class Settings:\n" + line + b"    beams: int or None\n\n    def f(self):\n        return a[0] or b\n"
    parsed = parse_source(data, Language.PYTHON)
    assert error_summary(parsed) is None
    assert parsed.source.replace(b"|  None", b"or None") == data  # same length, the `or` only


def test_dispatch_cases_side_by_side_read_as_arguments() -> None:
    # flute's qgemm.cpp: AT_DISPATCH_SWITCH's cases pasted side by side, no comma between
    data = (b"at::Tensor f(at::Tensor input) {\n  auto out = at::empty_like(input);\n"
            b"  AT_DISPATCH_SWITCH(\n    input.scalar_type(), \"f\",\n"
            b"    AT_DISPATCH_CASE(at::ScalarType::Half, [&]() { run<half>(out); return; })\n"
            b"    AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&]() { run<bf16>(out); return; })\n"
            b"    AT_DISPATCH_CASE(at::ScalarType::Float, [&]() { run<float>(out); return; })\n  );\n"
            b"  REGISTER_ONCE(x)\n  BAR(y);\n  return out;\n}\n")
    parsed = parse_source(data, Language.CUDA)
    assert error_summary(parsed) is None
    assert parsed.source.count(b" ,AT_DISPATCH_CASE(") == 2  # the blank before each later case only
    assert b",BAR(y);" not in parsed.source  # a run that ends no argument list is left as written


def test_subscripted_parameter_annotation_or_reads_as_a_union() -> None:
    # distrifuser's utils.py: a parameter's annotation, the parameter list over lines
    data = (b"class Buffers:\n    def register_tensor(\n"
            b"        self, shape: tuple[int, ...] or list[int], dtype: torch.dtype, kind: str = None\n"
            b"    ) -> int:\n        return torch.empty(shape, device='cuda', dtype=dtype)\n"
            b"def g(a, b: list[int] or None = None, *, c: dict[str, int] or None = None):\n"
            b"    return {a: b[0] or c, 'k': d[1] or e}\n")
    parsed = parse_source(data, Language.PYTHON)
    assert error_summary(parsed) is None
    assert parsed.source.replace(b"|  ", b"or ") == data  # same length, the annotations' `or` only
    assert b"b[0] or c, 'k': d[1] or e" in parsed.source  # a valid file's dict values stay as written


def test_annotation_repair_leaves_expressions_after_a_keyword() -> None:
    data = b"if x:\n    pass\nelse: a[0] or b\nclass C:\n    y: list[int] or None\n"
    parsed = parse_source(data, Language.PYTHON)
    assert error_summary(parsed) is None
    assert b"else: a[0] or b" in parsed.source
