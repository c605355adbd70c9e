"""Stage 5, before the callers: a sub-module moved to the device of the
module it belongs to, where every caller hands in a model it has just moved
whole, moves nothing: not a site (issue 11, round 20).

    def warm_up(tower, device):
        device = tower.device
        embed = tower.vision_model.embeddings.patch
        embed = embed.to(device)                        # no site: already there

    self.model = Model(cfg).half().to(self.device)  # in every caller, before the call
    warm_up(self.model.get_tower(), device=self.device)

The move is ``R.to(D)`` (or ``R.to(M.device)``) where every binding of the
local ``R`` before the move is an attribute chain of the parameter ``M``
(``M.a.b``) and every binding of ``D`` is ``M.device``; and every call of
the function (one or more) passes for ``M`` an expression on a name the
caller moved whole to a device earlier in the same function (``self.model =
....to(self.device)``, ``.cuda()``, not a dtype-only ``.to``), with no
rebinding of that name in between. Anything else keeps the site (a model
split across devices is not moved whole by one ``.to``).

Round 26 (``drop_gpu_return_moves``): ``x.cuda()`` (or ``.to("cuda")``)
of what a project function returns, where every ``return`` of every
function the call resolves to already ends on the current GPU (``.cuda()``,
``.to("cuda")`` or a torch factory given ``device="cuda"``, then only
arithmetic with a number or a name and dtype casts), moves nothing: the
value is there. The moved value is the call itself (``rand(n).cuda()``) or
a local that no assignment binds and every call bound to it is such a
producer or itself ends on the GPU; neither the function nor a producer
switches the current GPU (``set_device``, ``with torch.cuda.device``). A
producer with any other return (``t.cpu() if host else t.cuda()``, a value
of another call), a generator, a parameter moved, or a ``.cuda(i)`` to a
given GPU keeps the site (the mirror of ``host_returns``; round 29's
moves to a named device are ``placed_returns``). Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site
from .host_params import DEVICE_OF, chain, every_caller_binds, every_caller_passes, keeps_device
from .index import Func, ProjectIndex
from .module_classes import receiver_builder
from .move_apis import TO_MOVES


def drop_same_device_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, ...], bool] = {}

    def same(site: Site) -> bool:
        if site.api not in TO_MOVES or site.via is not None or site.language is not Language.PYTHON:
            return False
        found_call = index.site_call(site)
        if found_call is None:
            return False
        func, call = found_call
        if func.scope is None:
            return False
        args = split_args(call.arglist)
        own = _own_device_params(func, call, site.span.line)
        if own is not None:
            if own not in memo:
                memo[own] = every_caller_binds(func, own[1:], index, _same_owner)
            return memo[own]
        if not site.target or not site.target.isidentifier() or len(args) != 1 \
                or args[0].keyword not in (None, "device"):
            return False
        receiver = call.callee.rpartition(".")[0]
        owner = _device_owner(func, args[0].text.strip(), site.span.line)
        if owner is None or owner not in func.scope.params or _member_of(func, receiver, site.span.line) != owner:
            return False
        key = (func.id, owner)
        if key not in memo:
            memo[key] = _callers_moved_whole(func, owner, index)
        return memo[key]

    return [s for s in sites if not same(s)]


def _own_device_params(func: Func, call: Call, line: int) -> tuple[str, str, str] | None:
    """(function id, ``P``, ``D``) for ``P.to(device=D)`` or ``P.data.to(D, dtype)``
    where ``P`` and ``D`` are parameters the function has not rebound before."""
    assert func.scope is not None
    receiver = call.callee.rpartition(".")[0]
    if not call.callee.endswith(".to") or _OWN_RECEIVER.fullmatch(receiver) is None:
        return None
    args = split_args(call.arglist)
    device = next((a for a in args if a.keyword == "device"), None) or \
        next((a for a in args[:1] if a.keyword is None), None)
    param, device_param = receiver.partition(".")[0], device.text.strip() if device is not None else ""
    params = func.scope.params
    if param not in params or device_param not in params or param == device_param \
            or any(a.line < line and (param in a.targets or device_param in a.targets) for a in func.assigns):
        return None
    return func.id, param, device_param


def _same_owner(caller: Func, passed: tuple[str, ...], line: int) -> bool:
    """The caller passes for the device the tensor's own (``t=m.weight, device=m.weight.device``), or a
    parameter of a module and that module's device or its other parameter's (``t=m.bias``,
    ``device=m.device`` / ``m.weight.device``): a state holder's chosen device (``state.device``
    beside ``state.image``) is no tensor's own."""
    tensor, device = passed
    found = _OWN_DEVICE.fullmatch(device)
    if found is None or _OWNED.fullmatch(tensor) is None or tensor.split(".")[0] in ("self", "cls"):
        return False
    held = found.group(1)
    if held == tensor:
        return True  # `weight=m.weight, device=m.weight.device`
    # a module's parameters share its device: `bias=m.bias, device=m.weight.device` or `m.device`
    parent, _, leaf = tensor.rpartition(".")
    return leaf in _PARAMS and (held == parent or held.rpartition(".")[0] == parent
                                and held.rpartition(".")[2] in _PARAMS)


