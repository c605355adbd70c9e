"""Stage 5a, after derive (a helper of ``host_vias``): where one allocation a
derived site reaches takes its device from, as the parameters of the
function the derived site calls (``Roots``), followed through locals,
``self`` attributes of the object being built, arithmetic and the calls on
the path; ``("", "<none>", "device")`` stands for the default device. Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Arg, Call
from .index import Func, ProjectIndex, Reach, last_name
from .index.values import call_params
from .move_apis import TO_MOVES

_DEPTH = 3  # as the derived sites' own search
_NEST = 14  # names, attributes and operands followed for one expression
_FACTORY = re.compile(r"torch\.(?:rand|randn|randint|randperm|zeros|ones|empty|full|arange|linspace|logspace|eye|"
                      r"tensor|as_tensor|from_numpy|stack|cat)")
_OF_INPUT = frozenset({"torch.as_tensor", "torch.stack", "torch.cat"})  # on the device of what they are given
# ops whose result is where their tensor arguments are (numbers and strings among them count for nothing)
_OF_TENSORS = frozenset({"torch.outer", "torch.matmul", "torch.einsum", "torch.polar", "torch.complex", "torch.exp",
                         "torch.sin", "torch.cos", "torch.pow", "torch.mul", "torch.add", "torch.where"})
_SAME = frozenset({"clone", "detach", "contiguous", "float", "double", "half", "long", "int", "bool", "view",
                   "cos", "sin", "exp", "log", "sqrt", "rsqrt", "abs", "neg", "reciprocal", "pow", "cumsum",
                   "reshape", "requires_grad_", "unsqueeze", "squeeze", "flatten", "t", "transpose", "permute",
                   "expand", "repeat"})
_DEVICE, _TENSOR = "device", "tensor"
_NONE = "<none>"  # a device given as None: the default device
Root = tuple[str, str, str]  # (function id, parameter, kind)


class Roots:
    """The parameters one reached allocation takes its device from, as
    parameters of ``start`` where the path lets them be lifted."""

    def __init__(self, index: ProjectIndex, start: Func, reached: Reach) -> None:
        self.index, self.start, self.reached = index, start, reached
        self.funcs: list[Func] = [start]
        self.visiting: set[tuple[str, str, str]] = set()
        for i, _hop in enumerate(reached.hops):
            nxt = reached.hops[i + 1] if i + 1 < len(reached.hops) else None
            callee = index.func(nxt.path, nxt.caller) if nxt is not None else index.func(reached.site.path,
                                                                                      reached.site.scope)
            if callee is None:
                self.funcs = []
                return
            if _calls_param(callee):
                self.funcs = []
                return
            self.funcs.append(callee)

    def site_roots(self, receiver: bool = False) -> set[Root] | None:
        if not self.funcs or len(self.funcs) != len(self.reached.hops) + 1:
            return None
        func = self.funcs[-1]
        site = self.reached.site
        # the call the site is: a chain (`torch.arange(n).float().to(d)`) starts each of its calls at one place
        at = [c for c in func.calls if c.span.line == site.span.line and c.span.col == site.span.col]
        call = next((c for c in at if last_name(c.callee) == last_name(site.api)), at[0] if at else None)
        if call is None:
            return None
        source = _source(site.api, call)
        if source is None:
            return None
        roots = self.expr(func, source[0], source[1], _NEST)
        if receiver:  # `t.to(d)`: on `d`, or where `t` is when `d` is None
            moved = self.expr(func, call.callee.rsplit(".", 1)[0], _TENSOR, _NEST) if "." in call.callee else None
            roots = roots | moved if roots is not None and moved is not None else None
        # lift the roots of each function on the path to its caller's, last hop first
        for i in range(len(self.reached.hops) - 1, -1, -1):
            if roots is None:
                return None
            inner, outer, hop = self.funcs[i + 1], self.funcs[i], self.reached.hops[i]
            lifted: set[Root] = set()
            for root in roots:
                if root[0] != inner.id:
                    lifted.add(root)
                    continue
                up = self.lift(outer, hop.call, inner, root)
                if up is None:
                    return None
                lifted |= up
            roots = lifted
        return roots

    def lift(self, outer: Func, call: Call, inner: Func, root: Root) -> set[Root] | None:
        text = _passed(inner, root[1], split_args(call.arglist))
        if text is None:
            return None
        return self.expr(outer, text, root[2], _NEST)

    def expr(self, func: Func, text: str, kind: str, depth: int) -> set[Root] | None:
        try:
            node = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            return None
        return self.node(func, node, kind, depth)

    def node(self, func: Func, node: ast.expr, kind: str, depth: int) -> set[Root] | None:
        if depth <= 0:
            return None
        if isinstance(node, ast.Constant):
            if kind == _DEVICE:
                if node.value is None:
                    return {("", _NONE, kind)}
                return set() if isinstance(node.value, str) and node.value.startswith(("cpu", "meta")) else None
            return set()  # a Python value: `as_tensor` of it is on the host
        if _cpu_device(node):
            return set()
        if isinstance(node, ast.IfExp):
            a, b = self.node(func, node.body, kind, depth - 1), self.node(func, node.orelse, kind, depth - 1)
            return a | b if a is not None and b is not None else None
        if kind == _TENSOR and isinstance(node, (ast.BinOp, ast.UnaryOp, ast.List, ast.Tuple)):
            # arithmetic of tensors and numbers is where its tensors are; so is a display handed to `torch.cat`
            parts = [node.left, node.right] if isinstance(node, ast.BinOp) else \
                [node.operand] if isinstance(node, ast.UnaryOp) else node.elts
            if isinstance(node, ast.BinOp) and any(_sized(p) for p in parts):
                # an operand made by a sized factory (`torch.arange(0, d, 2) / d`): the result is on its device, as
                # torch only mixes a tensor with 0-dim tensors of the host (a GPU scalar with a host array raises)
                parts = [p for p in parts if _sized(p)]
            return self.union(func, parts, depth - 1)
        if isinstance(node, ast.Attribute) and node.attr == "device":
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return self.attr(func, "device", kind, depth - 1)
            return self.node(func, node.value, _TENSOR, depth - 1)
        if isinstance(node, ast.Subscript):
            return self.node(func, node.value, kind, depth - 1)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return self.attr(func, node.attr, kind, depth - 1)
        if isinstance(node, ast.Name):
            return self.name(func, node.id, kind, depth - 1)
        if isinstance(node, ast.Call) and kind == _TENSOR:
            return self.made(func, node, depth - 1)
        return None

    def union(self, func: Func, nodes: Sequence[ast.expr], depth: int) -> set[Root] | None:
        out: set[Root] = set()
        for part in nodes:
            found = self.node(func, part, _TENSOR, depth)
            if found is None:
                return None
            out |= found
        return out

    def name(self, func: Func, name: str, kind: str, depth: int) -> set[Root] | None:
        key = (func.id, name, kind)
        if key in self.visiting:
            return set()  # a binding from itself (`x = torch.as_tensor(x, device=x.device)`) adds no other place
        self.visiting.add(key)
        try:
            return self._name(func, name, kind, depth)
        finally:
            self.visiting.discard(key)

    def _name(self, func: Func, name: str, kind: str, depth: int) -> set[Root] | None:
        scope = func.scope
        if scope is None:
            return None
        bindings = [a.value for a in func.assigns if name in a.targets and (a.op != "=" or len(a.targets) != 1)]
        if bindings:
            return None  # a tuple target, an augmented one of unknown effect
        values = [a.value for a in func.assigns if a.targets == (name,)]
        values += [f"{c.callee}({c.arglist})" for c in func.calls if (c.target or "").strip() == name]
        if any((item.target or "").strip() == name for w in func.withs for item in w.items) or _mutated([func], name):
            return None
        out: set[Root] = set()
        if name in scope.params:
            out.add((func.id, name, kind))
        elif not values:
            return None
        for value in values:
            found = self.expr(func, value, kind, depth)
            if found is None:
                return None
            out |= found
        return out

    def made(self, func: Func, node: ast.Call, depth: int) -> set[Root] | None:
        """Where a tensor a call makes is: a torch factory's ``device=``, or
        the tensor a same-device method is called on."""
        callee = ast.unparse(node.func)
        device = next((k.value for k in node.keywords if k.arg == "device"), None)
        if _FACTORY.fullmatch(callee):
            if device is not None:
                return self.node(func, device, _DEVICE, depth)
            if callee in ("torch.as_tensor", "torch.tensor") and node.args:
                # of a tensor: on its device; of Python data: on the default device
                found = self.node(func, node.args[0], _TENSOR, depth)
                return found | {("", _NONE, _DEVICE)} if found is not None else None
            if callee in _OF_INPUT and node.args:
                return self.node(func, node.args[0], _TENSOR, depth)
            if callee == "torch.from_numpy":
                return set()
            return {("", _NONE, _DEVICE)}  # on the default device: the host unless a context reaches the path
        if callee in _OF_TENSORS and device is None:
            return self.union(func, node.args, depth)  # `torch.outer(t, freqs)`: where its tensors are
        if isinstance(node.func, ast.Attribute) and node.func.attr in _SAME:
            return self.node(func, node.func.value, _TENSOR, depth)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "type_as" and len(node.args) == 1:
            return self.node(func, node.args[0], _TENSOR, depth)  # the other tensor's type, its device included
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            if device is not None:  # `.to(dtype=..., device=D)`: on D
                return self.node(func, device, _DEVICE, depth)
            if all(_dtype(a) for a in node.args) and all(k.arg in ("dtype", "non_blocking", "copy")
                                                         for k in node.keywords):
                return self.node(func, node.func.value, _TENSOR, depth)  # a dtype cast stays where it is
            if len(node.args) == 1 and not node.keywords and not _dtype(node.args[0]):
                # `.to(D)`: on D, or (D None) where it was; both must be the host
                to, moved = self.node(func, node.args[0], _DEVICE, depth), self.node(func, node.func.value, _TENSOR,
                                                                                      depth)
                return to | moved if to is not None and moved is not None else None
        return None

    def attr(self, func: Func, attr: str, kind: str, depth: int) -> set[Root] | None:
        """``self.attr`` on the object being built: what every store of it
        in the constructor (or a base constructor it calls) puts there. The
        object is the one the nearest constructor on the path builds, every
        call after it one on ``self`` (a constructor a constructor calls
        builds its own object: `self.rope = Rope(d)` reads Rope's stores)."""
        at = next((j for j in range(len(self.funcs) - 1, -1, -1) if self.funcs[j] is func), None)
        if depth <= 0 or at is None:
            return None
        k = at
        while not _constructor(self.funcs[k]):
            if k == 0 or not self.reached.hops[k - 1].call.callee.startswith(("self.", "super")):
                return None
            k -= 1
        ctor = self.funcs[k]
        if ctor.owner is None:
            return None
        return self._attr(ctor, attr, kind, depth, set(), k == at)

    def _attr(self, ctor: Func, attr: str, kind: str, depth: int, seen: set[str],
              in_ctor: bool) -> set[Root] | None:
        if depth <= 0 or ctor.id in seen or ctor.owner is None:
            return None
        seen = seen | {ctor.id}
        stores = _stores(self.index, ctor, attr)
        prefix = ctor.owner.qualname + "."
        if _mutated([f for f in self.index.functions_in(ctor.path) if f.qualname.startswith(prefix)], "self." + attr):
            return None  # `self.x.append(t)`: filled with what else is not followed
        if in_ctor:  # read in the constructor: a method it does not run has not run yet
            runs = _run_by(self.index, ctor)
            stores = [(f, v) for f, v in stores if f.name in runs]
        if stores:
            if any(f is not ctor for f, _ in stores):
                return None  # stored by a method the constructor runs: which store comes last is not followed
            out: set[Root] = set()
            for _, value in stores:
                if value.strip() == "None" and kind == _TENSOR:
                    continue  # not a tensor yet: read only after another store
                found = self.expr(ctor, value, kind, depth - 1)
                if found is None:
                    return None
                out |= found
            return out
        for call in ctor.calls:
            if call.callee.startswith("super") and call.callee.endswith("__init__"):
                for base in self.index.resolve(ctor, call):
                    if _constructor(base):
                        inner = self._attr(base, attr, kind, depth - 1, seen, in_ctor)
                        if inner is None:
                            return None
                        out = set()
                        for root in inner:
                            if root[0] != base.id:
                                out.add(root)
                                continue
                            up = self.lift(ctor, call, base, root)
                            if up is None:
                                return None
                            out |= up
                        return out
        prop = self.index.method_lookup(ctor.owner, attr)
        if len(prop) == 1 and len(prop[0].returns) == 1:  # `def device(self): return self.tensor.device`
            return self.expr(ctor, prop[0].returns[0].value, kind, depth - 1)
        return None


_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "add", "__setitem__"})


