"""Stage 3, extract (Python): the device of each value a function binds,
followed in statement order through the ops that keep a device (issue 11,
round 30, ``device provenance``).

Input: a Python function (or a module's top-level statements) and a move
or factory site in it. Output: the *device token* of the moved value and of
the move's target, or of the tensor a factory copies its device from. A token
names one device without knowing which: ``host`` (``.cpu()``,
``torch.from_numpy``, a tokenizer's ``return_tensors="pt"`` output, a
``"cpu"`` literal), ``default`` (a torch factory given no device: the default
device, a device site only under a default-device context), ``cuda`` (the
current GPU, when the function never switches it), ``param:x`` (the device of
the parameter ``x``), ``lit:cuda:0``, or the device of one value the function
bound (``val@L:C``: a call of unknown device at line L, column C). A value's
token is that of the value it was made from through an op that keeps its
device: arithmetic, ``torch.cat``/``stack`` of values on one device, a view,
a slice, a dtype cast, a reduction, ``torch.where``, an op of
``torch.nn.functional`` / ``linalg`` / ``fft`` / ``special``, a tensor
method that stays, a factory given ``device=E`` (``E``'s token) or a
``*_like`` without one, ``.to(E)`` / ``.cuda()`` (the target's token). A
list built from ``[]`` by ``append``/``extend``/``insert``/``xs[i] = v`` or
written out has the token of its elements when they share one.

The walk is an abstract interpretation: branches join (a name bound to
different tokens on two paths gets a fresh token), a loop is run to a fixpoint and every
token made inside its body is new on each pass (joined at the loop head),
``break``/``continue``/``return``/``raise`` end a path, a ``try`` body may
stop anywhere, a ``with`` of an unknown manager (``deepspeed.zero.Init()``)
may place the factories in it, and a dropped ``m.to(d)`` moves a module in
place. An op mixing a host and an unknown value is of unknown device (a
0-dim host tensor goes with a GPU one); of a host and a GPU value, on the GPU.

Rule (``noop_move``): ``x.to(E)`` / ``x.cuda()`` copies nothing when ``x``'s token is ``E``'s, or ``E`` is the host or
``None``, or (round 33) ``x`` is empty (``python_empty.empty_move``); ``sd["w"].to(D)`` of ``sd = torch.load(p,
map_location=D)`` too (``python_device_calls.loaded``). True: ``inp = inps[i].to(dev)`` then ``f(inp.to(dev))``;
``torch.stack([F.pad(torch.ones(n, device=d), p) for ...]).to(d)``. False: ``x = y.to(d)`` in one branch of an ``if``,
then ``x.to(d)``; ``x.to(other)``; ``f(x).to(d)``; ``x.to(d, copy=True)``; a dtype beside the device (a cast).
``host_copy`` / ``host_device``: a ``*_like`` / ``new_*`` / ``device=x.device`` of a value whose token is ``host``
allocates no device memory. True: ``m = x.cpu() * 2; torch.zeros_like(m)``. False: ``m = x.cpu() * y`` (``y`` unknown).

Cost (issue 15): functions (module top levels) of at most 150 lines whose text above spells a move or a device. Pure.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from .common import enclosing
from .python_device_calls import Bindings
from .python_device_values import (
    _ADDS,
    _DTYPE,
    _LOOP_PASSES,
    _NO_PLACEMENT,
    _SCALAR,
    _SWITCHES,
    _UNKNOWN,
    DEFAULT,
    HOST,
    HOST_OR,
    NONE,
    Env,
    Val,
    _asked,
    _Calls,
    _Loop,
    _producer,
    _too_long,
    params_of,
)
from .python_empty import empty_move

if TYPE_CHECKING:
    from .python import PythonExtractor


class Flow(Bindings):
    """The device tokens of one function's locals before each of its statements."""

    def __init__(self, ext: PythonExtractor, fn: ast.AST, params: frozenset[str], dtypes: frozenset[str],
                 source: str, hosts: bool = True, scalars: frozenset[str] = frozenset()) -> None:
        self.ext = ext
        self.params = params
        self.dtypes = dtypes  # parameters annotated or defaulted as a dtype
        self.scalars = scalars  # parameters annotated as a number, a flag or a string (round 32)
        self.switches = ("device(" in source or "device_of(" in source) and _SWITCHES.search(source) is not None
        self.before: dict[int, Env] = {}
        self.volatile: set[str] = set()  # `global` / `nonlocal` names: a call may bind them
        self.loops: list[_Loop] = []
        self.parents: dict[int, ast.AST] = {}
        self.bound: set[str] = set()
        self.asked: set[int] = set()  # the statements around a move or a copy: their environments are kept
        self.calls: _Calls = {}
        self.stores: dict[int, set[str]] = {}  # a `try` statement's body: what it binds (cached)
        moves: list[ast.AST] = []
        stack: list[ast.AST] = [fn]
        parents = self.parents
        while stack:  # one walk: parents, bound names, the calls a site may ask about
            parent = stack.pop()
            if isinstance(parent, ast.Name):
                if isinstance(parent.ctx, ast.Store):
                    self.bound.add(parent.id)
                continue
            if isinstance(parent, ast.Call):
                if parent.end_lineno is not None and parent.end_col_offset is not None:
                    self.calls.setdefault((parent.lineno, parent.col_offset, parent.end_lineno,
                                           parent.end_col_offset), parent)
                if _asked(parent, hosts):
                    moves.append(parent)
            for field in parent._fields:
                value = getattr(parent, field, None)
                if isinstance(value, list):
                    for child in value:
                        if isinstance(child, ast.AST):
                            parents[id(child)] = parent
                            stack.append(child)
                elif isinstance(value, ast.AST):
                    parents[id(value)] = parent
                    stack.append(value)
        # statements below the last asked one, outside every loop, change nothing asked: not walked
        self.last = 0
        for move in moves:
            up: ast.AST | None = move
            while up is not None and not isinstance(up, ast.stmt):
                up = self.parents.get(id(up))
            if isinstance(up, ast.stmt):
                self.asked.add(id(up))
                self.last = max(self.last, up.end_lineno or up.lineno)
        body = fn.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) else []
        self.block(body, {})

    def block(self, body: list[ast.stmt], env: Env | None) -> Env | None:
        for stmt in body:
            if env is None:
                return None  # after a return, raise, break or continue: never runs on this path
            if not self.loops and stmt.lineno > self.last:
                return env
            env = self.stmt(stmt, env)
        return env

    def stmt(self, node: ast.stmt, env: Env) -> Env | None:
        if id(node) in self.asked:
            self.before[id(node)] = dict(env)
        # `env` is this path's own (a branch, a loop pass and a handler each walk a copy): changed in place
        if isinstance(node, ast.Assign):
            value = self.dev(node.value, env)
            for target in node.targets:
                self.bind(target, value, node.value, env)
            return env
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, self.dev(node.value, env), node.value, env)
            return env
        if isinstance(node, ast.AugAssign):
            self.augment(node, env)
            return env
        if isinstance(node, ast.Expr):
            self.effect(node.value, env)
            return env
        if isinstance(node, (ast.Return, ast.Raise)):
            return None
        if isinstance(node, (ast.Break, ast.Continue)):
            if self.loops:
                (self.loops[-1].breaks if isinstance(node, ast.Break) else self.loops[-1].continues).append(env)
            return None
        if isinstance(node, ast.If):
            self.dev(node.test, env)
            return self.join(self.block(node.body, dict(env)), self.block(node.orelse, dict(env)), node)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return self.loop(node, env)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self.with_(node, env)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self.try_(node, env)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.forget(node.name, env)
            env[node.name] = Val(self.fresh("def", node))
            return env
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.volatile.update(node.names)
            return env
        if isinstance(node, ast.Delete):
            for target in node.targets:
                for name in self.names_in(target):
                    self.forget(name, env)
            return env
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                self.forget(name, env)
                env[name] = Val(self.fresh("import", node))
            return env
        if isinstance(node, (ast.Pass, ast.Assert)):
            return env
        # anything else (`match`): every name it binds is of unknown device after it
        for name in self.stored(node):
            self.forget(name, env)
            env[name] = Val(self.fresh("stmt", node))
        return env

    def loop(self, node: ast.For | ast.AsyncFor | ast.While, env: Env) -> Env | None:
        loop = _Loop(node)
        element = self.element(node.iter, env) if isinstance(node, (ast.For, ast.AsyncFor)) else None
        head = dict(env)
        out: Env | None = None
        for _ in range(_LOOP_PASSES):
            loop.continues, loop.breaks = [], []
            self.loops.append(loop)
            try:
                inner = dict(head)
                if isinstance(node, ast.While):
                    self.dev(node.test, inner)
                else:
                    self.bind_element(node.target, element, node, inner)
                out = self.block(node.body, inner)
            finally:
                self.loops.pop()
            ends = [e for e in (out, *loop.continues) if e is not None]
            new = head
            for end in ends:
                new = self.loop_join(new, end, env, loop, node)
            if new == head:
                break
            head = new
        else:
            head = {k: (v if env.get(k) == v else Val(self.fresh(f"phi:{k}", node))) for k, v in head.items()}
        if isinstance(node, ast.While):
            self.before[id(node)] = dict(head)  # the test runs at the head of every pass
        exit_env: Env | None = head
        for broken in loop.breaks:
            exit_env = self.join(exit_env, broken, node)
        return self.block(node.orelse, exit_env) if node.orelse else exit_env

    def loop_join(self, head: Env, end: Env, entry: Env, loop: _Loop, node: ast.stmt) -> Env:
        """The head of the next pass: a token made inside the body is another device's on the next pass."""
        out: Env = {}
        for key in head.keys() | end.keys():
            a, b = self.implicit(head, key), self.implicit(end, key)
            if a == b and a is not None:
                out[key] = a
            elif b is None or a is None and not key.isidentifier():
                out[key] = Val(self.fresh(f"phi:{key}", node))
            elif a is None:
                out[key] = b if not loop.inside(b.token) else Val(self.fresh(f"phi:{key}", node))
            elif loop.inside(b.token) or loop.inside(a.token) and a.token != b.token:
                out[key] = Val(self.fresh(f"phi:{key}", node), a.uniform and b.uniform and not (a.listy or b.listy),
                               a.listy and b.listy)
            else:
                out[key] = self.join_val(a, b, key, node)
        return out

    def with_(self, node: ast.With | ast.AsyncWith, env: Env) -> Env | None:
        saved = env.get("<default>")
        for item in node.items:
            call = item.context_expr
            text = ast.unparse(call)
            if isinstance(call, ast.Call) and self.resolve(call.func) == "torch.device" and call.args:
                env["<default>"] = Val(self.device(call, env))  # a default-device context
            elif not _NO_PLACEMENT.match(text):
                env["<default>"] = Val(self.fresh("ctx", node))  # `deepspeed.zero.Init()` may place what is built
            else:
                self.dev(call, env)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, Val(self.fresh("with", node)), None, env)
        after = self.block(node.body, env)
        if after is not None:
            if saved is None:
                after.pop("<default>", None)
            else:
                after["<default>"] = saved
        return after

    def try_(self, node: Any, env: Env) -> Env | None:
        body_out = self.block(node.body, dict(env))
        # a handler may start anywhere in the body: what the body binds is of unknown device there
        stopped = dict(env)
        if id(node) not in self.stores:
            self.stores[id(node)] = self.stored_in(node.body)
        for name in self.stores[id(node)]:
            self.forget(name, stopped)
            stopped[name] = Val(self.fresh(f"try:{name}", node))
        ends: list[Env | None] = [self.block(node.orelse, body_out) if node.orelse else body_out]
        for handler in node.handlers:
            start = dict(stopped)
            if handler.name:
                start[handler.name] = Val(self.fresh("exc", handler))
            ends.append(self.block(handler.body, start))
        out: Env | None = None
        for end in ends:
            out = self.join(out, end, node)
        if node.finalbody:
            if out is None:
                self.block(node.finalbody, dict(stopped))
                return None
            return self.block(node.finalbody, out)
        return out

    def augment(self, node: ast.AugAssign, env: Env) -> None:
        key = self.key(node.target)
        if key is None:
            return
        old = self.dev(node.target, env)
        value = self.dev(node.value, env)
        if old.listy:
            env[key] = self.add(old, value if value.uniform else Val(None))
        elif old.token in (None, _SCALAR):
            self.forget(key, env)
            env[key] = self.combine([old, value], [node.target, node.value])
        # `x += y` of a tensor: in place, `x` stays where it is

    def effect(self, call: ast.expr, env: Env) -> None:
        """A statement that only calls: a list grown, a module moved in place, the default device set."""
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            key = self.key(call.func.value)
            method = call.func.attr
            if key is not None and method in _ADDS | {"extend"} and call.args:
                old = self.dev(call.func.value, env)
                if old.listy:
                    added = self.dev(call.args[-1], env)
                    env[key] = self.add(old, added if method != "extend" else (added if added.uniform else _UNKNOWN))
                else:
                    self.forget(key, env)
                    env[key] = Val(self.fresh("grown", call))
                return
            if key is not None and method in ("to", "cuda", "cpu", "to_empty", "apply", "half", "float", "bfloat16",
                                              "double", "xpu", "npu", "mps", "share_memory_", "load_state_dict",
                                              "set_", "requires_grad_"):
                self.forget(key, env)
                env[key] = Val(self.fresh("moved", call))  # a module moved in place, whatever it held
                return
            if key is not None and method in ("register_buffer", "register_parameter") and len(call.args) >= 2 \
                    and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
                # round 32: `self.register_buffer("w", v)` binds `self.w` to `v`'s tensor
                value, member = self.dev(call.args[1], env), f"{key}.{call.args[0].value}"
                self.forget(member, env)
                env[member] = Val(value.token, True) if value.uniform else _UNKNOWN
                return
            if self.resolve(call.func) == "torch.set_default_device" and call.args:
                env["<default>"] = Val(self.device(call.args[0], env))
                return
        self.dev(call, env)


