"""Stage 5, before the callers: a move to the device a project function
already returns its value on is no site (issue 11, round 29).

    def receive(shape, device, dtype):
        return torch.empty(shape, device=device, dtype=dtype)

    x = receive(shape, device=device, dtype=dtype)
    x.to(device)                                  # no site: already there

``x.to(E)`` where ``x`` is what a project function returns, every
``return`` of it (a ``None`` aside: moved, it raises) made on one device
expression: a torch factory given ``device=D``, a move ``.to(D)``, then
only views, dtype casts, subscripts and arithmetic with a number or a
name, or a local every binding of which is so. ``D``'s root is a parameter
the function never rebinds (``self`` for ``self.device``) or a module-level
name. Read at the call, ``D`` is the argument the call binds to that
parameter (``self``: the object the method is called on,
``pipe.prep(img).to(pipe.device)``) or the same import in both files (a
name defined and assigned once at the module level of a file both
functions are in); when that is the move's own ``E``, and ``E``'s root is
neither bound in the caller nor moved in place there (``.to``, ``.cuda``,
``.cpu`` on it), the move copies nothing. The moved value is the call
itself (``floats_tensor(s).to(torch_device)``) or a local every binding of
which is such a call, not made before a loop the move is in (a loop target
may bind the device name anew). A function with a return elsewhere, a move
to another expression, or a call that spreads ``*args`` keeps the site
(the named-device mirror of ``same_device_moves.drop_gpu_return_moves``).
Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site
from .host_params import chain
from .index import Func, ProjectIndex
from .module_classes import receiver_builder
from .same_device_moves import CAST_CALL

_DEPTH = 3  # locals followed


def drop_placed_return_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The sites, less the moves to the device expression a project function returns its value on."""
    memo: dict[str, str | None] = {}
    return [s for s in sites if not (s.via is None and s.language is Language.PYTHON and s.api == "Tensor.to"
                                     and _of_placed_return(s, index, memo))]


def _of_placed_return(site: Site, index: ProjectIndex, memo: dict[str, str | None]) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, call = found
    args = split_args(call.arglist)
    device = [a for a in args if a.keyword in (None, "device")]
    if len(device) != 1 or any(a.keyword not in (None, "device", "non_blocking") for a in args):
        return False  # `.to(d, torch.half)`: a dtype change copies
    target = re.sub(r"\s+", "", device[0].text)
    if _CHAIN.fullmatch(target) is None or target.split(".")[0] in ("None", "torch") or _rebinds(func, target):
        return False
    producer = receiver_builder(func, site)
    if producer is None or "(" in producer.callee:
        return False
    here = (call.span.line, call.span.col)
    if call.callee.rpartition(".")[0].endswith(")"):  # `f(x, device=d).to(d)`: the call is what is moved
        others = [c for c in func.calls if (c.span.line, c.span.col) == here and c != call and c != producer]
        return all(CAST_CALL.fullmatch(c.callee) is not None for c in others) \
            and _placed_call(func, producer, target, index, memo)
    local = producer.target.strip() if producer.target else ""
    if not local.isidentifier() or func.scope is None or local in func.scope.params \
            or _bound_else_than_call(func, local):
        return False
    calls = _binding_calls(func, local, site.span.line)
    lines = {c.span.line for c in calls}
    if any(local in a.targets and a.line != site.span.line and a.line not in lines for a in func.assigns):
        return False  # bound by an assignment that is no whole call
    if any(b.kind == "loop" and b.span.contains_line(site.span.line) and not all(
            b.span.contains_line(line) for line in lines) for b in func.blocks):
        return False  # made before a loop the move is in: a loop target may bind the device name anew
    return bool(calls) and min(lines) < site.span.line \
        and all("(" not in c.callee and _placed_call(func, c, target, index, memo) for c in calls)


def _bound_else_than_call(func: Func, name: str) -> bool:
    """``name`` is a tuple target, a loop or ``with`` target somewhere in ``func`` (an assign names it with others)."""
    return any(name in {w for t in a.targets for w in re.findall(r"[A-Za-z_]\w*", t)} and a.targets != (name,)
               for a in func.assigns)


def _binding_calls(func: Func, name: str, move: int) -> list[Call]:
    """The whole calls that bind ``name`` in ``func`` (each the one that ends last where it starts), the move's
    own statement left out (``x = x.to(d)`` binds after the move)."""
    starts: dict[tuple[int, int], Call] = {}
    for c in func.calls:
        if (c.target or "").strip() == name and c.span.line != move:
            at = (c.span.line, c.span.col)
            if at not in starts or (c.span.end_line, c.span.end_col) > (starts[at].span.end_line,
                                                                           starts[at].span.end_col):
                starts[at] = c
    return list(starts.values())


