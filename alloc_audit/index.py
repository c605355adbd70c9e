"""Stage 4, index: all files' facts -> ProjectIndex.

Joins the per-file facts into what the rules ask about: functions with their
calls, sites and statements; classes with methods, bases and member types;
Python modules and import resolution across files; call resolution (``f()``,
``self.m()``, ``self.attr.m()`` from member types, ``obj.m()`` from local or
parameter types, ``mod.f()``, ``Class.m()``, constructions; in C++ also
``ptr->m()``/``ref.m()`` through field, parameter and local types); and
"allocates, directly or within N calls, and which sites" summaries.

Resolution is deliberately conservative: a call resolves only when the
target is determined by names and declared types, never by guessing among
same-named methods of unrelated classes. Unresolved calls simply end a path,
which costs recall, never precision.

The index also finds *factories* (functions that return or hand back an
allocation, classes whose construction allocates) and turns calls to them
into *derived sites* in the caller's scope.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Iterator, Mapping

from .arglists import split_args
from .mentions import SkippedFile
from .model import Assign, Block, Call, CallTable, FileFacts, Language, Return, Scope, Site, SiteKind, Span, Tier, Via, With

_CONSTRUCTOR_NAMES = ("__init__", "__post_init__", "__new__")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CALL_HEAD = re.compile(r"^([A-Za-z_][\w.:]*)\s*(?:<[^()]*>)?\s*\(")


class Func:
    """One function (or a file's module level, qualname ``<module>``).

    Its calls stay in the file's columnar ``CallTable``; ``calls`` turns them
    into ``Call`` objects on first use (most functions are never inspected)."""

    __slots__ = ("id", "path", "qualname", "name", "scope", "language", "owner", "table", "call_ix", "_calls",
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


class ProjectIndex:
    def __init__(self, files: Mapping[str, FileFacts]) -> None:
        self.files: dict[str, FileFacts] = {}
        self.funcs: dict[str, Func] = {}
        self.by_path: dict[str, dict[str, Func]] = {}
        self.classes: dict[str, ClassInfo] = {}  # key -> class
        self.classes_by_name: dict[str, list[ClassInfo]] = {}
        self.modules: dict[str, str] = {}  # python module -> path
        self.modules_by_leaf: dict[str, list[str]] = {}
        self.module_symbols: dict[str, dict[str, Func | ClassInfo]] = {}
        self.module_imports: dict[str, dict[str, str]] = {}
        self.cpp_functions: dict[str, list[Func]] = {}  # simple name -> free functions
        self._unattached: list[Func] = []
        self._calls_by_leaf: dict[str, list[tuple[Func, int]]] = {}
        self._by_callee: dict[str, list[str]] = {}  # callee -> ids of the functions calling it
        self._leaves: dict[str, str] = {}  # callee -> its last name
        self._calls_indexed: set[str] = set()
        self._reset_caches()
        self.add(files)

    def _reset_caches(self) -> None:
        self._resolved: dict[tuple[str, str], tuple[Func, ...]] = {}
        self._reach: dict[tuple[str, int], tuple[Reach, ...]] = {}
        self._local_types: dict[str, dict[str, str]] = {}
        self._factory: dict[tuple[str, int], Reach | None] = {}
        self._class_alloc: dict[tuple[str, int], Reach | None] = {}
        self._import_roots: dict[str, set[str]] = {}
        self._subclasses: dict[str, list[ClassInfo]] | None = None
        for cls in self.classes.values():
            cls.fields = {k: v for k, v in cls.fields.items() if v}  # forget "unknown" memos

    # ------------------------------------------------------------ building
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

    def add(self, files: Mapping[str, FileFacts]) -> None:
        """Add files (the on-demand expansion adds them round by round)."""
        new_paths = sorted(p for p in files if p not in self.files)
        for path in new_paths:
            self.files[path] = files[path]
        self._reset_caches()
        for path in new_paths:
            facts = self.files[path]
            if facts.language is Language.PYTHON and facts.module:
                self.modules[facts.module] = path
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
        # attach methods to classes (out-of-line C++ definitions included); a
        # C++ method whose class is not known yet waits for a later round
        waiting: list[Func] = []
        for func in self._unattached:
            scope = func.scope
            assert scope is not None
            if not scope.owner:
                if func.language is not Language.PYTHON:
                    self.cpp_functions.setdefault(func.name, []).append(func)
                continue
            key = f"{func.path}::{scope.owner}" if func.language is Language.PYTHON else scope.owner
            cls = self.classes.get(key)
            if cls is None and func.language is not Language.PYTHON:
                cls = self._cpp_class(scope.owner)
            if cls is None:
                if func.language is not Language.PYTHON:
                    self.cpp_functions.setdefault(func.name, []).append(func)
                    waiting.append(func)
                continue
            func.owner = cls
            parent_qual = func.qualname.rsplit("::" if "::" in func.qualname else ".", 1)[0]
            if parent_qual == scope.owner or func.language is not Language.PYTHON:
                cls.methods.setdefault(func.name, []).append(func)
        self._unattached = waiting
        # statements into their functions
        for path in new_paths:
            facts = self.files[path]
            table = self.by_path[path]
            calls = facts.calls
            for i, scope_name in enumerate(calls.scopes):
                func = self._func_for(table, path, scope_name, facts)
                func.table = calls
                func.call_ix.append(i)
            for site in facts.sites:
                self._func_for(table, path, site.scope, facts).sites.append(site)
            for assign in facts.assigns:
                self._func_for(table, path, assign.scope, facts).assigns.append(assign)
            for ret in facts.returns:
                self._func_for(table, path, ret.scope, facts).returns.append(ret)
            for block in facts.blocks:
                self._func_for(table, path, block.scope, facts).blocks.append(block)
            for w in facts.withs:
                self._func_for(table, path, w.scope, facts).withs.append(w)

    def add_sites(self, sites: Iterable[Site]) -> None:
        """Add sites found after the files were indexed (allocations without a
        device found to run under a default-device context, stage
        default_device); their files' facts are updated to match."""
        added: dict[str, list[Site]] = {}
        for site in sites:
            facts = self.files[site.path]
            self._func_for(self.by_path[site.path], site.path, site.scope, facts).sites.append(site)
            added.setdefault(site.path, []).append(site)
        for path, extra in added.items():
            facts = self.files[path]
            merged = sorted((*facts.sites, *extra), key=lambda s: (s.span.line, s.span.col))
            self.files[path] = dataclasses.replace(facts, sites=tuple(merged))
        self._reset_caches()

    def _func_for(self, table: dict[str, Func], path: str, scope: str, facts: FileFacts) -> Func:
        found = table.get(scope)
        if found is None:  # a C++ namespace-level scope, or a class body
            found = self._func(path, scope, None, facts)
        return found

    def subclasses(self, name: str) -> list[ClassInfo]:
        """The known classes that name ``name`` as a direct base (bases are
        matched by their last name)."""
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

    def _cpp_class(self, qualname: str) -> ClassInfo | None:
        """A C++ class by qualified name, allowing either side to carry fewer
        namespace qualifiers (`Foo` vs `ns::Foo`)."""
        found = self.classes.get(qualname)
        if found is not None:
            return found
        name = qualname.rsplit("::", 1)[-1]
        candidates = [c for c in self.classes_by_name.get(name, ()) if c.language is not Language.PYTHON
                      and (c.qualname.endswith("::" + qualname) or qualname.endswith("::" + c.qualname)
                           or c.qualname == qualname)]
        return candidates[0] if len(candidates) == 1 else None

    # ------------------------------------------------------------ lookups
    def functions(self) -> Iterator[Func]:
        return iter(self.funcs.values())

    def func(self, path: str, scope: str) -> Func | None:
        return self.by_path.get(path, {}).get(scope)

    def module_path(self, module: str) -> str | None:
        found = self.modules.get(module)
        if found is not None:
            return found
        leaf = module.rsplit(".", 1)[-1]
        candidates = [m for m in self.modules_by_leaf.get(leaf, ()) if m.endswith("." + module)]
        return self.modules[candidates[0]] if len(candidates) == 1 else None

    def resolve_symbol(self, dotted: str, depth: int = 0) -> Func | ClassInfo | None:
        """A Python dotted name -> a project function or class, following
        re-exports (`from .x import y` in a package `__init__`)."""
        if depth > 4:
            return None
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            path = self.module_path(".".join(parts[:i]))
            if path is None:
                continue
            rest = parts[i:]
            symbol = self.module_symbols.get(path, {}).get(rest[0])
            if symbol is None:
                target = self.module_imports.get(path, {}).get(rest[0])
                if target is not None and target != dotted:
                    symbol = self.resolve_symbol(".".join([target, *rest[1:]]), depth + 1) if len(rest) > 1 \
                        else self.resolve_symbol(target, depth + 1)
                    return symbol
                return None
            if len(rest) == 1:
                return symbol
            if isinstance(symbol, ClassInfo) and len(rest) == 2:
                methods = self.method_lookup(symbol, rest[1])
                return methods[0] if methods else None
            return None
        return None

    def base_classes(self, cls: ClassInfo, depth: int = 0) -> list[ClassInfo]:
        out: list[ClassInfo] = []
        if depth > 8:
            return out
        for base in cls.bases:
            found = self._class_by_name(base, cls)
            if found is not None and found is not cls:
                out.append(found)
                out += self.base_classes(found, depth + 1)
        return out

    def _class_by_name(self, name: str, context: ClassInfo | Func | None = None) -> ClassInfo | None:
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
            candidates = [c for c in self.classes_by_name.get(name.rsplit(".", 1)[-1], ())
                          if c.language is Language.PYTHON]
            return candidates[0] if len(candidates) == 1 else None
        return self._cpp_class(name)

    def method_lookup(self, cls: ClassInfo, name: str) -> list[Func]:
        found = cls.methods.get(name)
        if found:
            return found
        for base in self.base_classes(cls):
            found = base.methods.get(name)
            if found:
                return found
        return []

    def constructors(self, cls: ClassInfo) -> list[Func]:
        if cls.language is Language.PYTHON:
            out: list[Func] = []
            for name in _CONSTRUCTOR_NAMES:
                out += self.method_lookup(cls, name)
            return out
        return list(cls.methods.get(cls.name, ()))

    # ------------------------------------------------------------ call resolution
    def resolve(self, func: Func, call: Call | str) -> tuple[Func, ...]:
        """The project functions a call in ``func`` runs (constructors for a
        construction); empty when it cannot be told."""
        callee = call if isinstance(call, str) else call.callee
        key = (func.id, callee)
        found = self._resolved.get(key)
        if found is None:
            if func.language is Language.PYTHON:
                found = tuple(self._resolve_py(func, callee))
            else:
                found = tuple(self._resolve_cpp(func, callee))
            self._resolved[key] = found
        return found

    def constructed_class(self, func: Func, call: Call) -> ClassInfo | None:
        """The project class a call constructs, if it is a construction."""
        callee = call.callee
        if func.language is Language.PYTHON:
            if callee.startswith(("self.", "cls.", "(")):
                return None
            if "." not in callee:
                symbol = self.module_symbols.get(func.path, {}).get(callee)
                if isinstance(symbol, ClassInfo):
                    return symbol
                return None
            symbol = self.resolve_symbol(callee)
            return symbol if isinstance(symbol, ClassInfo) else None
        if "." in callee or "->" in callee:
            return None
        return self._cpp_class(callee)

    def _resolve_py(self, func: Func, callee: str) -> list[Func]:
        if callee.startswith("super()."):
            if func.owner is None:
                return []
            name = callee[8:]
            for base in self.base_classes(func.owner):
                found = base.methods.get(name)
                if found:
                    return found
            return []
        if callee.startswith("("):
            return []
        parts = callee.split(".")
        if parts[0] in ("self", "cls") and func.owner is not None:
            if len(parts) == 2:
                return self.method_lookup(func.owner, parts[1])
            if len(parts) == 3:
                attr_cls = self._attr_class(func.owner, parts[1])
                return self.method_lookup(attr_cls, parts[2]) if attr_cls is not None else []
            return []
        if len(parts) == 1:
            name = parts[0]
            qual = func.qualname if func.qualname != "<module>" else ""
            table = self.by_path.get(func.path, {})
            while qual:
                nested = table.get(f"{qual}.{name}")
                if nested is not None:
                    return [nested]
                qual = qual.rpartition(".")[0]
            symbol = self.module_symbols.get(func.path, {}).get(name)
            if isinstance(symbol, Func):
                return [symbol]
            if isinstance(symbol, ClassInfo):
                return self.constructors(symbol)
            return []
        if len(parts) == 2:
            local = self._local_types_of(func).get(parts[0])
            if local is not None:
                cls = self._class_by_name(local, func)
                if cls is not None:
                    return self.method_lookup(cls, parts[1])
            symbol = self.module_symbols.get(func.path, {}).get(parts[0])
            if isinstance(symbol, ClassInfo):
                return self.method_lookup(symbol, parts[1])
        symbol = self.resolve_symbol(callee)
        if isinstance(symbol, Func):
            return [symbol]
        if isinstance(symbol, ClassInfo):
            return self.constructors(symbol)
        return []

    def _attr_class(self, cls: ClassInfo, attr: str) -> ClassInfo | None:
        """The class of ``self.attr``: from `self.attr = Cls(...)` or an
        annotation in any method (Python), or the member's declared type (C++)."""
        for owner in (cls, *self.base_classes(cls)):
            type_name = owner.fields.get(attr)
            if type_name is None and owner.language is Language.PYTHON:
                type_name = self._python_attr_type(owner, attr)
            if type_name:
                return self._class_by_name(type_name, owner)
        return None

    def _python_attr_type(self, cls: ClassInfo, attr: str) -> str | None:
        target = f"self.{attr}"
        for funcs in cls.methods.values():
            for method in funcs:
                for assign in method.assigns:
                    if target in assign.targets and len(assign.targets) == 1:
                        if assign.type:
                            cls.fields[attr] = assign.type
                            return assign.type
                        m = _CALL_HEAD.match(assign.value)
                        if m is not None:
                            resolved = self._python_name(method, m.group(1))
                            cls.fields[attr] = resolved
                            return resolved
        cls.fields[attr] = ""
        return None

    def _python_name(self, func: Func, name: str) -> str:
        head, dot, rest = name.partition(".")
        target = self.module_imports.get(func.path, {}).get(head)
        return f"{target}{dot}{rest}" if target else name

    def _local_types_of(self, func: Func) -> dict[str, str]:
        found = self._local_types.get(func.id)
        if found is not None:
            return found
        types: dict[str, str] = {}
        scope = func.scope
        if scope is not None:
            for name, type_name in zip(scope.params, scope.param_types):
                if type_name and name:
                    types[name.lstrip("*")] = type_name.strip("'\"")
        for assign in func.assigns:
            if len(assign.targets) != 1:
                continue
            target = assign.targets[0]
            if assign.type and assign.type not in ("auto", "auto*", "auto&", "constauto&"):
                types[target] = assign.type
                continue
            m = _CALL_HEAD.match(assign.value)
            if m is not None:
                head = m.group(1)
                if func.language is Language.PYTHON:
                    types[target] = self._python_name(func, head)
                else:
                    made = re.match(r"^(?:std::)?make_(?:unique|shared)\s*<\s*([\w:]+)", assign.value)
                    types[target] = made.group(1) if made else head
            elif func.language is not Language.PYTHON:
                made = re.match(r"^new\s+([\w:]+)", assign.value)
                if made:
                    types[target] = made.group(1)
        self._local_types[func.id] = types
        return types

    def _resolve_cpp(self, func: Func, callee: str) -> list[Func]:
        receiver, name = split_callee(callee)
        if not receiver:
            if func.owner is not None:
                found = self.method_lookup(func.owner, name)
                if found:
                    return found
            cls = self._cpp_class(name)
            if cls is not None:
                return self.constructors(cls)
            return self._free_function(func, name)
        if "::" in callee and "." not in callee and "->" not in callee:
            cls = self._cpp_class(callee)
            if cls is not None:
                return self.constructors(cls)
            owner = self._cpp_class(receiver)
            if owner is not None:
                return self.method_lookup(owner, name)
            return [f for f in self._free_function(func, name) if f.qualname.endswith(callee)]
        receiver = receiver.replace("(*", "").replace(")", "").strip()
        if receiver in ("this", "(*this)"):
            return self.method_lookup(func.owner, name) if func.owner is not None else []
        type_name = self._local_types_of(func).get(receiver)
        if type_name is None and func.owner is not None:
            cls = self._attr_class(func.owner, receiver)
            return self.method_lookup(cls, name) if cls is not None else []
        if type_name is not None:
            cls = self._cpp_class(_unwrap(type_name))
            return self.method_lookup(cls, name) if cls is not None else []
        return []

    def missing_names(self, func: Func, callee: str) -> set[str]:
        """For a call that did not resolve, what could resolve it if analysed:
        for Python the modules its names are imported from (``module:`` +
        dotted name), for C++ the class or function names involved. Never a
        plain method name on a receiver of unknown type: no definition would
        resolve that."""
        if func.language is Language.PYTHON:
            return {f"module:{m}" for m in self._python_missing_modules(func, callee)}
        receiver, name = split_callee(callee)
        if not receiver or ("." not in callee and "->" not in callee):
            names = {name}  # a free function, a static member, a construction
        else:
            type_name = self._local_types_of(func).get(receiver)
            if type_name is None and func.owner is not None:
                type_name = func.owner.fields.get(receiver)
            names = {_unwrap(type_name).rsplit("::", 1)[-1]} if type_name else set()
        return {n for n in names if _CPP_NAME.fullmatch(n) and not _MACRO_LIKE.fullmatch(n) and len(n) > 3
                and not _CPP_EXTERNAL.match(n)}

    def _python_missing_modules(self, func: Func, callee: str) -> set[str]:
        imports = self.module_imports.get(func.path, {})
        roots = self._import_roots.get(func.path)
        if roots is None:
            roots = self._import_roots[func.path] = {t.split(".")[0] for t in imports.values()}

        def module_of(name: str) -> set[str]:
            """The module a (possibly dotted) name is imported from."""
            head = name.split(".")[0]
            target = imports.get(head)
            if target is None:
                return set()
            full = target + name[len(head):]
            parts = full.split(".")
            return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - {""}

        if callee.startswith("super()"):
            return {m for b in (func.owner.bases if func.owner else ()) for m in module_of(b)}
        if callee.startswith("("):
            return set()
        parts = callee.split(".")
        if parts[0] in ("self", "cls"):
            if func.owner is None:
                return set()
            if len(parts) == 2:
                return {m for b in func.owner.bases for m in module_of(b)}
            if len(parts) == 3:
                type_name = func.owner.fields.get(parts[1]) or self._python_attr_type(func.owner, parts[1])
                return _dotted_modules(type_name) if type_name else set()
            return set()
        local = self._local_types_of(func).get(parts[0]) if len(parts) == 2 else None
        if local:
            return module_of(local) | (_dotted_modules(local) if _DOTTED.fullmatch(local) else set())
        if "." not in callee:
            return module_of(callee)
        # callee names are alias-resolved, so a dotted callee names a module
        # only when its head is a package this file imports from
        return _dotted_modules(callee) | self._reexported_from(callee) if parts[0] in roots else set()

    def _reexported_from(self, dotted: str, depth: int = 0) -> set[str]:
        """Modules a dotted name reaches through re-exports in modules
        already analysed (`pkg/__init__.py`: `from .impl import run`), as
        ``resolve_symbol`` would follow them once they are analysed too."""
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            path = self.module_path(".".join(parts[:i]))
            if path is None:
                continue
            if parts[i] in self.module_symbols.get(path, {}) or depth > 4:
                return set()
            target = self.module_imports.get(path, {}).get(parts[i])
            if target is None or target == dotted:
                return set()
            full = ".".join([target, *parts[i + 1:]])
            return _dotted_modules(full) | self._reexported_from(full, depth + 1)
        return set()

    def _free_function(self, func: Func, name: str) -> list[Func]:
        candidates = self.cpp_functions.get(name, [])
        if len(candidates) <= 1:
            return list(candidates)
        # several: prefer those sharing the caller's namespace, then the same file
        quals = {c.qualname for c in candidates}
        if len(quals) == 1:
            return list(candidates)
        prefix = func.qualname.rsplit("::", 1)[0] if "::" in func.qualname else ""
        same_ns = [c for c in candidates if prefix and c.qualname.startswith(prefix + "::")]
        if len({c.qualname for c in same_ns}) == 1:
            return same_ns
        same_file = [c for c in candidates if c.path == func.path]
        if len({c.qualname for c in same_file}) == 1:
            return same_file
        return []

    # ------------------------------------------------------------ allocation summaries
    def calls_by_leaf(self) -> dict[str, list[tuple[Func, int]]]:
        """Every call as (function, index in its file's CallTable), grouped
        by the last name of its callee; read from the columns, no objects.
        Kept up to date as files are added."""
        self._index_calls()
        return self._calls_by_leaf

    def callers_matching(self, predicate: Callable[[str], bool]) -> frozenset[str]:
        """Ids of the functions with a call whose callee satisfies
        ``predicate``. Each distinct callee is asked once: the rules ask
        this of every function, and callees repeat across thousands."""
        self._index_calls()
        return frozenset(fid for callee, fids in self._by_callee.items() if predicate(callee) for fid in fids)

    def _index_calls(self) -> None:
        """Group the calls of the files added since the last time by callee
        leaf and by callee (a file's functions never change once added)."""
        by_leaf, by_callee, leaves = self._calls_by_leaf, self._by_callee, self._leaves
        for path in self.files:
            if path in self._calls_indexed:
                continue
            self._calls_indexed.add(path)
            for func in self.by_path.get(path, {}).values():
                calls = func.table
                if calls is None:
                    continue
                callees = calls.callees
                seen: set[str] = set()
                for i in func.call_ix:
                    callee = callees[i]
                    leaf = leaves.get(callee)
                    if leaf is None:
                        leaf = leaves[callee] = split_callee(callee)[1]
                    by_leaf.setdefault(leaf, []).append((func, i))
                    if callee not in seen:
                        seen.add(callee)
                        by_callee.setdefault(callee, []).append(func.id)

    def callers_within(self, seeds: Iterable[Func], depth: int) -> dict[str, int]:
        """Functions that reach one of ``seeds`` through at most ``depth``
        resolved calls -> their distance (seeds are 0). Reverse breadth-first:
        only calls whose name matches the frontier are resolved."""
        dist: dict[str, int] = {}
        frontier: list[Func] = []
        for f in seeds:
            if f.id not in dist:
                dist[f.id] = 0
                frontier.append(f)
        by_leaf = self.calls_by_leaf()
        for level in range(1, depth + 1):
            ids = {f.id for f in frontier}
            names = {f.name for f in frontier}
            names |= {f.owner.name for f in frontier if f.owner is not None and f.scope is not None
                      and f.scope.role == "constructor"}
            next_frontier: list[Func] = []
            for name in sorted(names):
                for caller, i in by_leaf.get(name, ()):
                    if caller.id in dist:
                        continue
                    assert caller.table is not None
                    if any(t.id in ids for t in self.resolve(caller, caller.table.callees[i])):
                        dist[caller.id] = level
                        next_frontier.append(caller)
            if not next_frontier:
                break
            frontier = next_frontier
        return dist

    def callees(self, func: Func) -> Iterator[tuple[Call, tuple[Func, ...]]]:
        for call in func.calls:
            targets = self.resolve(func, call)
            if targets:
                yield call, targets

    def reach(self, func: Func, depth: int) -> tuple[Reach, ...]:
        """Allocation sites executed by ``func`` directly or through at most
        ``depth`` resolved calls, each with the shortest call path found
        (breadth first, so the first path to a site is a shortest one)."""
        key = (func.id, depth)
        cached = self._reach.get(key)
        if cached is not None:
            return cached
        out: list[Reach] = []
        seen_sites: set[tuple[str, int, int]] = set()
        seen_funcs = {func.id}
        frontier: list[tuple[Func, tuple[Hop, ...]]] = [(func, ())]
        for level in range(depth + 1):
            next_frontier: list[tuple[Func, tuple[Hop, ...]]] = []
            for current, hops in frontier:
                for site in current.sites:
                    if site.kind is SiteKind.RELEASE:
                        continue
                    skey = (site.path, site.span.line, site.span.col)
                    if skey not in seen_sites:
                        seen_sites.add(skey)
                        out.append(Reach(site, hops))
                if level == depth:
                    continue
                for call, targets in self.callees(current):
                    for target in targets:
                        if target.id in seen_funcs:
                            continue
                        seen_funcs.add(target.id)
                        hop = Hop(call, current.path, current.qualname, target.qualname)
                        next_frontier.append((target, (*hops, hop)))
            frontier = next_frontier
        result = tuple(out)
        self._reach[key] = result
        return result

    def class_allocates(self, cls: ClassInfo, depth: int = 3) -> Reach | None:
        """The first allocation a construction of ``cls`` executes (through its
        constructors and what they call), or None."""
        key = (cls.key, depth)
        if key in self._class_alloc:
            return self._class_alloc[key]
        self._class_alloc[key] = None  # cycle guard
        found: Reach | None = None
        # weights are counted where they are allocated; a helper's per-call
        # temporaries die before the constructor returns: neither makes the
        # construction a buffer factory
        reached = [r for ctor in self.constructors(cls) for r in self.reach(ctor, depth)
                   if not _weight(r.site) and not (r.site.tier is Tier.T4 and (r.hops or r.site.kept == "local"))]
        if reached:
            found = min(reached, key=_significance)
        self._class_alloc[key] = found
        return found

    def factory_allocation(self, func: Func, depth: int = 3) -> Reach | None:
        """When ``func`` hands an allocation back to its caller (returns it,
        or fills an out-parameter), the first such allocation."""
        key = (func.id, depth)
        if key in self._factory:
            return self._factory[key]
        self._factory[key] = None  # cycle guard
        found = self._find_factory_allocation(func, depth)
        self._factory[key] = found
        return found

    def _find_factory_allocation(self, func: Func, depth: int) -> Reach | None:
        scope = func.scope
        if scope is None or scope.kind != "function" or scope.role == "constructor":
            return None
        returned_lines = {r.line for r in func.returns}
        returned_names = {r.value for r in func.returns if r.value}
        for site in func.sites:
            if site.kind is SiteKind.RELEASE or _weight(site):
                continue
            if site.stmt_line in returned_lines or (site.target and site.target in returned_names):
                return Reach(site, ())
            if site.target and site.target.startswith("*") and \
                    site.target[1:] in {p.lstrip("*&") for p in scope.params}:
                return Reach(site, ())
        if depth <= 0:
            return None
        for ret in func.returns:
            for call in func.calls:
                if call.span.line != ret.line and not (call.target and call.target == ret.value):
                    continue
                for target in self.resolve(func, call):
                    inner = self.factory_allocation(target, depth - 1)
                    if inner is None and target.scope is not None and target.scope.role == "constructor" \
                            and target.owner is not None:
                        inner = self.class_allocates(target.owner, depth - 1)
                    if inner is not None:
                        hop = Hop(call, func.path, func.qualname, target.qualname)
                        return Reach(inner.site, (hop, *inner.hops))
        return None

    # ------------------------------------------------------------ derived sites
    def derived_sites(self, depth: int = 3) -> tuple[Site, ...]:
        """Calls to project factories and allocating classes, as sites in the
        caller's scope (api = the factory, via = the underlying allocation).

        Python factory functions count when their result is kept (stored on an
        object, at module level, or in a class body): a temporary returned by
        an op wrapper is already a per-call site inside the wrapper.
        Constructions of allocating classes and native factories always count.
        """
        by_leaf = self.calls_by_leaf()
        out: list[Site] = []
        for name in sorted(self._factory_names()):
            for func, i in by_leaf.get(name, ()):
                assert func.table is not None
                derived = self._derive(func, func.table[i], depth)
                if derived is not None:
                    out.append(derived)
        out.sort(key=lambda s: s.sort_key)
        return tuple(out)

    def _factory_names(self, depth: int = 3) -> set[str]:
        return {f.name for f in self.factories(depth)}

    def factories(self, depth: int = 3) -> set[Factory]:
        """Functions that hand an allocation back and classes whose
        construction allocates, found from the allocations outward:
        level 0 are functions returning (or filling an out-parameter with) a
        site of their own and classes whose construction allocates (within
        ``depth`` calls); each further level adds functions that return a
        call to a known factory. Only calls whose name matches the previous
        level are looked at, and only what is a factory when resolved (what
        ``_derive`` accepts) is returned."""
        names: set[Factory] = set()
        frontier: list[Func] = []
        for func in self.funcs.values():
            scope = func.scope
            if scope is None or scope.kind != "function" or scope.role == "constructor" or not func.sites:
                continue
            if self.factory_allocation(func, 0) is not None:
                frontier.append(func)
        # classes whose construction allocates, however deep (what a derived
        # site of a construction requires), in a stable order
        for key in sorted(self.classes):
            cls = self.classes[key]
            if self.class_allocates(cls, depth) is not None:
                frontier += self.constructors(cls)
        by_leaf = self.calls_by_leaf()
        seen: set[str] = set()
        for _level in range(depth + 1):
            level_names: set[str] = set()
            for func in frontier:
                if func.id in seen:
                    continue
                seen.add(func.id)
                if func.scope is not None and func.scope.role == "constructor" and func.owner is not None:
                    for cls in (func.owner, *self.subclasses(func.owner.name)):
                        level_names.add(cls.name)
                        if self.class_allocates(cls, depth) is not None:
                            names.add(Factory.of_class(cls))
                else:
                    level_names.add(func.name)
                    if self.factory_allocation(func, depth) is not None:
                        names.add(Factory.of_function(func))
            next_frontier: list[Func] = []
            for name in sorted(level_names):
                for caller, i in by_leaf.get(name, ()):
                    if caller.id in seen or caller.scope is None or caller.scope.kind != "function":
                        continue
                    if caller.scope.role == "constructor" or self._returns_call(caller, i):
                        next_frontier.append(caller)
            frontier = next_frontier
        return names

    def _returns_call(self, func: Func, i: int) -> bool:
        """Whether call ``i`` of ``func`` is returned (on a return line, or
        stored into a name that is returned)."""
        table = func.table
        if table is None or not func.returns:
            return False
        line = table.line(i)
        target = table.targets[i]
        return any(r.line == line or (target is not None and r.value == target) for r in func.returns)

    def _factory_api(self, func: Func, call: Call, cls: ClassInfo | None) -> str:
        """How a derived site names its factory: as called on ``self``/``cls``
        (`self._make_buffer`), else by the definition's qualified name
        (`KVCachePool`, `Wrapper.make`): readable, and unchanged by import style."""
        callee = call.callee
        if callee.startswith(("self.", "cls.", "this->", "super()")) or "->" in callee:
            return callee
        if cls is not None:
            return cls.qualname
        targets = self.resolve(func, call)
        return targets[0].qualname if targets else callee

    def _derive(self, func: Func, call: Call, depth: int) -> Site | None:
        cls = self.constructed_class(func, call)
        reach: Reach | None = None
        if cls is not None:
            reach = self.class_allocates(cls, depth)
            if reach is not None and not cls.defined_once:
                # one C++ name, several definitions (a device-side view and a
                # host class, in different headers): a caller in one of those
                # files means its own; elsewhere, which one is not known
                # without the includes, so say nothing
                if func.path not in cls.paths:
                    return None
                own = [r for ctor in self.constructors(cls) if ctor.path == func.path
                       for r in self.reach(ctor, depth) if not _weight(r.site)]
                reach = min(own, key=_significance) if own else None
        else:
            targets = self.resolve(func, call)
            if not targets:
                return None
            if func.language is Language.PYTHON and not _kept(func, call):
                return None
            for target in targets:
                if target is func:
                    continue
                reach = self.factory_allocation(target, depth)
                if reach is not None:
                    break
        if reach is None:
            return None
        under = reach.site
        return Site(
            path=func.path,
            span=call.span,
            language=func.language,
            api=self._factory_api(func, call, cls),
            kind=under.kind,
            scope=func.qualname,
            size=" ".join(call.arglist.split()) or None,
            shape=tuple(a.text for a in split_args(call.arglist, func.language is not Language.PYTHON)
                        if a.keyword is None),
            device=under.device,
            target=call.target,
            stmt_line=call.span.line,
            via=Via(under.api, under.path, under.span.line),
        )


_CPP_NAME = re.compile(r"[A-Za-z_]\w*")
_DOTTED = re.compile(r"[A-Za-z_][\w.]*")
# Names that are never the project's own: CUDA/driver/NCCL APIs, casts, std.
_CPP_EXTERNAL = re.compile(r"^(?:cuda|cu[A-Z]|nccl|nvml|cublas|cudnn|curand|cusparse|std$|dim3$|\w+_cast$|"
                           r"make_(?:unique|shared|pair|tuple)$|printf$|fprintf$|memset$|memcpy$|malloc$|free$)")
_MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9_]*")


