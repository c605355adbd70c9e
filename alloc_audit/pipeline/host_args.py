"""Stage 5, before the callers: an allocation whose device comes from a
parameter that every call in the project binds to a host value is host
memory, not a device site (issue 11, round 24).

    def sinc(t):
        return torch.where(t == 0, torch.tensor(1.0, device=t.device), ...)  # no site

    def kernel(zeros):
        t = torch.linspace(-zeros, zeros, 2 * zeros)  # no device, no default-device context
        t *= math.pi
        return sinc(t)

The allocation takes its device from a parameter ``P`` of its function
that the function never rebinds: ``device=P`` or ``.to(P)`` (P a device),
``device=P.device``, ``.to(P.device)``, ``torch.*_like(P)`` or
``P.new_*(...)`` (P a tensor). Every call of the function (at least one
from another function; the calls the graph resolves to it and, for a name
it does not resolve, every call by that name) passes for ``P``:

- a device: the CPU or ``meta`` literal, a module constant or a local
  bound only to one (``None`` is left alone: a factory given it is on the
  default device, and an unguarded `x.to(None)` keeps its site as in
  ``host_moves``; a guarded one is code in-tree calls skip but a user's
  may run);
- a tensor: ``x.cpu()``, ``torch.from_numpy(...)``, or a local of the
  caller every binding of which is such a call or a torch factory given no
  device that is no site there (no default-device context made it one),
  in-place arithmetic on it allowed (``t *= math.pi``); round 28: also a
  factory given ``device="cpu"``, ``y.to("cpu")``, a tokenizer's (or
  processor's) ``return_tensors="pt"`` output, and an entry or attribute of a
  local bound only so (``enc["input_ids"]``, ``enc.input_ids[0]``) that the
  caller never stores into, moves in place (``enc.to(device)`` moves a
  tokenizer output's entries) or hands whole to a call;
- or a parameter of the caller that is so in turn (a bounded fixed point,
  ``_DEPTH`` callers up; a recursive call handing on ``P`` itself).

A function handed on as a value (``map(f, ...)``, ``target=f``, a table),
registered by a decorator, a constructor (built by other names too:
``cls(...)``, ``partial(C, ...)``), or with a call that spreads ``*args``
keeps the site: its callers are not all seen. So does any other argument: a
parameter with a CPU default that one caller overrides, a tensor of
unknown device. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import argument_for, split_args
from ..model import Arg, Call, Language, Site
from .cpu_locals import only_off_device
from .host_returns import host_producer
from .index import Func, ProjectIndex
from .index.values import bind_edge, call_params, off_device
from .move_apis import TO_MOVES

_DEPTH = 3  # callers followed up for a parameter handed on
_DEVICE_OF = re.compile(r"([A-Za-z_]\w*)\.device")
_NEW = re.compile(r"([A-Za-z_]\w*)\.new_\w+")
_CALLED = re.compile(r"([A-Za-z_][\w.]*)\((?:[^()]|\([^()]*\))*\)", re.S)
_HOST_CALL = re.compile(r"(?:torch\.from_numpy\(.*\)|.*\.cpu\(\s*\))", re.S)
# a subscript or attribute chain of a local, no call: `enc["input_ids"]`, `enc.input_ids[0]`
_VIEW = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*|\[[^\[\]\n()]*\])+")
_PT = re.compile(r"""["']pt["']""")
_CPU_TEXT = re.compile(r"""(?:torch\.device\(\s*)?(["'])cpu\1\s*\)?""")
_TO_CPU = re.compile(r"""[\w.]+(?:\[[^\[\]()]*\])*\.to\(\s*(?:device\s*=\s*)?"""
                     r"""(?:torch\.device\(\s*)?(["'])cpu\1\s*\)?\s*\)""")
_MOVED = re.compile(r"\.(?:to|cuda)$")
_HOST_FACTORY = re.compile(r"torch\.(?:rand|randn|randint|randperm|zeros|ones|empty|full|arange|linspace|logspace|"
                           r"eye|from_numpy)")
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property", "lru_cache", "cache", "no_grad",
                               "inference_mode", "wraps", "abstractmethod", "override", "torch.no_grad"})
