"""Stage 3, extract (Python): the bindings of a local in a function's source
text, read by the host, same-device and current-GPU tests
(``python_host.py``, ``python_same_device.py``): every ``name = ...`` of a
name and its value, and whether the name is bound any other way (unpacked,
a loop or ``with`` target, a walrus, ``global``). Patterns are compiled once
per name. Pure.
"""

from __future__ import annotations

import functools
import re


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


@functools.lru_cache(maxsize=4096)
def _binding_pattern(name: str) -> re.Pattern[str]:
    """``name = ...`` (``name: T = ...``) at the start of a line, the indent
    captured: compiled once per name (``re``'s own cache holds 512)."""
    return re.compile(rf"^([ \t]*){re.escape(name)}[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*", re.M)


def _bound_else(source: str, name: str) -> bool:
    """``name`` is bound in ``source`` other than by `name = ...`."""
    if name not in source:
        return False  # every alternative below spells the name: skip compiling it
    return _other_binding_pattern(name).search(_lines_with(source, name)) is not None


@functools.lru_cache(maxsize=4096)
def _other_binding_pattern(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    # an unpacking target (`a, x = ...`, `x, b = ...`), not an argument line of a call (`f(a, x, dim=1)`)
    return re.compile(rf"^[ \t]*[^\n=#(]*,[ \t]*{n}\b[^\n=(]*=(?!=)|\bfor\b[^\n:]*\b{n}\b[^\n:]*\bin\b|"
                      rf"\bas[ \t]+{n}\b|\b{n}[ \t]*:=|^[ \t]*{n}[ \t]*,[^\n=(]*=(?!=)|"
                      rf"\b(?:global|nonlocal)\b[^\n]*\b{n}\b", re.M)


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
