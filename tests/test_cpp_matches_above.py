"""perf-r29: ``cpp_sites.matches_above`` answers a site's question about the
function text above it from one pass over the whole function; it must find
exactly the matches the search of the text cut at the site finds, for each
pattern it serves, at every cut (generated function texts, every byte a
node could start at, ASCII and not), and on C++ files of the fixtures."""

from __future__ import annotations

import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from alloc_audit.pipeline.extract import cpp_sites

_PATTERNS = (cpp_sites._OPTIONS_BINDING, cpp_sites._FACTORY_BINDING, cpp_sites._ASSIGNED)
_PIECES = ("auto ", "const ", "at::Tensor ", "torch::TensorOptions ", "options", "opts", " = ", "=", "==", " == ",
           "at::", "torch::", "c10::", "TensorOptions()", ".dtype(at::kInt)", ".device(x.device())", ";", ");", "(",
           ")", "empty", "zeros", "randn", "rand", "randint", "{n}", ", ", "torch::kLong", "\n", " ", "\t", "x", "ids",
           "&", "<", ">", "int", "if (", "return ", ".", "->", "é", "=\n")


def _cut_search(data: bytes, start: int, cut: int, pattern: re.Pattern[str]) -> list[tuple[int, int, tuple[str | None, ...]]]:
    return [(m.start(), m.end(), m.groups()) for m in pattern.finditer(data[start:cut].decode("utf-8", "replace"))]


def _check(data: bytes, start: int = 0) -> None:
    ext = SimpleNamespace(body_matches={}, src=SimpleNamespace(data=data))
    body = SimpleNamespace(start_byte=start, end_byte=len(data))
    for cut in range(start, len(data) + 1):
        if cut < len(data) and data[cut] & 0xC0 == 0x80:
            continue  # inside a character: no node starts there
        node = SimpleNamespace(start_byte=cut)
        for pattern in _PATTERNS:
            found = [(m.start(), m.end(), m.groups())
                     for m in cpp_sites.matches_above(ext, body, node, pattern)]  # type: ignore[arg-type]
            assert found == _cut_search(data, start, cut, pattern), (data, cut, pattern.pattern)


def test_matches_above_equals_the_cut_search_on_generated_functions() -> None:
    rng = random.Random(29)
    for _ in range(150):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 30)))
        prefix = "".join(rng.choice(("void f() {", "x ", "")) for _ in range(2))
        _check((prefix + text).encode(), len(prefix.encode()))


def test_matches_above_on_written_functions() -> None:
    for text in ("auto options = at::TensorOptions().dtype(at::kInt).device(x.device());\n"
                 "auto y = at::empty({n}, options);\noptions = other;\nauto z = at::zeros({n}, options);",
                 "torch::Tensor ids = torch::empty({n}, torch::kLong);\nauto out = torch::empty_like(ids);\n"
                 "ids == x;\nauto w = torch::zeros({n}, ids.options());",
                 "const auto opts = c10::TensorOptions(); int a = 1; a == 2; auto b = at::empty(n, opts);"):
        _check(text.encode())


@pytest.mark.slow  # run first (conftest.py)
def test_matches_above_on_the_fixtures_native_sources() -> None:
    root = Path(__file__).parent
    files = sorted(p for ext in ("*.cu", "*.cpp", "*.cuh", "*.h") for p in root.rglob(ext))[:12]
    assert files
    for path in files:
        data = path.read_bytes()[:1500]
        ext = SimpleNamespace(body_matches={}, src=SimpleNamespace(data=data))
        body = SimpleNamespace(start_byte=0, end_byte=len(data))
        for cut in range(0, len(data) + 1, 5):
            if cut < len(data) and data[cut] & 0xC0 == 0x80:
                continue
            for pattern in _PATTERNS:
                found = [(m.start(), m.end(), m.groups()) for m in
                         cpp_sites.matches_above(ext, body, SimpleNamespace(start_byte=cut), pattern)]  # type: ignore[arg-type]
                assert found == _cut_search(data, 0, cut, pattern), (path, cut)
