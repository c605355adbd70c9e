"""The index keeps its memos (resolutions, reaches, factories; callers until files are added) across the
expansion's rounds and forgets only what the added files can change
(``pipeline/index/memo``). The fixture project
``project-expansion-rounds`` is indexed round by round as the expansion
would (and in other orders); an index asked everything between rounds must
answer exactly as one asked only at the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fixtures_harness import extracted_facts

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import FileFacts, Span, Tier
from alloc_audit.pipeline.discover import language_of
from alloc_audit.pipeline.extract import extract_facts
from alloc_audit.pipeline.index import ProjectIndex, Reach
from alloc_audit.pipeline.index.factories import Factories
from alloc_audit.pipeline.index.memo import CutOff, Deps, Memo
from alloc_audit.pipeline.parse import parse_source

PROJECT = Path(__file__).parent / "fixtures" / "python" / "project-expansion-rounds"
# what passes the pre-filter, then what the first expansion round parses
FIRST = ("csrc/engine.cc", "csrc/pool.cc", "pkg/__init__.py", "pkg/engine.py", "pkg/raw.py")
ON_DEMAND = ("csrc/pool.h", "pkg/pools.py")


@pytest.fixture(scope="module")
def facts() -> dict[str, FileFacts]:
    return extracted_facts(PROJECT, (*FIRST, *ON_DEMAND))


def _reach(found: Reach | tuple[Reach, ...] | None) -> Any:
    if found is None:
        return None
    if isinstance(found, tuple):
        return tuple(_reach(r) for r in found)
    return found.site, tuple((h.call, h.path, h.caller, h.callee) for h in found.hops)


def answers(index: ProjectIndex) -> dict[str, Any]:
    """Everything the expansion, the derivation and the rules ask of the index."""
    out: dict[str, Any] = {}
    for fid in sorted(index.funcs):
        func = index.funcs[fid]
        out[fid] = ([(c, tuple(t.id for t in index.resolve(func, c)), index.missing_names(func, c))
                     for c in func.callees],
                    _reach(index.reach(func, 3)), _reach(index.factory_allocation(func, 3)),
                    list(index.callers_within([func], 2).items()),  # in the order found, as the passes read it
                    [(c, tuple(t.id for t in targets)) for c, targets in index.callees(func)])  # kept per function
    for name in sorted({c.name for f in index.funcs.values() if f.owner for c in [f.owner]}):
        out[f"class {name}"] = [_reach(index.class_allocates(c)) for c in index.classes_named(name)]
    out["factories"] = sorted(index.factories())
    out["derived"] = index.derived_sites()
    return out


ORDERS = {
    "as the expansion adds them": [FIRST, ON_DEMAND],
    "one file a round": [FIRST[:1], *[(p,) for p in (*FIRST[1:], *ON_DEMAND)]],
    "one file a round, backwards": [(p,) for p in reversed((*FIRST, *ON_DEMAND))],
}


@pytest.mark.parametrize("rounds", ORDERS.values(), ids=list(ORDERS))
def test_an_index_asked_between_rounds_answers_as_one_asked_at_the_end(facts: dict[str, FileFacts],
                                                                       rounds: list[tuple[str, ...]]) -> None:
    asked = ProjectIndex({p: facts[p] for p in rounds[0]})
    quiet = ProjectIndex({p: facts[p] for p in rounds[0]})
    for paths in rounds[1:]:
        answers(asked)  # fills every memo; the next add keeps what it can
        asked.add({p: facts[p] for p in paths})
        quiet.add({p: facts[p] for p in paths})
    final = answers(quiet)
    assert answers(asked) == final
    # the on-demand files matter: without them there is less to find
    assert final["derived"] != answers(ProjectIndex({p: facts[p] for p in FIRST}))["derived"]


def test_a_new_module_changes_what_names_it_and_keeps_the_rest(facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex({p: facts[p] for p in FIRST})
    init = index.func("pkg/engine.py", "Engine.__init__")
    assert init is not None
    make_pool = next(c for c in init.callees if c.endswith("make_pool"))
    alloc_block = next(c for c in init.callees if c.endswith("alloc_block"))
    assert index.resolve(init, make_pool) == ()  # pools.py is not analysed yet
    kept = index.resolve(init, alloc_block)
    assert [f.id for f in kept] == ["pkg/raw.py::alloc_block"]
    runner = index.func("csrc/engine.cc", "Runner::Runner")
    assert runner is not None
    assert not [s for s in index.derived_sites() if s.api == "Pool"]  # its class is in pool.h

    index.add({p: facts[p] for p in ON_DEMAND})
    assert [f.id for f in index.resolve(init, make_pool)] == ["pkg/pools.py::make_pool"]
    assert index.resolve(init, alloc_block) is kept  # pools.py defines nothing it looked up
    # the constructor in pool.cc waited for its class: a construction is a derived site now
    assert [(s.path, s.api) for s in index.derived_sites() if s.api == "Pool"] == [("csrc/engine.cc", "Pool")]


def test_sites_added_later_reach_the_functions_that_call_them(facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex(facts)
    make_pool = index.func("pkg/pools.py", "make_pool")
    alloc_block = index.func("pkg/raw.py", "alloc_block")
    assert make_pool is not None and alloc_block is not None
    before = index.reach(make_pool, 3)
    untouched = index.reach(alloc_block, 3)
    assert [r.site.path for r in before] == ["pkg/raw.py"]
    site = dataclasses.replace(before[0].site, path="pkg/pools.py", scope="make_pool", span=Span(10, 5, 10, 30))
    index.add_sites([site])
    assert [r.site.path for r in index.reach(make_pool, 3)] == ["pkg/pools.py", "pkg/raw.py"]
    assert index.reach(alloc_block, 3) is untouched  # reads nothing of pools.py


def test_a_memo_forgets_what_used_a_touched_name_and_what_was_built_on_it() -> None:
    deps = Deps()
    inner: Memo[str, int] = Memo(deps)
    outer: Memo[str, int] = Memo(deps)
    deps.begin()
    deps.note("Pool")
    inner.store("pool", 1, deps.end())
    deps.begin()
    deps.note("Arena")
    deps.begin()
    deps.note("Other")
    inner.store("other", 2, deps.end())
    outer.store("arena", inner.hit("pool") + 10, deps.end())  # a hit: uses what "pool" used
    assert inner.invalidate({"Pool"}) == 1 and "other" in inner
    assert outer.invalidate({"Pool"}) == 1 and "arena" not in outer
    # an entry computed while another was still in progress depends on the
    # order of evaluation: never kept
    outer.guard("cycle", 0)
    deps.begin()
    inner.store("late", outer.hit("cycle"), deps.end())
    assert inner.invalidate(set()) == 1 and "late" not in inner


def test_invalidate_drops_a_guard_left_behind_and_only_that() -> None:
    """perf-r35b: ``invalidate`` looks for guards left behind (a value with no names: its computation never
    stored) only when the memo holds more values than names; a guard is dropped, a stored entry kept."""
    deps = Deps()
    memo: Memo[str, int] = Memo(deps)
    deps.begin()
    memo.store("kept", 1, deps.end())
    assert memo.invalidate({"Pool"}) == 0 and "kept" in memo  # equal sizes: nothing left behind
    memo.guard("raised", 0)  # its computation raised: never stored
    assert memo.invalidate({"Pool"}) == 1 and "raised" not in memo and "kept" in memo
    assert len(memo.values) == len(memo.names) == 1


def test_callers_matching_asks_a_predicate_only_about_new_callees(facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex({p: facts[p] for p in FIRST})
    asked: list[str] = []

    def is_alloc_block(callee: str) -> bool:
        asked.append(callee)
        return callee.endswith("alloc_block")

    assert index.callers_matching(is_alloc_block) == {"pkg/engine.py::Engine.__init__"}
    first = len(asked)
    assert len(set(asked)) == first  # each distinct callee once
    index.add({p: facts[p] for p in ON_DEMAND})
    assert index.callers_matching(is_alloc_block) == {"pkg/engine.py::Engine.__init__", "pkg/pools.py::make_pool"}
    assert not set(asked[first:]) & set(asked[:first])  # only the new files' callees
    fresh = ProjectIndex(facts)
    assert fresh.callers_matching(lambda c: c.endswith("alloc_block")) == index.callers_matching(is_alloc_block)


def test_a_settled_index_forgets_the_names_and_starts_over_if_files_come_after_all(
        facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex({p: facts[p] for p in FIRST})
    answers(index)
    index.settle()  # the scan settles the index once the expansion and the default-device sites are done
    assert answers(index) == answers(ProjectIndex({p: facts[p] for p in FIRST}))
    index.add({p: facts[p] for p in ON_DEMAND})
    assert answers(index) == answers(ProjectIndex(facts))


def test_a_site_added_later_forgets_only_what_read_its_function(facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex(facts)
    arena_init = index.func("pkg/pools.py", "Arena.__init__")
    make_pool = index.func("pkg/pools.py", "make_pool")
    engine_init = index.func("pkg/engine.py", "Engine.__init__")
    assert arena_init is not None and make_pool is not None and engine_init is not None
    answers(index)
    same_file = index.reach(make_pool, 3)
    before = index.reach(engine_init, 3)
    site = dataclasses.replace(same_file[0].site, path="pkg/pools.py", scope="Arena.__init__", span=Span(17, 9, 17, 30))
    index.add_sites([site])
    assert index.reach(make_pool, 3) is same_file  # the same file, another function: kept
    assert site in [r.site for r in index.reach(engine_init, 3)] and site not in [r.site for r in before]
    fresh = ProjectIndex(facts)
    fresh.add_sites([site])
    assert answers(index) == answers(fresh)


def test_a_site_in_a_scope_without_a_function_answers_as_a_fresh_index(facts: dict[str, FileFacts]) -> None:
    index = ProjectIndex(facts)
    answers(index)
    make_pool = index.func("pkg/pools.py", "make_pool")
    assert make_pool is not None
    site = dataclasses.replace(index.reach(make_pool, 3)[0].site, path="pkg/pools.py", scope="Nowhere",
                               span=Span(30, 1, 30, 20))
    index.add_sites([site])
    assert index.func("pkg/pools.py", "Nowhere") is not None
    fresh = ProjectIndex(facts)
    fresh.add_sites([site])
    assert answers(index) == answers(fresh)


def test_weight_uploads_given_later_forget_only_the_factories_that_read_their_sites(
        facts: dict[str, FileFacts], monkeypatch: pytest.MonkeyPatch) -> None:
    raw = facts["pkg/raw.py"]
    empty = next(s for s in raw.sites if s.api == "torch.empty")
    # a weight (T1) is no factory's allocation, unless it is a weight upload
    facts = {**facts, raw.path: dataclasses.replace(raw, sites=tuple(
        dataclasses.replace(s, tier=Tier.T1) if s is empty else s for s in raw.sites))}
    uploads = frozenset({(empty.path, empty.span.line)})
    index = ProjectIndex(facts)
    index.factories(uploads=True)  # what the expansion asks, no upload known yet
    index.settle()  # the derivation comes after the index settled
    computed = _count_class_allocations(monkeypatch)
    derived = index.derived_sites(uploads=uploads)
    assert "Arena" in computed and "Pool" not in computed  # Pool's constructor reads nothing of raw.py: kept
    # the upload makes alloc_block a factory, and make_pool and Arena through it
    assert {"alloc_block", "Arena"} <= {s.api for s in derived}
    assert not {"alloc_block", "Arena"} & {s.api for s in ProjectIndex(facts).derived_sites()}
    assert derived == ProjectIndex(facts).derived_sites(uploads=uploads)
    computed.clear()  # asked again with other uploads, the names freed: everything is computed again
    assert index.derived_sites() == ProjectIndex(facts).derived_sites() and "Pool" in computed


def test_a_lookup_that_finds_the_same_keeps_what_was_built_on_it_and_one_that_finds_another_does_not() -> None:
    deps = Deps()
    pool, arena = object(), object()
    table: dict[str, object | None] = {"pool": pool, "arena": None}

    def find(name: str) -> object | None:
        deps.note("name:" + name)
        return table[name]

    lookups: CutOff[str, object | None] = CutOff(deps, find, "lookup:")
    built: Memo[str, object | None] = Memo(deps)
    for name in table:
        deps.begin()
        built.store(name, lookups.get(name), deps.end())
    assert built.names["pool"] == {"lookup:'pool'"}  # the entry's token, not the names it looked up
    table["arena"] = arena  # a new file defines it
    touched = {"name:pool", "name:arena"}
    changed = lookups.recheck(touched)
    assert changed == {"lookup:'arena'"}
    assert built.invalidate(touched | changed) == 1 and "pool" in built and "arena" not in built
    deps.begin()
    assert lookups.get("arena") is arena
    assert deps.end() == {"lookup:'arena'"}


def test_a_module_named_like_one_a_lookup_found_keeps_the_resolutions_built_on_it(
        facts: dict[str, FileFacts], monkeypatch: pytest.MonkeyPatch) -> None:
    from alloc_audit.pipeline.index.python import PythonResolution

    index = ProjectIndex({p: facts[p] for p in FIRST})
    init = index.func("pkg/engine.py", "Engine.__init__")
    assert init is not None
    make_pool = next(c for c in init.callees if c.endswith("make_pool"))
    assert index.resolve(init, make_pool) == ()  # looked up `pkg` (found) for `pools` (not in it)
    resolved: list[str] = []
    resolve = PythonResolution.resolve

    def counted(self: PythonResolution, func: Any, callee: str) -> Any:
        resolved.append(callee)
        return resolve(self, func, callee)

    monkeypatch.setattr(PythonResolution, "resolve", counted)
    # a vendored copy: module `vendor.pkg` touches every lookup of `pkg`, which still finds pkg/__init__.py
    index.add({"vendor/pkg/__init__.py": dataclasses.replace(facts["pkg/__init__.py"], path="vendor/pkg/__init__.py",
                                                             module="vendor.pkg")})
    assert index.resolve(init, make_pool) == () and make_pool not in resolved
    index.add({p: facts[p] for p in ON_DEMAND})  # pools.py: the lookup finds another, the resolution follows
    assert [f.id for f in index.resolve(init, make_pool)] == ["pkg/pools.py::make_pool"] and make_pool in resolved


def _facts_of(path: str, source: str) -> FileFacts:
    apis = load_catalog(load_config(PROJECT, None)).apis
    lang = language_of(path)
    assert lang is not None
    parsed = parse_source(source.encode(), lang, apis.attribute_macros, apis.specifier_macros, apis.lone_macro_lines)
    return extract_facts(path, lang, parsed, apis)


def test_what_an_unresolved_call_misses_is_asked_again_once_a_package_re_exports_it() -> None:
    app = _facts_of("app.py", "import pkg\n\n\ndef run(n):\n    return pkg.make_pool(n)\n")
    init = _facts_of("pkg/__init__.py", "from .pools import make_pool\n")
    index = ProjectIndex({"app.py": app})
    run = index.func("app.py", "run")
    assert run is not None
    callee = next(c for c in run.callees if c.endswith("make_pool"))
    assert index.missing_names(run, callee) == {"module:pkg"}
    index.add({"pkg/__init__.py": init})  # the package says where make_pool is: the module to parse next
    assert index.missing_names(run, callee) == {"module:pkg", "module:pkg.pools"} == \
        ProjectIndex({"app.py": app, "pkg/__init__.py": init}).missing_names(run, callee)


def test_a_weight_added_past_a_constructor_keeps_the_class_allocation_and_a_buffer_does_not(
        facts: dict[str, FileFacts], monkeypatch: pytest.MonkeyPatch) -> None:
    index = ProjectIndex(facts)
    arena = index.classes_named("Arena")[0]
    init = index.func("pkg/pools.py", "Arena.__init__")
    assert init is not None
    before = index.class_allocates(arena)
    assert before is not None and before.site.scope == "alloc_block"  # two calls past the constructor
    computed = _count_class_allocations(monkeypatch)
    # a weight (T1) one call past Arena's constructor: the reach sees it, the class allocation cannot
    weight = dataclasses.replace(before.site, path="pkg/pools.py", scope="make_pool", span=Span(10, 5, 10, 11),
                                 tier=Tier.T1)
    index.add_sites([weight])
    assert weight in [r.site for r in index.reach(init, 3)]
    assert index.class_allocates(arena) is before and "Arena" not in computed
    # a buffer there is nearer than alloc_block's: the class allocation is computed again and changes
    buffer = dataclasses.replace(weight, span=Span(10, 12, 10, 26), tier=Tier.T2)
    index.add_sites([buffer])
    after = index.class_allocates(arena)
    assert "Arena" in computed and after is not None and after.site == buffer
    # a transient in the constructor itself counts too (no call away): computed again
    computed.clear()
    transient = dataclasses.replace(weight, scope="Arena.__init__", span=Span(16, 9, 16, 20), tier=Tier.T4)
    index.add_sites([transient])
    index.class_allocates(arena)
    assert "Arena" in computed
    fresh = ProjectIndex(facts)
    for site in (weight, buffer, transient):
        fresh.add_sites([site])
    assert answers(index) == answers(fresh)


def _count_class_allocations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the classes whose allocation the factories compute from now on, in order."""
    computed: list[str] = []
    find = Factories._find_class_allocation

    def counted(self: Factories, cls: Any, depth: int) -> Any:
        computed.append(cls.name)
        return find(self, cls, depth)

    monkeypatch.setattr(Factories, "_find_class_allocation", counted)
    return computed


