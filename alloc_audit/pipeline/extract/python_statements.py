"""Python statements: assignments (and the call each right-hand side
targets), returns, control-flow blocks and ``with`` statements. Part of
the Python extractor (``python.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ...model import Assign, Block, Language, Return, With, WithItem
from . import common

if TYPE_CHECKING:
    from .python import PythonExtractor

_HOST_WORD = re.compile(r"cpu|meta", re.I)
_ENTRY = re.compile(r"[A-Za-z_][\w.]*\[.*\]", re.S)  # `_CACHE[key]`: an entry of a container
_HOST_DEVICES = frozenset({"cpu", "meta"})
_FLOW_ENDS = {"return_statement", "raise_statement", "continue_statement", "break_statement"}

def assigns(ext: PythonExtractor, assigns: list[Any], augs: list[Any], dels: list[Any]) -> list[Assign]:
    """Assignments, and (in ``rhs_targets``) the target of every call that
    is a whole right-hand side: such assignments are recorded as the
    call's target instead (asking a node for its parent walks the tree)."""
    out: list[Assign] = []
    rhs = ext.rhs_targets
    chained: set[int] = set()  # inner links of `a = b = value`, handled with the outermost
    left_id, right_id, type_id, operator_id = common.field_ids(Language.PYTHON, "left", "right", "type", "operator")
    for node in assigns:
        if node.start_byte in chained:
            continue
        left = node.child_by_field_id(left_id)
        right = node.child_by_field_id(right_id)
        type_node = node.child_by_field_id(type_id)
        if left is None:
            continue
        lefts = [left]
        while right is not None and right.type == "assignment" and right.child_by_field_id(left_id) is not None:
            # `self.init_snapshot = snapshot = MemorySnapshot(...)`: every target is a target
            chained.add(right.start_byte)
            lefts.append(right.child_by_field_id(left_id))
            right = right.child_by_field_id(right_id)
        if len(lefts) > 1:
            names = [ext.src.text(n) for n in lefts]
            kept = next((n for n in names if n.startswith(("self.", "cls."))), names[-1])
            if right is not None and right.type == "call":
                rhs[right.start_byte] = kept  # recorded as the call's target, like `x = call()`
                entries = tuple(n for n in names if n != kept and _ENTRY.fullmatch(n))
                if entries and kept.isidentifier():
                    # `_CACHE[key] = eng = Engine(...)`: the entries hold what the call's target holds
                    out.append(Assign(scope=ext.scope_name(ext.scope_of(node)), line=right.start_point[0] + 1,
                                      targets=entries, value=kept))
                continue
            out.append(Assign(scope=ext.scope_name(ext.scope_of(node)), line=node.start_point[0] + 1,
                              targets=tuple(names), value=ext.src.text(right) if right is not None else ""))
            continue
        if right is not None and right.type == "call":
            rhs[right.start_byte] = ext.src.text(left)
            if type_node is None:
                continue
        if right is not None and right.type == "conditional_expression":
            # `out = output if output is not None else torch.empty(...)`
            branches = right.named_children
            for branch in (branches[0], branches[-1]) if len(branches) >= 3 else ():
                if branch.type == "call":
                    rhs[branch.start_byte] = ext.src.text(left)
        if left.type in ("pattern_list", "tuple_pattern", "list_pattern"):
            targets = tuple(ext.src.text(c) for c in left.named_children)
        else:
            targets = (ext.src.text(left),)
        out.append(
            Assign(
                scope=ext.scope_name(ext.scope_of(node)),
                line=node.start_point[0] + 1,
                targets=targets,
                value=ext.src.text(right) if right is not None else "",
                type=ext.src.text(type_node) if type_node is not None else None,
            )
        )
    for node in augs:
        left = node.child_by_field_id(left_id)
        right = node.child_by_field_id(right_id)
        op = node.child_by_field_id(operator_id)
        out.append(
            Assign(
                scope=ext.scope_name(ext.scope_of(node)),
                line=node.start_point[0] + 1,
                targets=(ext.src.text(left),),
                value=ext.src.text(right) if right is not None else "",
                op=ext.src.raw(op) if op is not None else "+=",
            )
        )
    for node in dels:
        deleted: list[str] = []
        for child in node.named_children:
            if child.type == "expression_list":
                deleted += [ext.src.text(c) for c in child.named_children]
            else:
                deleted.append(ext.src.text(child))
        out.append(Assign(ext.scope_name(ext.scope_of(node)), node.start_point[0] + 1, tuple(deleted), "", "del"))
    out.sort(key=lambda a: a.line)
    return out