def _rebinds(func: Func, target: str) -> bool:
    """The device expression's root (a name, or ``self.x`` for ``self.x.device``) is bound in ``func``, or
    moved in place there (``model.cuda()``): it may name another device at the move than at the call."""
    parts = target.split(".")
    root = ".".join(parts[:2]) if parts[0] in _SELF_NAMES and len(parts) > 1 else parts[0]
    for a in func.assigns:
        for t in a.targets:
            t = t.strip()
            if t == root or t.startswith(root + ".") or "." not in root and root in re.findall(r"[A-Za-z_]\w*", t):
                return True
    return any(c.callee.rpartition(".")[0] == root and c.callee.rpartition(".")[2] in ("to", "cuda", "cpu")
               for c in func.calls)


def _placed_call(caller: Func, call: Call, target: str, index: ProjectIndex, memo: dict[str, str | None]) -> bool:
    """Every function ``call`` resolves to returns on a device expression that, read at the call, is ``target``."""
    funcs = index.resolve(caller, call)
    if not funcs:
        return False
    for producer in funcs:
        device = _return_device(producer, index, memo)
        if device is None or _at_call(caller, call, producer, device, index) != target:
            return False
    return True


def _at_call(caller: Func, call: Call, producer: Func, device: str, index: ProjectIndex) -> str | None:
    """The producer's device expression ``device`` as the caller reads it: its root parameter replaced by the
    argument the call binds to it, or a module-level name the same import in both files."""
    assert producer.scope is not None
    root, dot, rest = device.partition(".")
    params = list(producer.scope.params)
    if root not in params:
        ours, theirs = index.imported(caller.path, root), index.imported(producer.path, root)
        if ours is not None and ours == theirs:
            same = not _module_binds(index, caller.path, root) and not _module_binds(index, producer.path, root)
        else:  # defined once at the module level of the one file both functions are in
            same = ours is None and theirs is None and caller.path == producer.path \
                and _module_binds(index, producer.path, root) == 1 and _module_assigned(index, producer.path, root)
        return device if same else None
    args = split_args(call.arglist)
    if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args):
        return None
    bound = params[0] in _SELF_NAMES and "." in call.callee
    if root in _SELF_NAMES and params[0] == root:
        passed = call.callee.rpartition(".")[0] if bound else None
    else:
        positional = [a.text for a in args if a.keyword is None]
        position = params.index(root) - (1 if bound else 0)
        passed = next((a.text for a in args if a.keyword == root), None)
        if passed is None and 0 <= position < len(positional):
            passed = positional[position]
    if passed is None:
        return None
    passed = re.sub(r"\s+", "", passed)
    return passed + dot + rest if _CHAIN.fullmatch(passed) else None


def _module_binds(index: ProjectIndex, path: str, name: str) -> int:
    """How many assignments in the module at ``path`` bind ``name`` (a function's ``global`` store included)."""
    return sum(1 for f in index.functions_in(path) for a in f.assigns if name in a.targets)


def _module_assigned(index: ProjectIndex, path: str, name: str) -> bool:
    """``name`` is assigned at the module level of ``path``."""
    return any(f.qualname == "<module>" and any(name in a.targets for a in f.assigns) for f in index.functions_in(path))


