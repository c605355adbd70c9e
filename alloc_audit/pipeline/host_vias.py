"""Stage 5a, after derive: a derived site (a call of project code that
allocates) whose every allocation takes its device from arguments this
call binds to the host allocates nothing on the device (issue 11, round 25).

    class Boxes:
        def __init__(self, tensor):
            device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
            self.tensor = torch.as_tensor(tensor, dtype=torch.float32, device=device)

    b = torch.zeros(4, 5)   # no device, no default-device context
    Boxes(b)                # no site: the box tensor is on the host

``off_device`` drops a call that passes the CPU literal for a device
parameter; this is the same question when the device is not said but
taken from the data: each allocation the call reaches (``index.reach``,
as the derived site's own search) names where it allocates (``device=D``,
``.to(D)``, ``torch.*_like(T)``, ``T.new_*``, ``torch.as_tensor(T)``), and
``D``/``T`` is followed back, through locals (a conditional expression
takes both branches), items and ``.device`` of tensors, attributes of the
object being built (every store the constructor makes, a base constructor
it calls through ``super().__init__`` with what that call passes, a
property returning one), to the parameters of the function called, and up
each call on the path to what this call passes. Every one must be the host:
a CPU/meta literal, ``None`` for a factory's device (the default device:
no default-device context at the call), a Python number, list or array, a
tensor made without a device, ``x.cpu()``, ``torch.from_numpy``, a local
bound only to those, or a display of them (``[verts]``, ``[]``). Anything
unknown (a parameter of the caller, a tensor read from an object, a device
variable, a literal ``"cuda"``, an allocation that names no device, a call
spreading ``**kwargs``, a function handed in and called: `shard_fn(model)`
may place it) keeps the site. Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Arg, Call, Language, Site, SiteKind
from .cpu_locals import only_off_device
from .host_args import _host_local
from .index import Func, ProjectIndex, Reach
from .index.values import call_params

_DEPTH = 3  # as the derived sites' own search
_NEST = 8  # names and attributes followed for one expression
_MOVES = frozenset({"Tensor.to", "Module.to"})
_FACTORY = re.compile(r"torch\.(?:rand|randn|randint|randperm|zeros|ones|empty|full|arange|linspace|logspace|eye|"
                      r"tensor|as_tensor|from_numpy|stack|cat)")
_OF_INPUT = frozenset({"torch.as_tensor", "torch.stack", "torch.cat"})  # on the device of what they are given
_SAME = frozenset({"clone", "detach", "contiguous", "float", "double", "half", "long", "int", "bool", "view",
                   "reshape", "requires_grad_", "unsqueeze", "squeeze", "flatten", "t", "transpose", "permute",
                   "expand", "repeat"})
_DEVICE, _TENSOR = "device", "tensor"
_NONE = "<none>"  # a device given as None: the default device
Root = tuple[str, str, str]  # (function id, parameter, kind)


def drop_host_vias(derived: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The derived sites, less the calls whose every allocation's device comes from host arguments."""
    memo: dict[tuple[str, int], set[Root] | None] = {}  # what a constructor's allocation takes its device from
    return [s for s in derived if s.via is None or s.language is not Language.PYTHON or s.kind is not SiteKind.DEVICE
            or not _host_call(s, index, memo)]


def _host_call(site: Site, index: ProjectIndex, memo: dict[tuple[str, int], set[Root] | None]) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    caller, call = found
    if _default_device_context(caller):
        return False
    cls = index.constructed_class(caller, call)
    starts = index.constructors(cls) if cls is not None else [f for f in index.resolve(caller, call)
                                                               if f is not caller]
    args = split_args(call.arglist)
    if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args):
        return False
    counted = False
    for start in starts:
        if start.scope is None or start.language is not Language.PYTHON or _calls_param(start):
            return False
        for i, reached in enumerate(index.reach(start, _DEPTH)):
            if not reached.site.acquires:
                continue
            if reached.site.kind is not SiteKind.DEVICE:
                return False  # pinned host memory is a site wherever the data is
            key = (start.id, i)
            if key not in memo:
                memo[key] = _Roots(index, start, reached).site_roots()
            roots = memo[key]
            if roots is None:
                return False
            for func_id, param, kind in roots:
                if func_id != start.id:
                    return False
                text = _passed(start, param, args)
                if text is None or not _host_value(caller, text, kind, reached.site.api in _MOVES):
                    return False
            counted = True
    return counted


