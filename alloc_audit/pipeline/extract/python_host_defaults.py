"""Stage 3, extract (Python): more of what ``python_host.default_source``
follows to prove a tensor made on the default device (issue 11, round 17).

- In a constructor (``__init__``), an attribute of the object
  (``self.alphas``) is followed through its bindings there like a local:
  nothing else has bound it yet.
- ``torch.tensor(data)`` without a device is made on the default device
  when ``data`` is no tensor: a list or tuple display or comprehension, a
  local every binding of which is one (``betas = []`` then appends), or a
  parameter annotated as a list or an array (``np.ndarray | list[float]``)
  and not as a tensor. Of a tensor it keeps the tensor's device.
- A call of a module-level function of the same file
  (``rescale(self.betas)``, ``betas_for_alpha_bar(n)``) is where every
  ``return`` of that function is, with the parameters it is given
  default-device tensors for counted as such (by position or by keyword,
  round 26); one level only (a call inside it is not followed).
- Round 26: a module of ``torch.nn`` built without a device
  (``nn.Linear(4, 4)``, a ``Sequential`` of such, a local bound only so and
  never moved in place) holds its parameters and buffers on the default
  device (``nn_module_default``); a loop variable is followed to what it
  iterates (``loop_targets``: ``for p in model.parameters()``, ``zip``,
  ``enumerate``, a list of default-device tensors).

- ``copied_source`` names the tensor an inheriting allocation copies its
  device from: the first argument of ``torch.zeros_like(x)``, the receiver
  of ``x.new_zeros(n)`` (round 24); a lambda's own parameter is none.

Nothing here makes a site: a proven source only marks a ``device=x.device``
or ``*_like`` allocation as one on the default device, a device site only
under a default-device context (``pipeline/default_device.py``). Pure.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..names import has_word
from .python_bindings import _binding_pattern, _other_binding_pattern

if TYPE_CHECKING:
    from .python import PythonExtractor

_LISTY = re.compile(r"\b(?:list|List|tuple|Tuple|Sequence|ndarray)\b")
_TENSORY = re.compile(r"\b(?:Tensor|Any|Parameter)\b|^\w*$")
_PROVE_DEPTH = 6  # locals followed inside a called function (a helper chains more of them)


@dataclass(frozen=True)
class Env:
    """What a proof may assume in one function: its parameters (never
    proven), those annotated as lists or arrays, the parameters a caller
    gave default-device tensors for, and whether it is a constructor."""

    params: frozenset[str]
    listy: frozenset[str] = frozenset()
    given: frozenset[str] = frozenset()
    ctor: bool = False
    nested: bool = False  # inside a called function: calls are not followed


def env_of(ext: PythonExtractor, body: Any) -> Env:
    params = body.child_by_field_name("parameters")
    text = ext.src.text(params, 2000) if params is not None else "()"
    names = frozenset(re.findall(r"[A-Za-z_]\w*", text))
    name = body.child_by_field_name("name")
    ctor = name is not None and ext.src.text(name, 80) == "__init__"
    return Env(names - {"self"} if ctor else names, _listy(text), ctor=ctor)


@functools.lru_cache(maxsize=1024)
def _listy(params: str) -> frozenset[str]:
    """Parameters annotated as a list or an array and never as a tensor
    (cached by the parameter text: every proof in one function asks again)."""
    if ":" not in params or (_LISTY.search(params) is None and params.isascii()
                             and not any(c in params for c in "\\'\"")):
        # no list word spelled, and no string or escape that could spell one: no annotation can be listy
        # (the words of an unparsed annotation without strings are its source's ASCII names)
        return frozenset()
    try:
        fn = ast.parse(f"def f{params}: pass").body[0]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    assert isinstance(fn, ast.FunctionDef)
    out = set()
    for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs):
        note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        if note and _LISTY.search(note) and not _TENSORY.search(note):
            out.add(arg.arg)
    return frozenset(out)


def not_a_tensor(arg: ast.expr, source: str, env: Env, bindings: Callable[[str, str], list[str]]) -> bool:
    """``torch.tensor(arg)``: ``arg`` is no tensor (see the module doc)."""
    if isinstance(arg, (ast.List, ast.Tuple, ast.ListComp)):
        return True
    if not isinstance(arg, ast.Name):
        return False
    if arg.id in env.listy:
        return True
    if arg.id in env.params:
        return False
    values = bindings(source, arg.id)
    return bool(values) and all(re.fullmatch(r"\[[^\n]*\]", v.strip()) is not None for v in values)


Prove = Callable[[str, str, Env, int], bool]  # (source, name, env, depth): every binding is default


def local_function_default(ext: PythonExtractor, call: ast.Call, env: Env,
                           arg_default: Callable[[ast.expr], bool], prove: Prove) -> bool:
    """``call`` runs a module-level function of this file every ``return``
    of which is a default-device expression (``prove`` of a name bound to
    it), given default-device tensors for the arguments ``arg_default``
    proves."""
    if env.nested or any(k.arg in (None, "device", "out") for k in call.keywords):
        return False
    assert isinstance(call.func, ast.Name)
    found = _module_function(ext, call.func.id)
    if found is None:
        return False
    fn, source = found
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    given = frozenset(n for n, a in zip(names, call.args, strict=False) if arg_default(a)) | frozenset(
        k.arg for k in call.keywords if k.arg is not None and arg_default(k.value))  # `_mel(t=3)` (round 26)
    params = frozenset(names + [a.arg for a in fn.args.kwonlyargs]) - given
    if fn.args.vararg is not None or fn.args.kwarg is not None:
        return False
    returns = [r.value for r in _own_returns(fn)]
    if not returns or any(r is None for r in returns):
        return False
    sub = Env(params, given=given, nested=True)
    lines = source.splitlines()
    for value in returns:
        assert value is not None
        # the proof reads bindings: a returned expression is proven as a binding of a fresh name
        name = f"_ret_{value.lineno}_{value.col_offset}"
        lines.append(f"    {name} = {ast.unparse(value)}")
    text = "\n".join(lines)
    return all(prove(text, f"_ret_{v.lineno}_{v.col_offset}", sub, _PROVE_DEPTH) for v in returns if v is not None)


def _own_returns(fn: ast.FunctionDef) -> list[ast.Return]:
    out: list[ast.Return] = []
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _module_function(ext: PythonExtractor, name: str) -> tuple[ast.FunctionDef, str] | None:
    """The module-level ``def name`` of this file and its source."""
    for child in ext.tree.root_node.children:
        node = child.child_by_field_name("definition") if child.type == "decorated_definition" else child
        if node is None or node.type != "function_definition":
            continue
        ident = node.child_by_field_name("name")
        if ident is None or ext.src.text(ident, 200) != name:
            continue
        source = ext.src.data[node.start_byte:node.end_byte].decode("utf-8", "replace")
        try:
            fn = ast.parse(source).body[0]
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        return (fn, source) if isinstance(fn, ast.FunctionDef) else None
    return None


def copied_source(node: Any, api: str, positional: list[str], text: Callable[[Any], str]) -> str | None:
    """The tensor whose device an inheriting allocation copies: the first
    argument of `torch.zeros_like(x)`, the receiver of `x.new_zeros(n)`."""
    if api.startswith("torch."):
        found = positional[0] if positional else None
    else:
        fn = node.children[0]
        receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
        found = text(receiver) if receiver is not None else None
    root = re.match(r"[A-Za-z_]\w*", found.strip()) if found is not None else None
    up = node.parent
    while root is not None and up is not None and up.type != "function_definition":
        params = up.child_by_field_name("parameters") if up.type == "lambda" else None
        if params is not None and has_word(text(params), root.group(0)):
            return None  # `lambda t: t.new_zeros(n)`: the lambda's own parameter, not the function's local
        up = up.parent
    return found


# round 26: the tensors of a `torch.nn` module built without a device, and loop variables

# `torch.nn` classes that hold the modules they are given (their tensors are those modules')
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})
# methods of a module that return it (or a copy) on the same device
_SAME_DEVICE_MODULE = frozenset({"float", "double", "half", "bfloat16", "eval", "train", "requires_grad_"})
# methods that move a module in place (`.to(d)` of a module moves the module itself, whatever is bound)
_MOVES_MODULE = r"\.(?:to|cuda|to_empty|xpu|npu|mps|ipu|share_memory|apply)\("


def nn_module_default(ext: PythonExtractor, node: ast.expr, source: str, env: Env, depth: int,
                      bindings: Callable[[str, str], list[str]]) -> bool:
    """``node`` is a module of ``torch.nn`` built without a device
    (`nn.Linear(4, 4)`, `nn.Sequential(nn.Conv2d(1, 5, 3), nn.Linear(5, 10))`,
    a dtype cast or `.eval()` of one, a submodule or index of one, or a local
    every binding of which is one and that the function never moves in
    place): its parameters and buffers are on the default device. A wrapper
    that moves what it is given (`DataParallel`), a keyword that hands in a
    tensor (`_weight=`), `**kwargs` or a container given anything unproven
    prove nothing."""
    if depth <= 0:
        return False
    if isinstance(node, ast.Call):
        if any(k.arg is None or k.arg == "device" or k.arg.startswith("_") for k in node.keywords) \
                or any(isinstance(a, ast.Starred) for a in node.args):
            return False
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _SAME_DEVICE_MODULE and not node.args:
            return nn_module_default(ext, func.value, source, env, depth, bindings)
        if isinstance(func, ast.Attribute) and func.attr == "to" and not node.keywords and len(node.args) == 1 \
                and re.fullmatch(r"torch\.(?:float\d*|bfloat16|half|double)", ast.unparse(node.args[0])):
            return nn_module_default(ext, func.value, source, env, depth, bindings)
        name = ext.resolve_text(ast.unparse(func))
        if not name.startswith("torch.nn.") or name.startswith("torch.nn.functional."):
            return False
        cls = name.rsplit(".", 1)[1]
        if not cls[:1].isupper() or cls.endswith("Parallel") or cls in ("Parameter", "Buffer"):
            return False
        if cls not in _CONTAINERS:
            return True  # a layer: its arguments are sizes and options
        items = [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else (a,))]
        items += [k.value for k in node.keywords]
        return all(nn_module_default(ext, i, source, env, depth - 1, bindings) for i in items)
    if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
        return nn_module_default(ext, node.value, source, env, depth - 1, bindings)  # a submodule
    if isinstance(node, ast.Subscript):
        return nn_module_default(ext, node.value, source, env, depth - 1, bindings)  # `model[0]`
    name = ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""
    if not name or name in env.params or (name.startswith("self.") and not env.ctor):
        return False
    if re.search(rf"(?<![\w.]){re.escape(name)}(?:\.[A-Za-z_]\w*|\[[^\]\n]*\])*{_MOVES_MODULE}", source):
        return False  # it or a submodule (`model[0].cuda()`) moved in place somewhere in the function
    values = bindings(source, name)
    if not values or any(_in_with(source, hit.start() + len(hit.group(1)))
                         for hit in _binding_pattern(name).finditer(source)):
        return False  # built under a context manager (`with deepspeed.zero.Init():`) that may place it
    for value in values:
        try:
            tree = ast.parse(value.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        if not nn_module_default(ext, tree, source, env, depth - 1, bindings):
            return False
    return True


# context managers of unittest, pytest, warnings and autograd: none places a tensor
NO_PLACEMENT = re.compile(r"(?:\w+\.assert[A-Z]\w*|pytest\.(?:raises|warns)|warnings\.catch_warnings|"
                           r"torch\.(?:no_grad|inference_mode|enable_grad))\(")


def _in_with(source: str, at: int) -> bool:
    """The line at ``at`` sits in the body of a `with` statement (an enclosing line of smaller indent)
    whose context manager may place what is built (not an assertion, a warning filter or a grad mode)."""
    lines = source[:at].split("\n")
    indent = len(lines[-1]) - len(lines[-1].lstrip()) if lines[-1].strip() else len(lines[-1])
    for line in reversed(lines[:-1]):
        text = line.lstrip()
        if not text or text.startswith("#") or len(line) - len(text) >= indent:
            continue
        if text.startswith(("with ", "async with ")) and not NO_PLACEMENT.match(text.split("with ", 1)[1]):
            return True
        indent = len(line) - len(text)
    return False


@dataclass(frozen=True)
class LoopTarget:
    """``for a, b in zip(x, y)``: the iterated expression and where the name sits among the targets."""

    iterable: ast.expr
    index: int
    count: int


def loop_targets(source: str, name: str) -> list[LoopTarget] | None:
    """Every binding of ``name`` other than ``name = ...`` in ``source``, each
    a `for` target (a statement's or a comprehension's); None when one is
    bound another way (unpacked, a `with` target, a walrus) or not read."""
    out: list[LoopTarget] = []
    for hit in _other_binding_pattern(name).finditer(source):
        if not hit.group(0).lstrip().startswith("for"):
            return None
        head = _FOR.match(source, hit.start() + len(hit.group(0)) - len(hit.group(0).lstrip()))
        if head is None:
            return None
        targets = _split_targets(head.group(1))
        if targets is None:
            return None
        if name not in targets:
            if any(name in t for t in targets) or re.search(rf"\b{re.escape(name)}\b", head.group(1)):
                return None  # a nested target
            continue
        text = _iterable(source, head.end())
        try:
            iterable = ast.parse(text, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        out.append(LoopTarget(iterable, targets.index(name), len(targets)))
    return out


_FOR = re.compile(r"for[ \t]+([^\n:]+?)[ \t]+in[ \t]+")


def _split_targets(text: str) -> list[str] | None:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return parts if all(p.isidentifier() for p in parts) else None


def _iterable(source: str, start: int) -> str:
    """The iterated expression from ``start`` (after `in`) to its `:`, a
    comprehension's closing bracket, `if`/`for`, or the line's end."""
    depth = 0
    end = min(len(source), start + 2000)
    i = start
    while i < end:
        ch = source[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (ch in ":\n" or source.startswith((" if ", " for "), i)):
            break
        i += 1
    return source[start:i].strip()


Expr = Callable[[ast.expr, bool], bool]  # (expression, shaped): made on the default device
_MODULE_DEPTH = 4  # a module's proof: its own budget of names and calls followed
_CHAIN = frozenset({"itertools.chain"})


def mutated(source: str, name: str) -> bool:
    """A statement of ``source`` adds to the list ``name`` or replaces an entry of it."""
    n = re.escape(name)
    return re.search(rf"(?<![\w.]){n}(?:\.(?:append|extend|insert)\(|\[[^\]\n]*\][ \t]*=(?!=)|[ \t]*\+=)",
                     source) is not None


def element_default(ext: PythonExtractor, it: ast.expr, index: int, count: int, source: str, env: Env,
                    shaped: bool, expr: Expr, named: Callable[[str], bool],
                    bindings: Callable[[str, str], list[str]]) -> bool:
    """Target ``index`` of ``count`` in `for ... in it` is a default-device
    tensor: a parameter or buffer of a module of `torch.nn` built without a
    device (`model.parameters()`, `model.named_buffers()`), an element of a
    list or tuple of default-device tensors (``expr`` proves an element,
    ``named`` a local list), followed through `zip`, `enumerate` and
    `itertools.chain`."""
    def element(node: ast.expr) -> bool:
        return element_default(ext, node, 0, 1, source, env, shaped, expr, named, bindings)

    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("zip", "enumerate"):
        if any(isinstance(a, ast.Starred) for a in it.args) or any(k.arg != "start" for k in it.keywords):
            return False
        if it.func.id == "zip":
            return len(it.args) == count and element(it.args[index])
        return count == 2 and index == 1 and len(it.args) == 1 and element(it.args[0])
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.keywords:
        method = it.func.attr
        tensors = {1: ("parameters", "buffers"), 2: ("named_parameters", "named_buffers")}.get(count, ())
        if method in tensors and index == count - 1:
            # a layer's parameters have a dimension; a buffer may be a 0-dim counter
            return (not shaped or "buffers" not in method) and nn_module_default(
                ext, it.func.value, source, env, _MODULE_DEPTH, bindings)
    if count != 1:
        return False
    if isinstance(it, ast.Call) and not it.keywords and it.args and ext.resolve_text(ast.unparse(it.func)) in _CHAIN:
        # `itertools.chain(model.parameters(), model.buffers())`: an element of each in turn
        return all(not isinstance(a, ast.Starred) and element(a) for a in it.args)
    if isinstance(it, (ast.List, ast.Tuple)):
        return bool(it.elts) and all(expr(e, shaped) for e in it.elts)
    if isinstance(it, (ast.ListComp, ast.GeneratorExp)):
        return expr(it.elt, shaped)
    if isinstance(it, ast.Name):  # a local list of default-device tensors (iterating a tensor drops a dimension)
        values = bindings(source, it.id)
        return not shaped and named(it.id) and bool(values) and all(v.strip()[:1] in "[(" for v in values)
    return False


# attributes of a tensor that are on its device
SAME_TENSOR = frozenset({"data", "grad", "T", "mT", "H", "mH", "real", "imag"})
# the legacy typed constructors: a host type (`torch.cuda.FloatTensor` is another name)
LEGACY_TENSORS = frozenset({f"{t}Tensor" for t in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short",
                                                   "Char", "Byte", "Bool")})
CPU_LITERAL = re.compile(r"""(?:torch\.device\(\s*)?(["'])cpu\1\s*\)?""")


def empty_shape(arg: ast.expr) -> bool:
    return isinstance(arg, (ast.Tuple, ast.List)) and not arg.elts


def moved_to_host(call: ast.Call) -> bool:
    """`.cpu()`, `.to("cpu")`, `.to(torch.device("cpu"), non_blocking=True)`: a copy on the host."""
    func = call.func
    assert isinstance(func, ast.Attribute)
    if any(k.arg not in ("non_blocking", "dtype", "copy") for k in call.keywords):
        return False
    if func.attr == "cpu":
        return not call.args
    return func.attr == "to" and len(call.args) == 1 and CPU_LITERAL.fullmatch(ast.unparse(call.args[0])) is not None


def dtype_only(call: ast.Call) -> bool:
    """`.to(torch.float64)`, `.to(dtype=torch.int32)`: a dtype, no device."""
    texts = [ast.unparse(a) for a in call.args] + [ast.unparse(k.value) for k in call.keywords if k.arg == "dtype"]
    if len(texts) != len(call.args) + len(call.keywords) or len(texts) != 1:
        return False
    return bool(re.fullmatch(r"torch\.(?:u?int\d+|float\d*|bfloat16|half|double|bool|complex\d+|long|int)", texts[0]))
