"""Stage 3, extract (Python): a move to ``Y.device`` of a tensor made from
``Y`` is a no-op (issue 11, round 23).

``(tokens == pad).to(tokens.device)``, or ``t = torch.arange(n,
device=x.device)``; ``f = torch.einsum("i,j->ij", t, inv)``;
``torch.cat((f, f), dim=-1).to(x.device)``: the value moved is already
where ``Y`` is, so the move copies nothing. PyTorch runs an op on the one
device of its tensor inputs (a 0-dim host tensor aside: then the result may
be on the other input's GPU, and the move goes to the host, still no device
allocation), so an expression is on ``Y.device`` when it is ``Y`` itself (a
name or an attribute chain), a torch factory given ``device=Y.device``, a
``*_like`` of such a value without a device, a torch op, an operator, a
subscript or a tensor method that stays (a view, a dtype cast, math,
``new_*``; not ``type_as``, ``.cuda()``, ``.cpu()``, a ``.to`` elsewhere)
of which one tensor input is, or a local (not a parameter) every binding
of which in the function is. ``Y``'s root is a parameter never bound in
the function above the move, or a local bound once, above the move and
before any use; below the move it may be bound again only outside a loop.
Then ``Y.device`` names one device. Anything else -- a call of a project
function or a module, a factory without a device or with another one, an
``out=``, a ``self.device`` -- proves nothing and keeps the site. Pure.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from .common import enclosing
from .python_host import _DEFAULT_FACTORIES, _VIEWS, _binding_pattern, _bindings, _bound_else, _dtype_only

if TYPE_CHECKING:
    from .python import PythonExtractor

_NAME = re.compile(r"[A-Za-z_]\w*")
_DEVICE_OF = re.compile(r"((?:self\.)?[A-Za-z_]\w*)\.device")
_NOT_ON_INPUT = _DEFAULT_FACTORIES | {"tensor", "as_tensor", "from_numpy", "asarray", "frombuffer", "empty_strided",
                                      "full_like", "scalar_tensor", "zeros_like", "ones_like", "empty_like",
                                      "rand_like", "randn_like", "randint_like"}
_DEPTH = 4  # locals followed through their bindings
# tensor methods whose result is on the tensor's device (views, dtype casts, math, `new_*`); any other
# (`type_as`, `size`, `tolist`, `__class__`, a module's or an object's own method) proves nothing
_SAME_DEVICE = _VIEWS | frozenset({
    "float", "half", "bfloat16", "double", "int", "long", "bool", "short", "char", "byte", "abs", "neg", "exp", "log",
    "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "pow", "clamp", "clip", "sum", "mean", "amax",
    "amin", "max", "min", "prod", "cumsum", "cumprod", "argmax", "argmin", "softmax", "log_softmax", "masked_fill",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "sign", "reciprocal", "add",
    "sub", "mul", "div", "matmul", "bmm", "mm", "repeat", "repeat_interleave", "roll", "flip", "tril", "triu",
    "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "to"})


def on_device_of(ext: PythonExtractor, node: Any, receiver: str, target: str) -> bool:
    """``receiver`` (what ``.to(target)`` moves) is already on ``target``,
    a ``Y.device`` the receiver is made from."""
    m = _DEVICE_OF.fullmatch(target.strip())
    if m is None or ".device" not in target or b".device" not in ext.src.data[node.start_byte:node.end_byte]:
        return False
    root = m.group(1)
    if root == "self":
        return False  # a module's own `self.device`: its methods' results are not followed
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return False
    source = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace")
    if _bound_else(source, root):
        return False
    at = len(ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace"))
    bound = list(_binding_pattern(root).finditer(source))
    above = [b for b in bound if b.start() < at]
    if len(above) < len(bound) and _in_loop(node, body):
        return False  # bound again below the move, in a loop: a second pass may see that
    first = re.search(rf"(?<![\w.]){re.escape(root)}\b", source)
    if len(above) > 1 or above and (first is None or first.start() != above[0].start() + len(above[0].group(1))):
        return False  # bound again above the move (a parameter, or a local used before): another device, perhaps
    try:
        tree = ast.parse(receiver.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    params = body.child_by_field_name("parameters")
    given = frozenset(_NAME.findall(ext.src.text(params, 2000))) if params is not None else frozenset()
    return _on(ext, tree, root, source, _DEPTH, frozenset(), given)


def _in_loop(node: Any, body: Any) -> bool:
    """``node`` is in a loop body of the function ``body``."""
    up = node.parent
    while up is not None and up != body:
        if up.type in ("for_statement", "while_statement"):
            return True
        up = up.parent
    return False


def _on(ext: PythonExtractor, node: ast.AST, root: str, source: str, depth: int, proving: frozenset[str],
        params: frozenset[str]) -> bool:
    """``node`` is on ``root``'s device (``params``: the function's parameters, wherever their callers put them)."""
    if depth <= 0:
        return False
    text = ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""
    if text == root:
        return True
    if isinstance(node, ast.Name):
        if node.id in params:
            return False  # a parameter, even when the function binds it again
        if node.id in proving:
            return True  # `x = x * 2`: its first binding cannot read it
        values = _bindings(source, node.id)
        if not values:
            return False  # a parameter, or bound another way
        for value in values:
            try:
                tree = ast.parse(value.strip(), mode="eval").body
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return False
            if not _on(ext, tree, root, source, depth - 1, proving | {node.id}, params):
                return False
        return True
    if isinstance(node, ast.Subscript):
        return _on(ext, node.value, root, source, depth, proving, params)
    if isinstance(node, ast.UnaryOp):
        return _on(ext, node.operand, root, source, depth, proving, params)
    if isinstance(node, ast.BinOp):
        return any(_on(ext, side, root, source, depth, proving, params) for side in (node.left, node.right))
    if isinstance(node, ast.Compare):
        return any(_on(ext, side, root, source, depth, proving, params) for side in (node.left, *node.comparators))
    if isinstance(node, ast.IfExp):
        return all(_on(ext, side, root, source, depth, proving, params) for side in (node.body, node.orelse))
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False  # a call of a function or a module: wherever it puts its result
    func = node.func
    if any(k.arg in (None, "out") for k in node.keywords):
        return False  # `**kwargs` that may hold a device, or an output buffer
    device = next((k.value for k in node.keywords if k.arg == "device"), None)
    head = ext.resolve_text(func.value.id) if isinstance(func.value, ast.Name) else ""
    if head == "torch":
        if device is not None:
            return ast.unparse(device) == f"{root}.device"
        if func.attr in _NOT_ON_INPUT:
            return func.attr.endswith("_like") and bool(node.args) and \
                _on(ext, node.args[0], root, source, depth, proving, params)
        args = [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else (a,))]
        return any(_on(ext, a, root, source, depth, proving, params) for a in args)
    if func.attr not in _SAME_DEVICE:
        return False
    if func.attr == "to":
        moved = [*node.args, *(k.value for k in node.keywords if k.arg == "device")]
        if len(moved) == 1 and ast.unparse(moved[0]) == f"{root}.device":
            return True  # moved there on the way
        if not _dtype_only(node):
            return False
    elif device is not None:
        return False  # `x.new_zeros(n, device=d)`: wherever `d` is
    return _on(ext, func.value, root, source, depth, proving, params)
