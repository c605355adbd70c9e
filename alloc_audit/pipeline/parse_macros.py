"""Stage 2, parse: the helpers of the repair parse (``parse.repair_idioms``)
and two statement idioms of test and check macros it blanks. Every repair
writes over bytes in place (same length, newlines kept), so every span is
still a span of the file."""

from __future__ import annotations

import re
from collections.abc import Iterator

COMMENT_LINES = re.compile(rb"(?:[ \t]*(?://[^\n]*)?\n)*[ \t]*")
NOT_AFTER_STATEMENT = b";.{-:?&|+*/,)=<>["
# an ALL_CAPS macro call anywhere (`if (ALL_OF(p, n, bool, true))`)
MACRO_CALL = re.compile(rb"\b_*[A-Z][A-Z0-9_]*[ \t]*\(")


class MacroCalls:
    """One file's ALL_CAPS macro calls (``MACRO_CALL``'s matches) and where
    the parenthesis each `(` opens closes (``close_paren``), each found once
    for the repair passes that ask (round 34: three passes walked the same
    calls and matched the same parentheses again). ``close_paren`` is a
    function of the bytes and the position alone, so a kept answer is the
    answer."""

    __slots__ = ("data", "_calls", "_ends")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._calls: list[re.Match[bytes]] | None = None
        self._ends: dict[int, int] = {}

    def calls(self) -> list[re.Match[bytes]]:
        if self._calls is None:
            self._calls = list(MACRO_CALL.finditer(self.data))
        return self._calls

    def close(self, start: int) -> int:
        end = self._ends.get(start)
        if end is None:
            end = self._ends[start] = close_paren(self.data, start)
        return end


# `if (cond) TORCH_CHECK(...)`, `else CHECK(...)`: a control head whose body is
# a statement macro (a macro that expands to a whole statement needs no `;`)
_CONTROL_HEAD = re.compile(rb"\b(?:if|while|for|else)\b")
_MACRO_AT = re.compile(rb"[ \t]*(_*[A-Z][A-Z0-9_]*)[ \t]*\(")


def guarded_statement_macros(data: bytes, out: bytearray, known: MacroCalls | None = None) -> None:
    """`if (x) TORCH_CHECK(y, "msg")` with no `;` and nothing after it on
    its line: the grammar wants a `;`. The invocation becomes an empty
    statement (`;` and spaces), so the `if` keeps a body of its own and
    does not take the next statement."""
    close = (known or MacroCalls(data)).close
    for m in _CONTROL_HEAD.finditer(data):
        at = m.end()
        if m.group(0) != b"else":
            while at < len(data) and data[at] in b" \t":
                at += 1
            if at >= len(data) or data[at] != 40:
                continue
            at = close(at)
            if at < 0:
                continue
        macro = _MACRO_AT.match(data, at)
        if macro is None or macro.group(1) in (b"if", b"while", b"for"):
            continue
        end = close(macro.end() - 1)
        if end < 0 or b"{" in data[macro.start(1):end] or b"\n" in data[at:macro.start(1)]:
            continue
        if not ends_statement(data, end):
            continue
        blank_range(out, macro.start(1), end)
        out[macro.start(1)] = 59  # `;`


def juxtaposed_macro_arguments(data: bytes, out: bytearray, known: MacroCalls | None = None) -> None:
    """`AT_DISPATCH_SWITCH(t, "op", AT_DISPATCH_CASE(kHalf, [&] {...})
    AT_DISPATCH_CASE(kBFloat16, [&] {...}))`: macro invocations side by side
    as one argument (the macro pastes them); to the grammar a call then a
    name. The blank before each following invocation becomes `,`, so the run
    reads as arguments, when the run ends an argument list (`)` or `,`
    after its last invocation)."""
    known = known or MacroCalls(data)
    close = known.close
    for m in known.calls():
        if _after_a_call(data, m.start()):
            continue  # the run was followed from its first invocation
        gaps: list[int] = []
        end = close(m.end() - 1)
        while end >= 0:
            at = end + 1
            while at < len(data) and data[at] in b" \t\n":
                at += 1
            following = MACRO_CALL.match(data, at)
            if following is None or at == end + 1:
                break
            gaps.append(at - 1)
            end = close(following.end() - 1)
        if gaps and end >= 0 and at < len(data) and data[at] in b"),":
            for gap in gaps:
                out[gap] = 44  # `,`


