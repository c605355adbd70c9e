"""What the on-demand expansion parses: files the pre-filter skipped are
parsed only when the rules or the derived sites could need them, judged from
the names they mention. Pure functions, no CLI: the end-to-end behaviour is
pinned by the ``project-cross-file`` fixture (``pkg/service.py``)."""

from __future__ import annotations

from pathlib import Path

from alloc_audit.catalog import load_catalog, passes_prefilter
from alloc_audit.config import load_config
from alloc_audit.index import Wants

PY_FACTORIES = {"make_workspace": (frozenset({"engine", "buffers"}), frozenset({"engine"}))}


def never_read() -> frozenset[str]:
    raise AssertionError("a native file's definitions are read only when it mentions a wanted name")


def test_a_native_file_never_calls_a_python_factory():
    wants = Wants(definitions=frozenset(), mentions=PY_FACTORIES)
    assert not wants.wants_file("csrc/kernel.cuh", ("make_workspace", "engine", "buffers"), never_read)


def test_a_python_file_reaches_a_factory_through_its_module_or_package():
    wants = Wants(definitions=frozenset(), mentions=PY_FACTORIES)
    # `from engine.buffers import make_workspace`, or a re-export from `engine`
    assert wants.wants_file("app/serve.py", ("buffers", "make_workspace"), never_read)
    assert wants.wants_file("app/serve.py", ("engine", "make_workspace"), never_read)
    # `from . import make_workspace` inside the same package
    assert wants.wants_file("engine/serve.py", ("make_workspace",), never_read)
    # a local variable or a pytest fixture of the same name elsewhere
    assert not wants.wants_file("tests/test_serve.py", ("make_workspace", "torch"), never_read)


def test_native_mentions_and_definitions():
    read: list[str] = []

    def definitions() -> frozenset[str]:
        read.append("x")
        return frozenset({"launch_plan"})

    wants = Wants(definitions=frozenset({"launch_plan"}), native_mentions=frozenset({"DeviceArena"}))
    assert wants.wants_file("csrc/arena_user.cc", ("DeviceArena", "int"), never_read)
    assert not wants.wants_file("csrc/other.cc", ("int", "size_t"), never_read)
    assert wants.wants_file("csrc/plan.cc", ("launch_plan", "int"), definitions)
    assert read == ["x"]
    # a file that calls launch_plan but does not define it is not wanted
    assert not wants.wants_file("csrc/caller.cc", ("launch_plan",), lambda: frozenset({"main"}))


def test_a_qualified_allocating_type_is_not_found_by_its_last_name(tmp_path: Path):
    catalog = load_catalog(load_config(tmp_path, None))
    std_only = b"#include <vector>\nstd::vector<int> sizes(16);\nint main() { return sizes.size(); }\n"
    thrust = b"#include <thrust/device_vector.h>\nthrust::device_vector<float> buf(1 << 20);\n"
    nested = b"thrust::cuda::vector<float> buf(16);\n"
    assert not passes_prefilter(std_only, catalog.cpp_needles)
    assert passes_prefilter(thrust, catalog.cpp_needles)
    assert passes_prefilter(nested, catalog.cpp_needles)
