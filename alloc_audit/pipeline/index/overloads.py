"""Native constructor overloads: which constructors of a class one
construction can select (issue 11, round 29).

A C++ class with several constructors allocates only in some of them
(`Matrix(m, n)` owns memory, `Matrix(T* data, m, n)` points to memory it
is handed, `Matrix()` delegates to the pointer one with `nullptr`). The
index merges the overloads of one file into one function (one qualified
name); their scopes keep each overload's parameters and span. An overload
can be selected by a call when the argument count fits (its parameters,
less those with a default where the definition is inside the class body
and so shows them; any count from there on for a variadic one) and no
argument is provably of the wrong kind: `nullptr`, or a pointer parameter
of the caller, for a number parameter (`uint32_t m`); a non-zero integer
literal for a pointer parameter. Everything else may fit (sound: an
argument of unknown type selects every overload of its count).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ...arglists import split_args
from ...model import Arg, Call, Language, Scope, Site, Tier
from ..extract.cpp_names import strip_templates
from .symbols import ClassInfo, Func, Reach, Symbols, last_name

# the extractor keeps the first 400 bytes of a native argument list; a cut one may hold more arguments
_ARGLIST_CUT = 396
_NONZERO_INT = re.compile(r"^[-+]?(?:[1-9]\d*|0[xX][0-9a-fA-F]*[1-9a-fA-F][0-9a-fA-F]*)[uUlL]*$")


def overload_scopes(symbols: Symbols, ctor: Func) -> tuple[tuple[Scope, bool], ...]:
    """The scopes of the constructors merged into ``ctor`` (one file, one
    qualified name), each with whether its defaults are shown (defined in the
    class body: an out-of-line definition leaves them to a declaration)."""
    facts = symbols.files.get(ctor.path)
    if facts is None:
        return ()
    owner = ctor.scope.owner if ctor.scope is not None else None
    bodies = [s.span for s in facts.scopes if s.kind == "class" and s.qualname == owner]
    return tuple((s, any(b.line <= s.span.line and s.span.end_line <= b.end_line for b in bodies))
                 for s in facts.scopes if s.qualname == ctor.qualname and s.role == "constructor")


def countable(arglist: str, args: Sequence[Arg]) -> bool:
    """The arguments can be counted: not cut by the extractor, no pack
    expansion (`args...`) and no braced list standing for several."""
    return len(arglist.encode("utf-8", "replace")) < _ARGLIST_CUT and \
        not any("..." in a.text for a in args)


def accepts(scope: Scope, defaults_shown: bool, args: Sequence[Arg], pointers: frozenset[str]) -> bool:
    """Whether a construction with ``args`` can select this overload; ``pointers``: the names the
    constructing function declares as pointer parameters (``float* out``)."""
    kinds = scope.param_kinds
    variadic = kinds.endswith(".")
    kinds = kinds.rstrip(".")
    if len(kinds) != len(scope.params):
        return True  # written before the kinds were recorded: anything fits
    defaults = scope.param_defaults or ("",) * len(scope.params)
    required = sum(1 for d in defaults if not d) if defaults_shown else 0
    if len(args) < required or (len(args) > len(kinds) and not variadic):
        return False
    for arg, kind in zip(args, kinds):
        text = arg.text.strip()
        if kind == "n" and (text == "nullptr" or text in pointers):
            return False
        if kind == "p" and _NONZERO_INT.match(text):
            return False
    return True


def pointer_params(scope: Scope | None) -> frozenset[str]:
    """The parameters a function's scope declares as pointers."""
    if scope is None or len(scope.param_kinds.rstrip(".")) != len(scope.params):
        return frozenset()
    return frozenset(p for p, k in zip(scope.params, scope.param_kinds) if k == "p" and p)


def scope_at(symbols: Symbols, func: Func, line: int) -> Scope | None:
    """The scope of ``func`` that holds ``line``: of merged overloads (one qualified name), the one the
    line is in; None when none or several do."""
    facts = symbols.files.get(func.path)
    if facts is None or func.scope is None:
        return None
    found = [s for s in facts.scopes if s.qualname == func.qualname and s.kind == func.scope.kind
             and s.span.line <= line <= s.span.end_line]
    return found[0] if len(found) == 1 else None


