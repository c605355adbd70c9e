"""Stage 2, parse: declaration and expression idioms of C++17/20 and of the
compilers' builtins that tree-sitter-cuda cannot read, blanked in the repair
parse (``parse.repair_idioms``; only files with errors pay). Each repair
writes over bytes in place (same length, newlines kept), so every span is
still a span of the file."""

from __future__ import annotations

import re
from functools import lru_cache

from .parse_macros import blank_range, close_paren, literal_led

# `Dims d = {1, 1, 1}`, `typename T::Args args = {}`, `QuaternionSlerper<U> s = {}\n)`,
# `number<N> = {}`: a braced default argument (a type and a name before it, or
# a template type alone, a `,` or `)` after it, also on the next line); a
# designated initialiser (`.x = {1, 2},`) has no type before its name
# (every regex here starts with a literal, which `re` finds fast; what must
# come before the match is checked after it)
_BRACE_DEFAULT = re.compile(rb"=[ \t]*\{[^{}();\n]*\}(?=\s*[,)])")
_DECLARED_BEFORE = re.compile(rb"(?:[\w>*&][ \t]+[*&]*[A-Za-z_]\w*|>)[ \t]*\Z")
# `__builtin_bit_cast(float, x)`: a type as the first argument of a call
_BIT_CAST = re.compile(rb"__builtin_bit_cast[ \t]*\(")
# `template <> void operator()<float>(float x)`: the explicit template
# arguments of an operator() declared as a specialisation
_OPERATOR_TEMPLATE_ARGS = re.compile(
    rb"operator[ \t]*\([ \t]*\)[ \t]*(<[^;{}()<>]*(?:<[^;{}()<>]*>[^;{}()<>]*)*>)(?=\s*\()")
# `new char const *[n]`, `new Foo*[n]`, `new T*[n]`: an array of pointers (the grammar reads
# no `*` in the type of a new-expression, nor a leading `const`; round 31: a one-letter type too)
_NEW_POINTER_ARRAY = re.compile(
    rb"new[ \t]+(const[ \t]+)?[A-Za-z_](?:[\w:]*\w)?((?:[ \t]+const)?[ \t]*\*[ \t*]*)(?=\[)")
# `delete[] (uint8_t *)p;` (round 31): the grammar reads no `(` after `delete[]`; the
# `[]` blanked, `delete (uint8_t *)p;` reads as the same release of `p`
_DELETE_ARRAY_PAREN = re.compile(rb"\bdelete[ \t]*(\[[ \t]*\])(?=[ \t]*\()")
# `(STACK_OF(GENERAL_NAME) *)names` (round 31): a C cast to a pointer to a type a
# function-like macro names; the macro's parentheses become `_` (`STACK_OF_GENERAL_NAME_ *`), one type name
_MACRO_TYPE_CAST = re.compile(rb"\([ \t]*[A-Z][A-Z0-9_]*(\()[ \t]*\w+[ \t]*(\))[ \t]*\*+[ \t]*\)(?=[ \t]*[A-Za-z_(])")
# `using std::cout, std::cerr;` (a C++17 using-declarator list): the
# declarators after the first (`=` excluded: an alias declaration)
_USING_LIST = re.compile(rb"using[ \t]+(?:typename[ \t]+)?[\w:]*::\w+[ \t]*(,[^;{}()=<>/]*)(?=;)")
# `X<std::tuple_size_v<torch_arg_t<A>>>{}`: three template argument lists
# closed at once read as the `>>>` of a kernel launch; the innermost list of a
# single name becomes part of a name (`torch_arg_t_A_`). A launch's `>>>` is
# followed by its `(` (left alone)
_TRIPLE_CLOSE = re.compile(rb"<[\w:]+>(?=>>(?!>)(?!\s*\())")
# `OPUS_D Foo(void* p) : inner(p) {}`: an ALL_CAPS (or `__x__`) name before a
# constructor with a member-initialiser list can only be an attribute or
# inline macro (`Name(...) :` declares nothing else)
_CONSTRUCTOR_MACRO = re.compile(
    rb"(?m)^[ \t]*([A-Z][A-Z0-9_]*|__[a-z_]+__)(?=[ \t]+(?:(?:constexpr|explicit|inline)[ \t]+)*"
    rb"[A-Za-z_]\w*[ \t]*\([^;{}()]*(?:\([^;{}()]*\)[^;{}()]*)*\)[ \t]*(?:noexcept[ \t]*)?\n?[ \t]*:(?!:))")
# a `#define` with its `\\`-continued lines, and a `/* */` comment in it
_DEFINE = re.compile(rb"#[ \t]*define\b(?:[^\n]*\\\r?\n)*[^\n]*")
_BLOCK_COMMENT = re.compile(rb"/\*.*?\*/", re.DOTALL)


