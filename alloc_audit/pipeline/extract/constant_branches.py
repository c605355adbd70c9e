"""Branches on a function-local constant that cannot run: the calls and
allocations in them are not sites (Python and C++). The neighbour of
``dead_code`` (code after an unconditional exit).

Input: a file's ``if`` statements (and Python ``elif`` clauses). Output:
the statement lists that never run, so the extractor drops the calls and
sites inside them (a call dropped is no derived site either).

A test that reads one name (``NAME``, ``not NAME``/``!NAME``, Python's
``NAME is None``/``NAME is not None``) always has the same value when the
name is a local of the function holding the test and every binding of it
in that function binds the same literal (``True``/``False``/``None``/an
integer; C++ ``true``/``false``/``nullptr``/``NULL``/an integer). The
branch the value does not take is dead:

    lora_dir = None
    if lora_dir is not None:              # never true
        lora = ExLlamaLora(model, cfg, f)  # no site

    bool use_fp32 = true;
    if (OpType == FP32) use_fp32 = true;  // the same literal
    if (use_fp32) { ... } else {
      device_malloc(&gamma, n);           // no site
    }

False cases (the branch is live): a name with a binding that is not that
literal (another literal, a call, a name, an augmented assignment, ``++``),
one bound by a ``for``/``with``/``except``/walrus/unpacking/``del``/import,
a parameter, a global (no binding in the function, or a ``global``/
``nonlocal`` statement), a C++ name declared without an initialiser or as a
reference, whose address is taken (``&flag``), captured by a lambda, or
handed as a bare argument to a call that runs before the branch ends or in
a loop around it (a reference parameter can set it), and code at module
level. One function's text decides it, whatever else the scan holds.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from typing import Any

_PY_TEST = re.compile(r"^\(*\s*(not\s+)?([A-Za-z_]\w*)\s*\)*$|^\(*\s*([A-Za-z_]\w*)\s+is\s+(not\s+)?None\s*\)*$")
_CPP_TEST = re.compile(r"^\(\s*(!\s*)?\(*\s*([A-Za-z_]\w*)\s*\)*\s*\)$")
_PY_LITERALS = frozenset({"true", "false", "none", "integer"})
_CPP_LITERALS = frozenset({"true", "false", "null", "number_literal", "nullptr"})
_CPP_FUNCTIONS = frozenset({"function_definition", "lambda_expression"})
# where a name is bound (Python) when the occurrence is in the node's left part
_PY_BINDERS = frozenset({"augmented_assignment", "for_statement", "for_in_clause", "named_expression"})
_PY_BINDING_PARENTS = frozenset({
    "pattern_list", "tuple_pattern", "list_pattern", "as_pattern_target", "as_pattern", "global_statement",
    "nonlocal_statement", "delete_statement", "parameters", "default_parameter", "typed_parameter",
    "typed_default_parameter", "lambda_parameters", "aliased_import", "dotted_name", "list_splat_pattern",
    "dictionary_splat_pattern", "case_pattern", "keyword_pattern", "with_item", "except_clause",
    "import_from_statement", "import_statement"})
_PY_PACKING = frozenset({"tuple", "list", "parenthesized_expression", "expression_list"})
# a binding of a literal in the text (`%s` the name): a cheap test before the function's nodes are walked
# (a word character, `.` or `>` before the name makes it another name or a member)
_PY_BINDS = re.compile(rb"\b([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=[ \t]*(?:True|False|None|\d)")
_CPP_BINDS = re.compile(rb"\b([A-Za-z_]\w*)[ \t]*=[ \t]*(?:true|false|nullptr|NULL|\d)")
# the same matches found from their `= literal` part (a literal `=` that `re` finds fast): a match's
# name is the leftmost word before it that the rest of the pattern joins to that `=` (literal_bindings)
_LITERAL_AFTER = {False: re.compile(rb"=[ \t]*(?:True|False|None|\d)"),
                  True: re.compile(rb"=[ \t]*(?:true|false|nullptr|NULL|\d)")}
_NAME_BEFORE = {False: re.compile(rb"\b([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?\Z"),
                True: re.compile(rb"\b([A-Za-z_]\w*)[ \t]*\Z")}
_WORD = re.compile(rb"[A-Za-z_$][\w$]*")
_BEFORE = frozenset(bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.>")
_CPP_LOOPS = frozenset({"for_statement", "for_range_loop", "while_statement", "do_statement"})


class ConstantBranches:
    """The dead statement lists of one file, found once from its ``if``
    nodes (``ifs``; for Python also its ``elif`` nodes, read through their
    ``if``). ``ancestry`` is the extractor's ``Ancestry`` (``Node.parent``
    walks down from the root on every call)."""

    def __init__(self, source: bytes, ifs: list[Any], functions: list[Any], ancestry: Any, cpp: bool = False) -> None:
        self.src = source
        self.cpp = cpp
        self.parent_of: Callable[[Any], Any | None] = ancestry.parent
        self.ancestors_of: Callable[[Any], list[Any]] = ancestry.ancestors
        self.functions = sorted(functions, key=lambda n: n.start_byte)  # the file's function (and lambda) nodes
        self._starts = [n.start_byte for n in self.functions]
        self._seen: dict[tuple[int, str], list[Any]] = {}  # (function start, name) -> its identifier nodes
        self._binds: dict[str, list[int]] | None = None  # name -> where the file's text binds it to a literal
        self.dead: list[Any] = []
        for node in ifs:
            self.dead += self._dead_parts(node)
        self.ranges = sorted((n.start_byte, n.end_byte) for n in self.dead)

    def holds(self, node: Any) -> bool:
        """Whether ``node`` lies in a dead statement list."""
        start, end = node.start_byte, node.end_byte
        return any(a <= start and end <= b for a, b in self.ranges)

    def _text(self, node: Any) -> str:
        return self.src[node.start_byte:node.end_byte].decode("utf-8", "replace")

    def _dead_parts(self, node: Any) -> list[Any]:
        if self.cpp:
            value = self._value(node, node.child_by_field_name("condition"))
            if value is None:
                return []
            part = node.child_by_field_name("alternative" if value else "consequence")
            return [part] if part is not None else []
        # Python: the `if` and its `elif`s in order; the first constant-true test
        # makes every later clause dead, a constant-false one its own body
        out: list[Any] = []
        clauses = [node, *node.children_by_field_name("alternative")]
        for i, clause in enumerate(clauses):
            if clause.type == "else_clause":
                break
            value = self._value(node, clause.child_by_field_name("condition"))
            if value is None:
                continue
            if value:
                out += clauses[i + 1:]
                break
            body = clause.child_by_field_name("consequence")
            if body is not None:
                out.append(body)
        return out

    def _value(self, if_node: Any, condition: Any) -> bool | None:
        """The test's constant truth value, or None when it is not known."""
        if condition is None:
            return None
        text = " ".join(self._text(condition).split())
        m = (_CPP_TEST if self.cpp else _PY_TEST).match(text)
        if m is None:
            return None
        if self.cpp or m.group(2):
            negated, name, none_test = bool(m.group(1)), m.group(2), False
        else:
            negated, name, none_test = bool(m.group(4)), m.group(3), True
        if name in ("True", "False", "None", "true", "false", "nullptr", "NULL"):
            return None  # a literal test is the programmer's own switch; not this rule's
        literal = self._constant(if_node, name)
        if literal is None:
            return None
        if none_test:
            truth = literal in ("None",)
        else:
            truth = literal not in ("False", "None", "false", "nullptr", "NULL") and not _zero(literal)
        return truth != negated

    def _constant(self, if_node: Any, name: str) -> str | None:
        """The one literal every binding of ``name`` in the function holding
        ``if_node`` binds; None if there is none or anything else binds it."""
        func = self._function_of(if_node)
        if func is None:
            return None  # module level
        if self._binds is None:  # where the file's text binds a name to a literal, found in one pass
            self._binds = literal_bindings(self.src, self.cpp)
        if not any(func.start_byte <= at < func.end_byte for at in self._binds.get(name, ())):
            return None  # no `NAME = literal` in the function's text: nothing to walk
        occurrences = self._occurrences(func, name)
        if self.cpp and not any(self._declared_here(occ) for occ in occurrences):
            return None  # a member or a global: other functions set it
        literals: set[str] = set()
        for occ in occurrences:
            bound = self._cpp_binding(occ, if_node) if self.cpp else self._py_binding(occ)
            if bound is False:
                continue  # a read
            if not isinstance(bound, str):
                return None
            literals.add(bound)
        return literals.pop() if len(literals) == 1 else None

    def _function_of(self, node: Any) -> Any | None:
        """The innermost function holding ``node`` (a nested one starts after the one it is in)."""
        at = bisect.bisect_right(self._starts, node.start_byte)
        for func in reversed(self.functions[:at]):
            if node.end_byte <= func.end_byte:
                return func
        return None

    def _occurrences(self, func: Any, name: str) -> list[Any]:
        """The identifier nodes spelling ``name`` in ``func``, found in its text (once per function and name)."""
        key = (func.start_byte, name)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._find(func, name)
        return found

    def _find(self, func: Any, name: str) -> list[Any]:
        out = []
        key = name.encode()
        for at in word_starts(self.src, func.start_byte, func.end_byte, key):
            node = func.descendant_for_byte_range(at, at + len(key))
            if node is not None and node.type == "identifier" and node.start_byte == at \
                    and node.end_byte == at + len(key):
                out.append(node)
        return out

    def _literal(self, node: Any | None, kinds: frozenset[str]) -> str | None:
        if node is None or node.type not in kinds:
            return None
        text = self._text(node)
        if node.type in ("integer", "number_literal") and not re.fullmatch(r"\d+", text):
            return None
        return text

    def _py_binding(self, occ: Any) -> str | bool | None:
        """False for a read, the literal a plain ``NAME = literal`` binds,
        None for any other binding."""
        parent = self.parent_of(occ)
        if parent is None:
            return False
        if parent.type == "assignment" and parent.child_by_field_name("left") == occ:
            return self._literal(parent.child_by_field_name("right"), _PY_LITERALS)
        if parent.type == "keyword_argument" and parent.child_by_field_name("name") == occ:
            return False  # `f(name=...)`: a keyword, not the variable
        if parent.type == "attribute" and parent.child_by_field_name("attribute") == occ:
            return False  # `x.name`
        if parent.type in _PY_BINDING_PARENTS:
            return None
        child = occ
        while parent is not None and parent.type in _PY_PACKING:  # `a, b = ...` read as a tuple
            child, parent = parent, self.parent_of(parent)
        if parent is None:
            return False
        if parent.type == "assignment" and child is not occ and parent.child_by_field_name("left") == child:
            return None
        if parent.type in _PY_BINDERS and child in (parent.child_by_field_name("left"),
                                                    parent.child_by_field_name("name")):
            return None
        return False

    def _cpp_binding(self, occ: Any, if_node: Any) -> str | bool | None:
        parent = self.parent_of(occ)
        if parent is None:
            return False
        kind = parent.type
        if kind == "init_declarator":
            if parent.child_by_field_name("declarator") == occ:
                return self._literal(parent.child_by_field_name("value"), _CPP_LITERALS)
            declarator = parent.child_by_field_name("declarator")
            return None if declarator is not None and declarator.type == "reference_declarator" else False
        if kind == "assignment_expression" and parent.child_by_field_name("left") == occ:
            operator = parent.child_by_field_name("operator")
            if operator is None or self._text(operator) != "=":
                return None
            return self._literal(parent.child_by_field_name("right"), _CPP_LITERALS)
        if kind in ("declaration", "pointer_declarator", "reference_declarator", "array_declarator",
                    "parameter_declaration", "optional_parameter_declaration", "update_expression",
                    "lambda_capture_specifier", "structured_binding_declarator"):
            return None  # declared without a value, a parameter, `++`, captured
        if kind == "pointer_expression" and self._text(parent).lstrip().startswith("&"):
            return None  # its address taken
        if kind == "argument_list":
            call = self.parent_of(parent)
            if call is None or call.start_byte < if_node.end_byte or any(
                    loop.start_byte <= call.start_byte < loop.end_byte for loop in self._loops_around(if_node)):
                return None  # a call that may set it through a reference before the test is read
        return False

    def _declared_here(self, occ: Any) -> bool:
        """``occ`` is the name a declaration in the function declares (``bool f = true;``)."""
        parent = self.parent_of(occ)
        return parent is not None and parent.type == "init_declarator" and \
            parent.child_by_field_name("declarator") == occ

    def _loops_around(self, node: Any) -> list[Any]:
        out = []
        for parent in self.ancestors_of(node):
            if parent.type in _CPP_FUNCTIONS:
                break
            if parent.type in _CPP_LOOPS:
                out.append(parent)
        return out


