"""The byte pre-filter: compiled from the catalogues and rule packs, it may
skip a file only when no catalogue name or rule trigger can be in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import Language
from alloc_audit.pipeline.discover import language_of
from alloc_audit.pipeline.expand import identifiers
from alloc_audit.pipeline.prefilter import _LITERAL_PART, passes_prefilter, probes


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory):
    return load_catalog(load_config(tmp_path_factory.mktemp("project"), None))


def test_every_needle_alone_passes(catalog):
    """Grouping needles under shared gates (a module name, a common prefix
    such as `cuMem`) must not lose any: a file holding one needle passes."""
    for needles in (catalog.prefilter.py_needles, catalog.prefilter.cpp_needles):
        assert len(needles) > 3  # grouped
        for gate, words in needles:
            for word in words:
                # a prefix gate is implied by its words; a module gate
                # (`torch`) is half of a pair (`torch` ... `empty(`)
                data = b"x = 1\n" + (word if word.startswith(gate) else gate + b"\n" + word) + b"\n"
                assert passes_prefilter(data, needles), (gate, word)


def test_a_file_without_needles_is_skipped(catalog):
    assert not passes_prefilter(b"def add(a, b):\n    return a + b\n", catalog.prefilter.py_needles, catalog.prefilter.py_aliasable)
    # a module name alone is not enough: `torch` without an allocating call
    assert not passes_prefilter(b"import torch\n\ndef f(x):\n    return x.sum()\n", catalog.prefilter.py_needles,
                                catalog.prefilter.py_aliasable)
    assert passes_prefilter(b"import torch as T\nfrom torch import empty as E\n", catalog.prefilter.py_needles,
                            catalog.prefilter.py_aliasable)


def test_a_qualified_allocating_type_is_not_found_by_its_last_name(catalog):
    std_only = b"#include <vector>\nstd::vector<int> sizes(16);\nint main() { return sizes.size(); }\n"
    thrust = b"#include <thrust/device_vector.h>\nthrust::device_vector<float> buf(1 << 20);\n"
    nested = b"thrust::cuda::vector<float> buf(16);\n"
    assert not passes_prefilter(std_only, catalog.prefilter.cpp_needles)
    assert passes_prefilter(thrust, catalog.prefilter.cpp_needles)
    assert passes_prefilter(nested, catalog.prefilter.cpp_needles)


def _fixture_files() -> list[Path]:
    root = Path(__file__).parent / "fixtures"
    return sorted(p for p in root.rglob("*") if p.is_file() and language_of(p.name) is not None)


@pytest.mark.slow  # run first (conftest.py)
def test_screen_answers_as_the_prefilter_and_the_identifiers(catalog):
    """``screen`` (one pass: identifiers first, then the needles they leave)
    gives ``passes_prefilter``'s answer and, for a skipped file,
    ``expand.identifiers``: on every fixture, on each needle alone, and on
    the near misses where a probe must not rule a needle out."""
    pf = catalog.prefilter
    cases: list[tuple[bytes, Language]] = []
    for path in _fixture_files():
        language = language_of(path.name)
        assert language is not None
        data = path.read_bytes()
        cases.append((data, language))
        # the same file with every line that passes cut: mostly skipped
        cases.append((b"\n".join(line for line in data.split(b"\n") if not passes_prefilter(
            line, pf.py_needles if language is Language.PYTHON else pf.cpp_needles)), language))
    # an embedded binary: identifiers of hex literals (`x0full`, which ends like `full(`), past _LITERALS_FROM
    literal_cases = 0
    binary = b",\n".join(b"0x%016xULL, 0x0full, 0x%xu" % (i * 0x9E3779B97F4A7C15 % (1 << 64), i) for i in range(3000))
    for language, needles in ((Language.PYTHON, pf.py_needles), (Language.CPP, pf.cpp_needles)):
        for gate, words in needles:
            for i, word in enumerate(words):
                for text in (word, b"x" + word, b"9" + word + b"_", gate + b"\n" + word, word[:-1], b"0x" + word):
                    cases.append((b"y = 1\n" + text + b"\n", language))
                literal = any(_LITERAL_PART.fullmatch(p.strip()) for p in probes(word))
                if i < 2 or literal:  # a sample, and every word a literal's identifier can end like (`full(`)
                    cases.append((binary + b"\n" + gate + b"\n" + word + b"\n", language))
                    cases.append((binary + b"\n" + gate + b"\n" + word[:-1] + b"\n", language))
                if literal:  # `0x0full(`: the only identifier that shows `full` is a literal's
                    cases.append((binary + b"\n" + gate + b"\nf(0x0" + word + b"1))\n", language))
                    literal_cases += 1
    cases += [(b"import torch as T\nfrom torch import empty as E\n", Language.PYTHON),
              (b"from x import y as z\n", Language.PYTHON), (b"", Language.PYTHON), (b"\xff\xfe empty(", Language.CPP)]
    skipped = 0
    for data, language in cases:
        needles, aliasable = (pf.py_needles, pf.py_aliasable) if language is Language.PYTHON else (pf.cpp_needles,
                                                                                                 frozenset())
        expected = None if passes_prefilter(data, needles, aliasable, language is Language.PYTHON) \
            else identifiers(data)
        assert pf.screen(data, language) == expected, data[:200]
        skipped += expected is not None
    assert 0 < skipped < len(cases)  # both answers are exercised
    assert literal_cases


def test_probes_name_what_an_identifier_must_show():
    assert probes(b"empty(") == (b"empty ",)
    assert probes(b".new_empty(") == (b" new_empty ",)
    assert probes(b"cuMem") == (b"cuMem",)
    assert probes(b"thrust::cuda::vector") == (b"thrust ", b" cuda ", b" vector")
    assert probes(b".to(") == ()  # too short to be an identifier: looked for in the file


def test_quick_needles_are_needles_and_answer_as_the_prefilter(catalog):
    """``screen`` first looks for a few needles (``py_quick``); each is a
    (gate, word) of ``py_needles``, so a file that passes on them is one
    ``passes_prefilter`` passes; a word without its gate passes nothing."""
    pf = catalog.prefilter
    needles = {(gate, word) for gate, words in pf.py_needles for word in words}
    quick = [(gate, word) for gate, words in pf.py_quick for word in words]
    assert quick and set(quick) <= needles
    for gate, word in quick:
        whole = b"import " + gate + b"\nx = " + word + b"3)\n" if gate else b"x = f(" + word + b"')\n"
        assert passes_prefilter(whole, pf.py_quick) and pf.screen(whole, Language.PYTHON) is None
        if gate:  # `empty(` alone (a method of something else): not passed at once, screened as the prefilter
            alone = b"x = y." + word + b"3)\n"
            assert not passes_prefilter(alone, pf.py_quick)
            expected = None if pf.passes(alone, Language.PYTHON) else identifiers(alone)
            assert pf.screen(alone, Language.PYTHON) == expected


@pytest.mark.parametrize(("line", "passes"), [
    pytest.param(b"x = sample.to(torch_device)", True, id="device variable"),
    pytest.param(b"net.to(self.device)", True, id="device attribute"),
    pytest.param(b"noise = noise.to(dtype=x.dtype, device=dev)", True, id="device keyword after dtype"),
    pytest.param(b"y = x.to(\n    device,\n    non_blocking=True,\n)", True, id="arguments over lines"),
    pytest.param(b"y = x.to(0)", True, id="GPU index"),
    pytest.param(b"y = x.to(torch.float16)", False, id="dtype only"),
    pytest.param(b"y = x.to(dtype)", False, id="dtype variable"),
    pytest.param(b"y = convert_to(device)", False, id="another function ending in to"),
])
def test_a_python_file_that_moves_to_a_device_passes(catalog, line: bytes, passes: bool) -> None:
    """`.to(` is no needle; a copy to a named device is a site of the file
    itself, so the file is parsed whatever else it holds (issue 11, round 18)."""
    data = b"import torch\n\n\ndef step(x, sample, net, dev, device, dtype):\n    " + line + b"\n"
    assert catalog.prefilter.passes(data, Language.PYTHON) is passes
    assert (catalog.prefilter.screen(data, Language.PYTHON) is None) is passes
    assert not catalog.prefilter.passes(data, Language.CPP)