def _flow(ext: PythonExtractor, node: Any) -> tuple[Flow, ast.Call] | None:
    """The flow of the function around the tree-sitter call ``node`` (the module's top level outside any),
    and the ``ast`` call at its position."""
    body = enclosing(node.parent, "function_definition")
    if body is None and enclosing(node.parent, "class_definition") is not None:
        return None
    key = body.start_byte if body is not None else -1
    cache = ext.device_flows
    if key not in cache:
        text = ext.src.data[body.start_byte:body.end_byte] if body is not None else ext.src.data
        cache[key] = _build(ext, body, _producer(text))
    built = cache[key]
    if built is None:
        return None
    flow, calls, row0, shifts = built
    (row, col), (end_row, end_col) = node.start_point, node.end_point
    line, end = row - row0 + 1, end_row - row0 + 1
    if line == 1 and body is not None:
        return None  # a call in the `def` line (a default value): runs where the function is defined
    # a chain's calls start together (`torch.empty_like(x).contiguous()`): the end tells them apart
    found = calls.get((line, col - shifts.get(line, 0), end, end_col - shifts.get(end, 0)))
    return (flow, found) if found is not None else None


def _build(ext: PythonExtractor, body: Any, hosts: bool) -> tuple[Flow, _Calls, int, dict[int, int]] | None:
    data = ext.src.data
    if body is None:
        start, end, row0, indent = 0, len(data), 0, 0
    else:
        start, end = body.start_byte, body.end_byte
        row0, indent = body.start_point
    if _too_long(ext.src.data, body):
        return None  # a long function: its walk costs more than the few moves it would prove (issue 15)
    lines = data[start:end].decode("utf-8", "replace").split("\n")
    shifts: dict[int, int] = {}
    out = [lines[0]]
    for number, line in enumerate(lines[1:], 2):
        cut = min(indent, len(line) - len(line.lstrip(" \t")))
        shifts[number] = cut
        out.append(line[cut:])
    source = "\n".join(out)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    fn: ast.AST = tree
    if body is not None:
        if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        fn = tree.body[0]
    params, dtypes, scalars = params_of(fn)
    try:
        flow = Flow(ext, fn, params, dtypes, source, hosts, scalars)
    except RecursionError:
        return None
    # a tree-sitter column counts bytes, as `col_offset` does
    return flow, flow.calls, row0, shifts


