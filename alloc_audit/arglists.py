"""Splitting a call's argument text into arguments, on demand.

Extraction keeps each call's argument list as one string (cheap to record
for a hundred thousand calls); the few calls a rule or the index looks at
closely are split here, once (cached by text)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from .model import Arg, Call

_KEYWORD = re.compile(r"^([A-Za-z_]\w*)\s*=(?!=)\s*(.*)$", re.S)
_OPEN = "([{"
_CLOSE = ")]}"


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and string literals.

    Only a quote, a bracket or ``sep`` changes the state of the scan, so it jumps from one to the next
    (``_stops``) and past a literal to its closing quote (``_CLOSERS``: a backslash skips the character
    after it); a text with no quote nor bracket is ``str.split`` (perf-r36b: a third of the time of the
    character loop it replaced, on flashinfer's argument lists; tests/test_split_top_level.py compares the
    two)."""
    if len(sep) == 1 and _NESTING.search(text) is None:
        return [p for p in (p.strip() for p in text.split(sep)) if p]
    search = _stops(sep).search
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while (found := search(text, i)) is not None:
        i = found.start()
        ch = text[i]
        if ch in "'\"":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else ch
            closer = _CLOSERS[quote].search
            i += len(quote)
            while (end := closer(text, i)) is not None and text[end.start()] == "\\":
                i = end.start() + 2
            if end is None:
                break  # an unclosed literal runs to the end: no separator after it
            i = end.end()
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0:  # ``sep``
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return [p for p in parts if p]


_NESTING = re.compile(r"['\"()\[\]{}]")
_CLOSERS = {q: re.compile(r"\\|" + q) for q in ("'", '"', "'''", '"""')}


@lru_cache(maxsize=8)
def _stops(sep: str) -> re.Pattern[str]:
    """Where the scan of ``split_top_level`` stops: a quote, a bracket, or ``sep`` (only a one-character
    ``sep`` can be met: the scan compares one character with it)."""
    return re.compile("[" + re.escape("'\"()[]{}" + (sep if len(sep) == 1 else "")) + "]")


# 4,096 entries thrashed: a scan's tier passes split ~12 k distinct argument lists on flashinfer (18 k misses in
# 60 k asks with 4,096, 12 k with 65,536); an entry is the text's few `Arg`s (the text is the call table's own)
@lru_cache(maxsize=65536)
def split_args(arglist: str, cpp: bool = False) -> tuple[Arg, ...]:
    """Arguments of a call's argument text. Python keyword arguments keep
    their names; comments (``#``, or ``//`` and ``/* */`` in C++) are dropped."""
    out = []
    if cpp:
        if "/" in arglist:
            arglist = re.sub(r"//[^\n]*|/\*.*?\*/", " ", arglist, flags=re.S)
        return tuple(Arg(None, " ".join(p.split())) for p in split_top_level(arglist))
    if "\n" in arglist or "  " in arglist or "\t" in arglist:
        arglist = " ".join(_strip_comments(arglist).split())
    for part in split_top_level(arglist):
        m = _KEYWORD.match(part)
        if m is not None:
            out.append(Arg(m.group(1), m.group(2).strip()))
        else:
            out.append(Arg(None, part))
    return tuple(out)


def argument_for(args: Sequence[Arg], name: str, position: int) -> Arg | None:
    """The argument a call's ``args`` give the parameter ``name``, the
    ``position``-th positional one: by keyword, else by position; None when
    the call gives it neither way."""
    keyword = next((a for a in args if a.keyword == name), None)
    if keyword is not None:
        return keyword
    positional = [a for a in args if a.keyword is None]
    return positional[position] if 0 <= position < len(positional) else None


def _strip_comments(text: str) -> str:
    """Drop `# ...` comments from a multi-line Python argument list (outside strings)."""
    if "#" not in text:
        return text
    out = []
    for line in text.splitlines():
        quote = ""
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "#":
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def call_args(call: Call, cpp: bool = False) -> tuple[Arg, ...]:
    return split_args(call.arglist, cpp)


def pointer_target(arg: str) -> str:
    """What a native out-parameter argument names: `(void**)&p`,
    `reinterpret_cast<void**>(&this->p)`, `&p` -> `p`; a plain
    pointer-to-pointer `pp` -> `*pp` (what it points at is filled)."""
    a = arg.strip()
    for _ in range(4):
        m = re.fullmatch(r"\(\s*[\w:<>\s\*&]+\)\s*(.*)", a, re.S) or re.fullmatch(
            r"(?:reinterpret_cast|static_cast|const_cast)\s*<[^>]*>\s*\((.*)\)", a, re.S
        )
        if m is None:
            break
        a = m.group(1).strip()
    if a.startswith("(") and a.endswith(")"):
        a = a[1:-1].strip()
    if a.startswith("&"):
        a = a[1:].strip()
        if a.startswith("(") and a.endswith(")"):
            a = a[1:-1].strip()
        return _without_this(a)
    return "*" + _without_this(a)


def _without_this(a: str) -> str:
    a = a.replace(" ", "")
    return a[6:] if a.startswith("this->") else a