def _mutated(funcs: Sequence[Func], text: str) -> bool:
    """A container ``text`` is filled in place in one of ``funcs`` (`xs.append(t)`, `xs[i] = t`)."""
    head = text + "."
    return any(c.callee.startswith(head) and c.callee[len(head):] in _MUTATORS for f in funcs for c in f.calls) \
        or any(t.strip().startswith(text + "[") for f in funcs for a in f.assigns for t in a.targets)


def _calls_param(func: Func) -> bool:
    """``func`` calls a function it is handed (`shard_fn(self.model)`): what
    that puts on the device is not among the sites it reaches."""
    params = set(func.scope.params if func.scope is not None else ()) - {"self", "cls"}
    return bool(params) and any(c.callee in params for c in func.calls)


def _constructor(func: Func) -> bool:
    return func.scope is not None and func.scope.role == "constructor"


def _run_by(index: ProjectIndex, ctor: Func) -> set[str]:
    """The constructor and the names of the methods it runs on ``self``
    (through those, ``_DEPTH`` deep): a method nothing here calls runs after
    the object is built, and its stores are not what the construction reads."""
    names, todo = {ctor.name}, [(ctor, _DEPTH)]
    while todo:
        func, depth = todo.pop()
        for call in func.calls:
            name = call.callee[5:] if call.callee.startswith("self.") else ""
            if not name.isidentifier() or name in names:
                continue
            names.add(name)
            if depth > 1 and ctor.owner is not None:
                todo += [(m, depth - 1) for m in index.method_lookup(ctor.owner, name)]
    return names


