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
may place it) keeps the site.

Round 27 (constructions on the default device): a module built with no
device whose layers take theirs from a ``device=None`` default all the way
down (`Block(d)` -> `Attention(d)` -> `Rotary(d, device=None)` ->
`torch.arange(0, d, 2).float().to(device)`) holds host memory; its upload
is the model's later move, its own site. ``None`` (or a factory given no
device) counts as the host only where no default-device context reaches
the call's function or any function on the path (``default_device``'s own
reach, computed once per scan and only when asked); ``t.to(None)`` leaves
``t`` where it is, so a move counts with what it moves. The object a
``self.x`` read sees is the one the nearest constructor on the path builds
(a constructor a constructor calls builds its own); ``register_buffer("x",
v)`` stores ``v`` in ``self.x``; arithmetic is where its tensors are, and
an operand a sized factory made here decides it (torch mixes a tensor only
with 0-dim tensors of the host); `torch.outer`/`einsum`/`cat` and
elementwise methods are where their inputs are; `a.type_as(b)` is where
``b`` is. The site's call is the one of its API's name among the calls a
chain starts at one place (`torch.arange(n).float().to(d)`). Pure.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable, Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..model import Arg, Language, Site, SiteKind
from .checkpoint_reads import CheckpointReader
from .cpu_locals import only_off_device
from .extract.python_host_defaults import NO_PLACEMENT
from .host_args import host_local
from .index import Func, ProjectIndex, Reach
from .move_apis import TO_MOVES
from .via_roots import (
    _DEPTH,
    _DEVICE,
    _FACTORY,
    _NONE,
    _OF_INPUT,
    _SAME,
    _TENSOR,
    Root,
    Roots,
    _calls_param,
    _cpu_device,
    _mutated,
    _passed,
)

_CONTEXTS = ("torch.device",)  # default-device context managers, where no catalogue names them
# context managers that change how code runs, not where a tensor built without a device lands
_NOT_PLACING = re.compile(r"(?:torch\.)?(?:(?:cuda\.)?amp\.)?autocast$|(?:torch\.)?backends\.|"
                          r"torch\.cuda\.(?:stream|device)$|(?:torch\.)?profiler\.|torch\.(?:set_grad_enabled|random\.fork_rng)$|open$|"
                          r"(?:contextlib\.)?nullcontext$")


def drop_host_vias(derived: Sequence[Site], index: ProjectIndex, contexts: Collection[str] | None = None,
                   engines: Collection[str] | None = None, globs: CallerGlobs | None = None) -> list[Site]:
    """The derived sites, less the calls whose every allocation's device comes from host arguments."""
    memo: dict[tuple[str, int, bool], set[Root] | None] = {}  # what a constructor's allocation takes its device from
    placed = _Placed(index, _CONTEXTS if contexts is None else contexts, engines or ())
    loads = _Loads(index, CheckpointReader(index, globs) if globs is not None else None)
    return [s for s in derived if s.via is None or s.language is not Language.PYTHON or s.kind is not SiteKind.DEVICE
            or not _host_call(s, index, memo, placed) or loads.any_read(s, index)]


class _Loads:
    """A call that reads checkpoint tensors (``checkpoint-read``: `weights.get_tensor(k)`) in the
    constructor or a function it reaches (resolved calls, ``_DEPTH`` down): the loader places what it
    reads, which no site of the reach shows (`nn.Parameter(weights.get_tensor(k))` is on the loader's
    device), so the construction stays a site."""

    def __init__(self, index: ProjectIndex, reader: CheckpointReader | None) -> None:
        self.index, self.reader = index, reader
        self.memo: dict[str, bool] = {}

    def any_read(self, site: Site, index: ProjectIndex) -> bool:
        found = index.site_call(site)
        if found is None or self.reader is None:
            return False
        caller, call = found
        cls = index.constructed_class(caller, call)
        starts = index.constructors(cls) if cls is not None else list(index.resolve(caller, call))
        return any(self.reads(f, _DEPTH) for f in starts)

    def reads(self, func: Func, depth: int) -> bool:
        if func.id in self.memo:
            return self.memo[func.id]
        self.memo[func.id] = False  # a cycle reads nothing more
        assert self.reader is not None
        found = any(self.reader.call(c.callee) for c in func.calls) or depth > 0 and any(
            self.reads(f, depth - 1) for c in func.calls for f in self.index.resolve(func, c))
        self.memo[func.id] = found
        return found