def test_a_python_class_s_constructors_are_what_method_lookup_finds_for_each_name(tmp_path: Path) -> None:
    """``constructors`` walks a class's bases once for all constructor names (``symbol_parts``): the same
    functions, in the same order, as ``method_lookup`` of each name, before and after the index settles."""
    (tmp_path / "pkg").mkdir()
    sources = {
        "pkg/base.py": "class Base:\n    def __init__(self):\n        pass\n\n    def __new__(cls):\n"
                       "        return object.__new__(cls)\n",
        "pkg/mid.py": "from pkg.base import Base\n\n\nclass Mid(Base):\n    def __post_init__(self):\n        pass\n",
        "pkg/leaf.py": "from pkg.mid import Mid\n\n\nclass Leaf(Mid):\n    def __new__(cls):\n"
                       "        return object.__new__(cls)\n\n\nclass Alone:\n    pass\n",
    }
    for path, text in sources.items():
        (tmp_path / path).write_text(text)
    index = ProjectIndex(extracted_facts(tmp_path, tuple(sources)))
    classes = [c for name in ("Base", "Mid", "Leaf", "Alone") for c in index.classes_named(name)]
    assert len(classes) == 4
    for _settled in (False, True):
        for cls in classes:
            expected = [f for name in ("__init__", "__post_init__", "__new__") for f in index.method_lookup(cls, name)]
            assert index.constructors(cls) == expected
        leaf = index.classes_named("Leaf")[0]
        assert [f.qualname for f in index.constructors(leaf)] == ["Base.__init__", "Mid.__post_init__", "Leaf.__new__"]
        index.settle()


