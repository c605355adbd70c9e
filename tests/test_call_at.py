"""pipeline/index: ``ProjectIndex.site_call`` finds a site's call from a
table per function, made on first use; it answers what the scan of
``Func.calls`` answered (the first call at the site's span), before and
after the on-demand expansion adds files."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fixtures_harness import extracted_facts

from alloc_audit.model import FileFacts, Site, Span
from alloc_audit.pipeline.index import ProjectIndex

PROJECT = Path(__file__).parent / "fixtures" / "python" / "project-expansion-rounds"
FIRST = ("csrc/engine.cc", "csrc/pool.cc", "pkg/__init__.py", "pkg/engine.py", "pkg/raw.py")
ON_DEMAND = ("csrc/pool.h", "pkg/pools.py")


def _facts(paths: tuple[str, ...]) -> dict[str, FileFacts]:
    return extracted_facts(PROJECT, paths)


def _scanned(index: ProjectIndex, site: Site) -> Any:
    func = index.func(site.path, site.scope)
    call = next((c for c in func.calls if c.span == site.span), None) if func is not None else None
    return (func, call) if func is not None and call is not None else None


def _probes(facts: dict[str, FileFacts]) -> list[Site]:
    sites = [s for f in facts.values() for s in f.sites]
    assert sites
    # a span no call has, and a scope no function has
    return sites + [dataclasses.replace(sites[0], span=Span(9999, 0, 9999, 1)),
                    dataclasses.replace(sites[0], scope="no_such_function")]


def test_site_call_is_the_first_call_at_the_span_across_rounds() -> None:
    first, later = _facts(FIRST), _facts(ON_DEMAND)
    index = ProjectIndex(first)
    probes = _probes(first)
    found = [index.site_call(s) for s in probes]
    assert any(f is not None for f in found) and found[-2:] == [None, None]
    assert found == [_scanned(index, s) for s in probes]
    index.add(later)
    probes = _probes({**first, **later})
    assert [index.site_call(s) for s in probes] == [_scanned(index, s) for s in probes]
