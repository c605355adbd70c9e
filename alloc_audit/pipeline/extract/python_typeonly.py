"""Code that never runs because it only exists for a type checker: its
allocations are not sites. Two provable shapes:

- the body of ``if TYPE_CHECKING:`` (also ``typing.TYPE_CHECKING``), which is
  false at run time (its ``else`` branch runs and keeps its sites), and the
  body of ``if False:`` or ``if 0:`` (dead code, kept for reference);
- a type-level test file: a file under a ``stubs`` or ``typings`` directory
  where some function declares a local by annotation only (``x: Tensor``),
  never assigns it and then reads it, so running the function would raise
  ``NameError``; such files are written for pyre/mypy, never executed. A
  file under ``stubs/`` whose functions assign what they read (a hand-written
  fake backend, a mock) keeps its sites.

Part of the Python extractor (``python_sites.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

_STUB_DIRS = frozenset({"stubs", "typings"})
_TYPE_CHECKING = re.compile(r"^(?:(?:typing\.)?TYPE_CHECKING|False|0)$")


def type_checking_file(source: bytes) -> bool:
    """The cheap gate for ``in_type_checking``."""
    return b"TYPE_CHECKING" in source or b"if False" in source or b"if 0" in source


def in_type_checking(ext: PythonExtractor, node: Any) -> bool:
    """Whether ``node`` lies in the body of an ``if TYPE_CHECKING:``, ``if False:`` or ``if 0:``."""
    child = node
    parent = node.parent
    while parent is not None:
        if parent.type == "if_statement" and child == parent.child_by_field_name("consequence"):
            condition = parent.child_by_field_name("condition")
            if condition is not None and _TYPE_CHECKING.match(ext.src.text(condition, 60).strip()):
                return True
        child, parent = parent, parent.parent
    return False


def type_level_file(path: str, root: Any) -> bool:
    """Whether the file is a type-level test file (see the module text)."""
    if _STUB_DIRS.isdisjoint(p.lower() for p in path.split("/")[:-1]):
        return False
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            body = node.child_by_field_name("body")
            if body is not None and _declares_unbound_read(node, body):
                return True
        stack.extend(node.children)
    return False


def _declares_unbound_read(function: Any, body: Any) -> bool:
    """Some local of ``function`` is declared by a bare annotation, never
    bound (assignment, loop, ``as``, walrus, import, parameter, global) and
    read."""
    declared: set[bytes] = set()
    bound: set[bytes] = set()
    reads: dict[bytes, int] = {}
    parameters = function.child_by_field_name("parameters")
    if parameters is not None:
        bound.update(_names(parameters))
    stack = [body]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in ("function_definition", "class_definition", "lambda"):
            name = node.child_by_field_name("name")
            if name is not None:
                bound.add(name.text)
            continue  # a nested scope binds its own names
        if kind == "assignment":
            left = node.child_by_field_name("left")
            if node.child_by_field_name("right") is None and left is not None and left.type == "identifier":
                declared.add(left.text)
                continue
            if left is not None:
                bound.update(_names(left))
        elif kind in ("augmented_assignment", "for_statement", "for_in_clause"):
            left = node.child_by_field_name("left")
            if left is not None:
                bound.update(_names(left))
        elif kind in ("as_pattern_target", "global_statement", "nonlocal_statement", "import_statement",
                      "import_from_statement", "except_clause"):
            bound.update(_names(node))
        elif kind == "named_expression":
            name = node.child_by_field_name("name")
            if name is not None:
                bound.add(name.text)
        elif kind == "identifier":
            reads[node.text] = reads.get(node.text, 0) + 1
        elif kind == "attribute":
            obj = node.child_by_field_name("object")
            if obj is not None:
                stack.append(obj)
            continue  # `.name` is no read of a local
        elif kind == "type":
            continue  # annotations read no local at run time
        elif kind == "keyword_argument":
            value = node.child_by_field_name("value")
            if value is not None:
                stack.append(value)
            continue
        stack.extend(node.children)
    return any(reads.get(name, 0) and name not in bound for name in declared)


def _names(node: Any) -> set[bytes]:
    out: set[bytes] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            out.add(n.text)
        elif n.type != "attribute" and n.type != "subscript":  # `a.b = ...`, `a[i] = ...` bind no local
            stack.extend(n.children)
    return out
