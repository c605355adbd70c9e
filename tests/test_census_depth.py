"""Census depth (issue 11) beyond what fixture annotations can say: which
allocation a derived site's ``via`` names, and the reasons of sites found
under a default-device context."""

from __future__ import annotations

import pytest
from fixtures_harness import FIXTURES, run_fixture


def _sites(case: str):
    _expected, result = run_fixture(FIXTURES / "python" / case)
    return result.sites


def test_via_names_the_persistent_buffer_not_the_temporary() -> None:
    derived = [s for s in _sites("project-tiers-use") if s.api == "PrefixCache"]
    assert len(derived) == 1 and derived[0].via is not None
    # buffers.py: the mask is allocated first, the cache after it
    assert derived[0].via.path == "engine/buffers.py"
    source = (FIXTURES / "python" / "project-tiers-use" / "engine" / "buffers.py").read_text().splitlines()
    assert "self.cache = torch.empty" in source[derived[0].via.line - 1]


def test_constructor_with_only_temporaries_is_no_factory() -> None:
    assert not [s for s in _sites("project-tiers-use") if s.api == "Probe"]


@pytest.mark.parametrize("needle", [
    pytest.param("with target_device:", id="variable bound to torch.device"),
    pytest.param("model built by `model_class(...)` in initialize_model", id="dynamic model construction"),
])
def test_weights_under_context_name_it(needle: str) -> None:
    weights = [s for s in _sites("project-default-device")
               if s.scope == "UnquantizedLinearMethod.create_weights"]
    assert len(weights) == 1
    site = weights[0]
    assert site.tier.value == "T1" and site.device == "unknown"
    assert needle in site.tier_reason


def test_literal_context_gives_cuda_device() -> None:
    [site] = [s for s in _sites("project-default-device") if s.scope == "ModelRunner.bad_literal_context"]
    assert site.device == "cuda"
    assert 'with torch.device("cuda"):' in site.tier_reason


def test_native_default_argument_picks_the_branch_and_says_so() -> None:
    _expected, result = run_fixture(FIXTURES / "cuda" / "project-native-defaults")
    by_line = {s.span.line: s for s in result.sites if s.path == "users.cu"}
    left_default = by_line[6]  # allocator->malloc(n): is_host keeps its default false
    assert left_default.via is not None and left_default.via.api == "cudaMalloc"
    assert "takes the device branch of Allocator::malloc" in left_default.tier_reason
    assert "passes no is_host (default false)" in left_default.tier_reason
    passed_true = by_line[12]  # allocator->malloc(n, true, true)
    assert passed_true.via is not None and passed_true.via.api == "cudaMallocHost"
    assert "branch" not in passed_true.tier_reason
