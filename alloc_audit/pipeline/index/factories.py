"""Factories and derived sites: functions that hand an allocation back to
their caller (return it, fill an out-parameter), classes whose construction
allocates, and the calls to them, which become *derived sites* in the
caller's scope (api = the factory, via = the underlying allocation)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ...arglists import pointer_target, split_args
from ...model import Call, Language, Site, SiteKind, Tier, Via
from .calls import CallGraph
from .memo import Memo
from .overloads import OverloadWalk
from .symbols import ClassInfo, Func, Hop, Reach, Symbols, last_name, sites_of


class Factories:
    def __init__(self, symbols: Symbols, calls: CallGraph, resolve: Callable[[Func, Call | str], tuple[Func, ...]],
                 constructed_class: Callable[[Func, Call], ClassInfo | None]) -> None:
        self._symbols = symbols
        self._calls = calls
        self._resolve = resolve
        self._constructed_class = constructed_class
        self._factory: Memo[tuple[str, int, bool], Reach | None] = Memo(symbols.deps)
        self._class_alloc: Memo[tuple[str, int, bool], Reach | None] = Memo(symbols.deps)
        # weight uploads (whole-module moves, checkpoint uploads): a construction or factory that moves a
        # model to the device stands for it, only while the derived sites (and the expansion's factories)
        # are made; the rules' constructions leave them out. By (path, line), those the later stages found.
        self._with_uploads = False
        self._uploads: frozenset[tuple[str, int]] = frozenset()
        self._overloads = OverloadWalk(symbols, calls.reach, self._upload, self.class_allocates, self._significance)
        self._past: dict[str, str] = {}  # function id -> PAST + it, interned (``_past_constructors``)

    def reset(self) -> None:
        self._factory.clear()
        self._class_alloc.clear()

    def invalidate(self, touched: set[str], sites: Iterable[Site] = ()) -> None:
        """Files (or ``sites``) were added: forget what looked up a name they define (``memo``)."""
        touched = touched | counted_past_constructors(sites, self._uploads)
        self._factory.invalidate(touched)
        self._class_alloc.invalidate(touched)

    def class_allocates(self, cls: ClassInfo, depth: int = 3) -> Reach | None:
        """The first allocation a construction of ``cls`` executes (through its
        constructors and what they call), or None."""
        return self._memoised(self._class_alloc, (cls.key, depth, self._with_uploads),
                              lambda: self._find_class_allocation(cls, depth))

    def _find_class_allocation(self, cls: ClassInfo, depth: int) -> Reach | None:
        # weights are counted where they are allocated; temporaries (a
        # helper's per-call buffers, a buffer the constructor drops) die
        # before the construction returns: neither makes it a buffer factory
        # a lambda defined in a native constructor (`auto pin = [&]() {...}`) is the constructor's work
        ctors = self._symbols.constructors(cls)
        ctors += [f for ctor in ctors if ctor.language is not Language.PYTHON
                  for f in [self._symbols.func(ctor.path, ctor.qualname + "::<lambda>")] if f is not None]
        reaches = [self._calls.reach(ctor, depth) for ctor in ctors]
        _past_constructors(self._symbols.deps.stack, {sites_of(c) for c in ctors}, self._symbols.funcs, self._past)
        reached = [r for found in reaches for r in found if self._overloads.counts(r)]
        return min(reached, key=self._significance) if reached else None

    def factory_allocation(self, func: Func, depth: int = 3,
                           keep: Callable[[Site], bool] | None = None) -> Reach | None:
        """When ``func`` hands an allocation back to its caller (returns it, or fills an out-parameter),
        the first such allocation; with ``keep``, the first it accepts (not memoised: ``untaken``)."""
        if keep is not None:
            return self._find_factory_allocation(func, depth, keep)
        return self._memoised(self._factory, (func.id, depth, self._with_uploads),
                              lambda: self._find_factory_allocation(func, depth), sites_of(func))

    def _memoised(self, memo: Memo[tuple[str, int, bool], Reach | None], key: tuple[str, int, bool],
                  compute: Callable[[], Reach | None], note: str | None = None) -> Reach | None:
        """``compute()`` once per key, remembering the names it looked up (``memo``);
        a key asked again while it is being computed (a cycle) answers None."""
        if key in memo:
            return memo.hit(key)
        memo.guard(key, None)
        deps = self._symbols.deps
        deps.begin()
        if note is not None:
            deps.note(note)
        return memo.store(key, compute(), deps.end())

    def _find_factory_allocation(self, func: Func, depth: int,
                                 keep: Callable[[Site], bool] | None = None) -> Reach | None:
        scope = func.scope
        if scope is None or scope.kind != "function" or scope.role == "constructor":
            return None
        returned_lines = {r.line for r in func.returns}
        returned_names = {r.value for r in func.returns if r.value}
        # handed back inside another object: `return SharedBuffer(ptr, handle)`, `return cls(owner)`
        wrapped = {n for r in func.returns for n in _wrapped_names(r.value)}
        for site in func.sites:
            if not site.acquires or (_weight(site) and not self._upload(site)) or (keep and not keep(site)):
                continue
            if site.stmt_line in returned_lines or (site.target and (site.target in returned_names
                                                                     or site.target in wrapped)):
                return Reach(site, ())
            if site.target and site.target.startswith("*") and \
                    site.target[1:] in {p.lstrip("*&") for p in scope.params}:
                return Reach(site, ())
        if depth <= 0:
            return None
        scalars = _to_scalar(func)
        scalar: Reach | None = None  # only a number is handed back: the caller's temporary
        for ret in func.returns:
            inside = _wrapped_names(ret.value)
            for call in func.calls:
                if call.span.line != ret.line and not (call.target and (call.target == ret.value
                                                                        or call.target in inside)):
                    continue
                for target in self._resolve(func, call):
                    if target.scope is not None and target.scope.owner:  # its class may be added later
                        self._symbols.deps.note(last_name(target.scope.owner))
                    inner = self.factory_allocation(target, depth - 1, keep)
                    if inner is None and target.scope is not None and target.scope.role == "constructor" \
                            and target.owner is not None:
                        inner = self._overloads.allocates(target.owner, func, call, depth - 1)
                        if inner is not None and keep is not None and not keep(inner.site):
                            inner = None
                    if inner is not None:
                        hop = Hop(call, func.path, func.qualname, target.qualname)
                        if (call.span.line, call.span.col) not in scalars:
                            return Reach(inner.site, (hop, *inner.hops))
                        scalar = scalar or Reach(inner.site, (hop, *inner.hops))
        return scalar

    def _upload(self, site: Site) -> bool:
        return self._with_uploads and (_moves_module(site) or (site.path, site.span.line) in self._uploads)

    def _significance(self, reach: Reach) -> tuple[bool, int, bool, int, str, int]:
        """A weight upload stands for a construction first (it builds a
        model), then ``_significance``."""
        return (not self._upload(reach.site), *_significance(reach))

    def derived_sites(self, depth: int = 3, uploads: frozenset[tuple[str, int]] = frozenset()) -> tuple[Site, ...]:
        """Calls to project factories and allocating classes, as sites in the
        caller's scope (api = the factory, via = the underlying allocation).
        ``uploads`` (by path and line) are weight uploads the later stages
        found (module moves): a construction or factory whose allocation is
        one is a factory too, and one is its via before anything else
        (parameter declarations never are: every module construction
        would be a derived site).

        Python factory functions count when their result is kept (stored on an
        object, at module level, or in a class body): a temporary returned by
        an op wrapper is already a per-call site inside the wrapper.
        Constructions of allocating classes and native factories always count.
        """
        if uploads != self._uploads:
            # an entry's value changes only where it asked ``_upload`` of a site whose line moved in or out
            read = _sites_on_lines(self._symbols, uploads ^ self._uploads)
            self._uploads = uploads
            self._factory.discard(lambda k: k[2], read)
            self._class_alloc.discard(lambda k: k[2], read)
        self._with_uploads = True
        try:
            return self._derived_sites(depth)
        finally:
            self._with_uploads = False
            for memo in (self._factory, self._class_alloc) if self._symbols.deps.settled else ():
                memo.settle()  # the names served the discard above: free them

    def _derived_sites(self, depth: int) -> tuple[Site, ...]:
        by_leaf = self._calls.calls_by_leaf()
        out: list[Site] = []
        for name in sorted({f.name for f in self._factories(3)}):
            for func, i in by_leaf.get(name, ()):
                assert func.table is not None
                derived = self._derive(func, func.call_at(i), depth)
                if derived is not None:
                    out.append(derived)
        out.sort(key=lambda s: s.sort_key)
        return tuple(out)

    def factories(self, depth: int = 3, uploads: bool = False) -> set[Factory]:
        """With ``uploads``, as the derived sites see them (weight uploads
        the file shows make factories too); see ``_factories``."""
        self._with_uploads = uploads
        try:
            return self._factories(depth)
        finally:
            self._with_uploads = False

    def _factories(self, depth: int) -> set[Factory]:
        """Functions that hand an allocation back and classes whose
        construction allocates, found from the allocations outward:
        level 0 are functions returning (or filling an out-parameter with) a
        site of their own and classes whose construction allocates (within
        ``depth`` calls); each further level adds functions that return a
        call to a known factory. Only calls whose name matches the previous
        level are looked at, and only what is a factory when resolved (what
        ``_derive`` accepts) is returned."""
        names: set[Factory] = set()
        frontier: list[Func] = []
        for func in self._symbols.funcs.values():
            scope = func.scope
            if scope is None or scope.kind != "function" or scope.role == "constructor" or not func.sites:
                continue
            if self.factory_allocation(func, 0) is not None:
                frontier.append(func)
        # classes whose construction allocates, however deep (what a derived
        # site of a construction requires), in a stable order
        for key in sorted(self._symbols.classes):
            cls = self._symbols.classes[key]
            if self.class_allocates(cls, depth) is not None:
                frontier += self._symbols.constructors(cls)
        by_leaf = self._calls.calls_by_leaf()
        seen: set[str] = set()
        for _level in range(depth + 1):
            level_names: set[str] = set()
            for func in frontier:
                if func.id in seen:
                    continue
                seen.add(func.id)
                if func.scope is not None and func.scope.role == "constructor" and func.owner is not None:
                    for cls in (func.owner, *self._symbols.subclasses(func.owner.name)):
                        level_names.add(cls.name)
                        if self.class_allocates(cls, depth) is not None:
                            names.add(Factory.of_class(cls))
                else:
                    level_names.add(func.name)
                    if self.factory_allocation(func, depth) is not None:
                        names.add(Factory.of_function(func))
            next_frontier: list[Func] = []
            for name in sorted(level_names):
                for caller, i in by_leaf.get(name, ()):
                    if caller.id in seen or caller.scope is None or caller.scope.kind != "function":
                        continue
                    if caller.scope.role == "constructor" or self._returns_call(caller, i):
                        next_frontier.append(caller)
            frontier = next_frontier
        return names

    def _returns_call(self, func: Func, i: int) -> bool:
        """Whether call ``i`` of ``func`` is returned (on a return line, or
        stored into a name that is returned)."""
        table = func.table
        if table is None or not func.returns:
            return False
        line = table.line(i)
        target = table.targets[i]
        return any(r.line == line or (target is not None and r.value == target) for r in func.returns)

    def _factory_api(self, func: Func, call: Call, cls: ClassInfo | None) -> str:
        """How a derived site names its factory: as called on ``self``/``cls``
        (`self._make_buffer`), else by the definition's qualified name
        (`KVCachePool`, `Wrapper.make`): readable, and unchanged by import style."""
        callee = call.callee
        if callee.startswith(("self.", "cls.", "this->", "super()")) or "->" in callee:
            return callee
        if cls is not None:
            return cls.qualname
        targets = self._resolve(func, call)
        return targets[0].qualname if targets else callee

    def _derive(self, func: Func, call: Call, depth: int) -> Site | None:
        cls = self._constructed_class(func, call)
        reach: Reach | None = None
        filler: Func | None = None  # the factory whose own allocation is the reach (it may fill an out-parameter)
        if cls is not None:
            reach = self._overloads.allocates(cls, func, call, depth)
            if reach is not None and not cls.defined_once:
                # one C++ name, several definitions (a device-side view and a
                # host class, in different headers): a caller in one of those
                # files means its own; elsewhere, which one is not known
                # without the includes, so say nothing
                if func.path not in cls.paths:
                    return None
                own = [r for ctor in self._symbols.constructors(cls) if ctor.path == func.path
                       for r in self._calls.reach(ctor, depth) if not _weight(r.site) or self._upload(r.site)]
                reach = min(own, key=self._significance) if own else None
        else:
            targets = self._resolve(func, call)
            if not targets:
                return None
            if func.language is Language.PYTHON and not _kept(func, call):
                return None
            for target in targets:
                if target is func:
                    continue
                reach = self.factory_allocation(target, depth)
                if reach is not None:
                    filler = target if not reach.hops else None
                    break
        if reach is None:
            return None
        under = reach.site
        return Site(
            path=func.path,
            span=call.span,
            language=func.language,
            api=self._factory_api(func, call, cls),
            kind=under.kind,
            scope=func.qualname,
            size=" ".join(call.arglist.split()) or None,
            shape=tuple(a.text for a in split_args(call.arglist, func.language is not Language.PYTHON)
                        if a.keyword is None),
            device=under.device,
            target=call.target or _filled_argument(filler, under, call),
            stmt_line=call.span.line,
            via=Via(under.api, under.path, under.span.line),
            kept="local" if self._scalar(reach) else "",
        )

    def _scalar(self, reach: Reach) -> bool:
        """The factory hands back only a host scalar made from its
        allocation (``.item()``): the caller keeps a number, and the
        allocation is a temporary of the call (T4 wherever it is called)."""
        for hop in reach.hops:
            func = self._symbols.func(hop.path, hop.caller)
            if func is not None and (hop.call.span.line, hop.call.span.col) in _to_scalar(func):
                return True
        return False


def _filled_argument(factory: Func | None, site: Site, call: Call) -> str | None:
    """What a call of a native factory that fills its out-parameter with its
    own allocation (``cudaMalloc((void**)ptr, n)``, the site's target
    ``*ptr``) binds: the argument in that parameter's place, as an
    allocation's out-argument reads (``device_malloc(&buf, n)`` -> ``buf``);
    None when the site fills no parameter (or the factory is Python's)."""
    if factory is None or factory.language is Language.PYTHON:
        return None
    filled = (site.target or "").strip()
    params = factory.scope.params if factory.scope is not None else ()
    names = [p.lstrip("*&").strip() for p in params]
    if not filled.startswith("*") or filled[1:] not in names:
        return None
    args = split_args(call.arglist, True)
    at = names.index(filled[1:])
    if at >= len(args) or args[at].keyword is not None:
        return None
    return pointer_target(args[at].text) or None


def _sites_on_lines(symbols: Symbols, lines: frozenset[tuple[str, int]]) -> set[str]:
    """What a memo noted that read a site on one of ``lines`` (by path and line): ``sites_of`` its function,
    and the same past a constructor (``_past_constructors``)."""
    out: set[str] = set()
    for path, line in lines:
        for func in symbols.by_path.get(path, {}).values():
            if any(site.span.line == line for site in func.sites):
                out |= {sites_of(func), PAST + sites_of(func)}
    return out


# a class allocation counts, past its constructors (one call or more away), no
# weight (T1) and no transient (T4) but a weight upload: there it notes a
# function's sites as PAST + ``sites_of``, which only such a site added touches
PAST = "past:"


def _past_constructors(stack: list[set[str]], own: set[str], funcs: Mapping[str, Func],
                       interned: dict[str, str]) -> None:
    """Once the reaches are asked, note the functions they visited past the constructors (``own``)
    as PAST: a weight or a transient added there cannot change the class's allocation. (The names
    are interned: one string per function, however many entries note it; ``interned`` keeps each
    one made, so a function met again by another class's reaches makes none.)"""
    if stack:
        names = stack[-1]
        past = {n for n in names if n in funcs and n not in own}  # ``sites_of``: a function's id
        names -= past
        for n in past:
            noted = interned.get(n)
            if noted is None:
                noted = interned[n] = sys.intern(PAST + n)
            names.add(noted)


def counted_past_constructors(sites: Iterable[Site], uploads: frozenset[tuple[str, int]]) -> set[str]:
    """What adding ``sites`` touches past a constructor: the functions of those a class allocation
    would count there (not a weight or transient, or a weight upload, or on an upload's line)."""
    return {PAST + f"{s.path}::{s.scope}" for s in sites  # PAST + sites_of its function
            if (s.tier not in (Tier.T1, Tier.T4) or _moves_module(s) or (s.path, s.span.line) in uploads)}


_KIND_RANK = {SiteKind.DEVICE: 0, SiteKind.IPC: 1, SiteKind.MANAGED: 2, SiteKind.VIRTUAL: 3,
              SiteKind.WORKSPACE: 4, SiteKind.GRAPH_POOL: 5, SiteKind.PINNED_HOST: 6, SiteKind.RELEASE: 9}


def _significance(reach: Reach) -> tuple[int, bool, int, str, int]:
    """Which of a construction's allocations stands for it: device memory
    before host memory, persistent before per-call (the real cost of the
    construction), then the nearest, then the first in the source."""
    transient = reach.site.tier is Tier.T4
    return (_KIND_RANK[reach.site.kind], transient, len(reach.hops), reach.site.path, reach.site.span.line)


def _moves_module(site: Site) -> bool:
    """A whole-module move the file itself shows (a weight upload)."""
    return site.tier is Tier.T1 and site.api in ("Module.to", "Module.cuda") and site.tier_reason.startswith(
        "weight upload")


def _weight(site: Site) -> bool:
    """Model weights (T1) are counted where they are allocated; constructing a
    layer that owns weights is not a derived site."""
    return site.tier is Tier.T1


_SCALAR_CALLEES = (").item", ").tolist")  # a method called on a call's value


def _to_scalar(func: Func) -> frozenset[tuple[int, int]]:
    """Where calls start whose value is turned into a host scalar in the same
    expression (``seed = _broadcast(t).item()``): what is kept or returned is
    a number, not the tensor the call makes; the tensor is a temporary of
    ``func``, so the call does not hand an allocation back."""
    if not any(c.endswith(_SCALAR_CALLEES) for c in func.callees):
        return frozenset()
    return frozenset((c.span.line, c.span.col) for c in func.calls if c.callee.endswith(_SCALAR_CALLEES))


_WRAPPING_CALL = re.compile(r"^[A-Za-z_][\w.]*\s*\((.*)\)$", re.S)


def _wrapped_names(value: str) -> frozenset[str]:
    """Plain names passed to the call a return statement returns
    (``SharedBuffer(ptr, handle)`` -> ptr, handle): an allocation handed back
    inside the object it constructs."""
    m = _WRAPPING_CALL.match(value.strip())
    if m is None or "=" in value.split("(", 1)[0]:
        return frozenset()
    return frozenset(a.text.strip() for a in split_args(m.group(1)) if a.text.strip().isidentifier())


def _kept(func: Func, call: Call) -> bool:
    """True when a call's result outlives the call's frame."""
    scope = func.scope
    if scope is None or scope.kind == "class":
        return True
    return (call.target or "").startswith(("self.", "cls."))


@dataclass(frozen=True, order=True)
class Factory:
    """A buffer factory as the expansion looks for its callers: its name,
    language, kind (class, function or method) and where a caller must
    point to reach it: for Python the defining module, for a native method
    its class (a caller declares a variable of that type)."""

    name: str
    python: bool
    kind: str
    defined_in: str  # Python: the defining module; a native method: its class
    callable_anywhere: bool = True  # False: a native class defined in several files (callers elsewhere are unknown)
    owner: str = ""  # a method's class

    @staticmethod
    def of_class(cls: ClassInfo) -> Factory:
        python = cls.language is Language.PYTHON
        return Factory(cls.name, python, "class", cls.module, python or cls.defined_once)

    @staticmethod
    def of_function(func: Func) -> Factory:
        python = func.language is Language.PYTHON
        if func.owner is None:
            return Factory(func.name, python, "function", func.module)
        owner = func.owner
        return Factory(func.name, python, "method", func.module if python else owner.name,
                       python or owner.defined_once, owner.name)