class _Placed:
    """The functions a default-device context may reach (``default_device``'s
    own notion, computed once, only when a default device is to be trusted);
    and whether some `with` of a manager that may place what is built
    (`with ContextManagers(init_contexts):`, `deepspeed.zero.Init()`: not a
    grad mode, autocast, a warning filter or an assertion) calls a class the
    function is handed (`model = model_class(**config)`, a parameter; a local
    may be a module instance run forward): then any constructor may run there."""

    def __init__(self, index: ProjectIndex, contexts: Collection[str], engines: Collection[str]) -> None:
        self.index, self.contexts, self.engines = index, contexts, engines
        self._ids: frozenset[str] | None = None
        self._dynamic = False

    def any_of(self, funcs: Iterable[Func]) -> bool:
        if self._ids is None:
            from .default_device import device_contexts, engine_hooks, host_bodies, place_functions

            found = device_contexts(self.index, self.contexts)
            hooks = engine_hooks(self.index, self.index.files, frozenset(self.engines))
            self._ids = frozenset(hooks) | frozenset(place_functions(self.index, found,
                                                                     host_bodies(self.index, self.contexts)))
            self._dynamic = any(
                not NO_PLACEMENT.match(item.callee + "(") and not _NOT_PLACING.match(item.callee) and any(
                    w.body.contains(c.span) and c.target and f.scope is not None and c.callee in f.scope.params
                    for c in f.calls)
                for f in self.index.functions() if f.withs for w in f.withs for item in w.items)
        return any(f.id in self._ids or self._dynamic and f.scope is not None and f.scope.role == "constructor"
                   for f in funcs)


def _host_call(site: Site, index: ProjectIndex, memo: dict[tuple[str, int, bool], set[Root] | None],
               placed: _Placed) -> bool:
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
            move = reached.site.api in TO_MOVES
            if not _host_roots(index, caller, start, reached, i, args, memo, placed, move, False) and not (
                    move and _host_roots(index, caller, start, reached, i, args, memo, placed, False, True)):
                return False
            counted = True
    return counted


def _host_roots(index: ProjectIndex, caller: Func, start: Func, reached: Reach, i: int, args: Sequence[Arg],
                memo: dict[tuple[str, int, bool], set[Root] | None], placed: _Placed, move: bool,
                receiver: bool) -> bool:
    """Every place reached allocation ``i`` takes its device from is the
    host as this call binds it. ``receiver``: a move counted with what it
    moves (`t.to(device)`, `device` None leaves `t` where it is)."""
    key = (start.id, i, receiver)
    if key not in memo:
        memo[key] = Roots(index, start, reached).site_roots(receiver)
    roots = memo[key]
    if roots is None:
        return False
    for func_id, param, kind in roots:
        if param == _NONE:  # the default device: the host unless a context may reach the path
            if move or placed.any_of([caller, start, *_path(index, reached)]):
                return False
            continue
        if func_id != start.id:
            return False
        text = _passed(start, param, args)
        if text is None or not _host_value(caller, text, kind, move) \
                or (text.strip() == "None" and kind == _DEVICE and placed.any_of([caller, start,
                                                                               *_path(index, reached)])):
            return False
    return True


def _path(index: ProjectIndex, reached: Reach) -> list[Func]:
    """The functions a reached allocation runs in, past the first."""
    out = [index.func(h.path, h.caller) for h in reached.hops[1:]]
    out.append(index.func(reached.site.path, reached.site.scope))
    return [f for f in out if f is not None]


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
        if host_local(caller, node.id, lambda callee: False):
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


def _default_device_context(func: Func) -> bool:
    """A default-device context around the call: factories without a device may be on the GPU."""
    return any("device" in item.callee or "set_default" in item.callee for w in func.withs for item in w.items) \
        or any("set_default_device" in c.callee or "set_default_tensor_type" in c.callee for c in func.calls)
