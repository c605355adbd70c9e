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
  default-device tensors for counted as such; one level only (a call inside
  it is not followed).

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
    if ":" not in params:
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
    given = frozenset(n for n, a in zip(names, call.args, strict=False) if arg_default(a))
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
