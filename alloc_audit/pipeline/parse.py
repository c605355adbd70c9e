"""Stage 2, parse: source bytes -> tree-sitter tree.

Python files use tree-sitter-python; C++ and CUDA files use tree-sitter-cuda,
which reads kernel launches (``<<<...>>>``) and CUDA qualifiers that
tree-sitter-cpp cannot, also in headers (see ``parse_source`` for the
measurement behind the choice). Before parsing native code, attribute-like
macros (``__align__(16)``, ``__launch_bounds__(256)``) and declaration-specifier
macros (``CUTLASS_DEVICE``) are blanked with spaces of the same length, so
every position in the tree is a position in the file.

tree-sitter always returns a tree: syntax errors become ERROR/MISSING nodes
and the rest of the file is still read. ``error_summary`` describes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import tree_sitter as ts

from ..model import Language
from .parse_declarations import repair_declarations
from .parse_macros import (
    MacroCalls,
    blank_range,
    digit_led_macro_names,
    ends_statement,
    guarded_statement_macros,
    juxtaposed_macro_arguments,
    literal_led,
)
from .parse_mask import blank, mask_macros


@cache
def language(grammar: Language) -> ts.Language:
    if grammar is Language.PYTHON:
        import tree_sitter_python as mod
    elif grammar is Language.CPP:
        import tree_sitter_cpp as mod  # type: ignore[no-redef]
    else:
        import tree_sitter_cuda as mod  # type: ignore[no-redef]
    return ts.Language(mod.language())


@cache
def _parser(grammar: Language) -> ts.Parser:
    return ts.Parser(language(grammar))


@dataclass(frozen=True)
class Parsed:
    tree: Any  # tree_sitter.Tree; not a fact, never cached
    grammar: Language
    source: bytes  # the bytes that were parsed (masked for native code)


def parse_source(data: bytes, lang: Language, attribute_macros: tuple[str, ...] = (),
                 specifier_macros: tuple[str, ...] = (), lone_macro_lines: bool = True) -> Parsed:
    """Parse one file. Native code always goes through tree-sitter-cuda: it
    is a superset of tree-sitter-cpp, and measured on 1,430 native files of
    three engines (after macro masking) it leaves 317 files with error nodes
    where tree-sitter-cpp leaves 566 and the better of the two per file 316;
    trying both would cost a second parse of every file with an error for
    one file's gain (the scan's ``stats.parse_errors`` counts the files left
    with errors; bench/results/census-depth.md tracks it per tree)."""
    if lang is Language.PYTHON:
        tree = _parser(Language.PYTHON).parse(data)
        if tree.root_node.has_error:
            # `return a, *rest` (valid since Python 3.8) is an error to the
            # grammar; the star blanked (`return a,  rest`) reads the same to
            # the census, at the same positions. So is an annotation `x:
            # list[int] or None` (a subscript, then `or`: the grammar reads the
            # subscript as a generic type, which takes no `or`); as `x:
            # list[int] |  None` it is the union it means. A parameter's
            # annotation the same (`shape: tuple[int, ...] or list[int]`)
            repaired = data
            for _ in range(8):  # one star (one `] or`) per line and pass
                again = _ANNOTATION_OR.sub(rb"\1| ", _RETURN_STARRED.sub(rb"\1 ", repaired))
                again = _PARAMETER_OR.sub(rb"\1| ", again)
                if again == repaired:
                    break
                repaired = again
            if repaired != data:
                second = _parser(Language.PYTHON).parse(repaired)
                if error_bytes(second.root_node) < error_bytes(tree.root_node):
                    return Parsed(second, Language.PYTHON, repaired)
        return Parsed(tree, Language.PYTHON, data)
    masked = mask_macros(data, attribute_macros, specifier_macros, lone_macro_lines)
    if masked and not masked.endswith(b"\n"):
        # a directive on the last line needs its newline (a header ending in
        # `#define X` with none is an error to the grammar); appended after
        # every byte of the file, so no position moves
        masked += b"\n"
    tree = _parser(Language.CUDA).parse(masked)
    if tree.root_node.has_error:
        # idioms the grammar cannot read (statement macros without `;`,
        # `#if` inside a parameter list, ...): blank them and keep the tree
        # with fewer errors. Only files with errors pay for the second parse.
        best, best_source, best_errors = tree, masked, error_bytes(tree.root_node)
        repaired, unconditioned = _repairs(masked, attribute_macros)
        if repaired != masked:
            second = _parser(Language.CUDA).parse(repaired)
            errors = error_bytes(second.root_node)
            if errors < best_errors:
                best, best_source, best_errors = second, repaired, errors
        if best.root_node.has_error:
            # conditionals that cut through a statement (`} else\n#endif\n{`):
            # every branch kept, the directive lines blanked
            flat = _DIRECTIVE.sub(blank, repaired)
            if flat != repaired:
                third = _parser(Language.CUDA).parse(flat)
                third_errors = error_bytes(third.root_node)
                if third_errors < best_errors:
                    best, best_source, best_errors = third, flat, third_errors
            if best.root_node.has_error and flat != repaired:
                # conditionals that open a header in one branch and close it
                # after `#endif` (`#if A\n for (x;\n#else\n for (y;\n#endif\n
                # i++) {`), or whose branches each close a namespace: one
                # branch kept per conditional, the `#else` one where it exists
                single = _keep_one_branch(unconditioned)
                fourth = _parser(Language.CUDA).parse(single)
                if error_bytes(fourth.root_node) < best_errors:
                    best, best_source = fourth, single
        return Parsed(best, Language.CUDA, best_source)
    return Parsed(tree, Language.CUDA, masked)


# a starred element after a comma on a `return`/`yield` line
_RETURN_STARRED = re.compile(rb"(?m)(^[ \t]*(?:return|yield)[ \t][^\n#]*?,[ \t]*)\*(?=[\w(\[])")
# an annotation statement (`name: T[...] or None`, no `=` before the `or`) whose type is a
# subscript followed by `or`; no keyword heads it (`else: a[0] or b` is no annotation)
_ANNOTATION_OR = re.compile(rb"(?m)(^[ \t]*(?!(?:else|try|finally|lambda|except|case|match|with|for|while|if|elif"
                            rb"|def|class|return|yield|assert|del|print|global|nonlocal|async|await)\b)"
                            rb"[A-Za-z_]\w*[ \t]*:[ \t]*[^\n=#:]*\][ \t]+)or(?=[ \t])")
# the same type as a parameter's annotation (`def f(self, shape: tuple[int, ...] or list[int],`):
# a name after `(` or `,` (one alone on its line is an annotation statement to the grammar)
_PARAMETER_OR = re.compile(rb"([(,][ \t]*[A-Za-z_]\w*[ \t]*:[ \t]*[A-Za-z_][\w.]*\[[^\n=#:()\[\]]*\][ \t]+)or(?=[ \t])")

# a directive with its `\\`-continued lines (`#if defined(X) && \\` + condition)
_DIRECTIVE = re.compile(rb"(?m)^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|else|endif)\b(?:[^\n]*\\\n)*[^\n]*")


def _keep_one_branch(data: bytes) -> bytes:
    """Blank every conditional directive (with its continued lines) and all
    branches but one: the `#else` branch where there is one, else the first."""
    lines = data.split(b"\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    out = bytearray(data)
    stack: list[list[tuple[int, int, bytes]]] = []  # open conditionals: (first, last line, word)
    i = 0
    while i < len(lines):
        first = i
        while lines[i].rstrip().endswith(b"\\") and i + 1 < len(lines):
            i += 1
        stripped = lines[first].lstrip()
        word = stripped[1:].lstrip()[:6] if stripped.startswith(b"#") else b""
        if word.startswith(b"if"):
            stack.append([(first, i, b"if")])
        elif stack and (word.startswith(b"elif") or word.startswith(b"else")):
            stack[-1].append((first, i, word[:4]))
        elif stack and word.startswith(b"endif"):
            chain = stack.pop() + [(first, i, b"endif")]
            keep = len(chain) - 2 if chain[-2][2] == b"else" else 0
            for k, (head, head_end, _) in enumerate(chain):
                body_end = chain[k + 1][0] if k + 1 < len(chain) else head_end + 1
                stop = head_end + 1 if k == keep else body_end
                blank_range(out, starts[head], starts[stop] - 1)
        i += 1
    return bytes(out)


_STATEMENT_MACRO = re.compile(rb"(?m)^[ \t]*_*[A-Z][A-Z0-9_]*[ \t]*\(")
# round 34: a member a macro declares, given a constant default (`DEFINE_ARG(int64_t, n) = 0;`,
# a model-arguments struct): the grammar reads the call as a method declaration and breaks on
# the initialiser; the initialiser is blanked, never one that calls anything
_CONSTANT_INITIALISER = re.compile(rb"[ \t]*(=(?!=)[ \t]*[^;(){}\n=]*);")
# `typename T::Args{...}`, `typename FF<T>::Config(...)` (a braced or functional cast)
_TYPENAME_BRACE = re.compile(rb"\btypename(?=\s+[\w:]+(?:<[^<>;{}()]*>)?(?:::\w+)*\s*[{(])")
_LAMBDA_QUALIFIER = re.compile(rb"(?<=\])[ \t]*(?:__device__|__host__)(?:[ \t]+(?:__device__|__host__))*")
# `DS_D_INLINE void f(`, `template <int N> HD_INLINE T g(`: an ALL_CAPS name
# followed by a return type and a function name can only be an inline or
# attribute macro (a type or a variable would be followed by one name, not two)
_DECL_MACRO = re.compile(
    rb"(?m)^[ \t]*(?:template[ \t]*<[^;{}\n]*>[ \t]*)?([A-Z][A-Z0-9]*_[A-Z0-9_]+)(?=[ \t]+(?:(?:static|"
    rb"inline|const|constexpr|__device__|__host__|__global__|__forceinline__)[ \t]+)*[A-Za-z_][\w:]*"
    rb"(?:<[^;{}()\n]*>)?[ \t*&]+[A-Za-z_]\w*[ \t]*\()")
# round 31: the same before a destructor or an operator (`TCNN_HOST_DEVICE ~GPUMemory() {`,
# `TCNN_HOST_DEVICE T& operator[](size_t i)`): nothing but an attribute or inline macro stands there
_MEMBER_MACRO = re.compile(
    rb"(?m)^[ \t]*([A-Z][A-Z0-9]*_[A-Z0-9_]+)(?=[ \t]+(?:(?:static|inline|const|constexpr|virtual)[ \t]+)*"
    rb"(?:~[A-Za-z_]\w*[ \t]*\(|[A-Za-z_][\w:]*(?:<[^;{}()\n]*>)?[ \t*&]+operator\b))")
_ENUM_BASE = re.compile(rb"(?<=\benum)[ \t]*:[ \t]*[\w:]+(?=\s*\{)")  # `typedef enum : int {`
_STATEMENT_ARGUMENT = re.compile(rb"(?<=\))[ \t]*;(?=\s*\))")  # `MACRO(..., f(x);)`
_STRING_MACRO = re.compile(rb'(?<=")[ \t]+[A-Z][A-Z0-9_]*(?:\([^()"\n]*\))?(?=[ \t]+")')  # `"a" HINT(128) "b"`
_PRAGMA_LINE = re.compile(rb"(?m)^[ \t]*#[ \t]*pragma\b[^\n]*")  # `for (...)\n#pragma unroll\n for`
# `using typename Base::half_t;` in a class body: the `typename` of a using-declaration
_USING_TYPENAME = re.compile(rb"(?<=\busing)[ \t]+typename\b")
# `[](half2_t v) ALWAYSINLINE {`: an ALL_CAPS name between a parameter list and a
# body (or a trailing return type) can only be an attribute macro
_BODY_MACRO = re.compile(rb"(?<=\))[ \t]+(?:mutable[ \t]+)?([A-Z][A-Z0-9_]*[A-Z0-9])(?=[ \t]*(?:->[^{};\n]*)?\{)")
_TYPE_KEYWORD_ARGUMENT = re.compile(
    rb"[(,]\s*(?:(?:unsigned|signed|long|short)\s+)*(?:float|double|int|char|bool|void|long|short)\s*[,)]")
# `template class X<float>;`, `extern template struct ns::Y<T, 2>;`: an explicit
# instantiation of a class is valid C++, but both grammars read it with a
# MISSING declarator; without its `class`/`struct` keyword it reads cleanly
_CLASS_INSTANTIATION = re.compile(
    rb"(?m)^[ \t]*(?:extern[ \t]+)?template[ \t]+(class|struct|union)[ \t]+[\w:]+[ \t]*<[^;{}]*>[\w:]*[ \t]*;")


def repair_idioms(data: bytes, conditionals_in_parens: bool = True, attribute_macros: tuple[str, ...] = ()) -> bytes:
    """Blank (same length, newlines kept) what tree-sitter-cuda cannot read:
    a statement macro invocation without `;` alone on its lines
    (`REGISTER_EXTENSION(NAME)`, `CALL_IF(8, 8, 256)`), the `typename` of a
    braced construction (`typename T::Args{...}`), an empty-brace default
    argument (`Args args = {}`), the `__device__` of a
    lambda, and the `#else` branches of conditionals inside a parenthesised
    list (`void f(int a,\n#ifndef USE_ROCM\n...#else\n...#endif`, a continued
    `#if A && \\` included), an inline macro before a return type
    (`DS_D_INLINE void f(`; round 31: before a destructor or an operator
    too), the base of `typedef enum : int {`, the `;` of
    a statement passed as a macro argument (`M(..., f(x);)`), a statement
    macro with a type keyword argument (`DISPATCH(kFloat, float);`), the
    functional `typename T::Config(...)`, `#pragma` lines (between a `for`
    header and its body), a `/* */` inside a `#define` body and a string
    macro between literals (`"..." HINT(128) "..."`), the `typename` of a
    using-declaration (`using typename Base::half_t;`) and an attribute macro
    between a parameter list and a body (`[](T v) ALWAYSINLINE {`), the
    `class` of an explicit instantiation (`template class X<float>;`), a
    statement macro without `;` as the body of an `if`/`for`/`while`/`else`
    on its line (`if (a) TORCH_CHECK(b, "...")`: an empty statement `;` in its
    place), and a name a macro pastes that starts with a digit
    (`TEST(Suite, 2dimtest)`: `_dimtest`), macro invocations side by side
    as one argument (`AT_DISPATCH_CASE(...) AT_DISPATCH_CASE(...)`: a `,`
    in the blank between them), and the C++17/20 and builtin
    idioms of ``parse_declarations`` (braced default arguments,
    `__builtin_bit_cast(T, x)`, `operator()<T>(`, `new T *[n]`, a
    using-declarator list, `>>>` closing templates, an attribute macro
    over lines, a macro before a constructor's initialiser list, comments
    in a `#define`). Positions do not move, so every span is still a span
    of the file."""
    with_conditionals, without = _repairs(data, attribute_macros)
    return with_conditionals if conditionals_in_parens else without


def _repairs(data: bytes, attribute_macros: tuple[str, ...]) -> tuple[bytes, bytes]:
    """``repair_idioms(data)`` and ``repair_idioms(data, False)`` from one
    pass: the flag decides only the last repair (the conditionals in
    parentheses), every step before runs the same on the same bytes, so the
    second is the first as it stands before that step (round 34: the fourth
    parse asked for it again, a whole second repair)."""
    out = bytearray(data)
    known = MacroCalls(data)
    statements = list(_STATEMENT_MACRO.finditer(data))
    for m in statements:
        end = known.close(m.end() - 1)
        if end < 0:
            continue
        if not ends_statement(data, end):
            init = _CONSTANT_INITIALISER.match(data, end)
            if init is not None:  # `DEFINE_ARG(float, theta) = 1e4f;`: a declared member's default
                blank_range(out, init.start(1), init.end(1))
            continue
        if b"{" in data[m.start():end]:  # a lambda or a body: keep what it holds
            continue
        blank_range(out, m.start(), end)
    for m in literal_led(_TYPENAME_BRACE, data, b"typename", "at"):
        blank_range(out, m.start(), m.end())
    if b"__device__" in data or b"__host__" in data:  # every match holds one
        for m in _LAMBDA_QUALIFIER.finditer(data):
            blank_range(out, m.start(), m.end())
    for regex in (_DECL_MACRO, _BODY_MACRO, _MEMBER_MACRO):
        for m in regex.finditer(data):
            blank_range(out, m.start(1), m.end(1))
    for m in literal_led(_CLASS_INSTANTIATION, data, b"template", "line"):
        blank_range(out, m.start(1), m.end(1))
    for regex, found in ((_ENUM_BASE, literal_led(_ENUM_BASE, data, b"enum", "after")),
                         (_STATEMENT_ARGUMENT, _STATEMENT_ARGUMENT.finditer(data)),
                         (_PRAGMA_LINE, literal_led(_PRAGMA_LINE, data, b"pragma", "line")),
                         (_STRING_MACRO, literal_led(_STRING_MACRO, data, b'"', "after")),
                         (_USING_TYPENAME, literal_led(_USING_TYPENAME, data, b"using", "after"))):
        for m in found:
            if regex is _STATEMENT_ARGUMENT and _in_for_header(data, m.start()):
                continue  # `for (auto it = v.begin(); it != v.end();)`: the header's own `;`
            blank_range(out, m.start(), m.end())
    _blank_type_argument_macros(data, out, statements, known)
    _type_arguments_as_values(data, out, known)
    guarded_statement_macros(data, out, known)
    juxtaposed_macro_arguments(data, out, known)
    digit_led_macro_names(data, out, known)
    repair_declarations(data, out, attribute_macros)
    without = bytes(out)
    _blank_conditionals_in_parens(data, out)
    return bytes(out), without


_FOR_OPEN = re.compile(rb"\bfor[ \t]*$")


def _in_for_header(data: bytes, at: int, limit: int = 2000) -> bool:
    """The `(` enclosing ``at`` opens a `for` header (round 31: the `;` of
    `it != v.end();)`, a loop with no increment, is the header's)."""
    depth = 0
    for i in range(at - 1, max(-1, at - limit), -1):
        c = data[i]
        if c == 41:  # `)`
            depth += 1
        elif c == 40:  # `(`
            if depth == 0:
                return _FOR_OPEN.search(data, max(0, i - 40), i) is not None
            depth -= 1
        elif c in b"{}":
            return False
    return False


def _blank_type_argument_macros(data: bytes, out: bytearray, statements: list[re.Match[bytes]],
                                known: MacroCalls) -> None:
    """`DISPATCH_LAYER_NORM(kFloat, float);`: a statement macro that takes a
    type keyword as an argument is no expression; blank the invocation
    (``statements``: ``_STATEMENT_MACRO``'s matches)."""
    for m in statements:
        end = known.close(m.end() - 1)
        if end < 0 or b"{" in data[m.start():end]:
            continue
        if _TYPE_KEYWORD_ARGUMENT.search(data, m.end() - 1, end):
            blank_range(out, m.start(), end)


# a macro argument that is nothing but a type keyword sequence (`unsigned long long`),
# in an ALL_CAPS macro call anywhere (MACRO_CALL: `if (ALL_OF(p, n, bool, true))`)
_TYPE_WORDS = re.compile(rb"\s*(?:(?:unsigned|signed|long|short|const)\s+)*"
                         rb"(?:float|double|int|char|bool|void|long|short)\s*")


def _type_arguments_as_values(data: bytes, out: bytearray, known: MacroCalls) -> None:
    """`ALL_OF(p, n, bool, true)` inside an expression: a type keyword as a
    macro argument is no expression, and blanking the call would leave the
    expression empty. The keywords become a `0` and spaces (same length)."""
    for m in known.calls():
        end = known.close(m.end() - 1)
        if end < 0 or b"{" in data[m.start():end] or out[m.start()] == 32:  # blanked as a statement
            continue
        depth, start = 0, m.end()
        for i in range(m.end(), end):
            c = data[i]
            if c in b"([":
                depth += 1
            elif c in b")]" and depth:
                depth -= 1
            elif (c == 44 and depth == 0) or i == end - 1:  # `,` or the call's `)`
                word = _TYPE_WORDS.fullmatch(data, start, i)
                if word is not None:
                    lead = len(data[start:i]) - len(data[start:i].lstrip())
                    blank_range(out, start + lead, i)
                    out[start + lead] = 48  # `0`
                start = i + 1


def _blank_conditionals_in_parens(data: bytes, out: bytearray) -> None:
    """Inside an open parenthesis, keep the first branch of `#if...#endif`
    and blank the directives and the other branches."""
    if b"#" not in data:
        return
    depth = 0
    skipping = 0  # nesting level of the conditional being handled (0: none)
    blank_body = False
    pos = 0
    backslash = -1  # where the directive line before ended in `\\`, or -1
    for line in data.split(b"\n"):
        start, pos = pos, pos + len(line) + 1
        stripped = line.lstrip()
        if backslash >= 0:  # a directive's continuation: blanked with its head
            if out[backslash] == 32:
                blank_range(out, start, start + len(line))
            backslash = start + len(line.rstrip()) - 1 if line.rstrip().endswith(b"\\") else -1
            continue
        if stripped.startswith(b"#"):
            backslash = start + len(line.rstrip()) - 1 if line.rstrip().endswith(b"\\") else -1
            word = stripped[1:].lstrip().split(b" ", 1)[0].split(b"\t", 1)[0].split(b"(", 1)[0]
            if skipping:
                if word.startswith(b"if"):
                    skipping += 1
                elif word == b"endif":
                    skipping -= 1
                    if skipping == 0:
                        blank_range(out, start, start + len(line))
                        blank_body = False
                        continue
                elif word in (b"else", b"elif") and skipping == 1:
                    blank_body = True
                if skipping == 1 or blank_body:
                    blank_range(out, start, start + len(line))
                continue
            if depth > 0 and word in (b"if", b"ifdef", b"ifndef"):
                skipping, blank_body = 1, False
                blank_range(out, start, start + len(line))
            continue
        if blank_body:
            blank_range(out, start, start + len(line))
            continue
        code = line.split(b"//", 1)[0]
        depth = max(0, depth + code.count(b"(") - code.count(b")"))


def _error_nodes(root: Any, limit: int = 10_000) -> list[Any]:
    """ERROR and MISSING nodes, found without recursion (deep code is safe)."""
    found: list[Any] = []
    stack = [root]
    while stack and len(found) < limit:
        node = stack.pop()
        if node.is_error or node.is_missing:
            found.append(node)
            continue
        if node.has_error:
            stack.extend(node.children)
    return found


def error_bytes(root: Any) -> int:
    return sum(max(1, n.end_byte - n.start_byte) for n in _error_nodes(root))


def error_summary(parsed: Parsed) -> str | None:
    root = parsed.tree.root_node
    if not root.has_error:
        return None
    nodes = sorted(_error_nodes(root), key=lambda n: n.start_byte)
    if not nodes:
        return f"syntax error ({parsed.grammar.value} grammar); facts from the rest of the file are kept"
    first = nodes[0]
    line, col = first.start_point[0] + 1, first.start_point[1] + 1
    what = "missing token" if first.is_missing else "syntax error"
    more = f", {len(nodes)} error regions" if len(nodes) > 1 else ""
    return (
        f"{what} at line {line}, column {col} ({parsed.grammar.value} grammar{more}); "
        "sites in the rest of the file are still reported"
    )


# CPython refuses more than 100 indentation levels ("too many levels of
# indentation"); tree-sitter-python's scanner keeps its indent stack in a
# fixed buffer and crashes the whole process (SIGSEGV) past about 500 levels.
# A file nested deeper than Python allows cannot be valid code: it is refused
# before parsing, the same way in every process (--jobs 1 or N).
MAX_INDENT_LEVELS = 100
_DEEP_LINE = re.compile(rb"(?m)^[ \t\f]{%d,}\S" % MAX_INDENT_LEVELS)
_SPACES = b" " * MAX_INDENT_LEVELS


def nesting_problem(data: bytes, lang: Language) -> str | None:
    """Why ``data`` must not be handed to the parser, or None. Linear: a
    byte regex finds a line indented by 100 or more characters first (no
    real file has one), and only then are the levels counted."""
    if lang is not Language.PYTHON:
        return None
    if b"\t" not in data and b"\f" not in data and _SPACES not in data:
        return None  # such a line needs 100 blanks in a row, here all spaces (three byte searches, ~40x less CPU)
    if _DEEP_LINE.search(data) is None:
        return None
    levels = [0]
    deepest = 0
    for line_no, line in enumerate(data.splitlines(), 1):
        body = line.lstrip(b" \t\f")
        if not body or body.startswith(b"#"):
            continue
        width = len(line) - len(body)
        while width < levels[-1]:
            levels.pop()
        if width > levels[-1]:
            levels.append(width)
            deepest = max(deepest, len(levels) - 1)
            if deepest > MAX_INDENT_LEVELS:
                return (f"nested more than {MAX_INDENT_LEVELS} indentation levels deep (at line {line_no}); "
                        "Python itself refuses this, and the parser would crash: not parsed")
    return None