def _dotted_modules(dotted: str) -> set[str]:
    """Every prefix of a dotted name that could be its module."""
    parts = dotted.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


_KIND_RANK = {SiteKind.DEVICE: 0, SiteKind.IPC: 1, SiteKind.MANAGED: 2, SiteKind.VIRTUAL: 3,
              SiteKind.WORKSPACE: 4, SiteKind.GRAPH_POOL: 5, SiteKind.PINNED_HOST: 6, SiteKind.RELEASE: 9}


def _significance(reach: Reach) -> tuple[int, bool, int, str, int]:
    """Which of a construction's allocations stands for it: device memory
    before host memory, persistent before per-call, then the nearest, then
    the first in the source."""
    transient = reach.site.tier is Tier.T4  # a persistent buffer is the real cost of a construction
    return (_KIND_RANK[reach.site.kind], transient, len(reach.hops), reach.site.path, reach.site.span.line)


def _weight(site: Site) -> bool:
    """Model weights (T1) are counted where they are allocated; constructing a
    layer that owns weights is not a derived site."""
    return site.tier is Tier.T1


def _kept(func: Func, call: Call) -> bool:
    """True when a call's result outlives the call's frame."""
    scope = func.scope
    if scope is None or scope.kind == "class":
        return True
    return (call.target or "").startswith(("self.", "cls."))


