"""conversion_paths keeps three memos per run (perf-r27): whether a function
is handed on as a value (``_handed_on``), what a caller says before its own
way in is walked (``_caller_says``), and a function's callers
(``_callers``, the calls by name kept per name: round 34). Each answers a question of the function alone; a memoised
walk must answer exactly as one that asks afresh every time. Likewise
lazy_members' substring test before its per-member patterns."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures_harness import extracted_facts

from alloc_audit.arglists import split_args
from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.globs import matcher
from alloc_audit.pipeline import conversion_paths as cp
from alloc_audit.pipeline import lazy_members as lm
from alloc_audit.pipeline.index import Func, ProjectIndex

PROJECT = Path(__file__).parent / "fixtures" / "python" / "project-conversion-paths"


def _index() -> ProjectIndex:
    paths = tuple(sorted(str(p.relative_to(PROJECT)) for p in PROJECT.rglob("*.py")))
    index = ProjectIndex(extracted_facts(PROJECT, paths))
    index.settle()
    return index


def _ctx(index: ProjectIndex) -> cp._Ctx:
    globs = load_catalog(load_config(PROJECT, None)).callers
    quantisers = tuple((matcher([entry]), matcher([saver])) for entry, _, saver in
                       (pair.partition(":") for pair in globs.quantiser) if saver)
    return cp._Ctx(index, matcher(globs.load), matcher(globs.per_step), frozenset(globs.converter), quantisers)


def _handed_on_before(func: Func, index: ProjectIndex) -> bool:
    """``_handed_on`` as round 26 wrote it (every statement searched)."""
    if func.owner is not None or func.qualname == "<module>":
        return False
    name = func.name
    element = re.compile(rf"[\[{{(,:]\s*{re.escape(name)}\s*[,\]}})]")
    for other in index.functions_in(func.path):
        if any(a.value.strip() == name or element.search(a.value) for a in other.assigns):
            return True
    table = func.table
    return table is not None and any(
        name in text and any(arg.text.strip() == name for arg in split_args(text)) for text in table.arglists)


def test_memoised_answers_are_the_fresh_ones() -> None:
    index = _index()
    funcs = sorted(index.funcs.values(), key=lambda f: f.id)
    assert funcs
    shared = _ctx(index)
    for func in funcs:
        assert cp._handed_on(func, shared) == _handed_on_before(func, index), func.id
        for by_name in (True, False):
            assert cp._callers(func, shared, by_name) == cp.callers_of(func, index, by_name)
        for depth in (0, 1, 2, 3):
            fresh = _ctx(index)
            assert cp._caller_on_path(func, shared, depth, frozenset()) == \
                cp._caller_on_path(func, fresh, depth, frozenset()), (func.id, depth)
    # twice: the second pass reads every memo
    for func in funcs:
        assert cp._handed_on(func, shared) == _handed_on_before(func, index)


def _callers_of_before(func: Func, index: ProjectIndex, by_name: bool) -> list[Func]:
    """``callers_of`` as round 33 wrote it (every call of the name checked again for each method)."""
    dist = index.callers_within([func], 1)
    found = {fid: index.funcs[fid] for fid, d in dist.items() if d == 1 and fid in index.funcs}
    if by_name and func.owner is not None and not func.name.startswith("__"):
        for caller, i in index.calls_named(func.name):
            if caller.table is None or caller.id in found or caller is func:
                continue
            receiver = caller.table.callees[i].rpartition(".")[0]
            if receiver in ("", "self", "cls") or not cp._object(caller, receiver, index):
                continue
            if not index.resolve(caller, caller.table.callees[i]):
                found[caller.id] = caller
    return list(found.values())


def test_callers_by_name_kept_per_name_answer_as_asked_per_method() -> None:
    by_name_added = 0
    for project in (PROJECT, PROJECT.parent / "project-weight-preparation", PROJECT.parent / "project-offline-quantiser"):
        paths = tuple(sorted(str(p.relative_to(project)) for p in project.rglob("*.py")))
        index = ProjectIndex(extracted_facts(project, paths))
        index.settle()
        named: dict[str, list[Func]] = {}
        for func in sorted(index.funcs.values(), key=lambda f: f.id):
            for by_name in (True, False):
                before = _callers_of_before(func, index, by_name)
                assert cp.callers_of(func, index, by_name, named) == before, func.id
                assert cp.callers_of(func, index, by_name) == before, func.id
            by_name_added += len(before) < len(_callers_of_before(func, index, True))
    assert by_name_added  # some method has callers through an object, by name


def test_lazy_member_tests_with_and_without_the_substring_test() -> None:
    tests = ["self.buf is None", "getattr(self, 'buf', None) is None", "not hasattr(self, \"buf\")",
             "self.buf.numel() < n", "n > len(self.buf)", "len(self.buf) == 0", "not self.buf",
             "self.cache is not None", "self.bu is None", "self.buffer is None", "self.buf.shape != shape",
             "self.buf is not None and self.buf.dtype == dtype", "hasattr(self, 'buf')", "(self.buf)", "x"]
    members = [{"self.buf"}, {"self.bu"}, {"self.buf", "self.cache"}, {"self.b.x"}]
    for test in tests:
        for group in members:
            names = [re.escape(m[len("self."):]) for m in sorted(group)]
            text = " ".join(test.split())
            miss = any(lm._miss_pattern(n).search(test) for n in names)
            hit = not (text.startswith("not ") or " or " in text) and any(lm._hit_pattern(n).search(text)
                                                                           for n in names)
            assert lm._miss(test, group) == miss, (test, group)
            assert lm._hit(test, group) == hit, (test, group)
