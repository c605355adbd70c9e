"""The native macro mask of ``parse``: attribute macros (`__launch_bounds__(...)`),
specifier macros (`CUTLASS_HOST_DEVICE`) and lone macro lines blanked (same
length, newlines kept) before a native file is parsed."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=16)
def _mask_regex(attribute_macros: tuple[str, ...], specifier_macros: tuple[str, ...],
                lone_macro_lines: bool) -> re.Pattern[bytes] | None:
    parts = []

    def alternation(macros: tuple[str, ...]) -> bytes:
        # a `*` in a configured name matches any identifier characters
        return b"|".join(re.escape(m.encode()).replace(rb"\*", rb"\w*") for m in macros)

    if attribute_macros:
        names = alternation(attribute_macros)
        # NAME(...) with one level of nested parentheses, on one line
        # never the name a `#define` gives (`#define __launch_bounds__(x, y)`):
        # blanking it leaves an empty directive
        parts.append(rb"(?<!define )(?<!define\t)\b(?:" + names
                     + rb")\s*\((?:[^()\n]|\((?:[^()\n]|\((?:[^()\n]|\([^()\n]*\))*\))*\))*\)(?:\s*;)?")
    if specifier_macros:
        names = alternation(specifier_macros)
        parts.append(rb"(?<!define )(?<!define\t)\b(?:" + names + rb")\b(?!\s*\()")
    if lone_macro_lines:
        # not the last argument of a call (`..., CUBLAS_COMPUTE_32F,\n  CUBLAS_GEMM_DEFAULT\n);`)
        # or of a template argument list (`kernel<\n  HAS_MASK,\n  EMIT_RELU\n>`); round 31: nor
        # an operand of an expression over lines (`n ==\n  MAX_BLOCKS\n  ? a : b`, `f(a,\n  FLAG_X`)
        parts.append(rb"(?m)(?<![=(,|&+?!-]\n)^[ \t]*[A-Z][A-Z0-9_]*_[A-Z0-9_]+[ \t]*$(?!\n[ \t]*[)>?:|&+=])")
    if not parts:
        return None
    flags = b"(?m)" if lone_macro_lines else b""
    return re.compile(flags + b"|".join(p.replace(b"(?m)", b"") for p in parts))


def blank(match: re.Match[bytes]) -> bytes:
    text = match.group(0)
    return bytes(c if c in (10, 13) else 32 for c in text)


def mask_macros(data: bytes, attribute_macros: tuple[str, ...], specifier_macros: tuple[str, ...],
                lone_macro_lines: bool) -> bytes:
    """``_mask_regex``'s matches blanked: ``regex.sub(blank, data)``, tried
    only where a match can start (``_mask_starts``; perf-r30: the pattern's
    leading look-behinds and ``\\w*`` names made ``re`` try every byte, ~150 ns
    a byte, a second of aphrodite's native files)."""
    am, sm = tuple(attribute_macros), tuple(specifier_macros)
    regex = _mask_regex(am, sm, lone_macro_lines)
    if regex is None:
        return data
    starts = _mask_starts(am, sm, lone_macro_lines)
    if starts is None:
        return regex.sub(blank, data)
    words, lines = starts
    found: set[int] = set()
    if words is not None:
        for hit in words.finditer(data):
            at = hit.start()
            while at > 0 and data[at - 1] in _WORD_BYTES:
                at -= 1
            found.add(at)
    if lines is not None:
        found.add(0)
        found.update(hit.start() + 1 for hit in lines.finditer(data))
    out: list[bytes] = []
    done = 0
    for at in sorted(found):
        if at < done:
            continue
        match = regex.match(data, at)
        if match is not None:
            out += (data[done:at], blank(match))
            done = match.end()
    if not out:
        return data
    out.append(data[done:])
    return b"".join(out)


_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")  # `\w` of a bytes pattern
_WORD_PIECE = re.compile(r"[A-Za-z0-9_]+")


@lru_cache(maxsize=16)
def _mask_starts(attribute_macros: tuple[str, ...], specifier_macros: tuple[str, ...], lone_macro_lines: bool
                 ) -> tuple[re.Pattern[bytes] | None, re.Pattern[bytes] | None] | None:
    """Where a match of ``_mask_regex`` can start, as two patterns a search
    runs fast (each starts with a literal or a byte set): a macro name's
    longest literal piece (a name's match starts at ``\\b``, and every name
    is word bytes and ``*``, so it starts where the word holding that piece
    starts; a piece lies inside one word, so hits that do not overlap miss
    no word), and a line a lone macro fills (from the byte after its
    newline; and offset 0). None when a name has a piece of other bytes,
    or none: then the pattern is searched as it is. ``tests/test_mask_macros.py``
    compares the two on generated sources."""
    pieces: set[str] = set()
    for name in (*attribute_macros, *specifier_macros):
        parts = [p for p in name.split("*") if p]
        if not parts or not all(_WORD_PIECE.fullmatch(p) for p in parts):
            return None
        pieces.add(max(parts, key=len))
    words = re.compile(b"|".join(re.escape(p.encode()) for p in sorted(pieces, key=lambda p: (-len(p), p)))) \
        if pieces else None
    lines = re.compile(rb"\n[ \t]*[A-Z][A-Z0-9_]*_[A-Z0-9_]+[ \t]*(?=\n|\Z)") if lone_macro_lines else None
    return words, lines