def _return_device(func: Func, index: ProjectIndex, memo: dict[str, str | None]) -> str | None:
    """The one device expression every ``return`` of ``func`` is made on, if there is one."""
    if func.id in memo:
        return memo[func.id]
    memo[func.id] = None  # a cycle proves nothing
    scope = func.scope
    values = [r.value.strip() for r in func.returns]
    found: set[str] = set()
    if scope is None or scope.yields or not values:
        return None
    for value in values:
        if value in ("", "None"):
            continue  # a None moved raises: it never reaches a move
        try:
            tree = ast.parse(value, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        device = _node_device(func, tree, _DEPTH + 3)
        if device is None:
            return None
        found.add(device)
    if len(found) != 1:
        return None
    device = found.pop()
    root = device.split(".")[0]
    own = ".".join(device.split(".")[:2]) if root in _SELF_NAMES else root
    if root in _SELF_NAMES and device == root or any(
            t.strip() == own or t.strip().startswith(own + ".") for a in func.assigns for t in a.targets) \
            or root not in scope.params and root in {w for a in func.assigns for t in a.targets
                                                     for w in re.findall(r"[A-Za-z_]\w*", t)}:
        return None  # rebound in the function: the returns may read another device
    memo[func.id] = device
    return device


def _node_device(func: Func, node: ast.expr, depth: int) -> str | None:
    """The device expression ``node`` is made on (a factory's ``device=``, a move's target), through views,
    dtype casts, subscripts, arithmetic with a number or a name, and locals every binding of which agrees."""
    if depth <= 0:
        return None
    if isinstance(node, ast.Name):
        return _local_device(func, node.id, depth - 1)
    if isinstance(node, ast.Subscript):
        return _node_device(func, node.value, depth - 1)
    if isinstance(node, ast.UnaryOp):
        return _node_device(func, node.operand, depth - 1)
    if isinstance(node, ast.BinOp):
        plain = (ast.Constant, ast.Name, ast.Attribute)
        if isinstance(node.right, plain) and not isinstance(node.left, ast.Name):
            return _node_device(func, node.left, depth - 1)
        if isinstance(node.left, plain) and not isinstance(node.right, ast.Name):
            return _node_device(func, node.right, depth - 1)
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    keywords = {k.arg: k.value for k in node.keywords}
    if None in keywords or "out" in keywords:
        return None
    attr, args = node.func.attr, node.args
    if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
        device = keywords.get("device")
        if attr not in _PLACING or device is None:
            return None
        text = ast.unparse(device)
        return text if _CHAIN.fullmatch(text) and text.split(".")[0] not in ("None", "torch") else None
    if attr == "to":
        device = args[0] if args else keywords.get("device")
        cast = isinstance(device, ast.Attribute) and (device.attr == "dtype"
                                                      or ast.unparse(device).startswith("torch."))
        if device is not None and not cast:
            text = ast.unparse(device)
            if _CHAIN.fullmatch(text) is None or text.split(".")[0] in ("None", "torch") \
                    or set(keywords) - {"device", "dtype", "non_blocking"} or len(args) > 1:
                return None
            return text
        if set(keywords) - {"dtype", "non_blocking"} or len(args) > 1:
            return None
        return _node_device(func, node.func.value, depth - 1)  # a dtype cast stays where it is
    if attr in _KEEPS:
        return _node_device(func, node.func.value, depth - 1)
    return None


def _local_device(func: Func, name: str, depth: int) -> str | None:
    """The one device every binding of the local ``name`` in ``func`` is made on (a parameter: none)."""
    if depth <= 0 or func.scope is None or name in func.scope.params or _bound_else_than_call(func, name):
        return None
    found: set[str | None] = set()
    for a in func.assigns:
        if name not in a.targets:
            continue
        if a.op != "=":
            if a.op == "del":
                continue
            continue  # `x /= 10`: in place, where it was
        try:
            tree = ast.parse(a.value.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        found.add(_node_device(func, tree, depth - 1))
    lines = {a.line for a in func.assigns if name in a.targets}
    for call in _binding_calls(func, name, 0):
        if call.span.line not in lines:
            found.add(_call_device(func, call))
    return found.pop() if len(found) == 1 else None


def _call_device(func: Func, call: Call) -> str | None:
    """The device expression the method chain ending in ``call`` is made on: a torch factory given
    ``device=D`` or a move ``.to(D)`` first, then only views, dtype casts and moves."""
    device: str | None = None
    for i, link in enumerate(chain(func, call) or [call]):
        args = split_args(link.arglist)
        method = link.callee.rpartition(".")[2]
        if i == 0 and link.callee.startswith("torch.") and link.callee[6:] in _PLACING:
            given = [a.text.strip() for a in args if a.keyword == "device"]
            device = given[0] if len(given) == 1 and not any((a.keyword or "").startswith("*") or a.keyword == "out"
                                                              or a.text.lstrip().startswith("*") for a in args) \
                else None
        elif method == "to":
            given = [a.text.strip() for a in args if a.keyword in (None, "device")]
            if len(given) == 1 and _DTYPE_TEXT.fullmatch(given[0]) is None:
                device = given[0]  # moved: wherever it was
            elif i == 0 or given and any(_DTYPE_TEXT.fullmatch(g) is None for g in given):
                return None
        elif i == 0 or method not in _KEEPS:
            return None
        if device is None or _CHAIN.fullmatch(device) is None or device.split(".")[0] in ("None", "torch"):
            return None
    return device


_DTYPE_TEXT = re.compile(r"(?:dtype\s*=\s*)?(?:torch\.\w+|[\w.]+\.dtype)")


_SELF_NAMES = frozenset({"self", "cls"})
_CHAIN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# torch factories that build on the device they are given
_PLACING = frozenset({"empty", "zeros", "ones", "full", "arange", "linspace", "logspace", "eye", "rand", "randn",
                      "randint", "randperm", "tensor", "as_tensor", "empty_strided", "zeros_like", "ones_like",
                      "empty_like", "full_like", "rand_like", "randn_like", "randint_like"})
# tensor methods whose result is on the tensor's device: views, dtype casts, copies in place
_KEEPS = frozenset({"view", "reshape", "contiguous", "float", "half", "bfloat16", "double", "int", "long", "bool",
                    "unsqueeze", "squeeze", "permute", "transpose", "flatten", "expand", "clone", "detach", "t",
                    "narrow", "requires_grad_", "view_as", "reshape_as", "expand_as", "fill_", "zero_", "normal_",
                    "uniform_", "mul_", "add_", "div_", "sub_", "clamp_", "masked_fill_", "copy_", "abs", "neg",
                    "exp", "log", "sqrt", "sum", "mean", "cumsum"})