def test_past_constructors_notes_the_same_names_with_its_interned_table() -> None:
    """perf-r35b: ``_past_constructors`` keeps the PAST names it made per function; a second class meeting the
    same functions notes equal names (the very same strings), and the constructors' own and the names that are
    no function stay as they were."""
    from alloc_audit.pipeline.index import factories as fa

    funcs: dict[str, Any] = {"a.py::f": object(), "a.py::g": object(), "a.py::A.__init__": object()}
    interned: dict[str, str] = {}
    first = [{"a.py::f", "a.py::A.__init__", "Pool"}]
    fa._past_constructors(first, {"a.py::A.__init__"}, funcs, interned)
    assert first[0] == {fa.PAST + "a.py::f", "a.py::A.__init__", "Pool"}
    second = [{"a.py::f", "a.py::g", "Arena"}]
    fa._past_constructors(second, set(), funcs, interned)
    assert second[0] == {fa.PAST + "a.py::f", fa.PAST + "a.py::g", "Arena"}
    assert {n for n in first[0] if n.startswith(fa.PAST)} <= second[0]
    noted = next(n for n in second[0] if n == fa.PAST + "a.py::f")
    assert noted is interned["a.py::f"] and noted is next(n for n in first[0] if n.startswith(fa.PAST))
    fa._past_constructors([], set(), funcs, interned)  # outside a memoised computation: nothing to note


