"""Python call resolution: ``f()``, ``self.m()``, ``self.attr.m()`` from
member types, ``obj.m()`` from local or parameter types, ``mod.f()``,
``Class.m()``, ``super().m()`` and constructions; and, for a call that does
not resolve, the modules whose analysis could resolve it."""

from __future__ import annotations

import re

from .symbols import ClassInfo, Func, Symbols
from .types import Types

DOTTED = re.compile(r"[A-Za-z_][\w.]*")


class PythonResolution:
    def __init__(self, symbols: Symbols, types: Types) -> None:
        self._symbols = symbols
        self._types = types
        self._import_roots: dict[str, set[str]] = {}

    def reset(self) -> None:
        self._import_roots = {}

    def resolve(self, func: Func, callee: str) -> list[Func]:
        symbols = self._symbols
        if callee.startswith("super()."):
            if func.owner is None:
                return []
            name = callee[8:]
            for base in symbols.base_classes(func.owner):
                found = base.methods.get(name)
                if found:
                    return found
            return []
        if callee.startswith("("):
            return []
        parts = callee.split(".")
        if parts[0] in ("self", "cls") and func.owner is not None:
            if len(parts) == 2:
                return symbols.method_lookup(func.owner, parts[1])
            if len(parts) == 3:
                attr_cls = self._types.attr_class(func.owner, parts[1])
                return symbols.method_lookup(attr_cls, parts[2]) if attr_cls is not None else []
            return []
        if len(parts) == 1:
            name = parts[0]
            qual = func.qualname if func.qualname != "<module>" else ""
            table = symbols.by_path.get(func.path, {})
            while qual:
                nested = table.get(f"{qual}.{name}")
                # a class body is no enclosing scope of its methods: a bare `f()` in a method is never
                # the class's own `f` (`self.f = f(...)` in a method named `f` calls the module's `f`)
                if nested is not None and not (nested.owner is not None and nested.owner.qualname == qual):
                    return [nested]
                qual = qual.rpartition(".")[0]
            symbol = symbols.module_symbols.get(func.path, {}).get(name)
            if isinstance(symbol, Func):
                return [symbol]
            if isinstance(symbol, ClassInfo):
                return symbols.constructors(symbol)
            return []
        if len(parts) == 2:
            local = self._types.locals_of(func).get(parts[0])
            if local is not None:
                cls = symbols.class_by_name(local, func)
                if cls is not None:
                    return symbols.method_lookup(cls, parts[1])
            symbol = symbols.module_symbols.get(func.path, {}).get(parts[0])
            if isinstance(symbol, ClassInfo):
                return symbols.method_lookup(symbol, parts[1])
        symbol = symbols.resolve_symbol(callee, near=func.path)
        if isinstance(symbol, Func):
            return [symbol]
        if isinstance(symbol, ClassInfo):
            return symbols.constructors(symbol)
        return []

    def constructed_class(self, func: Func, callee: str) -> ClassInfo | None:
        if callee.startswith(("self.", "cls.", "(")):
            return None
        if "." not in callee:
            symbol = self._symbols.module_symbols.get(func.path, {}).get(callee)
            return symbol if isinstance(symbol, ClassInfo) else None
        symbol = self._symbols.resolve_symbol(callee, near=func.path)
        return symbol if isinstance(symbol, ClassInfo) else None

    def missing_modules(self, func: Func, callee: str) -> set[str]:
        """The modules whose analysis could resolve an unresolved call."""
        imports = self._symbols.module_imports.get(func.path, {})
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
                type_name = self._types.member(func.owner, parts[1]) or \
                    self._types.python_attr_type(func.owner, parts[1])
                return dotted_modules(type_name) if type_name else set()
            return set()
        local = self._types.locals_of(func).get(parts[0]) if len(parts) == 2 else None
        if local:
            return module_of(local) | (dotted_modules(local) if DOTTED.fullmatch(local) else set())
        if "." not in callee:
            return module_of(callee)
        # callee names are alias-resolved, so a dotted callee names a module
        # only when its head is a package this file imports from
        return dotted_modules(callee) | self._reexported_from(callee, near=func.path) if parts[0] in roots else set()

    def _reexported_from(self, dotted: str, depth: int = 0, near: str = "") -> set[str]:
        """Modules a dotted name reaches through re-exports in modules
        already analysed (`pkg/__init__.py`: `from .impl import run`), as
        ``resolve_symbol`` would follow them once they are analysed too."""
        symbols = self._symbols
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            path = symbols.module_path(".".join(parts[:i]), near)
            if path is None:
                continue
            if parts[i] in symbols.module_symbols.get(path, {}) or depth > 4:
                return set()
            target = symbols.module_imports.get(path, {}).get(parts[i])
            if target is None or target == dotted:
                return set()
            full = ".".join([target, *parts[i + 1:]])
            return dotted_modules(full) | self._reexported_from(full, depth + 1, path)
        return set()


def dotted_modules(dotted: str) -> set[str]:
    """Every prefix of a dotted name that could be its module."""
    parts = dotted.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}
