"""perf-r34b: ``constant_branches.word_starts`` finds where a name is a
word of a function's text without the per-function word table it replaced;
it must give exactly the starts of ``_WORD.finditer(source, start, end)``'s
matches that spell the name, on generated sources built to put digit runs,
``$``, non-ASCII bytes and other words against the names, with stretches
that cut words at either end, and on the fixtures."""

from __future__ import annotations

import random
from pathlib import Path

from alloc_audit.pipeline.extract import constant_branches

_PIECES = (b"x", b"flag", b"_a1", b"9", b"0", b"12", b" ", b"\n", b"=", b".", b"$", b"$x", b"x9", b"a", b"\xc3\xa9",
           b"(", b")", b"not ", b"is", b"None", b"flagx", b"_", b"x$", b"9x", b"xflag")
_KEYS = (b"x", b"flag", b"_a1", b"a", b"x9", b"$x", b"x$", b"_", b"9x", b"\xc3\xa9", b"", b"x x", b"xflag", b"flagx")


def _by_table(data: bytes, start: int, end: int, key: bytes) -> list[int]:
    words: dict[bytes, list[int]] = {}
    for m in constant_branches._WORD.finditer(data, start, end):
        words.setdefault(m.group(0), []).append(m.start())
    return words.get(key, [])


def _check(data: bytes, start: int, end: int, keys: set[bytes]) -> None:
    for key in keys:
        assert constant_branches.word_starts(data, start, end, key) == _by_table(data, start, end, key), \
            (data, start, end, key)


def test_word_starts_equal_word_table_on_generated_sources() -> None:
    rng = random.Random(34)
    for _ in range(3000):
        data = b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 30)))
        start = rng.randint(0, len(data))
        end = rng.randint(start, len(data))
        words = {m.group(0) for m in constant_branches._WORD.finditer(data)}
        _check(data, start, end, words | set(_KEYS))


def test_word_starts_on_written_sources() -> None:
    root = Path(__file__).parent / "fixtures"
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cu", ".cpp", ".h", ".cuh"))[:200]
    assert files
    for path in files:
        data = path.read_bytes()
        words = {m.group(0) for m in constant_branches._WORD.finditer(data)}
        _check(data, 0, len(data), words)
        _check(data, len(data) // 3, 2 * len(data) // 3, words)