class _Roots:
    """The parameters one reached allocation takes its device from, as
    parameters of ``start`` where the path lets them be lifted."""

    def __init__(self, index: ProjectIndex, start: Func, reached: Reach) -> None:
        self.index, self.start, self.reached = index, start, reached
        self.funcs: list[Func] = [start]
        self.visiting: set[tuple[str, str, str]] = set()
        self.self_path = True  # every hop a call on `self` (or super()): `self` is the object being built
        for i, hop in enumerate(reached.hops):
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
            if not hop.call.callee.startswith(("self.", "super")):
                self.self_path = False

    def site_roots(self) -> set[Root] | None:
        if not self.funcs or len(self.funcs) != len(self.reached.hops) + 1:
            return None
        func = self.funcs[-1]
        call = next((c for c in func.calls if c.span.line == self.reached.site.span.line
                     and c.span.col == self.reached.site.span.col), None)
        if call is None:
            return None
        source = _source(self.reached.site.api, call)
        if source is None:
            return None
        roots = self.expr(func, source[0], source[1], _NEST)
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
            if callee == "torch.as_tensor" and node.args:
                return self.node(func, node.args[0], _TENSOR, depth)
            return None  # on the default device, which a context may set
        if isinstance(node.func, ast.Attribute) and node.func.attr in _SAME:
            return self.node(func, node.func.value, _TENSOR, depth)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            if device is not None:  # `.to(dtype=..., device=D)`: on D
                return self.node(func, device, _DEVICE, depth)
            if all(_dtype(a) for a in node.args) and all(k.arg in ("dtype", "non_blocking", "copy")
                                                         for k in node.keywords):
                return self.node(func, node.func.value, _TENSOR, depth)  # a dtype cast stays where it is
        return None

    def attr(self, func: Func, attr: str, kind: str, depth: int) -> set[Root] | None:
        """``self.attr`` on the object being built: what every store of it
        in the constructor (or a base constructor it calls) puts there."""
        if depth <= 0 or not self.self_path or not _constructor(self.start) or self.start.owner is None:
            return None
        return self._attr(self.start, attr, kind, depth, set())

    def _attr(self, ctor: Func, attr: str, kind: str, depth: int, seen: set[str]) -> set[Root] | None:
        if depth <= 0 or ctor.id in seen or ctor.owner is None:
            return None
        seen = seen | {ctor.id}
        stores = _stores(self.index, ctor, attr)
        prefix = ctor.owner.qualname + "."
        if _mutated([f for f in self.index.functions_in(ctor.path) if f.qualname.startswith(prefix)], "self." + attr):
            return None  # `self.x.append(t)`: filled with what else is not followed
        if not self.reached.hops:  # read in the constructor: a method it does not run has not run yet
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
                        inner = self._attr(base, attr, kind, depth - 1, seen)
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
    return found


def _source(api: str, call: Call) -> tuple[str, str] | None:
    """The expression the allocation takes its device from, and whether it is a device or a tensor."""
    args = split_args(call.arglist)
    device = next((a.text.strip() for a in args if a.keyword == "device"), None)
    if device is not None:
        return device, _DEVICE
    if api in _MOVES:
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


def _host_value(caller: Func, text: str, kind: str, move: bool) -> bool:
    """What ``caller`` passes (``text``) is on the host, as a device or a tensor."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return False
    return _host_node(caller, node, kind, move, 3)


def _host_node(caller: Func, node: ast.expr, kind: str, move: bool, depth: int) -> bool:
    if depth <= 0:
        return False
    if isinstance(node, ast.Constant):
        if kind == _TENSOR:
            return True
        if node.value is None:
            return not move  # a factory's default device (no context); `.to(None)` keeps where it was
        return isinstance(node.value, str) and node.value.startswith(("cpu", "meta"))
    if _cpu_device(node):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_host_node(caller, e, kind, move, depth - 1) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return kind == _TENSOR
    if isinstance(node, ast.Attribute) and node.attr == "device" and kind == _DEVICE:
        return _host_node(caller, node.value, _TENSOR, move, depth - 1)
    if isinstance(node, ast.Name):
        params = caller.scope.params if caller.scope is not None else ()
        if node.id in params:
            return False
        if kind == _DEVICE:
            return bool(only_off_device(caller, node.id))
        if _host_local(caller, node.id, lambda callee: False):
            return True
        # every binding a display, a literal or a call that makes a host tensor (`torch.tensor(data)`),
        # none a site (a default-device context) nor a `with` target
        if any(a.op != "=" or a.targets != (node.id,) for a in caller.assigns if node.id in a.targets) \
                or _mutated([caller], node.id) or any(s.target == node.id for s in caller.sites) \
                or any((item.target or "").strip() == node.id for w in caller.withs for item in w.items):
            return False
        values = [a.value for a in caller.assigns if node.id in a.targets]
        for c in caller.calls:
            if (c.target or "").strip() != node.id:
                continue
            if _FACTORY.fullmatch(c.callee) and c.callee not in _OF_INPUT and "device" not in c.arglist:
                values.append("0")  # a factory given no device (its argument text may be cut short)
            else:
                values.append(f"{c.callee}({c.arglist})")
        for value in values:
            try:
                inner = ast.parse(value.strip(), mode="eval").body
            except (SyntaxError, ValueError, RecursionError):
                return False
            if not isinstance(inner, (ast.List, ast.Tuple, ast.Constant, ast.Call)) \
                    or not _host_node(caller, inner, kind, move, depth - 1):
                return False
        return bool(values)
    if isinstance(node, ast.Call) and kind == _TENSOR:
        callee = ast.unparse(node.func)
        if any(k.arg == "device" for k in node.keywords):
            return False
        if _FACTORY.fullmatch(callee) or callee.startswith(("np.", "numpy.")):
            return all(_host_node(caller, a, kind, move, depth - 1) if callee in _OF_INPUT else True
                       for a in node.args[:1])
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cpu":
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr in _SAME:
            return _host_node(caller, node.func.value, kind, move, depth - 1)  # `torch.arange(n).float()`
    return False


def _cpu_device(node: ast.expr) -> bool:
    """``torch.device("cpu")`` (or ``"meta"``)."""
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.device", "device") and len(node.args) == 1 \
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
        and node.args[0].value.startswith(("cpu", "meta"))


def _dtype(node: ast.expr) -> bool:
    return ast.unparse(node).startswith(("torch.float", "torch.int", "torch.bool", "torch.bfloat", "torch.half",
                                         "torch.long", "torch.double"))


def _default_device_context(func: Func) -> bool:
    """A default-device context around the call: factories without a device may be on the GPU."""
    return any("device" in item.callee or "set_default" in item.callee for w in func.withs for item in w.items) \
        or any("set_default_device" in c.callee or "set_default_tensor_type" in c.callee for c in func.calls)
