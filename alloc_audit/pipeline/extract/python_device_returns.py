"""Stage 3, extract (Python): where a function of the same file puts what it
returns, for ``python_device_flow``'s walk (issue 11, round 35).

Input: a call ``f(a, b)`` of a function the file defines once at its top
level (a name no import binds), or ``self.m(a, b)`` of a method only one
class of the file defines. Output: the parameter whose device every value
the function returns is on, when there is one. The function is walked by
the same flow, its parameters standing for themselves (``param:p``): when
every ``return`` gives a tensor made from ``p`` (or a tuple of such) through
ops that keep a device, the call's value is where its argument for ``p`` is.

True: ``all_gather_and_flatten(index)`` of ``def all_gather_and_flatten(t):
out = torch.empty(n, *t.shape, device=t.device); ...; return
out.flatten(end_dim=1)``; ``xx, yy = self._meshgrid(x, y)`` of ``yy, xx =
torch.meshgrid(y, x); return xx.reshape(-1), yy.reshape(-1)`` (``torch.meshgrid``
runs where its inputs are, all on one device). False: a return of anything
else (a module's output, a value of unknown device, ``None``), a generator,
a function whose end can be reached (it returns ``None``), a name defined
twice, ``self`` itself, an argument given through ``*args``/``**kwargs``.
Functions over 150 lines are not walked; each is walked once per file. Pure.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from .python_device_flow import Flow
from .python_device_values import Env, _too_long, params_of

if TYPE_CHECKING:
    from .python import PythonExtractor


class _Returns(Flow):
    """A flow that walks every statement and keeps the environment before each ``return``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.returned: list[tuple[ast.Return, Env]] = []
        super().__init__(*args, **kwargs)

    def block(self, body: list[ast.stmt], env: Env | None) -> Env | None:
        self.last = 1 << 30  # no move is asked: every statement may reach a return
        return super().block(body, env)

    def stmt(self, node: ast.stmt, env: Env) -> Env | None:
        if isinstance(node, ast.Return):
            self.returned.append((node, dict(env)))
        return super().stmt(node, env)


def returned_param(ext: PythonExtractor, name: str, method: bool) -> tuple[str, int] | None:
    """For a call of ``name`` (``method``: ``self.name``): the parameter every return is on, and its position
    among the arguments a call passes (-1: keyword-only)."""
    cache = ext.device_returns
    if ("defs",) not in cache:
        cache[("defs",)] = _definitions(ext)
    functions, methods = cache[("defs",)]
    if method:
        found = methods.get(name, [])
    else:
        found = functions.get(name, []) if ext.resolve_text(name) == name else []
    if len(found) != 1:
        return None
    key = ("fn", found[0].start_byte)
    if key not in cache:
        cache[key] = None  # a cycle proves nothing
        cache[key] = _summary(ext, found[0], method)
    result: tuple[str, int] | None = cache[key]
    return result


def _definitions(ext: PythonExtractor) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """The file's top-level functions and its classes' methods, by name."""
    functions: dict[str, list[Any]] = {}
    methods: dict[str, list[Any]] = {}
    for child in ext.tree.root_node.named_children:
        node = _definition(child)
        if node is not None and node.type == "function_definition":
            functions.setdefault(ext.src.text(node.child_by_field_name("name"), 200), []).append(node)
        elif node is not None and node.type == "class_definition":
            body = node.child_by_field_name("body")
            for member in body.named_children if body is not None else ():
                fn = _definition(member)
                if fn is not None and fn.type == "function_definition":
                    methods.setdefault(ext.src.text(fn.child_by_field_name("name"), 200), []).append(fn)
    return functions, methods


def _definition(node: Any) -> Any:
    if node.type == "decorated_definition":
        return node.child_by_field_name("definition")
    return node


def _summary(ext: PythonExtractor, body: Any, method: bool) -> tuple[str, int] | None:
    if _too_long(ext.src.data, body):
        return None
    row0, indent = body.start_point
    lines = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace").split("\n")
    source = "\n".join([lines[0], *(line[min(indent, len(line) - len(line.lstrip(" \t"))):] for line in lines[1:])])
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _ends(fn.body) or _yields(fn):
        return None
    params, dtypes, scalars = params_of(fn)
    try:
        flow = _Returns(ext, fn, params, dtypes, source, True, scalars)
    except RecursionError:
        return None
    tokens = set()
    for ret, env in flow.returned:
        if ret.value is None:
            return None
        for value in ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]:
            found = flow.dev(value, env)
            if not found.uniform or found.listy or found.token is None or not found.token.startswith("param:"):
                return None
            tokens.add(found.token[6:])
    if len(tokens) != 1:
        return None
    param = tokens.pop()
    a = fn.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    if method and positional and positional[0] in ("self", "cls") and not _static(fn):
        positional = positional[1:]
    if param in ("self", "cls") or param not in positional and param not in [x.arg for x in a.kwonlyargs]:
        return None  # `self`, `*args`, an attribute of a parameter
    return param, positional.index(param) if param in positional else -1


def _static(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _ends(body: list[ast.stmt]) -> bool:
    """Every path through ``body`` ends in a ``return`` or a ``raise``: the function never returns ``None``
    by falling off its end."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _ends(last.body) and _ends(last.orelse)
    return False


def _yields(fn: ast.AST) -> bool:
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False
