"""What a file the pre-filter skipped can still mean to the rules, read from
its bytes without parsing (the on-demand expansion, see ``pipeline``).

A skipped file is remembered by the identifiers it mentions. When the rules
want a name, the few files that mention it are read again and asked a
narrower question here: does a native file define the name, does a Python
file call a factory where its result is kept. Every answer errs on the side
of parsing the file: a wrong "yes" costs a parse, a wrong "no" a site.
"""

from __future__ import annotations

import re
from typing import Callable

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}")
# Names a native file defines, roughly: `type name(` starting a line (function
# definitions and declarations start at column 0; statements are indented),
# and class/struct names.
_CPP_DEFINITION = re.compile(
    rb"^(?:template\s*<[^>\n]*>\s*)?[A-Za-z_][\w:<>,*& ]*?\b(?:[A-Za-z_]\w*::)*([A-Za-z_~]\w*)\s*\("
    rb"|\b(?:class|struct)\s+(?:[A-Z_]+\s+)?([A-Za-z_]\w*)\s*[:{\n]", re.M)
_HEADER = re.compile(rb"[ \t]*(?:async[ \t]+)?(def|class)\b")
_CONTINUES = (b"(", b"[", b"{", b",", b"\\", b"=", b"+", b"-", b"*", b"/", b"|", b"&", b"and", b"or", b"else")
# statements whose value is dropped or kept in a local: not kept (index._kept)
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


def identifiers(data: bytes) -> tuple[str, ...]:
    """The identifiers (3 characters or more) a file mentions, sorted."""
    return tuple(sorted(m.decode("ascii") for m in set(_IDENTIFIER.findall(data))))


def native_definitions(data: bytes) -> frozenset[str]:
    """The functions and classes a native file defines (see ``_CPP_DEFINITION``),
    and the classes whose methods it defines out of line (``void
    Engine::decode_step(...) {``: a call through an ``Engine*`` needs this file)."""
    found = {a or b for a, b in _CPP_DEFINITION.findall(data)}
    found.update(_CPP_OUT_OF_LINE.findall(data))
    return frozenset(n.decode("ascii", "replace") for n in found if n)


_CPP_OUT_OF_LINE = re.compile(rb"^(?:template\s*<[^>\n]*>\s*)?[A-Za-z_][\w:<>,*& ]*?\b([A-Za-z_]\w*)::~?[A-Za-z_]\w*\s*\(",
                              re.M)


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
    heads |= {alias for source, name, alias in _ALIAS.findall(data)
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
