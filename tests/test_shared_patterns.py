"""Patterns shared by every name instead of compiled per name (perf-r27):
each must answer exactly as the per-name pattern it stands in for.

``python_bindings._bound_else`` masks the name's whole-word spellings with
a stand-in and searches one shared pattern; here it is checked against the
per-name pattern on generated lines (names with dots, names inside other
words, keywords next to them, overlapping spellings) and on this package's
own sources."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

from alloc_audit import globs
from alloc_audit.pipeline.extract import python_bindings as pb
from alloc_audit.pipeline.extract import python_module_move as pmm
from alloc_audit.pipeline.names import value_arguments, value_arguments_in

_NAMES = ("x", "buf", "self.buf", "a.b", "a.a", "aa", "f", "fo", "n", "i", "s.x.y", "in_", "as_", "forx", "_",
          "x1", "self", "état", "a.as_b")
_PIECES = ("for ", "in ", " in", "as ", " as", ", ", ",", " = ", "=", "==", ":=", " := ", "global ", "nonlocal ",
           "(", ")", "[", "]", ":", "#", ".", "\n", "\t", " ", "1", "_", "é", "f", "o", "r", "with ", "self.",
           "a", "b", "x", "buf", "\u1d25")


def _per_name(source: str, name: str) -> bool:
    if name not in source:
        return False
    return pb._other_binding_pattern(name).search(pb._lines_with(source, name)) is not None


def test_bound_else_matches_the_per_name_pattern_on_generated_lines() -> None:
    rng = random.Random(27)
    for _ in range(5000):
        name = rng.choice(_NAMES)
        parts = [rng.choice(_PIECES + (name, name, name)) for _ in range(rng.randint(1, 14))]
        source = "".join(parts)
        assert pb._bound_else(source, name) == _per_name(source, name), (source, name)


def test_bound_else_matches_on_written_bindings() -> None:
    lines = ["a, x = f()", "x, b = g()", "for i, x in items:", "with open(p) as x:", "if (x := f()):",
             "global x", "nonlocal a, x", "f(a, x, dim=1)", "y = x", "x = 1", "for x.y in z:", "self.x, b = 1, 2",
             "for f in fs:", "fx, = t", "a.a.a, b = c", "  x ,b = 2", "x[0], b = c", "print(x, end='')"]
    for name in ("x", "self.x", "f", "a.a", "b", "x.y", "i"):
        for n in range(1, 4):
            for combo in itertools.combinations(lines, n):
                source = "\n".join(combo)
                assert pb._bound_else(source, name) == _per_name(source, name), (source, name)


def test_bound_else_matches_on_the_package_sources() -> None:
    root = Path(pb.__file__).parents[2]
    for path in sorted(root.rglob("*.py"))[:30]:
        source = path.read_text(encoding="utf-8")
        for name in sorted(set(source.split()))[:60]:
            name = name.strip("(),:[]")
            if name:
                assert pb._bound_else(source, name) == _per_name(source, name), (path, name)


_VALUE_ARG = re.compile(r"(?:^|[,(=])[ \t]*(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)[ \t]*(?=,|\)|$)", re.M)
_ARG_PIECES = ("x", "self.", "a_qdq", "fn", "=", "==", ", ", ",", "(", ")", "\n", " ", "\t", ".", "..", "1", "é",
               "f(", "lambda", "[", "]", ":", "_", "a.b", "\r", "\u2028")


def test_value_arguments_matches_the_whole_pattern_on_generated_arglists() -> None:
    """perf-r29: ``names.value_arguments`` (weight_preparation's handed-on values) against the pattern it replaced."""
    rng = random.Random(29)
    for _ in range(5000):
        text = "".join(rng.choice(_ARG_PIECES) for _ in range(rng.randint(0, 16)))
        assert value_arguments(text) == set(_VALUE_ARG.findall(text)), text


def test_value_arguments_matches_on_this_packages_sources() -> None:
    for path in sorted(Path(pb.__file__).parents[2].rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert value_arguments(text) == set(_VALUE_ARG.findall(text)), path


def test_value_arguments_in_is_the_union_over_the_texts() -> None:
    """perf-r36b: ``value_arguments_in`` (the runs of all texts read once) is the union of ``value_arguments``."""
    rng = random.Random(36)
    for _ in range(2000):
        texts = ["".join(rng.choice(_ARG_PIECES) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(0, 5))]
        assert value_arguments_in(texts) == set().union(*map(value_arguments, texts)), texts
    sources = [p.read_text(encoding="utf-8") for p in sorted(Path(pb.__file__).parents[1].rglob("*.py"))]
    assert value_arguments_in(sources) == set().union(*map(value_arguments, sources))


_MOVE_NAMES = (b"model", b"self.model", b"m", b"a.m", b"mm", b"self")
_MOVE_PIECES = (b"model", b"self.", b".eval(", b".parameters()", b".to(d)", b".", b"(", b")", b" ", b"\n", b"_",
                b"x", b"m", b"a.", b"1", b"\xc3\xa9", b".train", b"(\n", b".buffers(", b"= ")


def test_called_module_method_matches_the_per_name_pattern() -> None:
    """perf-r29: ``python_module_move._called_module_method`` against the per-name search it replaced."""
    rng = random.Random(29)
    for _ in range(5000):
        name = rng.choice(_MOVE_NAMES)
        code = b"".join(rng.choice(_MOVE_PIECES + (name, name)) for _ in range(rng.randint(0, 14)))
        pattern = rb"(?<![\w.])" + re.escape(name) + rb"\.(?:" + pmm._MODULE_METHODS + rb")\("
        assert pmm._called_module_method(code, name) == (re.search(pattern, code) is not None), (code, name)


def test_test_path_is_remembered_and_answers_as_before() -> None:
    """perf-r29: ``globs.test_path`` is cached per path; the answer is the path convention's."""
    for path, want in (("tests/a.py", True), ("pkg/test_x.py", True), ("pkg/x_test.py", True), ("conftest.py", True),
                       ("pkg/testing/u.py", True), ("pkg/mod.py", False), ("pkg/contest.py", False)):
        assert globs.test_path(path) is want and globs.test_path(path) is want
    assert globs.test_path.cache_info().hits >= 7


_BIND_PIECES = ("a", "x", "self.", ".", ", ", ",", " ,", "(", ")", " = ", "=", "==", ": int ", ":", " ", "\t", "\n",
                "\n  ", "buf", "1", "é", "[0]", "#", "y")


def _same_matches(shared: object, compiled: re.Pattern[str], source: str) -> None:
    assert isinstance(shared, pb._Shared)
    got = [(m.span(), m.group(0), m.group(1), m.group(2) if compiled.groups > 1 else None)
           for m in shared.finditer(source)]
    want = [(m.span(), m.group(0), m.group(1), m.group(2) if compiled.groups > 1 else None)
            for m in compiled.finditer(source)]
    assert got == want, (source, shared.name)
    first = shared.search(source)
    assert (first.span() if first else None) == (want[0][0] if want else None), (source, shared.name)


def test_shared_binding_patterns_match_the_per_name_ones() -> None:
    """perf-r34e: `_binding_pattern` / `_tuple_pattern` of a plain name (one shared pattern, its matches
    filtered by their targets) give the per-name pattern's matches: same spans and groups, same order."""
    rng = random.Random(34)
    lines = ["x = 1", "a, x = f()", "(x, b) = g()", "x, = t", "self.x, b = 1, 2", "  x ,b = 2", "x: int = 3",
             "x == 1", "xy = 2", "x.y = 3", "a.x, b = c", "\tx\t=\t4", "x[0], b = c", "f(a, x, dim=1)",
             "a, b, a = 1, 2, 3", "((x, b)) = c", "x.y, x = z", "buf = x", "x :=1", "a,x,= 1"]
    sources = ["\n".join(rng.sample(lines, rng.randint(1, 5))) for _ in range(1500)]
    sources += ["".join(rng.choice(_BIND_PIECES + ("x",) * 4) for _ in range(rng.randint(1, 16)))
                for _ in range(4000)]
    names = _NAMES + ("a", "b", "y", "x.y", "self.x")
    for source in sources:
        for name in names:
            if pb._PLAIN_NAME.fullmatch(name) is None:
                continue
            _same_matches(pb._binding_pattern(name), pb._compiled_binding(name), source)
            _same_matches(pb._tuple_pattern(name), pb._compiled_tuple(name), source)


def test_binding_patterns_of_other_names_stay_compiled() -> None:
    for name in ("x[0]", "a b", " x", "x.", "*x", "(x)"):
        assert isinstance(pb._binding_pattern(name), re.Pattern)
        assert isinstance(pb._tuple_pattern(name), re.Pattern)