def repair_declarations(data: bytes, out: bytearray, attribute_macros: tuple[str, ...] = ()) -> None:
    """Blank, in ``out``, a braced default argument, the type argument of
    `__builtin_bit_cast`, the explicit template arguments of `operator()`,
    the `*`s of `new T *[n]` (joined into one name), the `[]` of `delete[] (T *)p`,
    the parentheses of a macro naming a cast's pointee type (`(STACK_OF(X) *)p`), the declarators after
    the first of a using-declaration list, the innermost list of a `>>>`
    that closes three template lists, an attribute macro whose parentheses
    span lines (`__align__(\\n alignof(T<A, 4>))`), a macro before a
    constructor with a member-initialiser list, and the comments inside a
    `#define`."""
    for m in _BRACE_DEFAULT.finditer(data):
        start = m.start()
        while start > 0 and data[start - 1] in b" \t":
            start -= 1
        if _DECLARED_BEFORE.search(data, max(0, start - 200), start):
            blank_range(out, start, m.end())
    for m in _BIT_CAST.finditer(data):
        if _word_start(data, m.start()):
            _blank_first_argument(data, out, m.end() - 1)
    for m in _OPERATOR_TEMPLATE_ARGS.finditer(data):
        before = data[max(0, m.start() - 40):m.start()].rstrip()
        # a declaration, not a call (`f.template operator()<true>()` needs its arguments)
        if _word_start(data, m.start()) and not before.endswith((b"template", b".", b"->", b"::")):
            blank_range(out, m.start(1), m.end(1))
    for m in _NEW_POINTER_ARRAY.finditer(data):
        if not _word_start(data, m.start()):
            continue
        if m.group(1):
            blank_range(out, m.start(1), m.end(1))
        for i in range(m.start(2), m.end(2)):  # `char const *` -> `char_const__`: one name
            if data[i] in b" \t*":
                out[i] = 95
    for m in literal_led(_DELETE_ARRAY_PAREN, data, b"delete", "at"):
        blank_range(out, m.start(1), m.end(1))
    for m in _MACRO_TYPE_CAST.finditer(data):
        for group in (1, 2):
            for i in range(m.start(group), m.end(group)):
                out[i] = 95
    for m in _USING_LIST.finditer(data):
        if not data[data.rfind(b"\n", 0, m.start()) + 1:m.start()].strip():  # first on its line
            blank_range(out, m.start(1), m.end(1))
    for m in _TRIPLE_CLOSE.finditer(data):
        if m.start() > 0 and not _word_start(data, m.start()):  # `Z<A>`: a name before the `<`
            out[m.start()] = out[m.end() - 1] = 95
    for m in _CONSTRUCTOR_MACRO.finditer(data):
        blank_range(out, m.start(1), m.end(1))
    if attribute_macros:
        _blank_attribute_calls_over_lines(data, out, attribute_macros)
    if b"/*" in data:
        _blank_define_comments(data, out)


def _blank_first_argument(data: bytes, out: bytearray, paren: int) -> None:
    """Blank the first argument of the call whose `(` is at ``paren`` and the
    `,` after it (`f(unsigned short, x)` -> `f(               x)`)."""
    depth = 0
    for i in range(paren + 1, min(len(data), paren + 400)):
        c = data[i]
        if c in b"(<[":
            depth += 1
        elif c in b")>]":
            if depth == 0:
                return  # one argument: nothing to blank
            depth -= 1
        elif c == 44 and depth == 0:  # `,`
            blank_range(out, paren + 1, i + 1)
            return
        elif c in b";{}/":  # no type; or a comment, which a blank would open up
            return


def _word_start(data: bytes, at: int) -> bool:
    """No identifier character just before ``at``."""
    return at == 0 or not (data[at - 1] == 95 or chr(data[at - 1]).isalnum())


@lru_cache(maxsize=16)
def _attribute_names(attribute_macros: tuple[str, ...]) -> tuple[tuple[bytes, re.Pattern[bytes]], ...]:
    """Per configured name: its literal tail (after a `*`) and a regex that
    matches the whole name ending at the end of what it is given."""
    return tuple((m.rsplit("*", 1)[-1].encode(),
                  re.compile(rb"(?<![\w#])(?<!define )(?<!define\t)"
                             + re.escape(m.encode()).replace(rb"\*", rb"\w*") + rb"\Z"))
                 for m in attribute_macros)


def _blank_attribute_calls_over_lines(data: bytes, out: bytearray, attribute_macros: tuple[str, ...]) -> None:
    """`__align__(\n alignof(T<A, 4>))`: an attribute macro whose parentheses
    span lines (the mask blanks those on one line)."""
    for tail, whole in _attribute_names(attribute_macros):
        at = data.find(tail)
        while at >= 0:
            end_name = at + len(tail)
            paren = end_name
            while paren < len(data) and data[paren] in b" \t":
                paren += 1
            name = whole.search(data, max(0, at - 80), end_name) if data[paren:paren + 1] == b"(" else None
            if name is not None:
                end = close_paren(data, paren)
                # a comment's `//` is never blanked
                if end > 0 and b"\n" in data[paren:end] and b"/" not in data[paren:end]:
                    blank_range(out, name.start(), end)
            at = data.find(tail, end_name)


def _blank_define_comments(data: bytes, out: bytearray) -> None:
    """A `/* */` in a `#define` ends its body early for the grammar (a comment
    with anything after it on its line, or over several lines): blanked, the
    `\\` that continues a line kept."""
    for define in _DEFINE.finditer(data):
        if b"/*" not in define.group(0):
            continue
        for m in _BLOCK_COMMENT.finditer(data, define.start(), define.end()):
            for i in range(m.start(), m.end()):
                c = data[i]
                if c in (10, 13) or (c == 92 and data[i + 1:i + 2] in (b"\n", b"\r")):
                    continue
                out[i] = 32
