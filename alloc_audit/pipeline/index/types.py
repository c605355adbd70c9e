"""What type a name has, as far as names and declarations tell: parameters
and locals of a function (annotations, constructions, ``make_unique<T>``,
``new T``) and members of a class (``self.x = Cls(...)``, annotations,
declared member types). Memos live here, never in the facts."""

from __future__ import annotations

import re

from ...model import Language
from .symbols import ClassInfo, Func, Symbols

CALL_HEAD = re.compile(r"^([A-Za-z_][\w.:]*)\s*(?:<[^()]*>)?\s*\(")


class Types:
    def __init__(self, symbols: Symbols) -> None:
        self._symbols = symbols
        self._local: dict[str, dict[str, str]] = {}
        self._members: dict[tuple[str, str], str] = {}  # (class key, attr) -> type; "" = unknown

    def reset(self) -> None:
        """Files were added: forget what could change (a member once found keeps its type)."""
        self._local = {}
        self._members = {k: v for k, v in self._members.items() if v}

    def member(self, cls: ClassInfo, attr: str) -> str | None:
        """The declared type of ``cls.attr``, else a Python member's type
        learnt earlier (``""``: known to be unknown); None if never asked."""
        if cls.language is not Language.PYTHON:  # a native class's fields grow as its files are added
            self._symbols.deps.note(cls.name)
        found = cls.fields.get(attr)
        return found if found is not None else self._members.get((cls.key, attr))

    def attr_class(self, cls: ClassInfo, attr: str) -> ClassInfo | None:
        """The class of ``self.attr``: from `self.attr = Cls(...)` or an
        annotation in any method (Python), or the member's declared type (C++)."""
        for owner in (cls, *self._symbols.base_classes(cls)):
            type_name = self.member(owner, attr)
            if type_name is None and owner.language is Language.PYTHON:
                type_name = self.python_attr_type(owner, attr)
            if type_name:
                return self._symbols.class_by_name(type_name, owner)
        return None

    def python_attr_type(self, cls: ClassInfo, attr: str) -> str | None:
        target = f"self.{attr}"
        for funcs in cls.methods.values():
            for method in funcs:
                for assign in method.assigns:
                    if target in assign.targets and len(assign.targets) == 1:
                        if assign.type:
                            self._members[(cls.key, attr)] = assign.type
                            return assign.type
                        m = CALL_HEAD.match(assign.value)
                        if m is not None:
                            resolved = self.python_name(method, m.group(1))
                            self._members[(cls.key, attr)] = resolved
                            return resolved
        self._members[(cls.key, attr)] = ""
        return None

    def python_name(self, func: Func, name: str) -> str:
        """A name as written in ``func``'s file -> its import target."""
        head, dot, rest = name.partition(".")
        target = self._symbols.module_imports.get(func.path, {}).get(head)
        return f"{target}{dot}{rest}" if target else name

    def locals_of(self, func: Func) -> dict[str, str]:
        """Parameter and local names of ``func`` -> their types."""
        found = self._local.get(func.id)
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
            m = CALL_HEAD.match(assign.value)
            if m is not None:
                head = m.group(1)
                if func.language is Language.PYTHON:
                    types[target] = self.python_name(func, head)
                else:
                    made = re.match(r"^(?:std::)?make_(?:unique|shared)\s*<\s*([\w:]+)", assign.value)
                    types[target] = made.group(1) if made else head
            elif func.language is not Language.PYTHON:
                made = re.match(r"^new\s+([\w:]+)", assign.value)
                if made:
                    types[target] = made.group(1)
        self._local[func.id] = types
        return types