def _unwrap(type_name: str) -> str:
    from .extract.cpp import unwrap_type

    return unwrap_type(type_name)


def build_index(files: Mapping[str, FileFacts]) -> ProjectIndex:
    return ProjectIndex(files)


@dataclass(frozen=True, order=True)
class Factory:
    """A buffer factory as the expansion looks for its callers: its name,
    language, kind (class, function or method) and where a caller must
    point to reach it: for Python the defining module, for a native method
    its class (a caller declares a variable of that type)."""

    name: str
    python: bool
    kind: str
    home: str
    everywhere: bool = True  # False: a native class defined in several files
    owner: str = ""  # a method's class

    @staticmethod
    def of_class(cls: ClassInfo) -> Factory:
        python = cls.language is Language.PYTHON
        return Factory(cls.name, python, "class", cls.module, python or cls.defined_once)

    @staticmethod
    def of_function(func: Func) -> Factory:
        python = func.language is Language.PYTHON
        if func.owner is None:
            return Factory(func.name, python, "function", func.module)
        owner = func.owner
        return Factory(func.name, python, "method", func.module if python else owner.name,
                       python or owner.defined_once, owner.name)


@dataclass(frozen=True)
class Wants:
    """What the on-demand expansion should parse next: native files that
    define one of ``definitions`` (callees the rules follow but could not
    resolve), Python files of ``modules`` (the same, by import), and files
    that may call a buffer factory (its callers are derived sites).

    Calls resolve within a language, so a CUDA header that says `workspace`
    cannot call a Python factory of that name. A Python file reaches a
    factory through an import, which names the factory's module or a package
    above it, or from its own package (`from . import make`): ``classes`` and
    ``functions`` map each Python factory name to those names and its
    packages. A construction is always a derived site; a factory function's
    call only where its result is kept (``mentions.python_keeps_call``).
    ``native_mentions`` are native factory names (a method's class name:
    calling a method needs an object of that type)."""

    definitions: frozenset[str]
    classes: Mapping[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    functions: Mapping[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    modules: frozenset[str] = frozenset()
    native_mentions: frozenset[str] = frozenset()
    python_names: frozenset[str] = field(init=False)  # classes and functions, for a quick no

    def __post_init__(self) -> None:
        object.__setattr__(self, "python_names", frozenset(self.classes) | frozenset(self.functions))

    def __bool__(self) -> bool:
        return bool(self.definitions or self.classes or self.functions or self.modules or self.native_mentions)

    def wants_file(self, path: str, identifiers: Collection[str], look: Callable[[], SkippedFile]) -> bool:
        """Whether a skipped file (the identifiers it mentions; a look at its
        bytes, taken only when a wanted name is among them) is one the rules
        need."""
        if not path.endswith(".py"):
            if not self.native_mentions.isdisjoint(identifiers):
                return True
            return not self.definitions.isdisjoint(identifiers) and \
                not self.definitions.isdisjoint(look().definitions())
        from .extract.python import module_name

        module = module_name(path)
        if self.wants_module(module):
            return True
        if self.python_names.isdisjoint(identifiers):
            return False
        package = module.rpartition(".")[0]
        named = set(identifiers)

        def reachable(table: Mapping[str, tuple[frozenset[str], frozenset[str]]]) -> list[str]:
            return sorted(n for n in table.keys() & named
                          if package in table[n][1] or not table[n][0].isdisjoint(named))

        if reachable(self.classes):
            return True
        functions = reachable(self.functions)
        modules = sorted({part for n in functions for part in self.functions[n][0]})
        return bool(functions) and look().keeps_call(tuple(functions), tuple(modules))

    def wants_module(self, module: str) -> bool:
        """Whether a skipped Python file's module is one the rules need
        (imports may name it with fewer leading packages: `pkg.mod` for a
        file at `src/pkg/mod.py`)."""
        if module in self.modules:
            return True
        parts = module.split(".")
        return any(".".join(parts[i:]) in self.modules for i in range(1, len(parts)))


def expansion_wants(index: ProjectIndex, roots: Callable[[ProjectIndex], list[Func]], depth: int) -> Wants:
    """Downward from the functions the rules start at (captures, readings,
    context managers...), the names of callees that could not be resolved;
    upward, the names of buffer factories. Names a file must define or
    mention to matter; everything else can stay unparsed."""
    definitions: set[str] = set()
    seen: set[str] = set()
    frontier = roots(index)
    for _level in range(depth + 1):
        next_frontier: list[Func] = []
        for func in frontier:
            if func.id in seen:
                continue
            seen.add(func.id)
            for callee in func.callees:
                targets = index.resolve(func, callee)
                if targets:
                    next_frontier.extend(t for t in targets if t.id not in seen)
                else:
                    definitions |= index.missing_names(func, callee)
        frontier = next_frontier
    # the factories derived sites are made of (the same depth), so a caller
    # is found whether or not its file passed the pre-filter
    python: dict[str, dict[str, set[str]]] = {"class": {}, "function": {}}  # kind -> name -> module parts
    packages: dict[str, set[str]] = {}
    native: set[str] = set()
    for factory in sorted(index.factories()):
        if not factory.python:
            # a class name defined in several places is not resolved from
            # elsewhere (see ``_derive``): its callers cannot be derived sites
            if factory.everywhere:
                native.add(factory.home if factory.kind == "method" else factory.name)
        else:
            # a Python method is called on self/cls (from its class or a
            # subclass) or on an object of its class: the caller names one
            named = [factory.name] if factory.kind != "method" else [factory.owner, *index.subclass_names(factory.owner)]
            table = python["function" if factory.kind == "function" else "class"]
            for name in named:
                table.setdefault(name, set()).update(factory.home.split("."))
                packages.setdefault(name, set()).add(factory.home.rpartition(".")[0])
    definitions |= index.unattached_owners()
    modules = frozenset(d[len("module:"):] for d in definitions if d.startswith("module:"))
    names = {d for d in definitions if not d.startswith("module:")}
    keep = lambda n: len(n) >= 3 and not n.startswith("__") and n not in ("<module>", "<lambda>")  # noqa: E731
    reach = {kind: {n: (frozenset(parts), frozenset(packages[n])) for n, parts in table.items() if keep(n)}
             for kind, table in python.items()}
    return Wants(frozenset(filter(keep, names)), reach["class"], reach["function"], modules,
                 frozenset(filter(keep, native)))
