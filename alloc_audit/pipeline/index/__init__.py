"""Stage 4, index: all files' facts -> ProjectIndex, the queries rules ask.

Joins the per-file facts into functions with their calls, sites and
statements, and classes with methods, bases and member types
(``symbols``); resolves calls (``python``, ``cpp``, with the types of
locals and members from ``types``); walks the call graph (``calls``); and
finds *factories* (functions that hand an allocation back, classes whose
construction allocates) and the *derived sites* that call them
(``factories``). Memos live in those parts, never in the facts.

Resolution is deliberately conservative: a call resolves only when the
target is determined by names and declared types, never by guessing among
same-named methods of unrelated classes. Unresolved calls simply end a path,
which costs recall, never precision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ...model import Call, FileFacts, Language, Site, Span
from .calls import CallGraph
from .cpp import CppResolution
from .factories import Factories, Factory
from .memo import Memo
from .python import PythonResolution
from .symbols import ClassInfo, Func, Hop, Reach, Symbols, last_name, split_callee
from .types import Types
from .values import Env, Value, bind_edge, module_constants

LOG = logging.getLogger("alloc_audit")

__all__ = ["ClassInfo", "Factory", "Func", "Hop", "ProjectIndex", "Reach", "build_index", "last_name",
           "split_callee"]


class ProjectIndex:
    """The facade: every query the rules, the expansion and the derivation ask."""

    def __init__(self, files: Mapping[str, FileFacts]) -> None:
        self._symbols = Symbols()
        self._deps = self._symbols.deps
        self._types = Types(self._symbols)
        self._python = PythonResolution(self._symbols, self._types)
        self._cpp = CppResolution(self._symbols, self._types)
        self._calls = CallGraph(self._symbols, self.resolve)
        self._factories = Factories(self._symbols, self._calls, self.resolve, self.constructed_class)
        self._resolved: Memo[tuple[str, str], tuple[Func, ...]] = Memo(self._deps)
        self._missing: Memo[tuple[str, str], frozenset[str]] = Memo(self._deps)  # (function id, callee) -> names
        self._constants: dict[str, dict[str, Value]] = {}
        self._visible: dict[str, dict[str, Value]] = {}
        self._at_span: dict[str, tuple[Func, dict[Span, Call]]] = {}  # function id -> (function, first call per span)
        self._bound: dict[str, tuple[Func, frozenset[str]]] = {}  # function id -> (function, names it binds)
        self.add(files)

    def add(self, files: Mapping[str, FileFacts]) -> None:
        """Add files (the on-demand expansion adds them round by round).
        What the new files cannot change is kept: resolutions, reaches and
        factories that looked up none of the names they define (``memo``)."""
        self._constants = {}
        self._visible = {}
        for part in (self._types, self._python):
            part.reset()
        if self._deps.settled:  # the names are gone: start over
            self._reset_memos()
        touched = self._symbols.add(files)
        touched |= self._symbols.symbol_lookups.recheck(touched)  # the symbol lookups that find another now
        kept = len(self._resolved)
        dropped = self._resolved.invalidate(touched)
        self._missing.invalidate(touched)
        self._calls.invalidate(touched)
        self._factories.invalidate(touched)
        if kept:
            LOG.debug("index: %d files added, %d names touched, %d of %d resolutions kept", len(files),
                      len(touched), kept - dropped, kept)

    def add_sites(self, sites: Iterable[Site]) -> None:
        """Add sites found after indexing (stage default_device). Calls
        resolve as before; what read the sites of the functions they go into
        is forgotten (everything, where a site needed a new function)."""
        self._constants = {}
        self._visible = {}
        if self._deps.settled:
            self._reset_memos()
        sites = list(sites)
        touched = self._symbols.add_sites(sites)
        if touched is None:
            self._reset_memos()
            return
        self._calls.invalidate(touched)
        self._factories.invalidate(touched, sites)

    def settle(self) -> None:
        """No file or site will be added: the memos keep their values but
        not the names each used (memory: tens of MB on a large tree)."""
        self._deps.settled = True
        self._symbols.symbol_lookups.clear()  # no longer asked: a settled index looks symbols up directly
        self._resolved.settle()
        self._missing.clear()  # asked by the expansion only
        self._calls.settle()  # the factories keep their names until derived_sites: its uploads drop what read them

    def _reset_memos(self) -> None:
        self._resolved.clear()
        self._missing.clear()
        self._symbols.symbol_lookups.clear()
        for part in (self._types, self._python, self._calls, self._factories):
            part.reset()

    # ------------------------------------------------------------ symbols
    @property
    def files(self) -> Mapping[str, FileFacts]:
        """Every indexed file's facts, by path."""
        return self._symbols.files

    def functions(self) -> Iterator[Func]:
        return self._symbols.functions()

    def classes_named(self, name: str) -> list[ClassInfo]:
        """The classes whose last name is ``name``."""
        return self._symbols.classes_by_name.get(name, [])

    def constructors(self, cls: ClassInfo) -> list[Func]:
        return self._symbols.constructors(cls)

    @property
    def funcs(self) -> Mapping[str, Func]:
        """Every function by id (``path::qualname``), module levels included."""
        return self._symbols.funcs

    def func(self, path: str, scope: str) -> Func | None:
        return self._symbols.func(path, scope)

    def site_call(self, site: Site) -> tuple[Func, Call] | None:
        """The function a site is in and the call it stands for (the call at its span), if both are indexed."""
        func = self._symbols.func(site.path, site.scope)
        if func is None:
            return None
        # the first of its calls at the site's span, from a table made per function on first use (a pass
        # asks for every site, and a long test function has thousands of calls); ``Func.calls`` is made
        # once, so the table holds while the function object does
        held = self._at_span.get(func.id)
        if held is None or held[0] is not func:
            at: dict[Span, Call] = {}
            for c in func.calls:
                at.setdefault(c.span, c)
            held = self._at_span[func.id] = (func, at)
        call = held[1].get(site.span)
        return (func, call) if call is not None else None

    def bound_names(self, func: Func) -> frozenset[str]:
        """The names ``func``'s assignments bind (their target texts) and the call results it stores (targets,
        stripped), kept per function: a function's statements never change once its file is added."""
        held = self._bound.get(func.id)
        if held is None or held[0] is not func:
            names = {t for a in func.assigns for t in a.targets} | {(c.target or "").strip() for c in func.calls}
            held = self._bound[func.id] = (func, frozenset(names))
        return held[1]

    def functions_in(self, path: str) -> Iterable[Func]:
        """The functions of one file, its module level included."""
        return self._symbols.by_path.get(path, {}).values()

    def method_lookup(self, cls: ClassInfo, name: str) -> list[Func]:
        """A method of ``cls`` or of its nearest base that defines it."""
        return self._symbols.method_lookup(cls, name)

    def base_classes(self, cls: ClassInfo) -> list[ClassInfo]:
        """The project classes ``cls`` derives from, nearest first."""
        return self._symbols.base_classes(cls)

    def subclass_names(self, name: str) -> list[str]:
        return self._symbols.subclass_names(name)

    def unattached_owners(self) -> set[str]:
        return self._symbols.unattached_owners()

    # ------------------------------------------------------------ resolution
    def resolve(self, func: Func, call: Call | str) -> tuple[Func, ...]:
        """The project functions a call in ``func`` runs (constructors for a
        construction); empty when it cannot be told."""
        callee = call if isinstance(call, str) else call.callee
        key = (func.id, callee)
        memo = self._resolved
        found = memo.values.get(key)
        stack = self._deps.stack
        if found is not None:
            if stack:  # inside a memoised computation: it used what this resolution looked up
                stack[-1].update(memo.names[key])
            return found
        names: set[str] = set()
        stack.append(names)
        scope = func.scope
        if scope is not None and scope.owner:  # a method defined out of line may meet its class later
            names.add(last_name(scope.owner))
        if func.language is Language.PYTHON:
            found = tuple(self._python.resolve(func, callee))
        else:
            found = tuple(self._cpp.resolve(func, callee))
        return memo.store(key, found, self._deps.end())

    def constructed_class(self, func: Func, call: Call) -> ClassInfo | None:
        """The project class a call constructs, if it is a construction."""
        if func.language is Language.PYTHON:
            return self._python.constructed_class(func, call.callee)
        return self._cpp.constructed_class(call.callee)

    def class_named(self, func: Func, name: str) -> ClassInfo | None:
        """The project class a (dotted) Python ``name`` means in ``func``'s
        file: the class calling it would construct."""
        return self._python.constructed_class(func, name) if func.language is Language.PYTHON else None

    def missing_names(self, func: Func, callee: str) -> frozenset[str]:
        """For a call that did not resolve, what could resolve it if analysed:
        for Python the modules its names are imported from (``module:`` +
        dotted name), for C++ the class or function names involved. Kept
        across the expansion's rounds like a resolution (``memo``)."""
        key = (func.id, callee)
        memo = self._missing
        if key in memo:
            return memo.hit(key)
        self._deps.begin()
        scope = func.scope
        if scope is not None and scope.owner:  # a method defined out of line may meet its class later
            self._deps.note(last_name(scope.owner))
        if func.language is Language.PYTHON:
            found = frozenset(f"module:{m}" for m in self._python.missing_modules(func, callee))
        else:
            found = frozenset(self._cpp.missing_names(func, callee))
        return memo.store(key, found, self._deps.end())

    # ------------------------------------------------------------ call graph
    # ------------------------------------------------------------ values
    def imported(self, path: str, name: str) -> str | None:
        """The dotted target a name is imported as in ``path`` (``from torch.nn import ReLU``: ``torch.nn.ReLU``)."""
        return self._symbols.module_imports.get(path, {}).get(name)

    def module_constants(self, path: str) -> Mapping[str, Value]:
        """Literal constants a Python module assigns once (``USE_SPLIT = False``)."""
        found = self._constants.get(path)
        if found is None:
            found = self._constants[path] = module_constants(self._symbols, path)
        return found

    def visible_constants(self, path: str) -> Mapping[str, Value]:
        """The module's constants and those it imports by name (``from
        .._const import CPU``) from a project module that defines them."""
        found = self._visible.get(path)
        if found is None:
            found = dict(self.module_constants(path))
            for name, target in self._symbols.module_imports.get(path, {}).items():
                module, _, attr = target.rpartition(".")
                where = self._symbols.module_path(module, path) if module and name not in found else None
                value = self.module_constants(where).get(attr) if where is not None else None
                if value is not None:
                    found[name] = value
            self._visible[path] = found
        return found

    def edge_values(self, caller: Func, call: Call, target: Func, known: Env) -> dict[str, Value]:
        """What ``call`` in ``caller`` passes for each parameter of ``target``
        that it determines (a literal, None, not None, a forwarded parameter
        whose value ``known`` holds); parameters it leaves unknown are absent."""
        return bind_edge(caller, call, target, known, self.module_constants(caller.path))

    def callers_matching(self, predicate: Callable[[str], bool]) -> frozenset[str]:
        return self._calls.callers_matching(predicate)

    def callers_within(self, seeds: Iterable[Func], depth: int) -> dict[str, int]:
        return self._calls.callers_within(seeds, depth)

    def calls_named(self, name: str) -> Sequence[tuple[Func, int]]:
        """Every call whose callee's last name is ``name``, as (function,
        index in its file's ``CallTable``), resolved or not."""
        return self._calls.calls_by_leaf().get(name, ())

    def calls_reaching(self, func: Func) -> list[tuple[Func, Call, bool]]:
        """Every call by ``func``'s name that may reach it: resolved to it,
        or resolved to nothing (``self.helper.run(...)``); with whether it
        was resolved."""
        out = []
        for caller, i in self.calls_named(func.name):
            if caller.table is None:
                continue
            call = caller.call_at(i)
            resolved = self.resolve(caller, call)
            if not resolved or func in resolved:
                out.append((caller, call, bool(resolved)))
        return out

    def callees(self, func: Func) -> Iterator[tuple[Call, tuple[Func, ...]]]:
        return self._calls.callees(func)

    def reach(self, func: Func, depth: int) -> tuple[Reach, ...]:
        return self._calls.reach(func, depth)

    # ------------------------------------------------------------ factories
    def class_allocates(self, cls: ClassInfo, depth: int = 3) -> Reach | None:
        return self._factories.class_allocates(cls, depth)

    def factory_allocation(self, func: Func, depth: int = 3,
                           keep: Callable[[Site], bool] | None = None) -> Reach | None:
        return self._factories.factory_allocation(func, depth, keep)

    def factories(self, depth: int = 3, uploads: bool = False) -> set[Factory]:
        return self._factories.factories(depth, uploads)

    def derived_sites(self, depth: int = 3, uploads: frozenset[tuple[str, int]] = frozenset()) -> tuple[Site, ...]:
        return self._factories.derived_sites(depth, uploads)


def build_index(files: Mapping[str, FileFacts]) -> ProjectIndex:
    return ProjectIndex(files)
