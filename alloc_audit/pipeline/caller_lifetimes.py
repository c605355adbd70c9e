"""Stage 5, classify (after the kept results): lifetimes from how often the
callers run a function and what they keep of its result.

Input: classified sites, the project index and the caller globs of
``rules/tiers.toml`` ``[callers]``. Output: the same sites, a few re-tiered,
each with a reason naming the caller. DESIGN.md ("Lifetime tiers"): who
calls the function and where the result goes decide, not the name. Pure.

- An initialiser by name (T2: ``setup*``, ``_initialize_*``) whose buffer is
  not kept on its object, called by a function inside a ``for``/``while``
  body that keeps the result in a local at most (``for n in sizes: fn =
  setup_case(n)``; a table of such functions a loop calls through the loop
  variable), makes it on every pass: T4. Stored on an object by the loop
  (``slot.buf = _reserve(slot.buf, n)``) or handed to a construction
  (``Linear(w, pairs)``), it stays the initialiser's.
- An initialiser whose buffers are returned (alone or in the containers it
  returns) to a method that is no constructor and keeps them on its object
  under a cache name (``self.kv_cache = self._initialize_caches(...)`` in
  ``rollout``) holds state rebuilt for each rollout or request: T3.
- A buffer written back into a container entry (``state[k] = t.to(dev)``)
  by a function its callers run only under a test on a checkpoint load
  (``if cfg.load_optimizer and step == start:``) is loaded state: T1.
- A buffer made when a key is missing from a store (``if "key" not in
  store:``) and put into that store (``store.update({"key": k_cache})``)
  is made on the first step and reused by the later ones (a KV cache kept
  across decode steps): request-scoped state, T3.
- A buffer handed to a construction that a method other than a per-step
  one keeps on its object together with caches (``self._ctx =
  Context(kv_cache=kv, noise_pool=pool)`` in ``streaming_reset``) lives
  with those caches until the next reset: request-scoped state, T3.
- A pinned host buffer (T5b, kept on an object) that a per-step function
  stores on an object it was handed and hands back (``batch.output = out``
  ... ``return batch`` in ``forward``) is re-made per call and handed out,
  not kept and reused by the function's own object: T5a.
- An object with persistent buffers (a derived site) returned by a method
  every call of which by name is in a constructor (``get_quant_method`` in
  a layer's ``__init__``) is built once per object: T2.

``attribute_caller`` answers for ``classify_callers`` whether a method whose
resolved callers are all constructors may run elsewhere: a call by its name
through an attribute of another object (``self.comm.all_reduce(x)``) that
no resolution pins down.
"""

from __future__ import annotations

import builtins
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex

_INITIALISER = "initialiser "  # the reason of the initialiser-name patterns (rules/tiers.toml)
_FUNCTION_ROLES = frozenset({"function", "method"})
_CACHE_MEMBER = matcher(["self.*cache*", "self.*_kv", "self.kv_*", "self.*_kv_*"])
_ADDS = (".append", ".extend", ".insert")
_MEMBER = re.compile(r"([A-Za-z_]\w*)\.[A-Za-z_]\w*")
_BUILTINS = frozenset(dir(builtins))
_DISTINCT = 12  # at most this many project functions of a name: a call by the name may be to any of them
_ENTRY = re.compile(r"[A-Za-z_]\w*\[[^\]]+\]")  # an entry of a local or handed-in container: `state[name]`
_ABSENT_KEY = re.compile(r"""["'](\w+)["']\s+not\s+in\s+([A-Za-z_]\w*)\s*$""")
_CACHE_ARG = re.compile(r"\b\w*cache\w*\s*=")
_LOADED = re.compile(r"\b\w*(?:load|resume|restore)\w*", re.IGNORECASE)


@dataclass
class NameMemo:
    """What ``attribute_caller`` found per method name and class, and how
    many project functions define each name (counted once per scan)."""

    found: dict[str, Func | None] = field(default_factory=dict)
    defined: Counter[str] | None = None