def _before(ext: PythonExtractor, node: Any) -> bytes | None:
    """The text of ``node``'s function (or module) above it; None where ``_flow`` walks nothing (round 33)."""
    body = enclosing(node.parent, "function_definition")
    if body is None and enclosing(node.parent, "class_definition") is not None or _too_long(ext.src.data, body):
        return None
    return bytes(ext.src.data[body.start_byte if body is not None else 0:node.start_byte])


# what a function above a move spells when a value there is placed (a move, a factory given a device)
_PLACES = (b".to(", b".cuda(", b"device=", b"device =", b".device", b"map_location")
_CASTS = frozenset({"type", "float", "half", "bfloat16", "double", "int", "long", "short", "bool", "byte", "to"})


def _cast_next(flow: Flow, call: ast.Call) -> bool:
    """The move's result is cast at once (`B.to(d).type(t)`): the line allocates (the cast copies), so the
    move stays its site."""
    attr = flow.parents.get(id(call))
    return isinstance(attr, ast.Attribute) and attr.attr in _CASTS and isinstance(flow.parents.get(id(attr)), ast.Call)


def noop_move(ext: PythonExtractor, node: Any) -> bool:
    """``x.to(E)`` / ``x.cuda()`` (the tree-sitter call ``node``) copies nothing onto a device: ``x`` is
    already where ``E`` is, or ``E`` is the host or ``None``."""
    if ext.empty_guard_file and empty_move(ext, node):
        return True  # round 33: `x.reshape((0, 5)).to(d)` under `if x.numel() == 0:`: zero elements
    before = _before(ext, node)
    if before is None or not any(n in before for n in _PLACES) and b"None" not in before:
        return False  # nothing above places a value: no walk
    found = _flow(ext, node)
    if found is None:
        return False
    flow, call = found
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("to", "cuda") or _cast_next(flow, call):
        return False
    env = flow.env_at(call)
    if env is None:
        return False
    if func.attr == "to":
        if len(call.args) > 1 or any(k.arg == "dtype" for k in call.keywords):
            return False  # a dtype given with the device: a cast, which copies
        where = flow.target(call, env)
    elif call.args or call.keywords and any(k.arg != "non_blocking" for k in call.keywords):
        return False
    else:
        where = flow.cuda(call)
    if where is None or where == _DTYPE:
        return False
    value = flow.dev(func.value, env).token  # round 35: of `HOST_OR`'s other device, a host copy or none at all
    return where in (HOST, NONE) or value == where \
        or where.startswith(HOST_OR + "@") and value == where.partition("=")[2]