def _after_a_call(data: bytes, start: int) -> bool:
    """Whether `)` then blanks come just before ``start`` (a run's second
    invocation or later: its first one decided the run)."""
    at = start - 1
    while at >= 0 and data[at] in b" \t\n":
        at -= 1
    return at >= 0 and data[at] == 41 and at < start - 1


# a macro argument that starts with a digit but is no number (`2dimtest`,
# `2d_tensor`): gtest pastes it into a name; a number keeps its suffix
# (`2u`, `1.5f`, `0x1F`, `1e-3`, `16_KiB`)
_DIGIT_ARGUMENT = re.compile(rb"(?<=[(,])([ \t]*)(\d[\w.']*)(?=[ \t]*[,)])")
_NUMBER = re.compile(rb"0[xX][\da-fA-F']+[uUlLzZ]*|0[bB][01']+[uUlLzZ]*|"
                     rb"[\d']+\.?[\d']*(?:[eE][+-]?\d+)?[uUlLfFzZ]*|[\d'.]+_\w+")


def digit_led_macro_names(data: bytes, out: bytearray, known: MacroCalls | None = None) -> None:
    """`TEST(TritonCatTest, 2dimtest) {`: the grammar reads `2dimtest` as a
    bad number and loses the test body to file scope; as `_dimtest` the
    macro reads as the function it defines."""
    known = known or MacroCalls(data)
    for m in known.calls():
        end = known.close(m.end() - 1)
        if end < 0:
            continue
        for arg in _DIGIT_ARGUMENT.finditer(data, m.end() - 1, end):
            if _NUMBER.fullmatch(arg.group(2)) is None:
                out[arg.start(2)] = 95  # `_`


def ends_statement(data: bytes, end: int) -> bool:
    """What closes at ``end`` can end a statement: nothing but a comment
    follows on its line, and the next code line does not go on with the
    expression (it starts with none of ``NOT_AFTER_STATEMENT``)."""
    line_end = data.find(b"\n", end)
    line_end = len(data) if line_end < 0 else line_end
    rest = data[end:line_end].strip()
    if rest and not rest.startswith(b"//"):
        return False
    skip = COMMENT_LINES.match(data, line_end)
    following = data[skip.end() if skip else line_end:][:1]
    return not (following and following in NOT_AFTER_STATEMENT)


def close_paren(data: bytes, start: int, limit: int = 4000) -> int:
    """The index after the `)` matching the `(` at ``start``, or -1."""
    depth = 0
    stop = min(len(data), start + limit)
    i = start
    while i < stop:
        c = data[i]
        if c == 40:
            depth += 1
        elif c == 41:
            depth -= 1
            if depth == 0:
                return i + 1
        elif c in (34, 39):  # skip a string or char literal
            j = i + 1
            while j < stop and data[j] != c and data[j] != 10:
                j += 2 if data[j] == 92 else 1
            i = j
        i += 1
    return -1


def blank_range(out: bytearray, start: int, end: int) -> None:
    for i in range(start, end):
        if out[i] not in (10, 13):
            out[i] = 32


def literal_led(regex: re.Pattern[bytes], data: bytes, literal: bytes, where: str) -> Iterator[re.Match[bytes]]:
    """``regex.finditer(data)`` for a pattern every match of which holds
    ``literal``, tried only where a match can start (round 34: a pattern that
    begins with a look-behind, ``\\b`` or ``(?m)^`` has no fast scan in ``re``,
    which tries it at every byte): at each occurrence of the literal (``where``
    "at": a match starts with it), just after it ("after": the pattern begins
    with a look-behind ending with it), or at the start of its line ("line":
    the pattern begins with ``(?m)^`` and the literal is on a match's first
    line). The places come in order, each at or after the last match's end,
    so the first that matches is ``finditer``'s next match (no pattern given
    here matches empty; ``match`` at a position sees the bytes before it)."""
    done, tried = 0, -1
    at = data.find(literal)
    while at >= 0:
        start = at if where == "at" else at + len(literal) if where == "after" else data.rfind(b"\n", 0, at) + 1
        if start >= done and start != tried:
            tried = start
            found = regex.match(data, start)
            if found is not None:
                yield found
                done = found.end()
        at = data.find(literal, at + 1)