def attribute_caller(func: Func, index: ProjectIndex, memo: NameMemo) -> Func | None:
    """A function other than a constructor that calls a method by
    ``func``'s name through an attribute of another object (a member
    ``self.comm.all_reduce(x)``, or a local or parameter
    ``comm.all_reduce(x)``) that does not resolve elsewhere: ``func`` may run
    there (not ``func`` itself: a wrapper calling the same name of the
    library it holds, ``self.lib.cudaMalloc(n)``). Only for a name few
    project functions define (``_DISTINCT``): a call to ``x.load()`` tells
    nothing about which of dozens of ``load`` methods runs."""
    owner = func.owner
    if func.language is not Language.PYTHON or owner is None:
        return None
    key = f"{func.name}#{owner.name}"
    if key in memo.found:
        return memo.found[key]
    if memo.defined is None:
        memo.defined = Counter(f.name for f in index.functions())
    found = None
    for caller, i in index.calls_named(func.name) if memo.defined[func.name] <= _DISTINCT else ():
        if caller.table is None or caller is func or caller.scope is None or caller.scope.role == "constructor":
            continue
        receiver = caller.table.callees[i].rpartition(".")[0]
        root = receiver.split(".", 1)[0]
        if not receiver or receiver in ("self", "cls") or not root.isidentifier():
            continue
        if root != "self" and not _local(caller, root):
            continue
        if not index.resolve(caller, caller.table.callees[i]):  # a resolved call is among the known callers
            found = caller
            break
    memo.found[key] = found
    return found


def _local(caller: Func, name: str) -> bool:
    """``name`` is a parameter of ``caller`` or assigned in it (not an import)."""
    params = caller.scope.params if caller.scope is not None else ()
    return name in params or any(name in (t.strip() for t in a.targets) for a in caller.assigns)


def caller_lifetimes(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None
    out = []
    for site in sites:
        if site.language is Language.PYTHON and site.via is not None and site.tier is Tier.T4:
            site = _returned_to_constructors_by_name(site, index)
        elif site.language is Language.PYTHON and site.via is None:
            if site.tier is Tier.T2 and site.tier_reason.startswith(_INITIALISER):
                site = _initialiser_by_callers(site, index)
            elif site.tier is Tier.T5B and site.kind is SiteKind.PINNED_HOST and per_step is not None:
                site = _handed_out(site, index, per_step)
            elif site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and _ENTRY.fullmatch(site.kept or ""):
                site = _restored_after_load(site, index)
            elif site.tier is Tier.T4 and site.kind is SiteKind.DEVICE:
                if (site.kept or "").startswith("handed:"):
                    site = _bundled_with_caches(site, index, per_step)
                site = _filled_once_in_store(site, index) if site.tier is Tier.T4 else site
        out.append(site)
    return out


def _initialiser_by_callers(site: Site, index: ProjectIndex) -> Site:
    kept = site.kept or ""
    if kept.startswith("self.") or kept == "static":
        return site
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    calls = [(caller, call.span.line, call.target) for caller in _callers(func, index)
             for call in caller.calls if call.callee.rpartition(".")[2] == func.name]
    returned = kept == "return" or _in_returned_container(site, func)
    for caller, line, target in calls:
        if caller.scope is None or caller.scope.role not in _FUNCTION_ROLES:
            continue
        members = [t.strip() for t in (target or "").strip("()").replace("\n", " ").split(",")]
        cached = [m for m in members if _CACHE_MEMBER(m)]
        if returned and cached:
            return dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"request-scoped state: {caller.qualname} rebuilds it on each call ({caller.path}:{line}) and "
                f"keeps it in {', '.join(cached)}; {site.tier_reason}"))
    for caller, line, target in calls:
        loop = next((b for b in caller.blocks if b.kind == "loop" and b.span.contains_line(line)), None)
        names = [t.strip() for t in (target or "").strip("()").split(",") if t.strip()]
        kept_by_caller = any(not n.isidentifier() for n in names) or _kept_on_line(caller, line)
        if loop is not None and not kept_by_caller and not _handed_to_keeper(caller, names, line, loop.span.end_line):
            return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"per loop pass: {caller.qualname} calls {func.qualname} inside a loop ({caller.path}:{line}) "
                f"and {func.qualname} keeps nothing on its object; {site.tier_reason}"))
    table = _table_loop(func, index) if not calls else None
    if table is not None:
        name, caller, line = table
        return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
            f"per loop pass: {func.qualname} sits in the table {name}, and {caller.qualname} calls the table's "
            f"functions inside a loop ({caller.path}:{line}); it keeps nothing on an object; {site.tier_reason}"))
    return site


