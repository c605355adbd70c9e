"""A ``*_like`` copy of a tensor that is provably empty holds no memory:
a zero-element tensor is no allocation. Two provable shapes:

- the call lies in the body of ``if X.numel() == 0:`` or
  ``if prod(X.shape) == 0:`` (``math.prod``/``np.prod``/``torch.prod`` too)
  and copies ``X`` itself (``torch.empty_like(X, dtype=d)``);
- the call copies ``ctx.A`` in the body of ``if ctx.flag:`` where the only
  ``ctx.flag = True`` of the class sits in the body of such an empty-input
  guard on ``V`` that also stores ``ctx.A = V`` (the autograd
  ``ctx.is_empty`` convention: ``backward`` returns ``zeros_like(ctx.A)``
  for an empty forward input).

- round 32: an ``assert X.numel() == 0`` (or the ``prod`` form) earlier in
  the statement list that holds the call, ``X`` not bound again between
  them (``assert p.numel() == 0; torch.zeros_like(p)``).

- round 33: a move (``X.to(d)``, ``X.cuda()``, a dtype given or not) of ``X``
  or of a view or cast of it (``X.reshape((0, 5)).to(d)``, ``X[:, 0].long()``)
  in the body of such an ``if``, ``X``'s root bound by no statement of that
  body above the move (``empty_move``): zero elements, nothing copied. True:
  ``if idx.numel() == 0: return idx.to(device=d, dtype=torch.long)``. False:
  ``if idx.numel() == 0: idx = torch.arange(n); idx.to(d)``; ``if
  idx.numel() > 0: idx.to(d)``; a move of another tensor in that body.

A guard joined with ``or``/``and``, an assert in another block (a branch
above) or before a rebinding of ``X``, or a copy of another tensor, keeps
its site. Part of the Python extractor (``python_sites.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor

_NAME = r"[A-Za-z_][\w.]*"
_EMPTY = (rf"(?:(?:math\.|np\.|numpy\.|torch\.)?prod\(\s*({_NAME})\.shape\s*\)|({_NAME})\.numel\(\))"
          r"\s*==\s*0")
_EMPTY_CONDITION = re.compile(rf"^\(?{_EMPTY}\)?$")
# a statement that binds a name: an assignment (not a comparison), `del`, a walrus
_BINDS = re.compile(r"(?<![=!<>])=(?!=)|\bdel\b|:=")
# `assert X.numel() == 0`, `X` any expression (`self.w[name]`), compared as text with the copied one
_EMPTY_ASSERT = re.compile(r"^assert\s+\(?(?:(?:math\.|np\.|numpy\.|torch\.)?prod\(\s*(.+?)\.shape\s*\)|"
                           r"(.+?)\.numel\(\))\s*==\s*0\)?\s*(?:,.*)?$", re.S)
_FLAG = re.compile(r"^(ctx\.\w+)$")
# `name = value` on a line of its own (one pattern, read by its captures)
_ASSIGN = re.compile(r"^[ \t]*([A-Za-z_][\w.]*)[ \t]*=[ \t]*([A-Za-z_][\w.]*)[ \t]*$", re.M)
# `if <empty guard on V>:` then its indented block (lines indented deeper)
_GUARD_BLOCK = re.compile(rf"^([ \t]*)if[ \t]+{_EMPTY}[ \t]*:[ \t]*\n((?:\1[ \t]+.*\n|[ \t]*\n)*)", re.M)


def may_have_empty_guards(source: bytes) -> bool:
    """The cheap gate for ``empty_guarded``."""
    return b"numel() == 0" in source or b".shape) == 0" in source


def empty_guarded(ext: PythonExtractor, node: Any, copied: str) -> bool:
    """Whether the ``*_like`` at ``node`` copies a tensor provably empty there."""
    copied = copied.strip()
    if _asserted_empty(ext, node, copied):
        return True
    child = node
    parent = node.parent
    while parent is not None and parent.type not in ("function_definition", "lambda"):
        if parent.type == "if_statement" and child == parent.child_by_field_name("consequence"):
            condition = parent.child_by_field_name("condition")
            text = ext.src.text(condition, 120).strip() if condition is not None else ""
            m = _EMPTY_CONDITION.match(text)
            if m is not None and (m.group(1) or m.group(2)) == copied:
                return True
            flag = _FLAG.match(text)
            if flag is not None and copied.startswith("ctx.") and _flag_marks_empty(ext, node, flag.group(1), copied):
                return True
        child, parent = parent, parent.parent
    return False


# a receiver that is a name or member, then views and casts of it (`x.reshape((0, 5))`, `x[:, 0].long()`)
_VIEWS = r"(?:view|reshape|flatten|squeeze|unsqueeze|contiguous|detach|t|long|int|float|half|bfloat16|double|bool)"
_VIEWED = re.compile(rf"({_NAME})(?:\s*\.\s*{_VIEWS}\s*\((?:[^()]|\([^()]*\))*\)|\[[^\[\]]*\])*")


def empty_move(ext: PythonExtractor, node: Any) -> bool:
    """Round 33: the move at ``node`` (``R.to(...)``, ``R.cuda()``) copies ``R``, a tensor ``X`` (or a view or
    cast of it) the enclosing ``if X.numel() == 0:`` proves empty, ``X``'s root bound by no statement of that
    body above the move: zero elements, no device memory."""
    fn = node.children[0] if node.children else None
    receiver = fn.child_by_field_name("object") if fn is not None and fn.type == "attribute" else None
    m = _VIEWED.fullmatch(ext.src.text(receiver, 200).strip()) if receiver is not None else None
    if m is None:
        return False
    copied = m.group(1)
    root = copied.split(".")[0]
    binds = re.compile(rf"(?<![\w.]){re.escape(root)}\s*(?:[-+*/@%&|^]|//|\*\*)?=(?!=)|\bdel\s+{re.escape(root)}\b|"
                       rf"\bfor\s+[^:]*(?<![\w.]){re.escape(root)}\b[^:]*\bin\b|:=")
    child = node
    parent = node.parent
    while parent is not None and parent.type not in ("function_definition", "lambda", "class_definition"):
        if parent.type == "if_statement" and child == parent.child_by_field_name("consequence"):
            condition = parent.child_by_field_name("condition")
            text = ext.src.text(condition, 120).strip() if condition is not None else ""
            found = _EMPTY_CONDITION.match(text)
            if found is not None and (found.group(1) or found.group(2)) == copied:
                statement = node  # the statement of the body that holds the move: it binds only after it
                while statement.parent is not None and statement.parent != child:
                    statement = statement.parent
                above = ext.src.data[child.start_byte:statement.start_byte].decode("utf-8", "replace")
                return binds.search(above) is None
            return False  # a nearer `if` of another test: the guard is read only as the innermost one
        child, parent = parent, parent.parent
    return False


def _flag_marks_empty(ext: PythonExtractor, node: Any, flag: str, copied: str) -> bool:
    # the class that holds the call (forward and backward), else the file
    holder = enclosing(node.parent, "class_definition")
    scope = holder if holder is not None else ext.tree.root_node
    data = ext.src.data[scope.start_byte:scope.end_byte].decode("utf-8", "replace") + "\n"
    if sum(1 for m in _ASSIGN.finditer(data) if m.group(1) == flag and m.group(2) == "True") != 1:
        return False
    for m in _GUARD_BLOCK.finditer(data):
        value = m.group(2) or m.group(3)
        stores = {(a.group(1), a.group(2)) for a in _ASSIGN.finditer(m.group(4))}
        if (flag, "True") in stores and (copied, value) in stores:
            return True
    return False


def _asserted_empty(ext: PythonExtractor, node: Any, copied: str) -> bool:
    """An ``assert copied.numel() == 0`` above the statement holding ``node`` in its own statement list, with
    no statement between that binds anything (an assignment, ``del``, a compound statement) (round 32)."""
    statement = node
    while statement.parent is not None and statement.parent.type not in ("block", "module"):
        if statement.parent.type in ("function_definition", "lambda", "class_definition"):
            return False
        statement = statement.parent
    sibling = statement.prev_named_sibling
    while sibling is not None:
        text = ext.src.text(sibling, 400).strip()
        if sibling.type == "assert_statement":
            m = _EMPTY_ASSERT.match(text)
            if m is not None and (m.group(1) or m.group(2)).strip() == copied:
                return True
        elif sibling.type != "comment" and _BINDS.search(text) is not None or sibling.type in (
                "for_statement", "while_statement", "with_statement", "if_statement", "try_statement"):
            return False  # a statement that may bind a name of `copied` between
        sibling = sibling.prev_named_sibling
    return False
