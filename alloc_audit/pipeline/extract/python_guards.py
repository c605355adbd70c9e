"""Stage 3, extract (Python): a factory that a test above proves holds no
device memory (issue 11, round 35). Part of the Python extractor
(``python_sites.py``).

- ``no_elements``: a shaped factory with a literal 0 dimension
  (``common.zero_elements``), or one in the body of an ``if`` whose test
  says the product of its dimensions is 0. True: ``if b * n * d == 0 and
  g.numel() == 0: torch.zeros(b, n, d, device=g.device)`` (one factor is 0,
  each factor is a dimension, so the tensor has no elements). False: a
  factor that is no dimension (``if b * k == 0: torch.zeros(b, n)``), a test
  joined with ``or`` or negated, a factor's root bound in the body above the
  call, the factory in the ``else`` branch.
- ``cpu_only_below``: a function that returns early unless its device is the
  CPU (``if self.base.device_type != DeviceType.CPU: return``, or
  ``if device.type != "cpu": raise ...``) runs what follows on the CPU, so a
  factory or move given that device (``device=self.base.dev``, the tested
  object or an attribute of it) makes a host tensor. False: a guard with an
  ``else``, one whose body does more than return or raise, one that tests
  another object, the object bound again between the guard and the call.

Pure; both read only the call's own ancestors and the text between.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from .common import Source, shape_dims, zero_elements

_PRODUCT = re.compile(r"\*[^=]*==\s*0\b|\b0\s*==[^=]*\*")


def no_elements(src: Source, node: Any, api: str, shape: tuple[str, ...]) -> bool:
    """``node`` (a factory of ``api`` given ``shape``) has no elements: a literal 0 dimension, or a test above
    that the product of its dimensions is 0."""
    if zero_elements(api, shape):
        return True
    dims = shape_dims(api, shape)
    if not dims:
        return False
    wanted: set[str | None] | None = None  # the dimensions normalised, parsed only once a guard tests a product
    child, parent = node, node.parent
    while parent is not None and parent.type not in ("function_definition", "lambda", "class_definition", "module"):
        if parent.type == "if_statement" and child == parent.child_by_field_name("consequence"):
            condition = parent.child_by_field_name("condition")
            text = src.text(condition, 400) if condition is not None else ""
            factors = _zero_product(text) if _PRODUCT.search(text) else None
            if factors:
                wanted = {_normal(d) for d in dims} - {None} if wanted is None else wanted
                if factors <= wanted and not _rebound(src, child, node, factors):
                    return True
        child, parent = parent, parent.parent
    return False


def _normal(text: str) -> str | None:
    try:
        return ast.unparse(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _zero_product(test: str) -> set[str] | None:
    """The factors of the conjunct ``a * b * c == 0`` of ``test`` (the whole test, or one operand of its
    top-level ``and``), as normalised text; None when there is none."""
    try:
        tree = ast.parse(test.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    conjuncts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) else [tree]
    for c in conjuncts:
        if not isinstance(c, ast.Compare) or len(c.ops) != 1 or not isinstance(c.ops[0], ast.Eq):
            continue
        left, right = c.left, c.comparators[0]
        if isinstance(left, ast.Constant) and left.value == 0:
            left, right = right, left
        if not (isinstance(right, ast.Constant) and right.value == 0 and not isinstance(right.value, bool)):
            continue
        factors: list[ast.expr] = []
        stack = [left]
        while stack:
            e = stack.pop()
            if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
                stack += [e.left, e.right]
            else:
                factors.append(e)
        if len(factors) > 1:
            return {ast.unparse(f) for f in factors}
    return None


def _rebound(src: Source, body: Any, node: Any, factors: set[str]) -> bool:
    """A root of ``factors`` is bound by a statement of the guarded ``body`` above the one holding ``node``."""
    statement = node
    while statement.parent is not None and statement.parent != body:
        statement = statement.parent
    above = src.data[body.start_byte:statement.start_byte].decode("utf-8", "replace")
    roots = {re.split(r"[.\[(]", f, maxsplit=1)[0] for f in factors}
    return any(_binds(root).search(above) for root in roots)


def _binds(root: str) -> re.Pattern[str]:
    r = re.escape(root)
    return re.compile(rf"(?<![\w.]){r}\s*(?:[-+*/@%&|^]|//|\*\*)?=(?!=)|\bdel\s+{r}\b|"
                      rf"\bfor\s+[^:]*(?<![\w.]){r}\b[^:]*\bin\b|:=")


# `O.device_type != DeviceType.CPU`, `O.type != "cpu"`, `O != torch.device("cpu")`: O is not the CPU
_NOT_CPU = re.compile(r"""([A-Za-z_][\w.]*?)(?:\.(?:device_type|type))?\s*!=\s*(?:[\w.]*\.CPU|["']cpu["']|"""
                      r"""torch\.device\(\s*["']cpu["']\s*\))""")


def cpu_only_below(src: Source, node: Any, device: str) -> bool:
    """``device`` (the device a factory or a move at ``node`` is given) is the tested object or an attribute
    of it, in a function an earlier guard (``if O.device_type != DeviceType.CPU: return``) leaves unless
    ``O`` is the CPU, ``O`` not bound again between them: a host tensor."""
    device = device.strip()
    if not re.fullmatch(r"[A-Za-z_][\w.]*", device) or src.data.rfind(b"!=", 0, node.start_byte) < 0:
        return False
    statement = node
    while statement.parent is not None and statement.parent.type not in ("function_definition", "class_definition",
                                                                          "module", "lambda"):
        if statement.parent.type == "block":
            sibling = statement.prev_named_sibling
            while sibling is not None:
                guard = _guarded_object(src, sibling)
                if guard is not None and (device == guard or device.startswith(guard + ".")
                                          and "." not in device[len(guard) + 1:]):
                    between = src.data[sibling.end_byte:node.start_byte].decode("utf-8", "replace")
                    return re.search(rf"(?<![\w.]){re.escape(guard)}\s*=(?!=)", between) is None
                sibling = sibling.prev_named_sibling
        statement = statement.parent
    return False


def _guarded_object(src: Source, statement: Any) -> str | None:
    """``O`` for ``if O... != CPU: return`` (no ``elif``/``else``, a body of one ``return`` or ``raise``)."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative") is not None:
        return None
    body = statement.child_by_field_name("consequence")
    condition = statement.child_by_field_name("condition")
    if body is None or condition is None:
        return None
    stmts = [c for c in body.named_children if c.type != "comment"]
    if len(stmts) != 1 or stmts[0].type not in ("return_statement", "raise_statement"):
        return None
    found = _NOT_CPU.fullmatch(src.text(condition, 200).strip())
    return found.group(1) if found is not None else None
