"""host_args' ``_handed_on`` searches only the texts that hold the name,
each file's call table once (perf-r34f): it must answer as the search of
every assignment and every function's table did, for every function of the
Python fixtures."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures_harness import extracted_facts

from alloc_audit.pipeline import host_args as ha
from alloc_audit.pipeline.index import Func, ProjectIndex

FIXTURES = Path(__file__).parent / "fixtures" / "python"


def _handed_on_before(func: Func, index: ProjectIndex) -> bool:
    paths = {func.path} | {c.path for c, _ in index.calls_named(func.name)} | {
        p for p in index.files if index.imported(p, func.name) is not None}
    word = re.compile(rf"(?<![\w]){re.escape(func.name)}\b(?!\s*\()")
    return any(word.search(a.value) for p in paths for f in index.functions_in(p) for a in f.assigns) or \
        any(word.search(text) for p in paths for f in index.functions_in(p) if f.table is not None
            for text in f.table.arglists)


def test_handed_on_is_the_full_search() -> None:
    paths = tuple(sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py")))
    index = ProjectIndex(extracted_facts(FIXTURES, paths))
    index.settle()
    host = ha._HostArgs(index)
    funcs = sorted(index.funcs.values(), key=lambda f: f.id)
    handed = 0
    for func in funcs:
        expected = _handed_on_before(func, index)
        assert host._handed_on(func) == expected, func.id
        handed += expected
    assert handed and handed < len(funcs)  # both answers occur
