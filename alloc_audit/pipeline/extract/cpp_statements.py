"""C++/CUDA statements: assignments, returns, class member fields and
control-flow blocks. Part of the C++ extractor (``cpp.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ...model import Assign, Block, Field, Return
from . import common
from .cpp_names import declared_name, strip_templates, unwrap_type
from .cpp_sites import strip_this, unwrapped

if TYPE_CHECKING:
    from .cpp import CppExtractor

_FLOW_ENDS = {"return_statement", "throw_statement", "break_statement", "continue_statement", "goto_statement"}

def assignments(ext: CppExtractor, nodes: list[Any], assigns: list[Assign]) -> None:
    for node in nodes:
        left, right, op = (node.child_by_field_name(f) for f in ("left", "right", "operator"))
        if left is None:
            continue
        if right is not None:
            ext.rhs_targets[unwrapped(right).start_byte] = strip_this(ext.src.text(left))
        assigns.append(
            Assign(
                ext.scope_for(node),
                node.start_point[0] + 1,
                (strip_this(ext.src.text(left)),),
                ext.src.text(right) if right is not None else "",
                ext.src.raw(op) if op is not None else "=",
            )
        )


def member_inits(ext: CppExtractor, nodes: list[Any], assigns: list[Assign]) -> None:
    """A constructor's member initialisers (``: _w(tw.get_w()), n_{n}``) as
    assignments in the constructor (``_w = tw.get_w()``), the value the
    text inside the brackets: what the member starts from."""
    for node in nodes:
        name = next((c for c in node.named_children if c.type == "field_identifier"), None)
        value = next((c for c in node.named_children if c.type in ("argument_list", "initializer_list")), None)
        owner = node.parent.parent if node.parent is not None else None
        body = owner.child_by_field_name("body") if owner is not None and owner.type == "function_definition" else None
        if name is None or value is None or body is None:
            continue
        assigns.append(Assign(ext.scope_for(body), node.start_point[0] + 1, (ext.src.text(name),),
                              ext.src.text(value)[1:-1].strip(), "="))


def returns(ext: CppExtractor, nodes: list[Any]) -> list[Return]:
    out = []
    for node in nodes:
        value = next((c for c in node.named_children if c.type != "comment"), None)
        text = ext.src.text(value) if value is not None else ""
        out.append(Return(ext.scope_for(node), node.start_point[0] + 1, text))
    return out


_QUALIFIED = re.compile(r"^(?:(?:const|volatile|mutable)\s+)+")


def fields(ext: CppExtractor, nodes: list[Any]) -> list[Field]:
    out = []
    for node in nodes:
        parent = node.parent
        if parent is None or parent.type != "field_declaration_list":
            continue
        type_node = node.child_by_field_name("type")
        owner_index = ext.scope_index(node)
        if type_node is None or owner_index < 0 or ext.kind_of(owner_index) != "class":
            continue
        for declarator in node.children_by_field_name("declarator"):
            if declarator.type == "function_declarator":
                continue
            name = declared_name(ext.src, declarator)
            if name:
                raw = ext.src.raw(type_node)
                type_name = unwrap_type(raw)
                held = declarator.type in ("field_identifier", "identifier") and \
                    strip_templates(_QUALIFIED.sub("", " ".join(raw.split()))) == type_name
                out.append(Field(ext.qualnames[owner_index], name, type_name, held))
    return out


def blocks(ext: CppExtractor, caps: dict[str, list[Any]]) -> list[Block]:
    blocks = common.Blocks(ext.src, ext.scope_for, _FLOW_ENDS)
    add = blocks.add

    for node in caps.get("if", ()):
        cond = node.child_by_field_name("condition")
        add("if", node, node.child_by_field_name("consequence"), cond, node)
        alt = node.child_by_field_name("alternative")
        if alt is not None:
            body = alt.named_children[-1] if alt.named_child_count else None
            if body is not None and body.type != "if_statement":
                add("else", node, body, None, node)
    for node in caps.get("loop", ()):
        test = node.child_by_field_name("condition")
        add("loop", node, node.child_by_field_name("body"), test, node)
    for node in caps.get("try", ()):
        add("try", node, node.child_by_field_name("body"), None, node)
    for node in caps.get("catch", ()):
        add("except", node, node.child_by_field_name("body"), None, node.parent)
    return blocks.in_order()