def _stores(index: ProjectIndex, ctor: Func, attr: str) -> list[tuple[Func, str]]:
    """Every `self.attr = value` in the methods of ``ctor``'s class (a call's value as its text)."""
    owner = ctor.owner
    if owner is None:
        return []
    prefix = owner.qualname + "."
    target = "self." + attr
    found: list[tuple[Func, str]] = []
    for func in index.functions_in(ctor.path):
        if func.qualname != ctor.qualname and not func.qualname.startswith(prefix):
            continue
        found += [(func, a.value if a.op == "=" and len(a.targets) == 1 else "<op>")
                  for a in func.assigns if any(t.strip() == target for t in a.targets)]
        found += [(func, f"{c.callee}({c.arglist})") for c in func.calls if (c.target or "").strip() == target]
        found += [(func, value) for c in func.calls if c.callee == "self.register_buffer"
                  for value in _registered(c, attr)]
    return found


def _registered(call: Call, attr: str) -> list[str]:
    """``self.register_buffer("attr", value)`` binds ``self.attr`` to ``value``."""
    args = split_args(call.arglist)
    positional = [a.text.strip() for a in args if a.keyword is None]
    if not positional or positional[0] not in (f'"{attr}"', f"'{attr}'"):
        return []
    value = positional[1] if len(positional) > 1 else next((a.text for a in args if a.keyword == "tensor"), None)
    return [value] if value is not None else []