_DEVICE, _TENSOR = "device", "tensor"
_CONSTRUCTORS = frozenset({"__init__", "__post_init__", "__new__"})


def drop_host_args(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The sites, less those whose device every caller binds to the host."""
    host = _HostArgs(index)
    return [s for s in sites if not (s.via is None and s.language is Language.PYTHON
                                     and s.device in (None, "unknown") and host.site(s))]


class _HostArgs:
    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self.memo: dict[tuple[str, str, str], bool] = {}
        self.handed: dict[str, bool] = {}

    def site(self, site: Site) -> bool:
        found = self.index.site_call(site)
        if found is None:
            return False
        func, call = found
        if func.scope is None or not func.scope.params:
            return False
        source = _source(site.api, call)
        if source is None:
            return False
        name, kind = source
        if name not in func.scope.params or name in ("self", "cls") or _rebound(func, name):
            return False
        return self.param(func, name, kind, _DEPTH)

    def param(self, func: Func, name: str, kind: str, depth: int) -> bool:
        """Every call of ``func`` binds its parameter ``name`` to the host."""
        key = (func.id, name, kind)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = False  # a cycle through other functions proves nothing
        found = depth > 0 and self._param(func, name, kind, depth)
        self.memo[key] = found
        return found

    def _param(self, func: Func, name: str, kind: str, depth: int) -> bool:
        if _registered(func) or func.name in _CONSTRUCTORS:
            return False  # a constructor: `cls(...)`, `partial(C, ...)` build it by other names
        index = self.index
        outside = False
        # every call by the name: one that passes the host needs no resolving (whoever it calls, it is
        # fine), except to find one call of `func` from elsewhere; one that does not must call another
        for caller, i in index.calls_named(func.name):
            if caller.table is None:
                continue
            call = caller.table[i]
            if self._passes_host(func, name, kind, depth, caller, call):
                outside = outside or caller is not func and self._may_call(func, caller, call)
            elif self._may_call(func, caller, call):
                return False
        return outside and not self._handed_on(func)  # last: the costliest question

    def _passes_host(self, func: Func, name: str, kind: str, depth: int, caller: Func, call: Call) -> bool:
        """``call``, taken as a call of ``func``, binds its parameter ``name`` to the host."""
        args = split_args(call.arglist)
        if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args) \
                or not _fits(func, args):
            return False  # what it passes is not known, or it is not a call of this function
        passed = _passed(func, name, args)
        if caller is func and passed is not None and passed.strip() == name:
            return True  # a recursive call hands on its own
        if kind == _DEVICE:
            value = bind_edge(caller, call, func, {}, self.index.visible_constants(caller.path)).get(name)
            return off_device(value) or passed is not None and self._host_name(caller, passed.strip(), kind, depth)
        return passed is not None and self._host_tensor(caller, passed.strip(), depth)

    def _may_call(self, func: Func, caller: Func, call: Call) -> bool:
        """``call`` resolves to ``func``, resolves nowhere, or (a method) to
        another class's method, a base's maybe, that an override here would
        take (`algorithm.load_weights(w, device=d)` on an `RLAlgorithm`)."""
        resolved = self.index.resolve(caller, call)
        return func in resolved or not resolved or func.owner is not None and any(f.owner is not None
                                                                                   for f in resolved)

    def _host_name(self, caller: Func, text: str, kind: str, depth: int) -> bool:
        """``text`` is a parameter of ``caller`` bound to the host by its own
        callers, or (a device) a local bound only to the CPU or meta."""
        if not text.isidentifier() or caller.scope is None:
            return False
        if text in caller.scope.params:
            return not _rebound(caller, text) and self.param(caller, text, kind, depth - 1)
        return kind == _DEVICE and bool(only_off_device(caller, text))

    def _host_tensor(self, caller: Func, text: str, depth: int) -> bool:
        if _HOST_CALL.fullmatch(text) and "device" not in text and ".to(" not in text or _TO_CPU.fullmatch(text):
            return True
        produced = _CALLED.fullmatch(text)
        if produced is not None:  # `f(n)`, every return of `f` a host tensor (`host_returns`)
            return host_producer(caller, produced.group(1), self.index)
        if caller.scope is None:
            return False
        if not text.isidentifier():  # `enc["input_ids"]` of a local bound to a tokenizer's output
            return host_view(caller, text, lambda callee: host_producer(caller, callee, self.index), _DEPTH)
        if text in caller.scope.params:
            return self._host_name(caller, text, _TENSOR, depth)
        return host_local(caller, text, lambda callee: host_producer(caller, callee, self.index))

    def _handed_on(self, func: Func) -> bool:
        """``func``'s name is read as a value (not called) in its own file or
        a file calling or importing it: `map(f, xs)`, `target=f`, `{"k": f}`."""
        found = self.handed.get(func.id)
        if found is None:
            index = self.index
            paths = {func.path} | {c.path for c, _ in index.calls_named(func.name)} | {
                p for p in index.files if index.imported(p, func.name) is not None}
            name = func.name
            word = re.compile(rf"(?<![\w]){re.escape(name)}\b(?!\s*\()")
            # a match holds the name: only texts holding it are searched; a file's functions share its call
            # table, so each table's argument lists are searched once (the same texts, the same answer)
            tables = {id(f.table): f.table for p in paths for f in index.functions_in(p) if f.table is not None}
            found = any(name in a.value and word.search(a.value) for p in paths for f in index.functions_in(p)
                        for a in f.assigns) or \
                any(name in text and word.search(text) for t in tables.values() for text in t.arglists)
            self.handed[func.id] = found
        return found


def _source(api: str, call: Call) -> tuple[str, str] | None:
    """The parameter-like name the allocation takes its device from, and
    whether it is a device or a tensor."""
    args = split_args(call.arglist)
    device = next((a.text.strip() for a in args if a.keyword == "device"), None)
    if api in TO_MOVES and device is None:
        positional = [a for a in args if a.keyword is None]
        device = positional[0].text.strip() if len(positional) == 1 and len(args) <= 2 else None
    if device is not None:
        of = _DEVICE_OF.fullmatch(device)
        if of is not None:
            return of.group(1), _TENSOR
        return (device, _DEVICE) if device.isidentifier() else None
    if api.startswith("torch.") and api.endswith("_like") and args and args[0].keyword is None:
        first = args[0].text.strip()
        return (first, _TENSOR) if first.isidentifier() else None
    new = _NEW.fullmatch(call.callee) if api.startswith("Tensor.new_") else None
    return (new.group(1), _TENSOR) if new is not None else None


def _passed(func: Func, name: str, args: Sequence[Arg]) -> str | None:
    """The argument text a call's ``args`` give parameter ``name`` of ``func``."""
    assert func.scope is not None
    params, _ = call_params(func.scope)
    passed = argument_for(args, name, params.index(name) if name in params else -1)
    return passed.text if passed is not None else None


def _fits(func: Func, args: Sequence[Arg]) -> bool:
    """The call's arguments fit ``func``'s parameters (a keyword it names, no
    more positionals than it takes): a call the graph resolves to two classes'
    methods of one name (`TileWorker().tiled_forward(..., tile_device=d)`)
    may be the other's."""
    assert func.scope is not None
    params, _ = call_params(func.scope)
    if any(p.startswith("**") for p in params):
        return True
    if any(a.keyword is not None and a.keyword not in params for a in args):
        return False
    return any(p.startswith("*") for p in params) or sum(a.keyword is None for a in args) <= len(params)


def _rebound(func: Func, name: str) -> bool:
    return any(name in a.targets for a in func.assigns) or any((c.target or "").strip() == name for c in func.calls) \
        or any((item.target or "").strip() == name for w in func.withs for item in w.items)


def host_local(func: Func, name: str, produced: Callable[[str], bool], depth: int = _DEPTH) -> bool:
    """Every binding of local ``name`` is a host call (`x.cpu()`,
    `torch.from_numpy(a)`, a call given `return_tensors="pt"` -- a
    tokenizer's or processor's output, built on the host --, a project
    function ``produced`` says returns a host tensor on every return) or a
    torch factory given no device that is no site (no default-device context
    made it one), or (round 28) an entry or attribute of a local bound only
    so (`ids = enc["input_ids"]`, `ids = enc.input_ids[0]`: ``host_view``);
    in-place arithmetic on it (`t *= k`) keeps it where it is. (The facts keep
    `x = f(...)` as the call's target; an assignment of anything else is kept
    as one.)"""
    calls = [c for c in func.calls if (c.target or "").strip() == name]
    views = [a for a in func.assigns if name in a.targets and (a.op == "=" or len(a.targets) != 1)]
    if not calls and not views or any(s.target == name for s in func.sites):
        return False
    for c in calls:
        if _on_cpu(c):
            continue  # `torch.zeros(n, device="cpu")`, `y.to("cpu")` (round 28)
        if "device" in c.arglist or not (_HOST_FACTORY.fullmatch(c.callee) or
                                         _HOST_CALL.fullmatch(f"{c.callee}({c.arglist})") or produced(c.callee)
                                         or _tokenized(c)):
            return False
    if any(a.targets != (name,) or a.op != "=" or not host_view(func, a.value, produced, depth - 1) for a in views):
        return False
    return not any((item.target or "").strip() == name for w in func.withs for item in w.items)


def _on_cpu(call: Call) -> bool:
    """A torch factory given the CPU literally (`torch.zeros(n, device="cpu")`) or a copy to it
    (`y.to("cpu")`, `y.to(device="cpu", dtype=t)`): a host tensor wherever the call runs."""
    if "cpu" not in call.arglist:
        return False
    args = split_args(call.arglist)
    if _HOST_FACTORY.fullmatch(call.callee) or call.callee in ("torch.tensor", "torch.as_tensor"):
        return any(a.keyword == "device" and _CPU_TEXT.fullmatch(a.text.strip()) for a in args)
    if not call.callee.endswith(".to") or any(a.keyword not in (None, "device", "dtype", "non_blocking", "copy")
                                              for a in args):
        return False
    named = [a for a in args if a.keyword == "device" or a.keyword is None and not a.text.strip().startswith("torch.")]
    return len(named) == 1 and _CPU_TEXT.fullmatch(named[0].text.strip()) is not None


def _tokenized(call: Call) -> bool:
    """`tok(text, return_tensors="pt")`: a tokenizer's (or processor's) output, made on the host."""
    return "return_tensors" in call.arglist and not _MOVED.search(call.callee) and any(
        a.keyword == "return_tensors" and _PT.fullmatch(a.text.strip()) for a in split_args(call.arglist))


def host_view(func: Func, text: str, produced: Callable[[str], bool], depth: int) -> bool:
    """``text`` is an entry or attribute (no call) of a local of ``func``
    bound only to host values (``host_local``), which the function never
    stores into, moves in place (`enc.to(device)` moves a tokenizer's
    output's entries), or hands whole to a call (that may store into it)."""
    view = _VIEW.fullmatch(text.strip())
    if view is None or depth <= 0 or func.scope is None:
        return False
    root = view.group(1)
    if root in func.scope.params or root in ("self", "cls"):
        return False
    into = (f"{root}.", f"{root}[")
    if any(t.startswith(into) for a in func.assigns for t in a.targets) or any(
            c.callee.startswith(f"{root}.") or (c.target or "").startswith(into)
            or root in c.arglist and any(a.text.strip() == root for a in split_args(c.arglist))
            for c in func.calls):
        return False
    return host_local(func, root, produced, depth)


def _registered(func: Func) -> bool:
    """Decorated by anything but a plain wrapper (``@register(...)``): what calls it is unknown."""
    scope = func.scope
    names = (d.split("(", 1)[0].strip().lstrip("@") for d in (scope.decorators if scope is not None else ()))
    return any(n not in _PLAIN_DECORATORS and n.rsplit(".", 1)[-1] not in _PLAIN_DECORATORS for n in names)