def copied_device(ext: PythonExtractor, node: Any, which: str) -> str | None:
    """The token of what the factory ``node`` takes its device from (``which``: ``"first"``, the first
    argument of a ``*_like``; ``"receiver"``, of ``x.new_zeros``; ``"device"``, the ``device=`` given):
    ``HOST``, ``DEFAULT``, another token, or None; asked only where the function above spells a host
    producer."""
    before = _before(ext, node)
    if before is None or not _producer(before):
        return None  # no host producer nor factory without a device above: no walk
    found = _flow(ext, node)
    if found is None:
        return None
    flow, call = found
    env = flow.env_at(call)
    if env is None:
        return None
    if which == "first":
        if not call.args or isinstance(call.args[0], ast.Starred):
            return None
        return flow.dev(call.args[0], env).token
    if which == "receiver":
        return flow.dev(call.func.value, env).token if isinstance(call.func, ast.Attribute) else None
    given = next((k.value for k in call.keywords if k.arg == "device"), None)
    if given is None:
        return None
    token = flow.device(given, env)
    return DEFAULT if token == NONE else token


def host_copy(ext: PythonExtractor, node: Any, like: bool) -> bool:
    """The ``*_like`` (``like``: its first argument) or ``x.new_*`` (its receiver) ``node`` copies the device
    of a value the function made on the host."""
    return copied_device(ext, node, "first" if like else "receiver") == HOST


# a device written out (`device="cuda:0"`): no local's provenance to follow
_LITERAL_DEVICE = re.compile(r"""(["'])[\w:]*\1|\d+""")


def host_device(ext: PythonExtractor, node: Any, device: str | None, given: str) -> bool:
    """The ``device=`` ``given`` to the factory ``node`` (classified ``device``) names the host: a local the
    function bound to a host device, or ``x.device`` of a host value."""
    return device != DEFAULT and _LITERAL_DEVICE.fullmatch(given.strip()) is None \
        and copied_device(ext, node, "device") == HOST