def literal_bindings(source: bytes, cpp: bool) -> dict[str, list[int]]:
    """Name -> the starts of the matches of ``_PY_BINDS`` (``_CPP_BINDS``)
    in ``source`` (``finditer``'s, less those after a byte of ``_BEFORE``).

    The same matches, found without trying the pattern at every byte (it
    starts with ``\\b`` and a class: ``re`` has no fast scan for it, ~70 ns
    a byte). Nothing before a match's ``=`` can be ``=`` (a name, blanks, a
    ``:`` annotation of ``[^=\\n]*``), so the ``=`` a match ends with is the
    first one after its start, and its start lies after the ``=`` before
    that: each ``=`` that a literal follows (``_LITERAL_AFTER``, searched
    fast from its literal ``=``) has as its match the leftmost place after
    the previous ``=`` (and after the previous match's end: ``finditer``'s
    matches do not overlap) where the pattern's name part reaches it
    (``_NAME_BEFORE``, searched in that stretch only). The match's end is
    the end of the literal's, as in the pattern."""
    out: dict[str, list[int]] = {}
    name_before = _NAME_BEFORE[cpp]
    end = 0  # the end of the last match: the next one starts there or after
    for m in _LITERAL_AFTER[cpp].finditer(source):
        at = m.start()
        lo = max(source.rfind(b"=", 0, at) + 1, end)
        lo = source.rfind(b"\n", lo, at) + 1 or lo  # nor a line break
        name = name_before.search(source, lo, at)
        if name is None:
            continue
        start = name.start()
        if start == 0 or source[start - 1:start] not in _BEFORE:
            out.setdefault(name.group(1).decode("utf-8", "replace"), []).append(start)
        end = m.end()
    return out