def _device_owner(func: Func, text: str, line: int) -> str | None:
    """``M`` when the device is ``M.device``, directly or through a local every earlier binding of which is it."""
    found = DEVICE_OF.fullmatch(text)
    if found is not None:
        return found.group(1)
    if not text.isidentifier():
        return None
    values = {a.value.strip() for a in func.assigns if a.line < line and text in a.targets}
    if len(values) != 1 or any(a.line < line and text in a.targets and len(a.targets) != 1 for a in func.assigns) \
            or any(c.span.line < line and (c.target or "").strip() == text for c in func.calls):
        return None
    found = DEVICE_OF.fullmatch(values.pop())
    return found.group(1) if found is not None else None


def _member_of(func: Func, receiver: str, line: int) -> str | None:
    """The parameter ``M`` of which the local ``receiver`` is an attribute chain (every earlier binding)."""
    if not receiver.isidentifier():
        return None
    values = {a.value.strip() for a in func.assigns if a.line < line and receiver in a.targets}
    if len(values) != 1 or any(c.span.line < line and (c.target or "").strip() == receiver for c in func.calls):
        return None
    head, dot, rest = values.pop().partition(".")
    return head if dot and re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", rest) else None


def _callers_moved_whole(func: Func, param: str, index: ProjectIndex) -> bool:
    return every_caller_passes(func, param, index, _moved_before)


def _moved_before(caller: Func, passed: str, line: int) -> bool:
    """``passed`` is (an expression on) a name the caller moved whole to a device before ``line``."""
    def on(target: str) -> bool:
        target = target.strip()
        return bool(target) and (passed == target or passed.startswith(target + "."))

    calls = [c for c in caller.calls if c.span.line < line and c.target and on(c.target)]
    assigns = [a for a in caller.assigns if a.line < line and len(a.targets) == 1 and on(a.targets[0])]
    last_call = max(calls, key=lambda c: c.span.line, default=None)
    last_assign = max(assigns, key=lambda a: a.line, default=None)
    if last_assign is not None and (last_call is None or last_assign.line > last_call.span.line):
        # `self.model = (Model(...).half().to(self.device).eval())`: a parenthesised chain, whose
        # outermost call starts on the assignment's line or the next one
        if _MOVE_TEXT.search(last_assign.value) is not None:
            return True
        if not last_assign.value.startswith("("):
            return False
        inner = [c for c in caller.calls if last_assign.line <= c.span.line <= last_assign.line + 1
                 and c.span.end_line < line]
        last_call = max(inner, key=lambda c: (c.span.end_line, c.span.end_col), default=None)
    if last_call is None:
        return False
    return any(c.callee.endswith(".cuda") or c.callee.endswith(".to") and not keeps_device(c)
               for c in chain(caller, last_call))


_OWN_RECEIVER = re.compile(r"[A-Za-z_]\w*(?:\.data)?")
_OWNED = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+")
_OWN_DEVICE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.device")
_PARAMS = frozenset({"weight", "bias"})
_MOVE_TEXT = re.compile(r"\.cuda\(|\.to\(\s*(?!(?:dtype\s*=\s*)?torch\.(?:u?int\d+|float\d*|bfloat16|half|bool|long"
                        r"|int|double|float8\w*)\s*\))")