class OverloadWalk:
    """What one construction of a native class allocates, through the
    overloads its arguments can select (``Factories.construction_allocates``)."""

    def __init__(self, symbols: Symbols, reach: Callable[[Func, int], tuple[Reach, ...]],
                 upload: Callable[[Site], bool], class_allocates: Callable[[ClassInfo, int], Reach | None],
                 significance: Callable[[Reach], Any]) -> None:
        self._symbols = symbols
        self._reach = reach
        self._upload = upload
        self._class_allocates = class_allocates
        self._significance = significance
        self._held: dict[str, dict[str, str]] = {}  # class key -> its members that are objects, with their types

    def counts(self, reach: Reach) -> bool:
        """An allocation a construction stands for: a weight upload, or neither a weight (T1, counted where
        it is made) nor a transient (T4 past the constructor, or dropped in it)."""
        site = reach.site
        return self._upload(site) or (site.tier is not Tier.T1 and not (site.tier is Tier.T4
                                                                        and (reach.hops or site.kept == "local")))

    def _held_members(self, cls: ClassInfo) -> dict[str, str]:
        """The members of ``cls`` that are objects of their type (``Field.held``), by name."""
        found = self._held.get(cls.key)
        if found is None:
            files = self._symbols.files
            found = self._held[cls.key] = {f.name: f.type for path in dict.fromkeys(cls.paths) if path in files
                                           for f in files[path].fields if f.owner == cls.key and f.held}
        return found

    def allocates(self, cls: ClassInfo, caller: Func, call: Call, depth: int) -> Reach | None:
        """The first allocation one construction of ``cls`` (``call`` in ``caller``) runs: for a native
        class, through the constructor overloads its arguments can select (a default-constructed
        `Matrix m;` or a view `Matrix(ptr, m, n)` runs a constructor that only stores what it is
        handed); where that cannot be told (an overload not indexed, arguments not countable, a member
        or base whose construction cannot be told), and for a Python class, the class's first allocation."""
        whole = self._class_allocates(cls, depth)
        if whole is None or cls.language is Language.PYTHON:
            return whole
        pointers = pointer_params(scope_at(self._symbols, caller, call.span.line))
        found = self.selected(cls, call.arglist, pointers, depth, frozenset())
        if found is None:
            return whole
        return min(found, key=self._significance) if found else None

    def selected(self, cls: ClassInfo, arglist: str, pointers: frozenset[str], depth: int,
                 seen: frozenset[tuple[str, int]]) -> list[Reach] | None:
        """What the overloads of ``cls`` that ``arglist`` (written where ``pointers`` are the pointer
        parameters) can select allocate; None when not known."""
        args = split_args(arglist, True)
        if depth < 0 or not countable(arglist, args):
            return None
        found: list[Reach] = []
        picked = False
        for ctor in self._symbols.constructors(cls):
            for scope, shown in overload_scopes(self._symbols, ctor):
                if not accepts(scope, shown, args, pointers):
                    continue
                key = (ctor.path, scope.span.line)
                inner = self._overload_reaches(cls, ctor, scope, depth, seen | {key}) if key not in seen else None
                if inner is None:
                    return None
                picked = True
                found += inner
        return found if picked else None

    def _overload_reaches(self, cls: ClassInfo, ctor: Func, scope: Scope, depth: int,
                          seen: frozenset[tuple[str, int]]) -> list[Reach] | None:
        """What one overload (``scope``, merged into ``ctor``) allocates: its own sites and
        calls, the constructor it delegates to, its bases and the members that are objects
        (``Field.held``) as its initialiser list builds them (by default where it
        names none), and the class body's member initialisers; None when not known."""
        span = scope.span

        def inside(line: int) -> bool:
            return span.line <= line <= span.end_line

        found = [r for r in self._reach(ctor, depth)
                 if inside((r.hops[0].call.span if r.hops else r.site.span).line) and self.counts(r)]
        lam = self._symbols.func(ctor.path, ctor.qualname + "::<lambda>")
        if lam is not None and lam.span is not None and inside(lam.span.line):
            found += [r for r in self._reach(lam, depth) if self.counts(r)]
        parts: dict[str, ClassInfo | None] = {}
        for base in cls.bases:
            parts[last_name(strip_templates(base))] = self._symbols.cpp_class(strip_templates(base))
        for name, type_name in self._held_members(cls).items():
            parts.setdefault(name, self._symbols.cpp_class(type_name))
        built: dict[str, str] = {}
        delegates = False
        for assign in ctor.assigns:
            if inside(assign.line):
                for target in assign.targets:
                    name = last_name(strip_templates(target))
                    if name == cls.name:
                        delegates = True
                        inner = self.selected(cls, assign.value, pointer_params(scope), depth, seen)
                        if inner is None:
                            return None
                        found += inner
                    elif name in parts:
                        built[name] = assign.value
        for name, part in parts.items():
            if part is None or part is cls or (delegates and name not in built):
                continue  # not a project class; or built by the constructor it delegates to
            if self._class_allocates(part, max(depth - 1, 0)) is None:
                continue
            inner = self.selected(part, built.get(name, ""), pointer_params(scope), depth - 1, seen)
            if inner is None:
                return None
            found += inner
        for path in dict.fromkeys(cls.paths):
            body = self._symbols.func(path, cls.qualname)  # member initialisers written in the class body
            if body is not None and any(self.counts(r) for r in self._reach(body, depth)):
                return None
        return found

