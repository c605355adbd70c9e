"""C++ names, types and declarators: template arguments stripped, smart
pointers unwrapped, the name a declarator declares. Shared by the C++
extractor's parts (``cpp.py``, ``cpp_sites.py``, ``cpp_statements.py``)
and the index's C++ resolution."""

from __future__ import annotations

import re
from typing import Any

from .common import Source

_SMART = re.compile(r"^(?:std::)?(?:unique_ptr|shared_ptr|weak_ptr|optional|reference_wrapper)<(.*)>$")
MAKERS = {"std::make_unique", "std::make_shared", "make_unique", "make_shared"}
PRIMITIVE_LIKE = re.compile(
    r"^(?:const\s+)?(?:unsigned|signed|int|long|short|char|bool|float|double|void|auto|size_t|u?int\d+_t)\b")


def strip_templates(name: str) -> str:
    """``a::B<T, C<D>>::f<int>`` -> ``a::B::f``; whitespace removed."""
    if "<" not in name and " " not in name and "\n" not in name:
        return name[2:] if name.startswith("::") else name
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and not ch.isspace():
            out.append(ch)
    result = "".join(out)
    return result[2:] if result.startswith("::") else result


def unwrap_type(type_text: str) -> str:
    """The class a declared type refers to: smart pointers, const, pointers
    and references unwrapped, template arguments dropped."""
    t = " ".join(type_text.split())
    t = re.sub(r"^(?:const|volatile|static|mutable|inline|constexpr)\s+", "", t)
    t = t.rstrip("*& ").replace(" ", "")
    for _ in range(3):
        m = _SMART.match(t)
        if not m:
            break
        t = m.group(1)
    return strip_templates(t).rstrip("*&")


def function_declarator(node: Any | None) -> Any | None:
    """The function_declarator under pointer/reference declarators."""
    for _ in range(8):
        if node is None:
            return None
        if node.type == "function_declarator":
            return node
        inner = node.child_by_field_name("declarator")
        if inner is None and node.type == "reference_declarator" and node.named_child_count:
            inner = node.named_children[-1]  # `T& f(...)`: the grammar gives it no field name
        node = inner
    return None


def declared_name(src: Source, node: Any | None) -> str:
    for _ in range(8):
        if node is None:
            return ""
        if node.type in ("identifier", "field_identifier"):
            return src.raw(node)
        if node.type == "structured_binding_declarator":
            return ",".join(src.raw(c) for c in node.named_children if c.type == "identifier")
        inner = node.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in node.named_children if c.type in ("identifier", "field_identifier")), None)
        node = inner
    return ""
