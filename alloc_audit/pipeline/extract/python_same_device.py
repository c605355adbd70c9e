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
Then ``Y.device`` names one device. (Round 28, ``source_device``: a
``y.to(X.device)`` of an ``X`` the function made on the host is a host
copy, and of one it made without a device a copy to the default device.) Anything else -- a call of a project
function or a module, a factory without a device or with another one, an
``out=``, a ``self.device`` -- proves nothing and keeps the site.

Round 24 reads a local also by the one binding that reaches the move when
not every binding is on ``Y``'s device: its last binding above the move
(the move's own statement, ``x = x.to(d)``, binds it only after), with no
line between them leaving its block, no loop entered between them, and
neither the local nor ``Y``'s root bound again between them; a value that
reads ``Y`` itself, in the same expression as the move
(``torch.zeros_like(c).to(c.device)``), needs no binding at all. A tuple
target takes its element of a tuple written out, or an output of a torch op
or a tensor method that splits (``v, i = torch.sort(y)``). ``type_as(Y)``
of a value on ``Y``'s device stays, an op of ``torch.linalg``, ``torch.fft``,
``torch.special`` or ``F`` runs where its inputs are, and an ``a if c else
None`` is where ``a`` is (a None moved raises). The same reading proves a
move to a device variable ``D`` (``.to(device)``) of a value made by a torch
factory given ``device=D``. ``self.X.to(self.D)``, where every binding of
``self.X`` in the class is a torch factory given ``device=self.D`` and
``self.D`` is bound once, in ``__init__``, moves nothing either.

Round 26 (``storage_alias``): ``torch.as_tensor(x.untyped_storage(),
device=x.device)`` (or ``torch.asarray``, ``x.storage()``, a slice of the
storage, no device) wraps memory ``x`` already holds on the device it is
on: a view, no allocation. Another device, or ``copy=True``, copies.

Round 28: the move's own statement binding ``Y``'s root again (``x =
x.masked_scatter(m.to(x.device), v)``) is no rebinding between the binding
read and the move: Python binds the target only after the value, the move
included, is computed. A ``.to(y.dtype)`` on the way is a dtype cast (a
tensor's ``dtype`` is a ``torch.dtype``, never a device), as
``.to(torch.half)`` is. Round 35: ``y.device`` of ``y = torch.zeros(n, device=Z)`` is ``Z`` (``_made_on``); a
loop between a binding and the move matters only where the value is bound again from the move on. Pure.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from ..names import IDENTIFIER
from .common import enclosing
from .python_bindings import (
    _binding_pattern,
    _bindings,
    _bound_else,
    _own_statement,
    _statement_at,
    _tuple_pattern,
    _value,
)
from .python_host import DEFAULT_FACTORIES, VIEWS, default_source, host_source, moved_in_place
from .python_host_defaults import dtype_only

if TYPE_CHECKING:
    from .python import PythonExtractor

_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")
_DEVICE_OF = re.compile(r"((?:self\.)?[A-Za-z_]\w*)\.device")
_NOT_ON_INPUT = DEFAULT_FACTORIES | {"tensor", "as_tensor", "from_numpy", "asarray", "frombuffer", "empty_strided",
                                      "full_like", "scalar_tensor", "zeros_like", "ones_like", "empty_like",
                                      "rand_like", "randn_like", "randint_like"}
_DEPTH = 4  # locals followed through their bindings
# torch namespaces whose ops run where their tensor inputs are
_TORCH_NAMESPACES = frozenset({"torch.linalg", "torch.fft", "torch.special", "torch.nn.functional"})
# tensor methods returning a tuple of tensors on the tensor's device (`v, i = x.sort()`)
_SPLITS = frozenset({"sort", "topk", "max", "min", "median", "mode", "kthvalue", "chunk", "split", "unbind",
                     "tensor_split", "std_mean", "var_mean", "aminmax", "unique", "qr", "svd"})
# names a move may take that name no device variable
_NOT_DEVICES = frozenset({"self", "cls", "None", "True", "False", "cuda", "cpu"})
# tensor methods whose result is on the tensor's device (views, dtype casts, math, `new_*`); any other
# (`type_as`, `size`, `tolist`, `__class__`, a module's or an object's own method) proves nothing
_SAME_DEVICE = VIEWS | frozenset({
    "float", "half", "bfloat16", "double", "int", "long", "bool", "short", "char", "byte", "abs", "neg", "exp", "log",
    "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "pow", "clamp", "clip", "sum", "mean", "amax",
    "amin", "max", "min", "prod", "cumsum", "cumprod", "argmax", "argmin", "softmax", "log_softmax", "masked_fill",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "sign", "reciprocal", "add",
    "sub", "mul", "div", "matmul", "bmm", "mm", "repeat", "repeat_interleave", "roll", "flip", "tril", "triu",
    "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "to"})


# torch calls that wrap the memory they are handed when it is a storage on the device asked for
_WRAPS = frozenset({"torch.as_tensor", "torch.asarray"})
# `x.untyped_storage()`, `x.storage()[a:b]`: the storage of the tensor `x` (a slice of one shares its memory)
_STORAGE_OF = re.compile(r"(.+?)\s*\.\s*(?:untyped_storage|storage|_typed_storage)\(\s*\)(?:\s*\[[^\[\]]*\])?")


def storage_alias(api: str, positional: list[str], kwargs: dict[str, str]) -> bool:
    """``torch.as_tensor(x.untyped_storage(), device=x.device)`` (no device, or ``x``'s own): a tensor over
    the storage ``x`` already holds, on the device it is on. Wrapping a storage shares its memory (a dtype
    reinterprets the bytes), so nothing is allocated; another device, or ``copy=True``, copies."""
    if api not in _WRAPS or len(positional) != 1 or kwargs.get("copy", "False").strip() not in ("False", "None"):
        return False
    found = _STORAGE_OF.fullmatch(positional[0].strip())
    if found is None:
        return False
    device = kwargs.get("device")
    return device is None or device.strip() == f"{found.group(1).strip()}.device"


def on_device_of(ext: PythonExtractor, node: Any, receiver: str, target: str) -> bool:
    """``receiver`` (what ``.to(target)`` moves) is already on ``target``,
    a ``Y.device`` the receiver is made from, or a device variable ``D`` it
    is made on (a factory given ``device=D``, a move to ``D``)."""
    target = target.strip()
    m = _DEVICE_OF.fullmatch(target)
    if (m is None or m.group(1) == "self") and _MEMBER.fullmatch(target) and _MEMBER.fullmatch(receiver.strip()):
        # `self.X.to(self.device)` too (round 28): a member the constructor binds, not a module's own property
        return _member_made_there(ext, node, receiver.strip(), target)
    if m is None and (IDENTIFIER.fullmatch(target) is None or target in _NOT_DEVICES):
        return False  # `.to("cuda")`, `.to(self.device)`: another pass's question, or nothing followed
    root = m.group(1) if m is not None else target
    if root == "self" or target.encode() not in ext.src.data[node.start_byte:node.end_byte]:
        return False  # a module's own `self.device`: its methods' results are not followed
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return False
    source = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace")
    at = len(ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace"))
    try:
        tree = ast.parse(receiver.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    on = _Target(root, target, m is not None)
    if m is not None and root.isidentifier():
        on.made = _made_on(ext, source, root, at)  # round 35: `y.device` of `y = torch.zeros(n, device=Z)` is `Z`
    if m is None and not re.search(rf"device\s*=\s*{re.escape(root)}\b|\.to\(\s*{re.escape(root)}\b",
                                  source[:at] + receiver):
        return False  # nothing above is made on, or moved to, the device variable: nothing to prove it by
    if m is not None and moved_in_place(root, source[:at]):
        return False  # `model.cpu()` above the move: `model.device` changed in place
    if _bound_once(source, root, at, node, body):
        params = body.child_by_field_name("parameters")
        given = frozenset(IDENTIFIER.findall(ext.src.text(params, 2000))) if params is not None else frozenset()
        if _on(ext, tree, on, source, _DEPTH, frozenset(), given, None):
            return True
    if (_binding_pattern(root).search(source[at:]) or _bound_else(source[at:], root)) and _in_loop(node, body):
        return False  # bound again below the move, in a loop: a second pass may see that
    return _on(ext, tree, on, source, _DEPTH, frozenset(), frozenset(), source[:at])


def _member_made_there(ext: PythonExtractor, node: Any, member: str, device: str) -> bool:
    """``self.X.to(self.D)`` where every binding of ``self.X`` in the class is a torch factory given
    ``device=self.D``, and ``self.D`` is bound once, in ``__init__``: made there, never moved. A factory in
    ``__init__`` given the constructor's parameter ``P`` that ``self.D = P`` stores is made there too (round 28)."""
    cls = enclosing(node.parent, "class_definition")
    if cls is None:
        return False
    source = ext.src.data[cls.start_byte:cls.end_byte].decode("utf-8", "replace")
    if _bound_else(source, device) or _bound_else(source, member):
        return False
    placed = list(_binding_pattern(device).finditer(source))
    if len(placed) != 1 or not re.search(r"\bdef[ \t]+__init__\b(?![\s\S]*\bdef[ \t])", source[:placed[0].start()]):
        return False  # bound again, or outside the constructor: another device, perhaps
    made = list(_binding_pattern(member).finditer(source))
    if not made:
        return False  # set elsewhere, or a property
    init, alias = _constructor_alias(source, placed[0])
    for hit in made:
        try:
            value = ast.parse(_value(source, hit.end()).strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute) \
                or _torch_head(ext, value.func.value) != "torch" or any(k.arg in (None, "out") for k in value.keywords):
            return False
        given = next((k.value for k in value.keywords if k.arg == "device"), None)
        if given is None or ast.unparse(given) != device and not (
                alias and ast.unparse(given) == alias and init[0] <= hit.start() < init[1]):
            return False
    return True


def _constructor_alias(source: str, placed: re.Match[str]) -> tuple[tuple[int, int], str]:
    """For ``self.D = P`` in ``__init__`` (``placed``), where ``P`` is a parameter of ``__init__`` that it never
    binds again: the stretch of the class ``source`` from ``def __init__`` to the next ``def`` (a nested one
    included), and ``P`` (round 28). A factory given ``device=P`` there is made on ``self.D``: both read the
    parameter's one value. ``((0, 0), "")`` otherwise."""
    none = ((0, 0), "")
    alias = _value(source, placed.end()).strip()
    if not alias.isidentifier() or alias in _NOT_DEVICES:
        return none
    start = max((m.start() for m in re.finditer(r"\bdef[ \t]+__init__\b", source[:placed.start()])), default=-1)
    if start < 0:
        return none
    following = re.compile(r"\bdef[ \t]").search(source, placed.end())
    end = following.start() if following is not None else len(source)
    opened = source.find("(", start)
    depth, close = 0, -1
    for i in range(opened, min(end, opened + 2000)):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0:
            close = i
            break
    if opened < 0 or close < 0 or not re.search(rf"(?<![\w.]){re.escape(alias)}\b", source[opened:close]):
        return none  # not a parameter of the constructor
    body = source[close:end]
    if _binding_pattern(alias).search(body) or _bound_else(body, alias):
        return none  # bound again in the constructor: another device, perhaps
    return (start, end), alias


class _Target:
    """What the move goes to: ``root.device`` (``tensor``: ``root`` a
    tensor the value may be) or the device variable ``root`` itself."""

    def __init__(self, root: str, text: str, tensor: bool) -> None:
        self.root, self.text, self.tensor = root, text, tensor
        self.made: tuple[str, str, int] | None = None  # ``root`` made on ``Z`` (whose root, where): ``_made_on``


def _bound_once(source: str, root: str, at: int, node: Any, body: Any) -> bool:
    """``root`` names one device in the whole function above the move: a
    parameter never bound in the function above it, or a local bound once,
    above the move and before any use; below it, bound again only outside a loop."""
    if _bound_else(source, root):
        return False
    bound = list(_binding_pattern(root).finditer(source))
    above = [b for b in bound if b.start() < at]
    if len(above) < len(bound) and _in_loop(node, body):
        return False  # bound again below the move, in a loop: a second pass may see that
    first = re.search(rf"(?<![\w.]){re.escape(root)}\b", source)
    if len(above) > 1 or above and (first is None or first.start() != above[0].start() + len(above[0].group(1))):
        return False  # bound again above the move (a parameter, or a local used before): another device, perhaps
    return True


def _in_loop(node: Any, body: Any) -> bool:
    """``node`` is in a loop body of the function ``body``."""
    up = node.parent
    while up is not None and up != body:
        if up.type in ("for_statement", "while_statement"):
            return True
        up = up.parent
    return False


def _on(ext: PythonExtractor, node: ast.AST, on: _Target, source: str, depth: int, proving: frozenset[str],
        params: frozenset[str], before: str | None) -> bool:
    """``node`` is on ``on``'s device (``params``: the function's parameters, wherever their callers put them;
    ``before``: the function up to the move, when a local is read by its last binding above, not by all)."""
    if depth <= 0:
        return False
    text = ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""
    if on.tensor and text == on.root:
        return True

    def sub(child: ast.AST, down: int = 0) -> bool:
        return _on(ext, child, on, source, depth - down, proving, params, before)

    if isinstance(node, ast.Name):
        if before is not None:
            return _reaching(ext, node.id, on, source, depth, before)
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
            if not _on(ext, tree, on, source, depth - 1, proving | {node.id}, params, None):
                return False
        return True
    if isinstance(node, ast.Subscript):
        return sub(node.value)
    if isinstance(node, ast.UnaryOp):
        return sub(node.operand)
    if isinstance(node, ast.BinOp):
        return any(sub(side) for side in (node.left, node.right))
    if isinstance(node, ast.Compare):
        return any(sub(side) for side in (node.left, *node.comparators))
    if isinstance(node, ast.IfExp):
        # `a if c else None`: a None moved raises, so only the tensor side reaches a move
        return all(sub(side) or _none(side) for side in (node.body, node.orelse)) \
            and not all(_none(side) for side in (node.body, node.orelse))
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False  # a call of a function or a module: wherever it puts its result
    func = node.func
    if any(k.arg in (None, "out") for k in node.keywords):
        return False  # `**kwargs` that may hold a device, or an output buffer
    device = next((k.value for k in node.keywords if k.arg == "device"), None)
    head = _torch_head(ext, func.value)
    if head == "torch":
        if device is not None:
            return ast.unparse(device) == on.text or _same_made(on, ast.unparse(device), source, before)
        if func.attr in _NOT_ON_INPUT:
            return func.attr.endswith("_like") and bool(node.args) and sub(node.args[0])
        args = [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else (a,))]
        return any(sub(a) for a in args)
    if head:
        args = [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else (a,))]
        return device is None and any(sub(a) for a in args)  # `torch.linalg.solve(R, b)`: where its inputs are
    if func.attr == "type_as":
        # `.type_as(y)` takes `y`'s type, its device kind included: stays only when `y` is there too
        return len(node.args) == 1 and not node.keywords and sub(node.args[0]) and sub(func.value)
    if func.attr not in _SAME_DEVICE:
        return False
    if func.attr == "to":
        moved = [*node.args, *(k.value for k in node.keywords if k.arg == "device")]
        if len(moved) == 1 and ast.unparse(moved[0]) == on.text:
            return True  # moved there on the way
        if not _dtype_cast(node):
            return False
    elif device is not None:
        return False  # `x.new_zeros(n, device=d)`: wherever `d` is
    return sub(func.value)


def _none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _torch_head(ext: PythonExtractor, value: ast.expr) -> str:
    """``"torch"`` for ``torch.op``, the namespace for an op of a torch namespace whose ops run where their
    tensor inputs are (``torch.linalg``, ``F`` for ``torch.nn.functional``); else ``""``."""
    if isinstance(value, ast.Name):
        head = ext.resolve_text(value.id)
    elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
        head = f"{ext.resolve_text(value.value.id)}.{value.attr}"
    elif isinstance(value, ast.Attribute) and ast.unparse(value) == "torch.nn.functional":
        head = "torch.nn.functional"
    else:
        return ""
    return head if head == "torch" or head in _TORCH_NAMESPACES else ""


def _reaching(ext: PythonExtractor, name: str, on: _Target, source: str, depth: int, before: str) -> bool:
    """The local ``name``'s last binding above the move (``before`` ends there) is on ``on``'s device and
    still holds at the move: nothing between them leaves its block, binds it another way, or enters a loop
    when the function binds it again below; nor is ``on``'s root bound between. A tuple target takes an
    element of a tuple written out, or any output of a torch op (`v, i = torch.sort(x)`)."""
    if name not in before:
        return False  # a parameter, or never bound above
    tuples = list(_tuple_pattern(name).finditer(before))
    last = None
    end = len(before)
    for hit in sorted((*_binding_pattern(name).finditer(before), *tuples), key=lambda h: -h.start()):
        if not _statement_at(before, hit.start()):
            continue  # a keyword argument on a line of its own
        if _own_statement(before, hit):
            end = min(end, hit.start())  # the move's own statement, `x = x.to(d)`: it binds the name after
            continue
        last = hit
        break
    if last is None:
        return False  # a parameter, or bound another way
    value = _value(before, last.end())
    between = before[last.end() + len(value):end]
    indent = len(last.group(1))
    lines = between.split("\n")[1:]
    if any(line.strip() and len(line) - len(line.lstrip()) < indent for line in lines):
        return False  # the block was left in between: the binding may not run before the move
    root = on.root.split(".", 1)[0]
    if _bound_else(between, name) or _binding_pattern(name).search(between) or _tuple_pattern(name).search(between):
        return False
    if any(_rebound(between, n) for n in (on.root, root)) or _bound_else(between, root):
        return False  # the root bound again between: the binding saw another device, perhaps
    if moved_in_place(on.root, between):
        return False  # `model.cpu()` between: a module's device moved in place
    if any(re.match(r"\s*(?:async\s+)?(?:for|while)\b", line) for line in lines) \
            and _bound_from(source[end:], name):
        return False  # a loop entered in between, the name bound again from the move on: a later pass may see it
    try:
        tree = ast.parse(value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if last in tuples:
        targets = [t.strip() for t in last.group(2).split(",") if t.strip()]
        if isinstance(tree, ast.Tuple):
            if len(tree.elts) != len(targets) or any(isinstance(e, ast.Starred) for e in tree.elts):
                return False
            tree = tree.elts[targets.index(name)]
        elif not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Attribute) or \
                not _torch_head(ext, tree.func.value) and tree.func.attr not in _SPLITS:
            return False  # unpacked from a project call, or a tensor method that returns anything
    return _on(ext, tree, on, source, depth - 1, frozenset(), frozenset(), before[:last.start()])


def _bound_from(rest: str, name: str) -> bool:
    """``name`` is bound in ``rest`` (the function from the move's statement on), any way (round 35): a loop
    around the move may carry that binding back to it; bound nowhere there, the binding above still holds."""
    return name in rest and (_binding_pattern(name).search(rest) is not None
                             or _tuple_pattern(name).search(rest) is not None or _bound_else(rest, name))


def _made_on(ext: PythonExtractor, source: str, name: str, at: int) -> tuple[str, str, int] | None:
    """Round 35: ``(Z, Z's root, where)`` where the local ``name`` was made by a torch factory given ``device=Z``
    (then casts of it, or an element of a tuple written out: ``s, y = n, torch.zeros(n, device=x.device)``), by
    the function's one binding of ``name`` (at ``where``), above the move (at ``at``) in a block not left before
    it, ``Z`` a name or a name's ``.device``: there ``name.device`` is ``Z`` (``_same_made`` reads it)."""
    hits = [h for h in (*_binding_pattern(name).finditer(source), *_tuple_pattern(name).finditer(source))
            if _statement_at(source, h.start())]
    if len({h.start() for h in hits}) != 1 or hits[0].start() >= at:
        return None
    hit = hits[0]
    line_end = source.find("\n", hit.end())
    if _bound_else(source[:hit.start()] + source[line_end if line_end >= 0 else len(source):], name):
        return None  # bound another way elsewhere (a loop target, a walrus)
    value = _value(source, hit.end())
    between = source[hit.end() + len(value):at]
    if any(line.strip() and len(line) - len(line.lstrip()) < len(hit.group(1)) for line in between.split("\n")[1:]):
        return None  # the block was left in between: the binding may not run before the move
    try:
        tree = ast.parse(value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    targets = [t.strip() for t in hit.group(2).split(",") if t.strip()] if (hit.lastindex or 0) >= 2 else [name]
    if len(targets) > 1:
        if not isinstance(tree, ast.Tuple) or len(tree.elts) != len(targets) or targets.count(name) != 1:
            return None
        tree = tree.elts[targets.index(name)]
    while isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr in _SAME_DEVICE \
            and tree.func.attr != "to" and not tree.keywords:
        tree = tree.func.value  # `torch.zeros(n, device=d).bool()`: a cast where it is
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Attribute) \
            or _torch_head(ext, tree.func.value) != "torch" or any(k.arg in (None, "out") for k in tree.keywords):
        return None
    given = next((ast.unparse(k.value) for k in tree.keywords if k.arg == "device"), "")
    found = re.fullmatch(r"([A-Za-z_]\w*)(?:\.device)?", given)
    if found is None or found.group(1) in ("self", "cls", name):
        return None
    return given, found.group(1), hit.start()


def _same_made(on: _Target, device: str, source: str, before: str | None) -> bool:
    """A factory given ``device=Z``, in the statement that ends ``before``, is where ``on``'s root was made
    (``_made_on``): ``Z``'s root is neither bound nor moved between the two statements, nor, where a loop
    starts between them, anywhere below the first (a later pass would read another ``Z``)."""
    if on.made is None or before is None or device != on.made[0]:
        return False
    _, root, made_at = on.made
    lo, hi = sorted((made_at, len(before)))
    span = source[lo:hi]
    if re.search(r"^[ \t]*(?:async[ \t]+)?(?:for|while)\b", span, re.M):
        span = source[lo:]
    return _binding_pattern(root).search(span) is None and not _bound_else(span, root) \
        and not moved_in_place(root, span)


def _rebound(between: str, name: str) -> bool:
    """``name = ...`` in ``between`` (the lines from a binding up to the move), other than by the move's own
    statement (round 28): ``x = x.masked_fill(m.to(x.device), 0)`` binds ``x`` only after its value, the move
    included, is computed, so the move still sees the ``x`` bound above."""
    return any(_statement_at(between, hit.start()) and not _own_statement(between, hit)
               for hit in _binding_pattern(name).finditer(between))


def _dtype_cast(call: ast.Call) -> bool:
    """``.to(torch.half)``, or ``.to(y.dtype)`` / ``.to(dtype=y.dtype)`` (round 28): a tensor's ``dtype``
    attribute is a ``torch.dtype``, never a device, so the value stays where it is."""
    if dtype_only(call):
        return True
    given = [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]
    return len(given) == 1 == len(call.args) + len(call.keywords) and isinstance(given[0], ast.Attribute) \
        and given[0].attr == "dtype"


# `x.device` of a plain name (`source_device`); `_DEVICE_OF` above also takes `self.x.device`
_LOCAL_DEVICE_OF = re.compile(r"([A-Za-z_]\w*)\.device")


def source_device(ext: PythonExtractor, node: Any, wanted: list[str], device: str | None) -> str | None:
    """The device of a `y.to(x.device)` copy (round 28): None (no device copy) where the function made `x`
    on the host (`python_host.host_source`), ``"default"`` (``python_sites.DEFAULT_DEVICE``: a site only
    under a default-device context) where it made `x` without a device, else ``device``."""
    named = [c.strip() for c in wanted if c.strip()]
    source = _LOCAL_DEVICE_OF.fullmatch(named[0]) if device is not None and len(named) == 1 else None
    if source is None:
        return device
    if host_source(ext, node, source.group(1)):
        return None
    return "default" if default_source(ext, node, source.group(1)) else device
