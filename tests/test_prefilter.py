"""The byte pre-filter: compiled from the catalogues and rule packs, it may
skip a file only when no catalogue name or rule trigger can be in it."""

from __future__ import annotations

import pytest

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.pipeline.prefilter import passes_prefilter


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