def _table_loop(func: Func, index: ProjectIndex) -> tuple[str, Func, int] | None:
    """``func`` is a value in a module-level table of its file (``MODES =
    [("dense", setup_dense), ...]``) and a function of the file calls, inside
    a loop, a name that is neither a function nor one of its parameters or
    assigned locals (the loop variable: ``for name, setup in MODES: setup(n)``)."""
    module = index.func(func.path, "<module>")
    if module is None or func.owner is not None or not any(func.name in a.value for a in module.assigns):
        return None  # the pattern below spells the name: skip compiling it
    word = re.compile(rf"\b{re.escape(func.name)}\b(?!\s*\()")
    name = next((a.targets[0] for a in module.assigns if a.targets and word.search(a.value)), None)
    if name is None:
        return None
    for caller in index.functions_in(func.path):
        if caller.scope is None or caller.scope.role not in _FUNCTION_ROLES:
            continue
        loops = [b for b in caller.blocks if b.kind == "loop"]
        for call in caller.calls if loops else ():
            callee = call.callee
            if not callee.isidentifier() or callee in _BUILTINS or _local(caller, callee) \
                    or index.resolve(caller, call):
                continue
            if any(b.span.contains_line(call.span.line) for b in loops):
                return name, caller, call.span.line
    return None


def _handed_to_keeper(caller: Func, names: list[str], start: int, end: int) -> bool:
    """A local holding the result is passed, later in the loop, to a
    construction (``PseudoLinear(old, pairs)``) or to a call whose value is
    stored on an object: the result is kept, not dropped with the pass."""
    if not names:
        return False
    word = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in names) + r")\b")
    for call in caller.calls:
        if start < call.span.line <= end and word.search(call.arglist):
            leaf = call.callee.rpartition(".")[2]
            if leaf[:1].isupper() or (call.target is not None and not call.target.strip().isidentifier()):
                return True
    return False


def _kept_on_line(caller: Func, line: int) -> bool:
    """A call on ``line`` adds to a container on an object (``self.bufs.append(setup(n))``)."""
    return any(c.span.line <= line <= c.span.end_line and "." in c.callee.rsplit(".", 1)[0]
               and c.callee.endswith(_ADDS)
               for c in caller.calls)


def _callers(func: Func, index: ProjectIndex) -> list[Func]:
    dist = index.callers_within([func], 1)
    return [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]


def _in_returned_container(site: Site, func: Func) -> bool:
    """The site is built inside ``L.append(...)`` (or extend, insert) where
    ``func`` returns the local ``L`` (alone or in a tuple)."""
    returned = {part.strip() for r in func.returns for part in r.value.strip().strip("()").split(",")}
    line = site.span.line
    for call in func.calls:
        if call.span.line <= line <= call.span.end_line and call.callee.endswith(_ADDS):
            if call.callee.rsplit(".", 1)[0] in returned:
                return True
    return False