def test_module_path_by_a_tail_answers_as_a_fresh_index_after_each_add(facts: dict[str, FileFacts]) -> None:
    """``Symbols.module_path`` keeps the modules that end in a dotted tail until the next ``add``: asked
    between adds (the tails remembered), it answers every tail from every importing file as a fresh
    index given the same files does (several copies of a package, one added later, ties, no copy)."""
    from alloc_audit.pipeline.index.symbols import Symbols

    base = facts["pkg/raw.py"]
    layout = [("vendor/a/pkg/util.py", "vendor.a.pkg.util"), ("lib/pkg/util.py", "lib.pkg.util"),
              ("vendor/b/pkg/util.py", "vendor.b.pkg.util"), ("util.py", "util"), ("lib/pkg/io.py", "lib.pkg.io"),
              ("lib/other/io.py", "lib.other.io")]
    made = {p: dataclasses.replace(base, module=m) for p, m in layout}
    tails = sorted({".".join(m.split(".")[i:]) for _p, m in layout for i in range(len(m.split(".")))} | {"nowhere"})
    nears = ["", "vendor/a/x.py", "vendor/b/y.py", "lib/z.py", "top.py"]
    asked = Symbols()
    added: dict[str, FileFacts] = {}
    for paths in (layout[:2], layout[2:4], layout[4:]):
        new = {p: made[p] for p, _m in paths}
        asked.add(new)
        added.update(new)
        fresh = Symbols()
        fresh.add(added)
        for _twice in range(2):  # the second time from what the first remembered
            assert [asked.module_path(t, n) for t in tails for n in nears] == \
                [fresh.module_path(t, n) for t in tails for n in nears]
    assert asked.module_path("pkg.util", "vendor/b/y.py") == "vendor/b/pkg/util.py"
    assert asked.module_path("pkg.util", "lib/z.py") == "lib/pkg/util.py"
    assert asked.module_path("io", "") is None  # two copies and no importing file: ambiguous