def returns(ext: PythonExtractor, nodes: list[Any]) -> list[Return]:
    out = []
    for node in nodes:
        value = node.named_child(0) if node.named_child_count else None
        out.append(Return(ext.scope_name(ext.scope_of(node)), node.start_point[0] + 1,
                          ext.src.text(value) if value is not None else ""))
    return out


def blocks(ext: PythonExtractor, caps: dict[str, list[Any]]) -> list[Block]:
    blocks = common.Blocks(ext.src, lambda node: ext.scope_name(ext.scope_of(node)), _FLOW_ENDS)
    add = blocks.add
    consequence, condition, body_id, right_id = common.field_ids(Language.PYTHON, "consequence", "condition", "body",
                                                                 "right")

    for node in caps.get("if", ()):
        add("if", node, node.child_by_field_id(consequence), node.child_by_field_id(condition), node)
    for node in caps.get("elif", ()):
        add("elif", node, node.child_by_field_id(consequence), node.child_by_field_id(condition),
            node.parent)
    for node in caps.get("else", ()):
        parent = node.parent
        kind = {"if_statement": "else", "try_statement": "try-else"}.get(parent.type, "loop-else")
        add(kind, node, node.child_by_field_id(body_id), None, parent)
    for node in caps.get("loop", ()):
        test = node.child_by_field_id(condition) or node.child_by_field_id(right_id)
        add("loop", node, node.child_by_field_id(body_id), test, node)
    for node in caps.get("try", ()):
        add("try", node, node.child_by_field_id(body_id), None, node)
    for node in caps.get("except", ()):
        body = next((c for c in node.named_children if c.type == "block"), None)
        add("except", node, body, None, node.parent)
    for node in caps.get("finally", ()):
        body = next((c for c in node.named_children if c.type == "block"), None)
        add("finally", node, body, None, node.parent)
    return blocks.in_order()


def withs(ext: PythonExtractor, nodes: list[Any]) -> list[With]:
    out = []
    for node in nodes:
        body = node.child_by_field_name("body")
        if body is None:
            continue
        items = tuple(WithItem(callee, args, alias) for callee, args, alias in ext.with_items(node))
        out.append(With(ext.scope_name(ext.scope_of(node)), ext.src.span(node), ext.src.span(body), items))
    return out


def host_locals(assigns: list[Assign], call_targets: set[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """(scope, name) of locals only ever assigned a literal "cpu"/"meta"
    device string (`dev = "cpu"`): a tensor made with `device=dev` is host
    memory. A name also bound from a call in the same scope is not (the
    same name bound from a call in another function is another local)."""
    from .python_sites import classify_device

    host = _HOST_WORD.search

    def on_host(a: Assign) -> bool:
        # only a value that says cpu or meta (in any case) can classify as either
        return len(a.targets) == 1 and a.op == "=" and host(a.value) is not None \
            and classify_device(a.value) in _HOST_DEVICES

    # the locals some binding puts on the host (few, in few files), then those of them bound any other way
    found = {(a.scope, a.targets[0]) for a in assigns if on_host(a)} - call_targets
    if found:
        found -= {(a.scope, target) for a in assigns if not on_host(a) for target in a.targets}
    return frozenset(found)