def _handed_out(site: Site, index: ProjectIndex, per_step: Callable[[str], bool]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or not per_step(func.name):
        return site
    local = (site.target or "").strip()
    params = [p for p in func.scope.params if p not in ("self", "cls")]
    returned = {r.value.strip() for r in func.returns}
    places = [local] if _MEMBER.fullmatch(local) else [
        t.strip() for a in func.assigns if a.value.strip() == local and local.isidentifier() for t in a.targets]
    for place in places:
        m = _MEMBER.fullmatch(place)
        if m is not None and m.group(1) in params and m.group(1) in returned:
            return dataclasses.replace(site, tier=Tier.T5A, tier_reason=(
                f"pinned output handed out: {func.qualname} re-makes it on every call, stores it in {place} "
                f"of the {m.group(1)} it was handed and returns {m.group(1)}; not kept by its own object"))
    return site


def _restored_after_load(site: Site, index: ProjectIndex) -> Site:
    """A buffer written back into a container entry (``state[name] =
    t.to(device)``) by a function every caller runs only under a test on a
    checkpoint load (``if cfg.load_optimizer and step == initial_step:``)
    restores loaded state once: T1 (the judges' load-path convention)."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    tests = []
    for caller in _callers(func, index):
        lines = [c.span.line for c in caller.calls if c.callee.rpartition(".")[2] == func.name]
        found = next((b.test for b in caller.blocks if b.kind in ("if", "elif") and _LOADED.search(b.test)
                      and any(b.span.contains_line(n) for n in lines)), None)
        if found is None:
            return site
        tests.append((caller, found))
    if not tests:
        return site
    caller, test = tests[0]
    text = " ".join(test.split())
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"restored after a checkpoint load: {caller.qualname} calls {func.qualname} only when "
        f"`{text[:60]}`, and it is written back into {site.kept}; {site.tier_reason}"))


def _returned_to_constructors_by_name(site: Site, index: ProjectIndex) -> Site:
    """An object with persistent buffers (a derived site) returned by a
    method that every call by its name in the project runs from a
    constructor (``self.quant_method = quant_config.get_quant_method(self)``
    in a layer's ``__init__``) is built once per object that keeps it: T2."""
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None or func.scope is None or func.scope.role != "method" \
            or not any(r.line == site.span.line or r.value.strip() == site.target for r in func.returns):
        return site
    calls = [caller for caller, _ in index.calls_named(func.name) if caller is not func]
    if not calls or not all(c.scope is not None and c.scope.role == "constructor" for c in calls):
        return site
    names = ", ".join(sorted({c.qualname for c in calls})[:3])
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"built once per object: every call of {func.name} in the project is in a constructor ({names}); "
        f"{site.tier_reason}"))


def _filled_once_in_store(site: Site, index: ProjectIndex) -> Site:
    local = (site.target or "").strip()
    if not local.isidentifier():
        return site
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    line = site.span.line
    for block in func.blocks:
        m = _ABSENT_KEY.search(" ".join(block.test.split())) if block.kind == "if" else None
        if m is None or not block.span.contains_line(line):
            continue
        store = m.group(2)
        word = re.compile(rf"\b{re.escape(local)}\b")
        stored = any(c.span.line > line and c.callee == f"{store}.update" and word.search(c.arglist)
                     for c in func.calls) or any(
            a.line > line and a.value.strip() == local and any(t.startswith(f"{store}[") for t in a.targets)
            for a in func.assigns)
        if stored:
            return dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"request-scoped state: made when `{m.group(0)}` (the first step) and kept in {store} for the "
                f"later steps; {site.tier_reason}"))
    return site


def _bundled_with_caches(site: Site, index: ProjectIndex, per_step: Callable[[str], bool] | None) -> Site:
    callee = (site.kept or "")[len("handed:"):]
    func = index.func(site.path, site.scope)
    if not callee.rpartition(".")[2][:1].isupper() or func is None or func.scope is None \
            or func.scope.role != "method" or (per_step is not None and per_step(func.name)):
        return site
    for call in func.calls:
        target = (call.target or "").strip()
        if call.callee == callee and call.span.line >= site.span.line and target.startswith("self.") \
                and _CACHE_ARG.search(call.arglist):
            return dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"request-scoped state: handed to {callee}, which {func.qualname} keeps in {target} with the "
                f"caches until the next reset; {site.tier_reason}"))
    return site
