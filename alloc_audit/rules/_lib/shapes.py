"""Shared analysis for the rules: does an expression's *shape* carry taint?

A tensor filled with values derived from a reading (``torch.ones(bs) *
max_s``, a block table ``torch.arange(max_bt)`` passed on as contents) does
not have a shape derived from it: ``x.shape[0]``, ``x.size(0)``,
``len(x)`` and ``x.numel()`` of such a tensor are the batch size. The taint
analysis keeps, per tainted name, whether its shape is tainted too
("shaped"); this module answers that for one Python expression.

The answer errs towards "shaped" (the old behaviour): a call outside the
short lists below that receives a tainted value (``torch.arange(n)``,
``torch.empty(n)``, ``x.repeat(n)``, ``range(n)``), a list multiplied by a
tainted count, a slice or index with a tainted bound, a comprehension, and
anything this module cannot parse. Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from functools import lru_cache

# calls whose result is a scalar, whatever their arguments: its shape carries nothing
SCALAR_CALLS = frozenset({
    "int", "float", "bool", "round", "abs", "min", "max", "sum", "len", "pow", "divmod",
    "ceil", "floor", "sqrt", "log2", "cdiv", "ceil_div", "div_up", "item", "numel", "nelement",
    "size", "dim", "element_size", "tolist"})
# methods that keep the receiver's shape, whatever their arguments say
SHAPE_KEEPING = frozenset({
    "to", "cuda", "cpu", "float", "half", "bfloat16", "int", "long", "bool", "contiguous", "clone",
    "detach", "type", "mul", "add", "sub", "div", "clamp", "clamp_", "fill_", "mul_", "add_",
    "copy_", "zero_", "masked_fill", "masked_fill_", "pin_memory"})
# `x.shape`, `x.size(...)`, `len(x)`, `x.numel()`: the shape of x, read
SHAPE_OF = re.compile(r"\blen\(\s*([A-Za-z_][\w.]*)\s*\)"
                      r"|\b([A-Za-z_][\w.]*)\.(?:shape|size|numel|nelement|dim|ndim)\b")


def without_free_shapes(text: str, shape_free: Callable[[str], bool]) -> str:
    """``text`` with each read of the shape of a name whose shape is not
    tainted replaced by ``0``: `input_lengths.shape[0] + 1` -> `0[0] + 1`."""
    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return "0" if shape_free(name) else m.group(0)
    return SHAPE_OF.sub(replace, text)


@lru_cache(maxsize=16384)
def _parse(text: str) -> ast.expr | None:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def shape_tainted(text: str, tainted: Callable[[str], bool], shaped: Callable[[str], bool]) -> bool:
    """Whether the value of Python expression ``text`` has a tainted shape.
    ``tainted(expr_text)`` says whether an expression's value is tainted,
    ``shaped(chain)`` whether a tainted name's shape is."""
    node = _parse(text)
    if node is None:
        return tainted(text)
    return _shaped(node, tainted, shaped)


def _shaped(node: ast.AST, tainted: Callable[[str], bool], shaped: Callable[[str], bool]) -> bool:
    def sub(n: ast.AST) -> bool:
        return _shaped(n, tainted, shaped)

    def value(n: ast.AST) -> bool:
        return tainted(ast.unparse(n))

    if isinstance(node, ast.Constant | ast.Compare):
        return False
    if isinstance(node, ast.Name):
        return shaped(node.id)
    if isinstance(node, ast.Attribute):
        if node.attr in ("shape", "ndim"):
            return False  # a tuple of ints or an int: its length is the rank
        return shaped(ast.unparse(node))
    if isinstance(node, ast.Call):
        func = node.func
        leaf = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if leaf in SCALAR_CALLS:
            return False
        receiver = sub(func.value) if isinstance(func, ast.Attribute) else False
        if isinstance(func, ast.Attribute) and leaf in SHAPE_KEEPING:
            return receiver
        args = [*node.args, *(k.value for k in node.keywords)]
        return receiver or any(value(a) or sub(a) for a in args)
    if isinstance(node, ast.BinOp):
        repeats = isinstance(node.op, ast.Mult) and (
            isinstance(node.left, ast.List | ast.Tuple) and value(node.right)
            or isinstance(node.right, ast.List | ast.Tuple) and value(node.left))
        return repeats or sub(node.left) or sub(node.right)
    if isinstance(node, ast.UnaryOp):
        return sub(node.operand)
    if isinstance(node, ast.BoolOp):
        return any(sub(v) for v in node.values)
    if isinstance(node, ast.IfExp):
        return sub(node.body) or sub(node.orelse)
    if isinstance(node, ast.Subscript):
        return sub(node.value) or value(node.slice)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return any(sub(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(sub(v) for v in node.values)
    return value(node)
