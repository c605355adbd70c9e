"""perf-r30: ``parse_mask.mask_macros`` tries the macro pattern only where a match
can start (``_mask_starts``); it must blank exactly what ``regex.sub`` of
the whole pattern blanks: on generated sources (the catalogue's macro
names, wildcard names, `#define`, nested parentheses, lone macro lines
before `)`/`>` and at the ends, bytes that are not ASCII), and on the C++
and CUDA fixtures. And ``nesting_problem``'s byte gate (no tab, no form
feed, no run of 100 spaces: no line the pattern can find) refuses what the
pattern alone refused."""

from __future__ import annotations

import random
from pathlib import Path

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import Language
from alloc_audit.pipeline import parse, parse_mask

FIXTURES = Path(__file__).parent / "fixtures"
_APIS = load_catalog(load_config(FIXTURES, None)).apis
_OPTIONS = [
    (tuple(_APIS.attribute_macros), tuple(_APIS.specifier_macros), True),
    (tuple(_APIS.attribute_macros), tuple(_APIS.specifier_macros), False),
    (("__align__", "*STATIC_ASSERT", "A*B"), ("__*_bounds_*__", "HD", "X"), True),
    ((), (), True),
    (("__align__",), (), False),
]
_PIECES = ("__align__", "__launch_bounds__", "STATIC_ASSERT", "MY_STATIC_ASSERT", "_STATIC_CHECK", "__host__",
           "__device__", "CUTLASS_HOST_DEVICE", "C10_HOST_DEVICE", "__x_bounds_y__", "__bounds__", "AxB", "AB",
           "HD", "HDX", "X", "define ", "#define ", "define\t", "(", ")", "((", "))", "(a, (b))", ";", " ;", "\n",
           "\r\n", " ", "\t", "x", "int", "FOO_BAR", "FOO", "_", ",", ">", "<", "é", "MAX_N", "\n)", "\n>",
           "void f()", "{", "}", "0x1F", "9_A")


def _same(data: bytes, options: list[tuple[tuple[str, ...], tuple[str, ...], bool]] = _OPTIONS) -> None:
    for am, sm, lone in options:
        regex = parse_mask._mask_regex(am, sm, lone)
        want = regex.sub(parse_mask.blank, data) if regex is not None else data
        assert parse_mask.mask_macros(data, am, sm, lone) == want, (data, am, sm, lone)


def test_generated_sources_blank_as_the_whole_pattern() -> None:
    rng = random.Random(30)
    for _ in range(400):
        _same("".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40))).encode())


def test_fixture_sources_blank_as_the_whole_pattern() -> None:
    paths = [p for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")]
    assert paths
    for path in paths:
        _same(path.read_bytes(), _OPTIONS[:1])  # the catalogue's names


def test_a_name_with_other_bytes_searches_the_whole_pattern() -> None:
    assert parse_mask._mask_starts(("a.b",), (), True) is None
    assert parse_mask._mask_starts(("*",), (), False) is None
    assert parse_mask.mask_macros(b"x a.b(1) y", ("a.b",), (), False) == b"x        y"


def _deep(data: bytes) -> str | None:
    """``nesting_problem`` as it was before its byte gate (perf-r30)."""
    from alloc_audit.pipeline.parse import _DEEP_LINE
    if _DEEP_LINE.search(data) is None:
        return None
    return parse.nesting_problem(data + b"\t", Language.PYTHON)  # a tab: the gate lets it through


def test_nesting_gate_refuses_what_the_line_pattern_finds() -> None:
    rng = random.Random(31)
    blanks = (b" ", b"\t", b"\f", b" " * 7, b"\n", b"x\n", b"#", b"    ")
    for _ in range(300):
        data = b"".join(rng.choice(blanks) for _ in range(rng.randint(0, 60)))
        assert parse.nesting_problem(data, Language.PYTHON) == _deep(data)
    stairs = b"".join(b" " * i + b"x\n" for i in range(110))
    for indent in (b" ", b"\t", b"\f"):
        steps = b"".join(indent * i + b"x\n" for i in range(110))
        assert parse.nesting_problem(steps, Language.PYTHON) == _deep(steps) is not None
    assert parse.nesting_problem(stairs, Language.PYTHON) is not None
    assert parse.nesting_problem(b" " * 99 + b"x\n", Language.PYTHON) is None
