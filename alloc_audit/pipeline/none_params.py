"""Stage 5, after derive: a move to, or a factory given, a parameter whose
default is ``None`` and that every call leaves so allocates nothing on the
device: no site (issue 11, round 29).

    class Rotary(nn.Module):
        def __init__(self, dim, device=None):
            t = torch.arange(0, dim, 2).float().to(device)   # no site: `.to(None)` returns t itself

    self.rotary = Rotary(head_dim)                          # every construction passes no device

``x.to(P)``, ``P`` a parameter whose default is ``None``, that the function
never rebinds and that every call leaves so (or passes ``None``, or hands
on a parameter of its own left so in turn, 3 callers up), is ``x.to(None)``:
it returns ``x`` itself, wherever ``x`` is (a tensor a default-device
context put on the GPU is its factory's site). A dtype or ``copy=`` beside
the device copies, and a move under a branch that tests ``P`` (``if device
is not None:``) is code the in-tree calls skip but a user's may run (as
``host_args`` keeps it): both keep the site. A torch factory given
``device=P`` so builds on the default device: the host where no
default-device context reaches the function or a caller on the way
(``host_vias``' notion) and the project enters no device held in a name
(``with device:``, whose builds are not followed). The calls are every
call by the function's name and, for a constructor, by its class's name,
its subclasses' names (which may inherit it) and ``super().__init__`` in a
subclass; a name read as a value (a table, ``partial``), a class built by
``cls(...)``, a ``forward`` (run by ``module(...)``) or another dunder, or a
call spreading ``*args``/``**kwargs`` keeps the site.

The pass runs after ``derive``, so the derived constructions and their
tiers read the same sites as before; only the no-op sites leave. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from ..arglists import split_args
from ..model import Arg, Language, Site, SiteKind
from .host_args import read_as_value
from .host_vias import _CONTEXTS, _Placed
from .index import Func, ProjectIndex

_SELF = frozenset({"self", "cls"})
# methods Python or torch runs under another name (`module(x)` runs `forward`)
_DISPATCHED = frozenset({"forward", "_forward", "__call__"})
_DEPTH = 3  # callers followed up for a `None` parameter handed on
# factories that build on the device they are given, else the default one (not `*_like`, `tensor`,
# `as_tensor`: given None, those keep their input's device)
_FACTORIES = frozenset(f"torch.{f}" for f in ("empty", "zeros", "ones", "full", "arange", "linspace", "logspace",
                                               "eye", "rand", "randn", "randint", "randperm", "empty_strided"))


def drop_none_params(sites: Sequence[Site], index: ProjectIndex, contexts: Collection[str] | None = None,
                     engines: Collection[str] | None = None) -> list[Site]:
    """The sites, less the moves to and factories given a ``None`` every call leaves."""
    left = _LeftNone(index)
    held: dict[str, bool] = {}
    placed = _Placed(index, _CONTEXTS if contexts is None else contexts, engines or ())

    def none(site: Site) -> bool:
        if site.via is not None or site.language is not Language.PYTHON or site.device not in (None, "unknown"):
            return False
        if site.api in _FACTORIES and site.kind is SiteKind.DEVICE:
            return _host_factory(site, index, left, placed, held)
        if site.api != "Tensor.to":
            return False
        found = index.site_call(site)
        if found is None or found[0].scope is None:
            return False
        func, call = found
        param = _none_default_param(func, split_args(call.arglist))
        return param is not None and not _guarded(func, param, site.span.line) \
            and left.callers(func, param) is not None

    return [s for s in sites if not none(s)]


def _host_factory(site: Site, index: ProjectIndex, left: _LeftNone, placed: _Placed, held: dict[str, bool]) -> bool:
    """A torch factory given ``device=P``, ``P`` a parameter every call leaves ``None`` (round 29): built
    on the default device, the host where no default-device context reaches the function or a caller
    the proof went through (``host_vias``' own notion); the module's later move is its own site."""
    found_call = index.site_call(site)
    if found_call is None:
        return False
    func, call = found_call
    device = [a for a in split_args(call.arglist) if a.keyword == "device"]
    if func.scope is None or len(device) != 1 or not _none_param(func, device[0].text.strip()):
        return False
    callers = left.callers(func, device[0].text.strip())
    return callers is not None and not placed.any_of([func, *callers]) and not _held_devices(index, held)


def _held_devices(index: ProjectIndex, memo: dict[str, bool]) -> bool:
    """Some ``with`` in the project enters a device held in a name (``with device:``, ``with
    self.target_device:``): a ``torch.device`` is itself a default-device context, and what the name holds
    (``META_DEVICE if meta else gang.device``) is not followed, nor what the block builds (a factory handed
    in): any constructor may run under it, so ``device=None`` proves no host. Asked once per scan."""
    if "held" not in memo:
        memo["held"] = any(_HELD_DEVICE.fullmatch(item.callee) is not None and not item.args
                           for f in index.functions() for w in f.withs for item in w.items)
    return memo["held"]


_HELD_DEVICE = re.compile(r"(?:[A-Za-z_]\w*\.)*\w*device\w*", re.I)


def _guarded(func: Func, name: str, line: int) -> bool:
    """``line`` is in a branch whose test reads ``name`` (``if device is not None:``): code the in-tree calls
    skip but a user's may run, as ``host_args`` keeps it; the unguarded ``x.to(None)`` runs and moves nothing."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    tests = {b.stmt: b.test for b in func.blocks if b.kind == "if"}  # an `else` reads its `if`'s test
    return any(b.kind in ("if", "elif", "else") and b.span.contains_line(line)
               and word.search(b.test or (tests.get(b.stmt, "") if b.kind == "else" else "") or "")
               for b in func.blocks)


def _none_default_param(func: Func, args: Sequence[Arg]) -> str | None:
    """The parameter the move's device is, when its default is ``None``, the move
    takes nothing else (a dtype or ``copy=True`` copies wherever the tensor is;
    ``non_blocking`` is allowed) and the function never rebinds it (round 29)."""
    assert func.scope is not None
    device = [a for a in args if a.keyword in (None, "device")]
    if len(device) != 1 or any(a.keyword not in (None, "device", "non_blocking") for a in args):
        return None
    name = device[0].text.strip()
    return name if _none_param(func, name) else None


def _none_param(func: Func, name: str) -> bool:
    """``name`` is a parameter of ``func`` with a ``None`` default that ``func`` never rebinds."""
    scope = func.scope
    if scope is None or not name.isidentifier() or name not in scope.params:
        return False
    position = scope.params.index(name)
    if position >= len(scope.param_defaults) or scope.param_defaults[position].strip() != "None":
        return False
    return not any(name in a.targets for a in func.assigns) \
        and not any((c.target or "").strip() == name for c in func.calls)


class _LeftNone:
    """Which parameters with a ``None`` default every call leaves so (round 29), and the callers each
    proof went through (where a default-device context would make ``None`` the GPU)."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self.memo: dict[tuple[str, str], tuple[Func, ...] | None] = {}

    def callers(self, func: Func, param: str, depth: int = _DEPTH) -> tuple[Func, ...] | None:
        """The callers (transitively) when every call of ``func`` leaves ``param`` to its ``None``
        default, passes ``None``, or hands on a parameter of the caller left so in turn (``depth``
        callers up; a recursive call handing on ``param``); else None."""
        key = (func.id, param)
        if key not in self.memo:
            self.memo[key] = None  # a cycle through other functions proves nothing
            self.memo[key] = self._callers(func, param, depth) if depth > 0 else None
        return self.memo[key]

    def _callers(self, func: Func, param: str, depth: int) -> tuple[Func, ...] | None:
        """``x.to(None)`` returns ``x`` itself, and a factory given ``device=None`` builds on the default
        device. The calls are every call by the function's name (a constructor: by its class's name and
        by its subclasses', which may inherit it; ``super().__init__(...)`` in a subclass) that resolves
        to it or to nothing; one resolved elsewhere is another function's. A function whose name is read
        as a value (``partial``, a table, ``target=f``), or a class one of whose methods builds it by
        ``cls(...)``, may be called where no call shows: no proof, nor for a call that spreads
        ``*args``/``**kwargs``."""
        assert func.scope is not None
        if func.name in _DISPATCHED or func.name.startswith("__") and func.name != "__init__":
            return None  # `module(x, device=d)` runs `forward`: calls by another name
        index = self.index
        owner = func.owner.name if func.owner is not None else None
        names = [func.name]
        subclasses: list[str] = []
        if func.name == "__init__":
            if owner is None:
                return None
            subclasses = index.subclass_names(owner)
            names = [owner, *subclasses, "__init__"]
        if any(read_as_value(index, n, func.path) for n in names if n != "__init__"):
            return None
        if func.name == "__init__" and any(
                f.owner is not None and f.owner.name in names and any(c.callee in _SELF_BUILDS for c in f.calls)
                for f in index.functions_in(func.path)):
            return None  # `cls(...)`, `type(self)(...)`: built by another name
        params = list(func.scope.params)
        found: dict[str, Func] = {}
        for name in names:
            for caller, i in index.calls_named(name):
                if caller.table is None:
                    continue
                call = caller.table[i]
                if name == "__init__" and (caller.owner is None or caller.owner.name not in subclasses):
                    continue  # `super().__init__(...)` of this class itself, or of one that does not derive from it
                resolved = index.resolve(caller, call)
                if resolved and func not in resolved:
                    continue  # another function of that name
                args = split_args(call.arglist)
                if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args):
                    return None  # what it passes is not known
                positional = [a for a in args if a.keyword is None]
                # `Base.__init__(self, ...)` hands `self` itself; a bound call or a construction does not
                offset = 1 if params and params[0] in _SELF and not (
                    positional and positional[0].text.strip() == params[0]
                    and not call.callee.startswith("self.")) else 0
                position = params.index(param) - offset
                passed = next((a for a in args if a.keyword == param), None)
                if passed is None and 0 <= position < len(positional):
                    passed = positional[position]
                text = passed.text.strip() if passed is not None else "None"
                if caller is func and text == param:
                    continue  # a recursive call handing on its own
                if text != "None":
                    if caller.scope is None or not _none_param(caller, text):
                        return None
                    above = self.callers(caller, text, depth - 1)
                    if above is None:
                        return None
                    found.update((f.id, f) for f in above)
                found[caller.id] = caller
        return tuple(found.values()) or None


_SELF_BUILDS = frozenset({"cls", "type", "self.__class__", "__class__"})