def _source(api: str, call: Call) -> tuple[str, str] | None:
    """The expression the allocation takes its device from, and whether it is a device or a tensor."""
    args = split_args(call.arglist)
    device = next((a.text.strip() for a in args if a.keyword == "device"), None)
    if device is not None:
        return device, _DEVICE
    if api in TO_MOVES:
        positional = [a for a in args if a.keyword is None]
        return (positional[0].text.strip(), _DEVICE) if len(positional) == 1 and len(args) <= 2 else None
    if api.startswith("torch.") and api.endswith("_like") and args and args[0].keyword is None:
        return args[0].text.strip(), _TENSOR
    if api == "torch.as_tensor" and args and args[0].keyword is None:
        return args[0].text.strip(), _TENSOR
    if api.startswith("Tensor.new_") and "." in call.callee:
        return call.callee.rsplit(".", 1)[0], _TENSOR
    return None


def _passed(func: Func, name: str, args: Sequence[Arg]) -> str | None:
    """What a call's ``args`` give parameter ``name`` of ``func``: the argument, else its default."""
    scope = func.scope
    if scope is None:
        return None
    if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args):
        return None  # `f(**cfg)`: what it passes is not known
    params, defaults = call_params(scope)
    if any(p.startswith("*") for p in params) and name not in params:
        return None
    keyword = next((a for a in args if a.keyword == name), None)
    if keyword is not None:
        return keyword.text
    if name not in params:
        return None
    at = params.index(name)
    if any(p.startswith("*") for p in params[:at]):
        return None
    positional = [a for a in args if a.keyword is None]
    if at < len(positional):
        return positional[at].text
    default = defaults[at] if at < len(defaults) else ""
    return default or None


_SIZED = frozenset({"torch.arange", "torch.linspace", "torch.logspace", "torch.zeros", "torch.ones", "torch.empty",
                    "torch.rand", "torch.randn", "torch.eye"})


def _sized(node: ast.expr, depth: int = 8) -> bool:
    """A tensor of at least one dimension made by a factory here, through same-device
    methods, moves and arithmetic (`torch.arange(0, d, 2).float().to(device) / d`)."""
    if depth <= 0:
        return False
    if isinstance(node, ast.BinOp):
        return _sized(node.left, depth - 1) or _sized(node.right, depth - 1)
    if not isinstance(node, ast.Call):
        return False
    if ast.unparse(node.func) in _SIZED:
        return bool(node.args)
    return isinstance(node.func, ast.Attribute) and (node.func.attr in _SAME or node.func.attr == "to") \
        and _sized(node.func.value, depth - 1)


def _cpu_device(node: ast.expr) -> bool:
    """``torch.device("cpu")`` (or ``"meta"``)."""
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.device", "device") and len(node.args) == 1 \
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
        and node.args[0].value.startswith(("cpu", "meta"))


def _dtype(node: ast.expr) -> bool:
    return ast.unparse(node).startswith(("torch.float", "torch.int", "torch.bool", "torch.bfloat", "torch.half",
                                         "torch.long", "torch.double"))
