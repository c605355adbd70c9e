"""What a file the pre-filter skipped can still mean to the rules, read from
its bytes without parsing (the on-demand expansion, see ``pipeline``).

A skipped file is remembered by the identifiers it mentions. When the rules
want a name, the few files that mention it are read again and asked a
narrower question here: does a native file define the name, does a Python
file call a factory where its result is kept. Every answer errs on the side
of parsing the file: a wrong "yes" costs a parse, a wrong "no" a site.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import Language
from .move_apis import MODULE_MOVES

if TYPE_CHECKING:
    from ..pack import RulePack
    from .index import Func, ProjectIndex
    from .workers import Outcomes

LOG = logging.getLogger("alloc_audit")

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}")
# Names a native file defines, roughly: `type name(` starting a line (function
# definitions and declarations start at column 0; statements are indented),
# and class/struct names.
_CPP_DEFINITION = re.compile(
    rb"^(?:template\s*<[^>\n]*>\s*)?[A-Za-z_][\w:<>,*& ]*?\b(?:[A-Za-z_]\w*::)*([A-Za-z_~]\w*)\s*\("
    rb"|\b(?:class|struct)\s+(?:[A-Z_]+\s+)?([A-Za-z_]\w*)\s*[:{\n]", re.M)
_HEADER = re.compile(rb"[ \t]*(?:async[ \t]+)?(def|class)\b")
_CONTINUES = (b"(", b"[", b"{", b",", b"\\", b"=", b"+", b"-", b"*", b"/", b"|", b"&", b"and", b"or", b"else")
# statements whose value is dropped or kept in a local: not kept (the derivation's rule for Python factory calls)
_LOCAL = re.compile(rb"[ \t]*(?:[A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*[ \t]*(?::[^=\n]*)?=(?!=)"
                    rb"|(?:assert|if|elif|while|for|with|print|await)\b"
                    rb"|[A-Za-z_][\w.]*\()")
# `import pkg.buffers as pb`, `from pkg import buffers as pb`
_ALIAS = re.compile(rb"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+)?import[ \t]+([\w.]+)[ \t]+as[ \t]+([A-Za-z_]\w*)", re.M)
# how far a line-based look goes before giving up (and parsing the file):
# keeps a file of many calls in one huge function linear, not quadratic
_REACH = 2000
# `out = ...`, `a, b = ...`: the names a line assigns
_ASSIGNED = re.compile(rb"[ \t]*([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)[ \t]*(?::[^=\n]*)?=(?!=)")


class SkippedFile:
    """A skipped file read again for the expansion, read once and with its
    answers kept: each round asks the same files the same questions."""

    __slots__ = ("_read", "_data", "_definitions", "_kept")

    def __init__(self, read: Callable[[], bytes]) -> None:
        self._read = read
        self._data: bytes | None = None
        self._definitions: frozenset[str] | None = None
        self._kept: dict[tuple[tuple[str, ...], tuple[str, ...]], bool] = {}

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = self._read()
        return self._data

    def definitions(self) -> frozenset[str]:
        if self._definitions is None:
            self._definitions = native_definitions(self.data)
        return self._definitions

    def keeps_call(self, names: tuple[str, ...], modules: tuple[str, ...]) -> bool:
        found = self._kept.get((names, modules))
        if found is None:
            found = self._kept[(names, modules)] = python_keeps_call(self.data, names, modules)
        return found


def identifiers(data: bytes) -> str:
    """The identifiers (3 characters or more) a file mentions, as one text:
    each once, in the order of first mention, each between single spaces
    (``" torch empty_cache "``; ``"  "`` for none). What a skipped file is
    remembered by: one string, not a string per name (a large tree's
    skipped files mention ~1.5 M names). ``names.split()`` lists them;
    ``mentions`` asks for one."""
    return (b" " + b" ".join(dict.fromkeys(_IDENTIFIER.findall(data))) + b" ").decode("ascii")


def mentions(names: str, name: str) -> bool:
    """Whether ``name`` is one of the identifiers ``names`` (``identifiers``'
    text). Exact: each identifier stands between single spaces and holds
    none, so `` name `` occurs in the text only as a whole identifier."""
    return bool(name) and " " not in name and f" {name} " in names


def native_definitions(data: bytes) -> frozenset[str]:
    """The functions and classes a native file defines (see ``_CPP_DEFINITION``),
    and the classes whose methods it defines out of line (``void
    Engine::decode_step(...) {``: a call through an ``Engine*`` needs this file)."""
    found = {a or b for a, b in _CPP_DEFINITION.findall(data)}
    found.update(_CPP_OUT_OF_LINE.findall(data))
    return frozenset(n.decode("ascii", "replace") for n in found if n)


_CPP_OUT_OF_LINE = re.compile(
    rb"^(?:template\s*<[^>\n]*>\s*)?[A-Za-z_][\w:<>,*& ]*?\b([A-Za-z_]\w*)::~?[A-Za-z_]\w*\s*\(", re.M)


def python_keeps_call(data: bytes, names: tuple[str, ...], modules: tuple[str, ...] = ()) -> bool:
    """Whether a Python file calls one of the functions ``names`` (defined
    in a module whose dotted parts are ``modules``) where the result can
    outlive the call (what a derived site of a factory function needs:
    stored on ``self``/``cls``, at module level, in a class body) or where it
    is handed on (``return make(...)``: the file may define a factory of its
    own). A call counts when bare (imported) or through the module or an
    import alias, not as another object's method (`cute.make_tensor` is not
    `make_tensor`). Only a call on a line that plainly keeps it in a local,
    drops it or passes it on inside a function is not counted."""
    wanted = [n.encode() for n in names]
    heads = {m.encode() for m in modules}
    # `import pkg.buffers as pb`, `from pkg import buffers as pb`: the alias
    # stands for the factory's module when the import names one of its parts
    heads |= {alias for source, name, alias in _ALIAS.findall(_lines_with(data, b"import"))
              if not heads.isdisjoint((source + b"." + name).split(b"."))}
    called = re.compile(rb"\b(?:" + b"|".join(re.escape(n) for n in wanted) + rb")\s*\(")
    qualifier = re.compile(rb"(?:^|[^\w.])(" + (b"|".join(re.escape(h) for h in sorted(heads)) or b"(?!)") + rb")\.$")
    lines: list[bytes] = []
    checked: set[int] = set()
    for match in called.finditer(data):
        at = match.start()
        if at and data[at - 1:at] == b"." and qualifier.search(data, max(0, at - 200), at) is None:
            continue  # another object's method
        number = data.count(b"\n", 0, at)
        if number in checked:
            continue
        checked.add(number)
        lines = lines or data.split(b"\n")
        line = lines[number]
        if _HEADER.match(line) is not None:
            continue  # its own definition
        if not _LOCAL.match(line) or _continued(lines, number) or not _inside_function(lines, number):
            return True
        local = _ASSIGNED.match(line)
        if local is not None and _returned_later(lines, number, local.group(1).split(b",")):
            return True
    return False


def _lines_with(data: bytes, word: bytes) -> bytes:
    """The lines of ``data`` that spell ``word``, joined: a pattern that
    matches within one line from its start (``^`` under ``re.M``, no line
    break in it) and spells ``word`` finds the same matches, in order, in them
    as in ``data`` (tests/test_expansion.py), without trying every other line."""
    lines: list[bytes] = []
    at = data.find(word)
    while at >= 0:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        if end < 0:
            end = len(data)
        lines.append(data[start:end])
        at = data.find(word, end)
    return b"\n".join(lines)


def _returned_later(lines: list[bytes], number: int, names: list[bytes]) -> bool:
    """Whether a local assigned on line ``number`` is returned (or yielded)
    further down the same function: `out = make(n)` ... `return out`."""
    line = lines[number]
    indent = len(line) - len(line.lstrip())
    pattern = re.compile(rb"[ \t]*(?:return|yield)\b.*\b(?:" + b"|".join(re.escape(n.strip()) for n in names) + rb")\b")
    stop = min(len(lines), number + 1 + _REACH)
    for k in range(number + 1, stop):
        text = lines[k]
        stripped = text.lstrip()
        if not stripped or stripped.startswith(b"#"):
            continue
        level = len(text) - len(stripped)
        if level < indent and _HEADER.match(text) is not None or level == 0:
            return False
        if pattern.match(text):
            return True
    return stop < len(lines)  # a function too long to look through: parse the file


def _continued(lines: list[bytes], number: int) -> bool:
    """Whether line ``number`` continues the statement of an earlier line."""
    for k in range(number - 1, -1, -1):
        text = lines[k].split(b"#", 1)[0].rstrip()
        if text:
            return text.endswith(_CONTINUES)
    return False


def _inside_function(lines: list[bytes], number: int) -> bool:
    """Whether the nearest enclosing ``def``/``class`` of a line is a def."""
    line = lines[number]
    indent = len(line) - len(line.lstrip())
    for k in range(number - 1, max(-1, number - 1 - _REACH), -1):
        text = lines[k]
        stripped = text.lstrip()
        if not stripped or stripped.startswith(b"#"):
            continue
        level = len(text) - len(stripped)
        if level < indent:
            header = _HEADER.match(text)
            if header is not None:
                return header.group(1) == b"def"
            indent = level
            if level == 0:
                return False
    return False


# ---------------------------------------------------------------- what to parse next


@dataclass(frozen=True)
class WantedFiles:
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
    call only where its result is kept (``expand.python_keeps_call``).
    ``native_mentions`` are native factory names (a method's class name:
    calling a method needs an object of that type)."""

    definitions: frozenset[str]
    classes: Mapping[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    functions: Mapping[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    modules: frozenset[str] = frozenset()
    native_mentions: frozenset[str] = frozenset()
    python_names: frozenset[str] = field(init=False)  # classes and functions, for a quick no
    native_names: frozenset[str] = field(init=False)  # definitions and native mentions, for a quick no

    def __post_init__(self) -> None:
        object.__setattr__(self, "python_names", frozenset(self.classes) | frozenset(self.functions))
        object.__setattr__(self, "native_names", self.definitions | self.native_mentions)

    def __bool__(self) -> bool:
        return bool(self.definitions or self.classes or self.functions or self.modules or self.native_mentions)

    def wants_file(self, path: str, mentioned: str, look: Callable[[], SkippedFile],
                   none_of: dict[str, frozenset[str]] | None = None) -> bool:
        """Whether a skipped file (the identifiers it mentions, ``identifiers``'
        text; a look at its bytes, taken only when a wanted name is among
        them) is one the rules need. ``none_of``, kept across the rounds by
        the caller: path -> the quick-no names (``native_names``, ``python_names``)
        of a round that found the file mentions none of them. A file's
        identifiers never change, so a later round whose quick-no names are
        among those mentions none of its own either: no again without
        splitting the text (a large tree's skipped native files hold ~1.2 M
        names; on aphrodite round 3 and on flashinfer rounds 2-3 add no name)."""
        if not path.endswith(".py"):
            if none_of is not None and self.native_names <= none_of.get(path, frozenset()):
                return False
            identifiers = mentioned.split()
            if self.native_names.isdisjoint(identifiers):  # one pass over a long list, not two
                if none_of is not None:
                    none_of[path] = self.native_names
                return False
            if not self.native_mentions.isdisjoint(identifiers):
                return True
            return not self.definitions.isdisjoint(identifiers) and \
                not self.definitions.isdisjoint(look().definitions())
        from .extract.python import module_name

        module = module_name(path)
        if self.wants_module(module):
            return True
        if none_of is not None and self.python_names <= none_of.get(path, frozenset()):
            return False
        identifiers = mentioned.split()
        if self.python_names.isdisjoint(identifiers):
            if none_of is not None:
                none_of[path] = self.python_names
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


def expansion_wants(index: ProjectIndex, roots: Callable[[ProjectIndex], list[Func]], depth: int) -> WantedFiles:
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
    for factory in sorted(index.factories(uploads=True)):
        if not factory.python:
            # a class name defined in several places is not resolved from
            # elsewhere (see ``_derive``): its callers cannot be derived sites
            if factory.callable_anywhere:
                native.add(factory.defined_in if factory.kind == "method" else factory.name)
        else:
            # a Python method is called on self/cls (from its class or a
            # subclass) or on an object of its class: the caller names one
            named = [factory.name] if factory.kind != "method" else \
                [factory.owner, *index.subclass_names(factory.owner)]
            table = python["function" if factory.kind == "function" else "class"]
            for name in named:
                table.setdefault(name, set()).update(factory.defined_in.split("."))
                packages.setdefault(name, set()).add(factory.defined_in.rpartition(".")[0])
    definitions |= index.unattached_owners()
    definitions |= moved_classes(index)
    modules = frozenset(d[len("module:"):] for d in definitions if d.startswith("module:"))
    names = {d for d in definitions if not d.startswith("module:")}

    def keep(n: str) -> bool:
        return len(n) >= 3 and not n.startswith("__") and n not in ("<module>", "<lambda>")

    reach = {kind: {n: (frozenset(parts), frozenset(packages[n])) for n, parts in table.items() if keep(n)}
             for kind, table in python.items()}
    return WantedFiles(frozenset(filter(keep, names)), reach["class"], reach["function"], modules,
                 frozenset(filter(keep, native)))


def moved_classes(index: ProjectIndex) -> set[str]:
    """The modules that could define the class of a Python module a move
    builds right there (``ROIAlign(...).to(device)``) when it is not
    analysed yet: whether its class keeps any tensor decides whether the
    move allocates (``stateless_modules``), and a file that defines a module
    with no tensor is one the pre-filter skips."""
    from .module_classes import receiver_builder

    wanted: set[str] = set()
    for func in index.funcs.values():
        if func.language is not Language.PYTHON or not func.sites:
            continue
        for site in func.sites:
            if site.api not in MODULE_MOVES or site.via is not None:
                continue
            call = receiver_builder(func, site)
            if call is not None and not index.resolve(func, call.callee):
                wanted |= index.missing_names(func, call.callee)
    return wanted


# ---------------------------------------------------------------- the rounds


def expand_skipped(index: ProjectIndex, files: Outcomes, pack: RulePack,
                   contexts: Collection[str] = ()) -> None:
    """Parse the skipped files the rules or the derived sites need, round by
    round up to the configured depth, adding each round to the index. The
    functions that enter a default-device context (``contexts``) are roots
    too: what they call must be analysed to be followed."""
    from ..rules import root_finder
    from .default_device import context_functions

    rule_roots = root_finder(pack)

    def roots(idx: ProjectIndex) -> list[Func]:
        return [*rule_roots(idx), *context_functions(idx, contexts)]

    depth = max(pack.capture_depth, pack.flow_depth, 1)
    looks: dict[str, SkippedFile] = {}  # skipped files read again, once
    none_of: dict[str, frozenset[str]] = {}  # skipped files that mention none of a round's names (``wants_file``)

    def look(path: str) -> SkippedFile:
        found = looks.get(path)
        if found is None:
            found = looks[path] = SkippedFile(functools.partial(files.read, path))
        return found

    for _round in range(depth):
        asked = time.perf_counter()
        wants = expansion_wants(index, roots, depth)
        chosen = sorted(p for p, idents in files.skipped.items()
                        if wants.wants_file(p, idents, functools.partial(look, p), none_of))
        LOG.debug("expansion round %d: %d of %d skipped files wanted (%d bytes; chosen in %.3f s)", _round + 1,
                  len(chosen), len(files.skipped), sum(files.size(p) for p in chosen), time.perf_counter() - asked)
        if not chosen:
            break
        before = set(files.facts)
        files.parse(chosen)
        for p in chosen:
            files.skipped.pop(p, None)
        index.add({p: files.facts[p] for p in sorted(files.facts) if p not in before})
