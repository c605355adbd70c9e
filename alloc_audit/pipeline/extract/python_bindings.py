"""Stage 3, extract (Python): the bindings of a local in a function's source
text, read by the host, same-device and current-GPU tests
(``python_host.py``, ``python_same_device.py``): every ``name = ...`` of a
name and its value, and whether the name is bound any other way (unpacked,
a loop or ``with`` target, a walrus, ``global``). Patterns are compiled once
per name. Pure.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator


def _value(source: str, start: int) -> str:
    """The right-hand side from ``start`` to the end of its statement
    (brackets balanced across lines)."""
    depth = 0
    for i, ch in enumerate(source[start:start + 4000]):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "\n" and depth <= 0:
            return source[start:start + i]
    return source[start:start + 4000]


def _bindings(source: str, name: str) -> list[str]:
    """The values of every `name = ...` in ``source``; empty when the name is
    also bound another way (unpacked, a loop or `with` target, a walrus)."""
    if name not in source or _bound_else(source, name):
        return []
    return [_value(source, hit.end()) for hit in
            _binding_pattern(name).finditer(source)]


class _Shared:
    """A per-name binding pattern answered by one pattern shared by every
    plain name (``_PLAIN_NAME``): its matches less those whose targets
    (group 2) do not hold the name. Where the per-name pattern matches a
    line, the shared one matches the same line with the same span and
    groups: both start at a line start, take the whole indent, and the
    target the name stands for can only be a whole dotted name (a tuple
    element), since the pattern goes on only with blanks, ``,``, ``:``,
    ``)`` or ``=``; so the name is one of the shared match's targets exactly
    when the per-name pattern matches there (tests/test_shared_patterns.py).
    Saves compiling a pattern per name (perf-r34e)."""

    __slots__ = ("name", "pattern", "tuple")

    def __init__(self, name: str, pattern: re.Pattern[str], tuple_: bool) -> None:
        self.name, self.pattern, self.tuple = name, pattern, tuple_

    def _holds(self, hit: re.Match[str]) -> bool:
        targets = hit.group(2)
        if not self.tuple:
            return targets == self.name
        return self.name in targets and self.name in [t.strip(" \t") for t in targets.split(",")]

    def finditer(self, source: str) -> Iterator[re.Match[str]]:
        if self.name not in source:
            return iter(())  # every match spells the name
        return (hit for hit in self.pattern.finditer(source) if self._holds(hit))

    def search(self, source: str) -> re.Match[str] | None:
        return next(self.finditer(source), None)


# `name = ...` / `a, name = ...` for any plain name in group 2 (`_Shared`)
_ANY_BINDING = re.compile(r"^([ \t]*)(\w+(?:\.\w+)*)[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*", re.M)
_ANY_TUPLE = re.compile(r"^([ \t]*)\(?([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)[ \t]*,?\)?[ \t]*=(?!=)[ \t]*", re.M)


@functools.lru_cache(maxsize=4096)
def _binding_pattern(name: str) -> re.Pattern[str] | _Shared:
    """``name = ...`` (``name: T = ...``) at the start of a line, the indent
    captured: a plain name shares one pattern (``_Shared``), any other is
    compiled once (``re``'s own cache holds 512)."""
    if _PLAIN_NAME.fullmatch(name) is not None:
        return _Shared(name, _ANY_BINDING, False)
    return _compiled_binding(name)


def _compiled_binding(name: str) -> re.Pattern[str]:
    return re.compile(rf"^([ \t]*){re.escape(name)}[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*", re.M)


@functools.lru_cache(maxsize=1024)
def _tuple_pattern(name: str) -> re.Pattern[str] | _Shared:
    """``a, name = ...``, ``(name, b) = ...`` at the start of a line, the indent and the targets captured
    (a plain name: ``_Shared``)."""
    if _PLAIN_NAME.fullmatch(name) is not None:
        return _Shared(name, _ANY_TUPLE, True)
    return _compiled_tuple(name)


def _compiled_tuple(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    targets = rf"(?:[\w.]+[ \t]*,[ \t]*)*{n}(?:[ \t]*,[ \t]*[\w.]+)*"
    return re.compile(rf"^([ \t]*)\(?({targets})[ \t]*,?\)?[ \t]*=(?!=)[ \t]*", re.M)


def _own_statement(text: str, hit: re.Match[str]) -> bool:
    """The binding ``hit`` found in ``text`` (a function up to a move) is the move's own statement
    (``x = x.to(d)``): its value runs to the end of ``text``, so it binds the name only after the move."""
    return hit.end() + len(_value(text, hit.end())) >= len(text)


def _last_binding(before: str, name: str) -> tuple[re.Match[str], str, str] | None:
    """The last statement binding ``name`` in ``before`` (a function up to a move) that is not the move's own
    (``x = x.to(d)`` binds ``x`` after the move): the match, the value the name takes and the text between the
    statement's end and the move. A tuple target (``a, name = ...``, round 28) takes its own element of a tuple
    written out (any other value: empty); a keyword argument on a line of its own binds nothing."""
    tuples = [h for h in _tuple_pattern(name).finditer(before) if "," in h.group(2)] if "," in before else []
    hits = sorted((h for h in (*_binding_pattern(name).finditer(before), *tuples) if _statement_at(before, h.start())),
                  key=lambda h: h.start())
    if hits and _own_statement(before, hits[-1]):
        hits.pop()
    if not hits:
        return None
    last = hits[-1]
    value = _value(before, last.end())
    between = before[last.end() + len(value):]
    return last, _tuple_element(value, last.group(2), name) if last in tuples else value, between


def _tuple_element(value: str, targets: str, name: str) -> str:
    """The element of a tuple written out (``value``) that the tuple target ``targets`` binds to ``name``
    (round 28); empty, which proves nothing, for any other value (a call that returns a tuple, a star)."""
    names = [t.strip() for t in targets.split(",") if t.strip()]
    try:
        tree = ast.parse(value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    if not isinstance(tree, ast.Tuple) or len(tree.elts) != len(names) or names.count(name) != 1 \
            or any(isinstance(e, ast.Starred) for e in tree.elts):
        return ""
    return ast.unparse(tree.elts[names.index(name)])


def _bound_else(source: str, name: str) -> bool:
    """``name`` is bound in ``source`` other than by `name = ...`."""
    if name not in source:
        return False  # every alternative below spells the name: skip compiling it
    lines = _lines_with(source, name)
    if _PLAIN_NAME.fullmatch(name) is not None and _KEYWORDS.isdisjoint(name.split(".")) \
            and not _bordered(name) and _STAND_IN not in lines:
        # one pattern for every name: the name's whole-word spellings become one stand-in (see _masked)
        return _OTHER_BINDING_ANY.search(_masked(lines, name)) is not None
    return _other_binding_pattern(name).search(lines) is not None


# a stand-in for the name in `_bound_else`'s shared pattern: word characters
# (so `\b` sees the same edges) that no Python source spells in practice
# (a source that does takes the per-name pattern)
_STAND_IN = "\u1d25\u1d25\u1d25"
# a name of word runs joined by dots (`x`, `self.buf`): every edge the pattern
# tests is a word/non-word edge, and no run is one of the pattern's keywords
_PLAIN_NAME = re.compile(r"\w+(?:\.\w+)*")
_KEYWORDS = frozenset({"for", "in", "as", "global", "nonlocal"})


def _bordered(name: str) -> bool:
    """Some proper prefix of ``name`` is also its suffix (`a.a`): two of
    its spellings may overlap, and the stand-in would replace only one."""
    return any(name[:k] == name[-k:] for k in range(1, len(name)))


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"  # what `re`'s `\w` matches in a str pattern


def _masked(lines: str, name: str) -> str:
    """``lines`` with each spelling of ``name`` that no word character
    touches replaced by the stand-in. Every alternative of the pattern
    reads the name only so (a word edge or a `,`/blank/line start before
    it, a word edge or `[ \t]*` then `,`/`:=` after it), the name's runs
    are no keyword of it and its spellings cannot overlap (``_bordered``),
    so the shared pattern matches the masked lines exactly when the name's
    own pattern matches the lines (tests/test_python_bindings.py)."""
    out: list[str] = []
    size, n, start = len(lines), len(name), 0
    at = lines.find(name)
    while at >= 0:
        end = at + n
        if (at == 0 or not _is_word(lines[at - 1])) and (end == size or not _is_word(lines[end])):
            out += (lines[start:at], _STAND_IN)
            start = end
            at = lines.find(name, end)
        else:
            at = lines.find(name, at + 1)
    out.append(lines[start:])
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _other_binding_pattern(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    # an unpacking target (`a, x = ...`, `x, b = ...`), not an argument line of a call (`f(a, x, dim=1)`)
    return re.compile(rf"^[ \t]*[^\n=#(]*,[ \t]*{n}\b[^\n=(]*=(?!=)|\bfor\b[^\n:]*\b{n}\b[^\n:]*\bin\b|"
                      rf"\bas[ \t]+{n}\b|\b{n}[ \t]*:=|^[ \t]*{n}[ \t]*,[^\n=(]*=(?!=)|"
                      rf"\b(?:global|nonlocal)\b[^\n]*\b{n}\b", re.M)


_OTHER_BINDING_ANY = _other_binding_pattern(_STAND_IN)


def _lines_with(source: str, name: str) -> str:
    """The lines of ``source`` that spell ``name``, joined: a pattern whose
    every alternative spells the name within one line (``[^\\n]``, ``^``
    under ``re.M``, ``\\b``) matches them exactly when it matches
    ``source``, and the search skips the function's other lines."""
    if "\n" in name:
        return source
    lines: list[str] = []
    at = source.find(name)
    while at >= 0:
        start = source.rfind("\n", 0, at) + 1
        end = source.find("\n", at)
        if end < 0:
            end = len(source)
        lines.append(source[start:end])
        at = source.find(name, end)
    return "\n".join(lines)

_TOKENS = re.compile(r"#[^\n]*|'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|"  # comments, strings, brackets
                     r"\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|[()\[\]{}]")


def _statement_at(source: str, pos: int) -> bool:
    """``pos`` (a line start) is outside every bracket: a statement, not a
    call's keyword argument on a line of its own (strings and comments skipped)."""
    depth = 0
    for token in _TOKENS.finditer(source, 0, pos):
        ch = token.group(0)
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth <= 0


def _statement_bindings(source: str, name: str, looped: bool = False) -> list[str]:
    """`_bindings` less the lines that only look like one: a call's keyword
    argument on a line of its own (`f(\\n    x = x,\\n)`), which binds
    nothing (``looped``: the name is also a loop target, which `_bindings`
    refuses)."""
    values = [] if not looped and _bound_else(source, name) else [
        (_value(source, hit.end()), hit.start()) for hit in _binding_pattern(name).finditer(source)]
    return [v for v, at in values if _statement_at(source, at)]