def drop_gpu_return_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The sites, less the moves to the current GPU of what a project function returns there already."""
    memo: dict[str, bool] = {}
    return [s for s in sites if not (s.via is None and s.language is Language.PYTHON and _gpu_move(s)
                                     and _of_gpu_return(s, index, memo))]


def _gpu_move(site: Site) -> bool:
    return site.api == "Tensor.cuda" or site.api == "Tensor.to" and site.device == "cuda"


def _of_gpu_return(site: Site, index: ProjectIndex, memo: dict[str, bool]) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, call = found
    args = split_args(call.arglist)
    if call.callee.endswith(".cuda"):
        if any(a.keyword != "non_blocking" for a in args):
            return False  # `.cuda(1)`: a given GPU, not the current one
    elif not _to_gpu(call, False):
        return False  # `.to("cuda", torch.half)`: a dtype change copies
    if any(_SWITCH.search(c.callee) for c in func.calls):
        return False  # the current GPU may change between the producer and the move
    producer = receiver_builder(func, site)
    if producer is None:
        return False
    here = (call.span.line, call.span.col)
    if call.callee.rpartition(".")[0].endswith(")"):  # `rand(n).cuda()`: the call is what is moved
        others = [c for c in func.calls if (c.span.line, c.span.col) == here and c != call and c != producer]
        return not any(CAST_CALL.fullmatch(c.callee) is None for c in others) \
            and "(" not in producer.callee and _gpu_producer(func, producer.callee, index, memo, _DEPTH)
    local = producer.target.strip() if producer.target else ""
    return _local_on_gpu(func, local, index, memo, _DEPTH, site.span.line)


_DEPTH = 3  # producers and locals followed


def _local_on_gpu(func: Func, name: str, index: ProjectIndex, memo: dict[str, bool], depth: int,
                  move: int = 0) -> bool:
    """Every binding of the local ``name`` in ``func`` is on the current GPU: an assignment of such a value
    (``_on_gpu``), or a whole call that moves there or a project function that returns there; an
    augmented assignment (``x /= 10``) keeps the device. A parameter, or a tuple target, proves nothing.
    ``move``: the line of the move asked about, whose own statement (``x = x.cuda()``) binds it only after,
    and above which one binding must be (a name bound by a loop alone is no local the facts show)."""
    if depth <= 0 or not name.isidentifier() or func.scope is None or name in func.scope.params:
        return False
    dtypes = _dtype_params(func)
    bound = False
    above = not move
    for a in func.assigns:
        words = {w for t in a.targets for w in re.findall(r"[A-Za-z_]\w*", t)}
        if name not in words or a.line == move:
            continue
        above = above or a.line < move
        if a.op != "=" and len(a.targets) == 1 and a.targets[0].strip() == name and a.op != "del":
            continue  # `x /= 10`: in place, where it was
        if a.op != "=" or len(a.targets) != 1 or a.targets[0].strip() != name \
                or not _on_gpu(a.value, dtypes, _Reader(func, index, memo, depth - 1)):
            return False  # a tuple target, an attribute of it, a `del`, or a value elsewhere
        bound = True
    starts: dict[tuple[int, int], Call] = {}
    for c in func.calls:  # every binding by a whole call, each by the call that ends last where it starts
        if (c.target or "").strip() == name and c.span.line != move:
            above = above or c.span.line < move
            at = (c.span.line, c.span.col)
            if at not in starts or (c.span.end_line, c.span.end_col) > (starts[at].span.end_line,
                                                                           starts[at].span.end_col):
                starts[at] = c
    return above and (bound or bool(starts)) and all(
        c.callee.endswith(".cuda") and not split_args(c.arglist) or _to_gpu(c, True)
        or "(" not in c.callee and _gpu_producer(func, c.callee, index, memo, depth - 1) for c in starts.values())


def _to_gpu(call: Call, cast: bool) -> bool:
    """``x.to("cuda")`` (``cast``: ``x.to("cuda", dtype=...)`` too): a move to the current GPU."""
    args = split_args(call.arglist)
    return call.callee.endswith(".to") and bool(args) and _CUDA_ARG.fullmatch(args[0].text.strip()) is not None \
        and all(a.keyword == "non_blocking" or cast and a.keyword in (None, "dtype") for a in args[1:])


def _gpu_producer(func: Func, callee: str, index: ProjectIndex, memo: dict[str, bool], depth: int) -> bool:
    """Every function ``callee`` resolves to returns a tensor on the current GPU on every ``return``."""
    targets = index.resolve(func, callee) if callee and depth > 0 else ()
    if not targets:
        return False
    for target in targets:
        if target.id not in memo:
            memo[target.id] = False  # a cycle proves nothing
            values = [r.value.strip() for r in target.returns]
            reader = _Reader(target, index, memo, depth)
            memo[target.id] = bool(values) and target.scope is not None and not target.scope.yields \
                and not any(_SWITCH.search(c.callee) for c in target.calls) \
                and all(_on_gpu(v, _dtype_params(target), reader) for v in values)
        if not memo[target.id]:
            return False
    return True


class _Reader:
    """Where names and calls of a value are read: the function holding it, followed ``depth`` more levels."""

    def __init__(self, func: Func, index: ProjectIndex, memo: dict[str, bool], depth: int) -> None:
        self.func, self.index, self.memo, self.depth = func, index, memo, depth

    def local(self, name: str) -> bool:
        return _local_on_gpu(self.func, name, self.index, self.memo, self.depth)

    def call(self, callee: str) -> bool:
        return _gpu_producer(self.func, callee, self.index, self.memo, self.depth)


def _dtype_params(func: Func) -> frozenset[str]:
    """The parameters ``func`` declares a ``torch.dtype`` (``dtype: torch.dtype``)."""
    scope = func.scope
    if scope is None:
        return frozenset()
    return frozenset(p for p, t in zip(scope.params, scope.param_types) if t.strip() in ("torch.dtype", "dtype"))


def _on_gpu(value: str, dtypes: frozenset[str], reader: _Reader) -> bool:
    """``value`` ends on the current GPU: a move there or a factory given it, a local or a project call
    so (``reader``), then only arithmetic with a number or a name and dtype casts (``torch.rand(n).cuda()
    * 2 - 1``, ``x.cuda().to(torch.half)``, or ``.to(dtype)`` of a parameter ``dtypes`` declares a
    ``torch.dtype``: a name alone may hold a device)."""
    try:
        tree = ast.parse(value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return _gpu_node(tree, dtypes, reader, 8)


def _gpu_node(node: ast.expr, dtypes: frozenset[str], reader: _Reader, depth: int) -> bool:
    if depth <= 0:
        return False
    if isinstance(node, ast.Name):
        return reader.local(node.id)
    if isinstance(node, ast.UnaryOp):
        return _gpu_node(node.operand, dtypes, reader, depth - 1)
    if isinstance(node, ast.BinOp):
        plain = (ast.Constant, ast.Name, ast.Attribute)
        return isinstance(node.right, plain) and _gpu_node(node.left, dtypes, reader, depth - 1) \
            or isinstance(node.left, plain) and _gpu_node(node.right, dtypes, reader, depth - 1)
    if not isinstance(node, ast.Call):
        return False  # a branch, a subscript: not followed
    keywords = {k.arg: k.value for k in node.keywords}
    if None in keywords or "out" in keywords:
        return False
    if isinstance(node.func, ast.Name):
        return reader.call(node.func.id)  # a project function's value
    if not isinstance(node.func, ast.Attribute):
        return False
    func, args = node.func, node.args
    if isinstance(func.value, ast.Name) and func.value.id == "torch":
        device = keywords.get("device")  # a factory given the current GPU
        return isinstance(device, ast.Constant) and device.value == "cuda"
    if func.attr == "cuda":
        return not args and set(keywords) <= {"non_blocking"}
    if func.attr == "to":
        device = args[0] if args else keywords.get("device")
        if isinstance(device, ast.Constant) and device.value == "cuda":
            return True
        cast = keywords.get("dtype") if not args else args[0] if len(args) == 1 else None
        if device is not None and device is not cast or set(keywords) - {"dtype", "non_blocking", "copy"}:
            return False
        if not (isinstance(cast, ast.Attribute) and ast.unparse(cast).startswith("torch.")
                or isinstance(cast, ast.Name) and cast.id in dtypes):
            return False  # `.to(d)` of a name that may be a device
        return _gpu_node(func.value, dtypes, reader, depth - 1)
    if func.attr in _CASTS and not args and not keywords:
        return _gpu_node(func.value, dtypes, reader, depth - 1)
    return False


_CUDA_ARG = re.compile(r"""(?:device\s*=\s*)?(?:torch\.device\(\s*)?["']cuda["']\s*\)?""")
_SWITCH = re.compile(r"(?:^|\.)set_device$|(?:^|\.)cuda\.device$")
# a dtype cast in a chain (`rand(n).float().cuda()`): the value stays where it is
CAST_CALL = re.compile(r"\(\.\.\.\)\.(?:float|half|bfloat16|double|contiguous)")
# dtype casts: the value stays where it is
_CASTS = frozenset({"float", "half", "bfloat16", "double", "int", "long", "bool", "contiguous"})

