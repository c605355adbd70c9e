"""Allocations that hold no memory because a fake tensor mode runs them:
the body of a function registered as an operator's fake/abstract/meta
implementation (``@torch.library.register_fake("ns::op")``,
``@op.register_fake``, ``@impl_abstract(...)``, ``@register_meta(...)``,
``@torch.library.impl(lib, "op", "Meta")``), and code lexically inside
``with FakeTensorMode(...):`` or ``with fake_mode:`` where ``fake_mode`` is
bound to ``FakeTensorMode(...)`` in the same function. Part of the Python
extractor (``python_sites.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

# a file without one of these words has no fake scope (the cheap gate)
_WORDS = (b"register_fake", b"impl_abstract", b"register_meta", b"FakeTensorMode", b"Meta")
_FAKE_DECORATOR = re.compile(
    r"""^@\s*(?:[\w.]+\.)?(?:register_fake|impl_abstract|register_meta|register_fake_class)\b"""
    r"""|^@\s*(?:torch\.)?(?:library\.)?impl\(.*["']Meta["']\s*\)\s*$""", re.S)
_FAKE_MODE_CALL = re.compile(r"^(?:[\w.]+\.)?FakeTensorMode\(")


def may_have_fake_scopes(source: bytes) -> bool:
    return any(word in source for word in _WORDS)


def in_fake_scope(ext: PythonExtractor, node: Any) -> bool:
    """Whether ``node`` runs under a fake tensor mode (see the module text)."""
    src = ext.src
    parent = node.parent
    while parent is not None:
        kind = parent.type
        if kind == "with_statement" and _fake_with(ext, parent):
            return True
        if kind == "function_definition":
            holder = parent.parent
            if holder is not None and holder.type == "decorated_definition":
                for child in holder.children:
                    if child.type == "decorator" and _FAKE_DECORATOR.search(src.text(child, 300)):
                        return True
        parent = parent.parent
    return False


def _fake_with(ext: PythonExtractor, node: Any) -> bool:
    src = ext.src
    for clause in node.children:
        if clause.type != "with_clause":
            continue
        for item in clause.children:
            if item.type != "with_item":
                continue
            value = item.child_by_field_name("value")
            if value is None:
                continue
            if value.type == "as_pattern" and value.children:
                value = value.children[0]
            text = src.text(value, 200).strip()
            if _FAKE_MODE_CALL.match(text):
                return True
            if value.type == "identifier" and _bound_to_fake_mode(ext, node, text):
                return True
    return False


def _bound_to_fake_mode(ext: PythonExtractor, node: Any, name: str) -> bool:
    """``name = torch._subclasses.FakeTensorMode(...)`` in the function (or
    module) that holds the ``with``."""
    scope = node.parent
    while scope is not None and scope.type not in ("function_definition", "module"):
        scope = scope.parent
    if scope is None:
        return False
    body = ext.src.data[scope.start_byte:node.start_byte].decode("utf-8", "replace")
    return re.search(rf"(?<![\w.]){re.escape(name)}\s*=\s*(?:[\w.]+\.)?FakeTensorMode\(", body) is not None
