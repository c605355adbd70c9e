"""perf-r31: ``constant_branches.literal_bindings`` finds a file's
``NAME = literal`` bindings from each ``= literal`` back to its name; it
must give exactly what ``finditer`` of ``_PY_BINDS`` / ``_CPP_BINDS`` gives
(less the matches after a byte of ``_BEFORE``), on generated sources built
to make matches overlap (annotations holding ``name = 1``, ``==``, digits
before names, line breaks) and on the fixtures."""

from __future__ import annotations

import random
from pathlib import Path

from alloc_audit.pipeline.extract import constant_branches

_PIECES = ("x", "flag", "_a1", "9", "0", "1", " ", "\t", "\n", "=", " = ", "==", ": ", ":", "int", "Dict[str, int]",
           "True", "False", "None", "true", "false", "nullptr", "NULL", ".", "->", ">", "(", ")", ",", ";", "é",
           "self.", "$", "#", "\"", "!", "a", "x9", "$x")


def _by_finditer(data: bytes, cpp: bool) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    pattern = constant_branches._CPP_BINDS if cpp else constant_branches._PY_BINDS
    for m in pattern.finditer(data):
        if m.start() == 0 or data[m.start() - 1:m.start()] not in constant_branches._BEFORE:
            out.setdefault(m.group(1).decode("utf-8", "replace"), []).append(m.start())
    return out


def _check(data: bytes) -> None:
    for cpp in (False, True):
        assert constant_branches.literal_bindings(data, cpp) == _by_finditer(data, cpp), (data, cpp)


def test_literal_bindings_equal_finditer_on_generated_sources() -> None:
    rng = random.Random(31)
    for _ in range(3000):
        _check("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 40))).encode())


def test_literal_bindings_on_written_sources() -> None:
    for text in ("x: Foo; b = True\nif b:\n    pass\n", "a = 1b = 2\nc: int = 0\nd=None", "x == 1\ny <= 2\nz = 3",
                 "bool f = true;\nint n = 0; p = nullptr; q=NULL;", "a = True: b = 1", "x = \\\n  True"):
        _check(text.encode())


def test_literal_bindings_on_the_fixtures() -> None:
    root = Path(__file__).parent / "fixtures"
    files = sorted(p for ext in ("*.py", "*.cu", "*.cpp") for p in root.rglob(ext))
    assert files
    for path in files:
        _check(path.read_bytes())