def word_starts(source: bytes, start: int, end: int, key: bytes) -> list[int]:
    """Where ``_WORD.finditer(source, start, end)`` has a match that is
    ``key``, found without reading every word of the stretch (round 34: the
    per-function word table cost more than its few lookups).

    A position ``p`` starts a match exactly when its byte can start a word
    and the run of word bytes (``[\\w$]``) before it, back to ``start``,
    holds no byte that can start one: such a byte (the leftmost of the run;
    only digits precede it) starts a match that runs on over ``p``, while a
    run of digits starts none and nothing reaches across a non-word byte.
    The match is ``key`` when ``key`` is a whole word there (``key`` itself a
    word, the byte after it not a word byte, or ``end``)."""
    out: list[int] = []
    if _WORD.fullmatch(key) is None:
        return out  # no match of `_WORD` spells it
    size = len(key)
    at = source.find(key, start, end)
    while at >= 0:
        after = at + size
        if after == end or source[after] not in _WORD_BYTES:
            before = at - 1
            while before >= start and source[before] in _DIGITS:
                before -= 1
            if before < start or source[before] not in _WORD_BYTES:
                out.append(at)
        at = source.find(key, at + 1, end)
    return out


_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")  # `[\w$]` in bytes
_DIGITS = frozenset(b"0123456789")


def _zero(literal: str) -> bool:
    return literal.isdigit() and int(literal) == 0
