"""The index's symbol tables: functions, classes (methods, bases, member
types), Python modules with their symbols and imports, native free
functions; built file by file as the expansion adds files. Lookups by name
that need no call context live here too (a class by name, a method through
the bases, the constructors of a class, a Python dotted name)."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ...model import Assign, Block, Call, CallTable, FileFacts, Language, Return, Scope, Site, Span, With
from .memo import CutOff, Deps
from .symbol_parts import module_file as _module_file
from .symbol_parts import python_constructors as _python_constructors
from .symbol_parts import statements_into_functions as _statements_into_functions

_CONSTRUCTOR_NAMES = ("__init__", "__post_init__", "__new__")


class Func:
    """One function (or a file's module level, qualname ``<module>``).

    Its calls stay in the file's columnar ``CallTable``; ``calls`` turns them
    into ``Call`` objects on first use (most functions are never inspected)."""

    __slots__ = ("id", "path", "qualname", "name", "scope", "language", "owner", "table", "call_ix", "_calls", "_at",
                 "sites", "assigns", "returns", "blocks", "withs", "module")

    def __init__(self, fid: str, path: str, qualname: str, scope: Scope | None, language: Language,
                 module: str) -> None:
        self.id = fid
        self.path = path
        self.qualname = qualname
        self.name = scope.name if scope is not None else qualname
        self.scope = scope
        self.language = language
        self.owner: ClassInfo | None = None
        self.module = module
        self.table: CallTable | None = None
        self.call_ix: list[int] = []
        self._calls: list[Call] | None = None
        self._at: dict[int, Call] | None = None
        self.sites: list[Site] = []
        self.assigns: list[Assign] = []
        self.returns: list[Return] = []
        self.blocks: list[Block] = []
        self.withs: list[With] = []

    @property
    def calls(self) -> list[Call]:
        if self._calls is None:
            table = self.table
            self._calls = [table[i] for i in self.call_ix] if table is not None else []
        return self._calls

    def call_at(self, i: int) -> Call:
        """The call at ``i`` (of ``call_ix``) in the file's ``CallTable``, built once (round 33, issue 15)."""
        if self._calls is not None:
            return self._calls[bisect_left(self.call_ix, i)]  # `call_ix` ascends (the table is in order)
        at = self._at = self._at if self._at is not None else {}
        found = at.get(i)
        if found is None:
            found = at[i] = self.table[i]  # type: ignore[index]  # an index of `call_ix`: the table is set
        return found

    @property
    def callees(self) -> list[str]:
        table = self.table
        return [table.callees[i] for i in self.call_ix] if table is not None else []

    @property
    def arglists(self) -> list[str]:
        table = self.table
        return [table.arglists[i] for i in self.call_ix] if table is not None else []

    @property
    def span(self) -> Span | None:
        return self.scope.span if self.scope is not None else None

    def in_loop(self, line: int) -> bool:
        """``line`` lies in the body of one of this function's loops."""
        return any(b.kind == "loop" and b.span.contains_line(line) for b in self.blocks)

    def calls_of(self, name: str) -> list[Call]:
        """This function's calls of ``name`` (the last part of a dotted callee)."""
        return [c for c in self.calls if c.callee.rsplit(".", 1)[-1] == name]

    def __repr__(self) -> str:
        return f"Func({self.id})"


class ClassInfo:
    __slots__ = ("key", "name", "qualname", "paths", "language", "bases", "methods", "fields", "module", "scope")

    def __init__(self, key: str, qualname: str, language: Language, module: str) -> None:
        self.key = key
        self.qualname = qualname
        self.name = qualname.replace("::", ".").rsplit(".", 1)[-1]
        self.paths: list[str] = []
        self.language = language
        self.bases: list[str] = []
        self.methods: dict[str, list[Func]] = {}
        self.fields: dict[str, str] = {}
        self.module = module
        self.scope: Scope | None = None

    @property
    def defined_once(self) -> bool:
        """One definition in one file (a native name defined in several
        headers is not resolved from elsewhere)."""
        return len(set(self.paths)) <= 1

    def __repr__(self) -> str:
        return f"ClassInfo({self.key})"


@dataclass(frozen=True)
class Hop:
    """One step of a call path: the call and where it is."""

    call: Call
    path: str
    caller: str
    callee: str


@dataclass(frozen=True)
class Reach:
    """A site reached from a function through ``hops`` calls."""

    site: Site
    hops: tuple[Hop, ...]


def last_name(name: str) -> str:
    """``pkg.mod.Cls`` -> ``Cls``; ``ns::Cls`` -> ``Cls``."""
    return name.rsplit(".", 1)[-1].rsplit("::", 1)[-1]


def split_callee(callee: str) -> tuple[str, str]:
    """(receiver, name) of a callee: ``self.a.b`` -> (``self.a``, ``b``);
    ``p->run`` -> (``p``, ``run``); ``ns::f`` -> (``ns``, ``f``)."""
    if "::" not in callee and "->" not in callee:
        receiver, _, name = callee.rpartition(".")
        return receiver, name
    best = -1
    sep_len = 0
    for sep in ("->", "::", "."):
        at = callee.rfind(sep)
        if at > best:
            best, sep_len = at, len(sep)
    if best < 0:
        return "", callee
    return callee[:best], callee[best + sep_len:]


class Symbols:
    """Every function and class of the analysed files, by id, path and name."""

    def __init__(self) -> None:
        self.files: dict[str, FileFacts] = {}
        self.funcs: dict[str, Func] = {}
        self.by_path: dict[str, dict[str, Func]] = {}
        self.classes: dict[str, ClassInfo] = {}  # key -> class
        self.classes_by_name: dict[str, list[ClassInfo]] = {}
        self.modules: dict[str, str] = {}  # python module -> path
        self.modules_by_leaf: dict[str, list[str]] = {}
        self.module_tails: dict[str, list[str]] = {}  # a dotted tail -> the modules ending in it, until ``add``
        self.module_symbols: dict[str, dict[str, Func | ClassInfo]] = {}
        self.module_imports: dict[str, dict[str, str]] = {}
        self.cpp_functions: dict[str, list[Func]] = {}  # simple name -> free functions
        self._unattached: list[Func] = []
        self._subclasses: dict[str, list[ClassInfo]] | None = None
        # settled (no file comes): a class's bases (name None) and methods by name, once (perf-r30)
        self._settled: dict[tuple[ClassInfo, str | None], list[Any]] = {}
        # lookups by name are noted here: the memos of the index keep what
        # files added later cannot change (see ``memo``)
        self.deps = Deps()
        self.symbol_lookups: CutOff[tuple[str, str], Func | ClassInfo | None] = CutOff(
            self.deps, lambda key: _find_symbol(self, key[0], 0, key[1]), "symbol:")

    def _func(self, path: str, qualname: str, scope: Scope | None, facts: FileFacts) -> Func:
        table = self.by_path.setdefault(path, {})
        found = table.get(qualname)
        if found is None:
            found = Func(f"{path}::{qualname}", path, qualname, scope, facts.language, facts.module)
            table[qualname] = found
            self.funcs[found.id] = found
            if scope is not None and scope.kind == "function":
                self._unattached.append(found)
        elif found.scope is None and scope is not None:
            found.scope = scope
            found.name = scope.name
        return found

    def add(self, files: Mapping[str, FileFacts]) -> set[str]:
        """Add files (the on-demand expansion adds them round by round);
        returns the names whose lookups they may change (``memo``): module
        leaves, the classes they define or extend and their bases' names,
        the native free functions they add."""
        touched: set[str] = set()
        self._settled.clear()
        self.module_tails.clear()  # ``modules_by_leaf`` changes
        new_paths = sorted(p for p in files if p not in self.files)
        for path in new_paths:
            self.files[path] = files[path]
        self._subclasses = None
        for path in new_paths:
            facts = self.files[path]
            if facts.language is Language.PYTHON and facts.module:
                self.modules[facts.module] = path
                # ``module_path`` finds a module by any dotted tail of its name
                parts = facts.module.split(".")
                touched.update("module:" + ".".join(parts[i:]) for i in range(len(parts)))
                self.modules_by_leaf.setdefault(facts.module.rsplit(".", 1)[-1], []).append(facts.module)
                self.module_imports[path] = {imp.name: imp.target for imp in facts.imports}
            symbols = self.module_symbols.setdefault(path, {})
            self._func(path, "<module>", None, facts)
            for scope in facts.scopes:
                if scope.kind == "class":
                    key = f"{path}::{scope.qualname}" if facts.language is Language.PYTHON else scope.qualname
                    cls = self.classes.get(key)
                    if cls is None:
                        cls = self.classes[key] = ClassInfo(key, scope.qualname, facts.language, facts.module)
                        self.classes_by_name.setdefault(cls.name, []).append(cls)
                    cls.paths.append(path)
                    touched.add(_touched_class(cls))
                    touched.update("subclass:" + last_name(b) for b in scope.bases)
                    cls.bases += [b for b in scope.bases if b not in cls.bases]
                    cls.scope = cls.scope or scope
                    if "." not in scope.qualname and "::" not in scope.qualname:
                        symbols.setdefault(scope.qualname, cls)
                else:
                    func = self._func(path, scope.qualname, scope, facts)
                    if facts.language is Language.PYTHON and "." not in scope.qualname:
                        symbols.setdefault(scope.qualname, func)
            for field in facts.fields:
                cls = self.classes.get(field.owner)
                if cls is None:
                    cls = self.classes[field.owner] = ClassInfo(field.owner, field.owner, facts.language, "")
                    self.classes_by_name.setdefault(cls.name, []).append(cls)
                cls.fields.setdefault(field.name, field.type)
                touched.add(_touched_class(cls))
        # attach methods to classes (out-of-line C++ definitions included); a
        # C++ method whose class is not known yet waits for a later round
        waiting: list[Func] = []
        for func in self._unattached:
            owned = func.scope
            assert owned is not None
            scope = owned
            if not scope.owner:
                if func.language is not Language.PYTHON:
                    self.cpp_functions.setdefault(func.name, []).append(func)
                    touched.add("function:" + func.name)
                continue
            key = f"{func.path}::{scope.owner}" if func.language is Language.PYTHON else scope.owner
            cls = self.classes.get(key)
            if cls is None and func.language is not Language.PYTHON:
                cls = self.cpp_class(scope.owner)
            if cls is None:
                if func.language is not Language.PYTHON:
                    self.cpp_functions.setdefault(func.name, []).append(func)
                    touched.add("function:" + func.name)
                    waiting.append(func)
                continue
            func.owner = cls
            touched.add(_touched_class(cls))
            parent_qual = func.qualname.rsplit("::" if "::" in func.qualname else ".", 1)[0]
            if parent_qual == scope.owner or func.language is not Language.PYTHON:
                cls.methods.setdefault(func.name, []).append(func)
        self._unattached = waiting
        for path in new_paths:
            _statements_into_functions(self, path)
        return touched

    def _note_native(self, cls: ClassInfo) -> None:
        if cls.language is not Language.PYTHON:  # a Python class is one file's; a native one grows
            self.deps.note(cls.name)

    def add_sites(self, sites: Iterable[Site]) -> set[str] | None:
        """Add sites found after the files were indexed (default-device allocations), updating their files'
        facts. Returns what a memo that read the sites of their functions noted (``sites_of``); None where a
        site needed a new function (lookups of its scope change: keep nothing)."""
        added: dict[str, list[Site]] = {}
        touched, made = set[str](), False
        for site in sites:
            table = self.by_path[site.path]
            made = made or site.scope not in table
            func = self._func_for(table, site.path, site.scope, self.files[site.path])
            func.sites.append(site)
            touched.add(sites_of(func))
            added.setdefault(site.path, []).append(site)
        for path, extra in added.items():
            merged = sorted((*self.files[path].sites, *extra), key=lambda s: (s.span.line, s.span.col))
            self.files[path] = dataclasses.replace(self.files[path], sites=tuple(merged))
        return None if made else touched

    def _func_for(self, table: dict[str, Func], path: str, scope: str, facts: FileFacts) -> Func:
        found = table.get(scope)
        if found is None:  # a C++ namespace-level scope, or a class body
            found = self._func(path, scope, None, facts)
        return found

    def subclasses(self, name: str) -> list[ClassInfo]:
        """The known classes that name ``name`` as a direct base (bases are
        matched by their last name)."""
        self.deps.note("subclass:" + name)
        if self._subclasses is None:
            children: dict[str, list[ClassInfo]] = {}
            for cls in self.classes.values():
                for base in sorted({last_name(b) for b in cls.bases}):
                    children.setdefault(base, []).append(cls)
            self._subclasses = children
        return self._subclasses.get(name, [])

    def subclass_names(self, name: str) -> list[str]:
        """Names of the known classes that derive from a class name, however
        indirectly."""
        out: list[str] = []
        seen = {name}
        stack = [name]
        while stack:
            for child in sorted({c.name for c in self.subclasses(stack.pop())}):
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    stack.append(child)
        return out

    def unattached_owners(self) -> set[str]:
        """Names of native classes defined out of line (constructors, or
        methods that allocate) whose class definition (a header, often) has
        not been analysed: once it is, the class can be a factory."""
        out = set()
        for func in self._unattached:
            owner = func.scope.owner.rsplit("::", 1)[-1] if func.scope is not None and func.scope.owner else ""
            if owner and (func.sites or func.name == owner):
                out.add(owner)
        return out

    def cpp_class(self, qualname: str) -> ClassInfo | None:
        """A C++ class by qualified name, allowing either side to carry fewer
        namespace qualifiers (`Foo` vs `ns::Foo`)."""
        name = qualname.rsplit("::", 1)[-1]
        self.deps.note(last_name(name))
        found = self.classes.get(qualname)
        if found is not None:
            return found
        candidates = [c for c in self.classes_by_name.get(name, ()) if c.language is not Language.PYTHON
                      and (c.qualname.endswith("::" + qualname) or qualname.endswith("::" + c.qualname)
                           or c.qualname == qualname)]
        return candidates[0] if len(candidates) == 1 else None

    # ------------------------------------------------------------ lookups
    def functions(self) -> Iterator[Func]:
        return iter(self.funcs.values())

    def func(self, path: str, scope: str) -> Func | None:
        return self.by_path.get(path, {}).get(scope)

    def module_path(self, module: str, near: str = "") -> str | None:
        """The file of a dotted module. When several copies of a package
        match (a tree that vendors `server/pkg` and `backends/x/server/pkg`),
        the one that shares the most leading directories with ``near`` (the
        importing file) is meant; a tie is ambiguous."""
        self.deps.note("module:" + module)
        return _module_file(self, module, near)

    def resolve_symbol(self, dotted: str, depth: int = 0, near: str = "") -> Func | ClassInfo | None:
        """A Python dotted name -> a project function or class, following
        re-exports (`from .x import y` in a package `__init__`); ``near``:
        the file that names it (see ``module_path``). Kept across the
        expansion's rounds while it finds the same (``memo.CutOff``)."""
        if depth:
            return _find_symbol(self, dotted, depth, near)
        return self.symbol_lookups.get((dotted, near))

    def _once(self, key: tuple[ClassInfo, str | None], compute: Callable[..., list[Any]], *args: Any) -> list[Any]:
        if key not in self._settled:
            self._settled[key] = compute(*args)
        return self._settled[key]

    def base_classes(self, cls: ClassInfo, depth: int = 0) -> list[ClassInfo]:
        settled = depth == 0 and self.deps.settled
        return list(self._once((cls, None), self._base_classes, cls, 0)) if settled else self._base_classes(cls, depth)

    def _base_classes(self, cls: ClassInfo, depth: int) -> list[ClassInfo]:
        out: list[ClassInfo] = []
        self._note_native(cls)
        if depth > 8:
            return out
        for base in cls.bases:
            found = self.class_by_name(base, cls)
            if found is not None and found is not cls:
                out.append(found)
                out += self._base_classes(found, depth + 1)
        return out

    def class_by_name(self, name: str, context: ClassInfo | Func | None = None) -> ClassInfo | None:
        if not name:
            return None
        language = context.language if context is not None else Language.PYTHON
        if language is Language.PYTHON:
            path = context.paths[0] if isinstance(context, ClassInfo) and context.paths else (
                context.path if isinstance(context, Func) else None)
            if path is not None and "." not in name:
                local = self.module_symbols.get(path, {}).get(name)
                if isinstance(local, ClassInfo):
                    return local
                target = self.module_imports.get(path, {}).get(name)
                if target is not None:
                    name = target
            found = self.resolve_symbol(name) if "." in name else None
            if isinstance(found, ClassInfo):
                return found
            self.deps.note("class:" + last_name(name))
            candidates = [c for c in self.classes_by_name.get(name.rsplit(".", 1)[-1], ())
                          if c.language is Language.PYTHON]
            return candidates[0] if len(candidates) == 1 else None
        return self.cpp_class(name)

    def method_lookup(self, cls: ClassInfo, name: str) -> list[Func]:
        if self.deps.settled:  # a fresh empty list, as before
            return self._once((cls, name), self._method_lookup, cls, name) or []
        return self._method_lookup(cls, name)

    def _method_lookup(self, cls: ClassInfo, name: str) -> list[Func]:
        self._note_native(cls)
        found = cls.methods.get(name)
        if found:
            return found
        for base in self.base_classes(cls):
            self._note_native(base)
            found = base.methods.get(name)
            if found:
                return found
        return []

    def constructors(self, cls: ClassInfo) -> list[Func]:
        self._note_native(cls)
        if cls.language is Language.PYTHON:
            return _python_constructors(self, cls, _CONSTRUCTOR_NAMES)
        return list(cls.methods.get(cls.name, ()))


def _find_symbol(symbols: Symbols, dotted: str, depth: int, near: str) -> Func | ClassInfo | None:
    """``Symbols.resolve_symbol``, computed."""
    if depth > 4:
        return None
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = symbols.module_path(".".join(parts[:i]), near)
        if path is None:
            continue
        rest = parts[i:]
        symbol = symbols.module_symbols.get(path, {}).get(rest[0])
        if symbol is None:
            target = symbols.module_imports.get(path, {}).get(rest[0])
            if target is not None and target != dotted:
                symbol = symbols.resolve_symbol(".".join([target, *rest[1:]]), depth + 1, path) if len(rest) > 1 \
                    else symbols.resolve_symbol(target, depth + 1, path)
                return symbol
            return None
        if len(rest) == 1:
            return symbol
        if isinstance(symbol, ClassInfo) and len(rest) == 2:
            methods = symbols.method_lookup(symbol, rest[1])
            return methods[0] if methods else None
        return None
    return None


def _touched_class(cls: ClassInfo) -> str:
    """What a new or extended class touches (``memo``): a native class by its
    name (``cpp_class``, its methods and fields), a Python class as a
    candidate of ``class_by_name`` (the rest of it is its own file's)."""
    return cls.name if cls.language is not Language.PYTHON else "class:" + cls.name


def sites_of(func: Func) -> str:
    """What a memo notes when it reads the sites of a function (``add_sites``
    touches it): the function's id (``path::qualname``, the string the
    function holds: no copy per memo entry)."""
    return func.id
