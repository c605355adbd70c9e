"""Stage 5, classify (after the callers): weights read from a checkpoint.

Input: classified sites, the project index and the caller globs of
``rules/tiers.toml`` ``[callers]`` (``checkpoint-read``, ``per-step``).
Output: the same sites, the checkpoint uploads re-tiered T1 with a reason
naming the read.

A device copy (``Tensor.to``/``Tensor.cuda``) of a tensor read out of a
checkpoint (``f.get_slice(name)``, ``f.get_tensor(name)``, ``torch.load``,
directly or through loaders that return what they read, up to
``_CHECKPOINT_DEPTH`` calls down), that the function returns or keeps on
its object, uploads a weight: T1 (DESIGN.md, "Lifetime tiers": weight
upload), whatever the function is called (``Weights.get_packed_sharded``)
and whoever calls it. The read must flow into the copied value through the
function's locals (assignments and calls that use them): a function that
loads an embedding file and also uploads an input is not a loader. A copy
handed to another call may be load-time scratch (a scale a requantisation
consumes) and a function a per-step function calls (within 2 calls)
streams per step: both unchanged. A copy in the ``map_location`` lambda
of ``torch.load`` is a load path too: T1.

Round 30 (docs/tiers.md §2, "a constructor that reads a checkpoint and
uploads what it read makes weights"): a constructor's copy (T2 until here)
counts as well, kept on the object, returned, or stored into an entry of a
local container the constructor builds its layers from (``tensors[key] =
t.to(dev)``; ``ExLlama(config)``); and the device temporaries that such a
constructor drops (a rope table's ``torch.arange`` operand, a local it does
not keep) are the load path's temporaries: T1. A constructor that reads a
file and uploads something the read does not flow into (an input, a
workspace) keeps its tiers.

Round 33: a checkpoint read that itself places what it reads on a device
(``torch.load(f, map_location=dev)``, ``load_file(f, device="cuda")``: the
catalogue's ``loader`` entries) is the upload: T1 where the function
returns it, keeps it on its object or in a container entry, or hands it
(directly or through its locals) to a module's ``load_state_dict``; a
batch file a per-step function reads onto the device and uses stays T4.

Round 35 (docs/tiers.md §2, "weights are T1 whoever loads them"): a
set-up copy (T2: module level, a run-once function, a constructor) of what
a read gives whole (``f.get_tensor(k).to(dev)``, ``torch.load(p).cuda()``,
``w = f.get_tensor(k)`` ... ``w.to(dev)``, ``sd["w"].cuda()``) uploads a
checkpoint tensor wherever it goes (kept in a module-level name, handed to
a wrapper): T1. A value computed from the read (``model(x).cuda()``) is not
what was read. And a read onto the device handed (through locals) to
accelerate's ``set_module_tensor_to_device`` is set into a module: T1, as
one handed to ``load_state_dict``.

Round 35 (the same convention): a per-call function's copy (T4) stored
into an entry of a container (``sd[key] = f.get_tensor(key).to(dev)``, the
state dict an offline merge or a loader builds) counts as one it returns,
as a constructor's did since round 30; a per-step caller still keeps it
T4. A function's reads are told once per callee, so three ``load_file``
calls leave room (of ``_reads``' four) for its other readers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Call, Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .retier import WEIGHT_UPLOAD

_CHECKPOINT_DEPTH = 3  # calls down from a function to a checkpoint read
_STEP_DEPTH = 2  # calls up to a per-step function that makes it a per-step stream
_COPIES = frozenset({"Tensor.to", "Tensor.cuda"})
_FUNCTION_ROLES = frozenset({"function", "method", "constructor"})


@dataclass
class _Ctx:
    index: ProjectIndex
    checkpoint: Callable[[str], bool]
    per_step: Callable[[str], bool] | None
    reads: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)


def checkpoint_uploads(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    sites = [_map_location(site, index) if _mapped(site) else site for site in sites]
    if not globs.checkpoint:
        return sites
    ctx = _Ctx(index, matcher(globs.checkpoint), matcher(globs.per_step) if globs.per_step else None)
    out = []
    loaders: dict[tuple[str, str], Site] = {}  # constructors whose upload of a checkpoint read this pass told
    for site in sites:
        found = _checkpoint_upload(site, ctx) if _candidate(site) else \
            _placed_read(site, ctx) if _placing(site, ctx) else site
        if found is site and _set_up_copy(site):
            found = _direct_upload(site, ctx)
        if found is not site and _constructor(found, index):
            loaders.setdefault((found.path, found.scope), found)
        out.append(found)
    sites = out
    if not loaders:
        return sites
    return [_load_temporary(site, loaders[(site.path, site.scope)]) if (site.path, site.scope) in loaders
            and _temporary(site) else site for site in sites]


_ENTRY = re.compile(r"[A-Za-z_][\w.]*\[[^\]]*\]")  # `tensors[key]`, `target.lora_a[self]`: a container's entry


def _candidate(site: Site) -> bool:
    if not (site.api in _COPIES and site.kind is SiteKind.DEVICE and site.via is None
            and site.language is Language.PYTHON):
        return False
    kept = site.kept
    if site.tier not in (Tier.T2, Tier.T4):
        return False
    return kept == "return" or kept.startswith("self.") or bool(_ENTRY.fullmatch(kept))


def _placing(site: Site, ctx: _Ctx) -> bool:
    """A checkpoint read that puts what it reads on a device (``torch.load(f,
    map_location=dev)``, ``load_file(f, device="cuda")``: the catalogue's
    ``loader`` entries), not yet told load-time."""
    return (site.kind is SiteKind.DEVICE and site.via is None and site.language is Language.PYTHON
            and site.tier in (Tier.T2, Tier.T4) and ctx.checkpoint(site.api))


# hands a state (or a tensor: accelerate's `set_module_tensor_to_device`) to a module
_LOADS = re.compile(r"(?:^|\.)(?:load_state_dict|load_model|set_model_state_dict|set_module_tensor_to_device)$")


def _placed_read(site: Site, ctx: _Ctx) -> Site:
    """A read onto the device that the function returns or yields (also
    through its locals: ``state = torch.load(...)``, ``yield from
    state.items()``), keeps on its object or in an entry of a container, or
    hands to a module's ``load_state_dict``, loads weights: T1 (docs/tiers.md §2),
    unless a per-step function calls it (a batch file read per step stays
    T4). One read into a local and used otherwise keeps its tier."""
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES or _per_step(func, ctx):
        return site
    kept = site.kept
    line = site.span.line
    read = next((c for c in func.calls if c.span.line == line and ctx.checkpoint(c.callee)), None)
    handed = {r.line for r in func.returns} | set(func.scope.yields)
    if kept.startswith("self.") or _ENTRY.fullmatch(kept):
        how = f"keeps it in {kept}"
    elif site.stmt_line in handed and read is not None and not read.target:
        how = "returns it"  # `return load_file(path, device="cuda")`
    elif any(_LOADS.search(c.callee) and c.span.contains(site.span) for c in func.calls) or (
            read is not None and _flows(func, read.callee, lambda c: bool(_LOADS.search(c.callee))
                                        and c.span.line >= line, ())):
        taker = next((c.callee for c in func.calls if _LOADS.search(c.callee) and c.span.line >= line), "")
        how = f"hands it to {taker.rsplit('.', 1)[-1] or 'load_state_dict'}"
    elif read is not None and _handed_whole(func, read, handed, ctx.index):
        how = "returns or yields what it read"
    else:
        return site
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"{WEIGHT_UPLOAD}{func.qualname} reads a checkpoint onto the device ({site.api}) and {how}; "
        f"was: {site.tier_reason}"))


_WHOLE = re.compile(r"([A-Za-z_]\w*)(?:\[[^\]]*\])*")  # `state`, `state["model"]`: the value itself, or an entry


def _handed_whole(func: Func, read: Call, lines: set[int], index: ProjectIndex) -> bool:
    """Whether what ``read`` gave (its target, or a name bound to it or to an
    entry of it) is returned whole (``return state``), read by a method of
    its own on one of ``lines`` (``yield from state.items()``), or handed
    whole there to a function of the same file that is no forward
    (``return cls.from_tensors(tensors)``). A value computed from it
    (``return bool((a == b).all())``, ``return model(batch)``) is not what
    was read."""
    names = {read.target} if read.target else set()
    for a in func.assigns:
        whole = _WHOLE.fullmatch(a.value.strip())
        if whole is not None and whole.group(1) in names:
            names.update(a.targets)
    if not names:
        return False
    if any(r.value.strip() in names for r in func.returns):
        return True
    for call in func.calls:
        receiver = _WHOLE.fullmatch(call.callee.rsplit(".", 1)[0]) if "." in call.callee else None
        if call.span.line in lines and receiver is not None and receiver.group(1) in names:
            return True  # `yield from state.items()`, `return sd["w"].to(d)`
    return any(call.span.line in lines and any(a.text.strip() in names for a in split_args(call.arglist))
               and all(t.path == func.path and t.name not in ("forward", "__call__") for t in targets)
               for call, targets in index.callees(func))


def _set_up_copy(site: Site) -> bool:
    return (site.tier is Tier.T2 and site.api in _COPIES and site.kind is SiteKind.DEVICE and site.via is None
            and site.language is Language.PYTHON)


def _direct_upload(site: Site, ctx: _Ctx) -> Site:
    """A set-up copy (T2) of what a checkpoint read gives whole: the read
    itself (``f.get_tensor(k).to(dev)``, the copy's expression starts with
    it) or a name bound to it or to an entry of it (``w = f.get_tensor(k)``
    ... ``w.to(dev)``): T1 wherever it goes, unless a per-step function
    calls the function."""
    func = ctx.index.func(site.path, site.scope)
    if func is None or (func.scope is not None and func.scope.role not in _FUNCTION_ROLES):
        return site
    checkpoint = ctx.checkpoint
    reads = [c for c in func.calls if checkpoint(c.callee)]
    if not reads:
        return site
    span = site.span
    read = next((c.callee for c in reads if c.span.line == span.line and c.span.col == span.col
                 and c.span != span), "")
    if not read:
        found = ctx.index.site_call(site)
        receiver = _WHOLE.fullmatch(found[1].callee.rsplit(".", 1)[0]) if found is not None else None
        if receiver is None:
            return site
        read = _bound_whole(func, reads).get(receiver.group(1), "")
    if not read or (func.scope is not None and _per_step(func, ctx)):
        return site
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"{WEIGHT_UPLOAD}{func.qualname} uploads what a checkpoint read ({read}) gives; was: {site.tier_reason}"))


def _bound_whole(func: Func, reads: list[Call]) -> dict[str, str]:
    """The names ``func`` binds to what a read gives whole (its target, or a
    name bound to it or to an entry of it), each with the read's callee."""
    names = {c.target.strip(): c.callee for c in reads if c.target and c.target.strip().isidentifier()}
    if not names:
        return names
    other: set[str] = set()  # names also bound to something else (`x = model(x)`): not told
    for a in func.assigns:
        whole = _WHOLE.fullmatch(a.value.strip())
        if whole is not None and whole.group(1) in names and a.op == "=":
            names.update((t, names[whole.group(1)]) for t in a.targets if t.isidentifier())
        else:
            other.update(a.targets)
    read_calls = {id(c) for c in reads}
    other.update((c.target or "").strip() for c in func.calls if id(c) not in read_calls)
    return {n: how for n, how in names.items() if n not in other}


def _constructor(site: Site, index: ProjectIndex) -> bool:
    func = index.func(site.path, site.scope)
    return func is not None and func.scope is not None and func.scope.role == "constructor"


def _temporary(site: Site) -> bool:
    """A direct Python device site the function does not keep: a local it drops or an operand."""
    return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is None
            and site.tier in (Tier.T2, Tier.T4) and site.kept in ("", "local"))


def _load_temporary(site: Site, upload: Site) -> Site:
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"load-path temporary: {site.scope} reads a checkpoint and uploads weights ({upload.api} at line "
        f"{upload.span.line}); what it drops is load-time; was: {site.tier_reason}"))


def _mapped(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.api in _COPIES and site.kind is SiteKind.DEVICE and site.via is None
            and site.language is Language.PYTHON and site.scope.rsplit(".", 1)[-1] == "<lambda>")


def _map_location(site: Site, index: ProjectIndex) -> Site:
    """A device copy in a lambda handed to ``torch.load`` as its
    ``map_location`` (``torch.load(path, map_location=lambda s, l:
    s.cuda(dev))``) moves the checkpoint's storages to the device as they are
    read: a load path, T1."""
    outer = site.scope.rsplit(".", 1)[0] if "." in site.scope else "<module>"
    func = index.func(site.path, outer)
    if func is None:
        return site
    for call in func.calls:
        if (call.callee == "torch.load" and "map_location" in call.arglist and call.span.contains(site.span)):
            return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                f"checkpoint load: the map_location of torch.load in {outer} moves the checkpoint's storages to "
                f"the device as they are read (a load path); was: {site.tier_reason}"))
    return site


def _per_step(func: Func, ctx: _Ctx) -> bool:
    per_step = ctx.per_step
    if per_step is None:
        return False
    if per_step(func.name):
        return True
    dist = ctx.index.callers_within([func], _STEP_DEPTH)
    return any(d > 0 and fid in ctx.index.funcs and per_step(ctx.index.funcs[fid].name) for fid, d in dist.items())


def _checkpoint_upload(site: Site, ctx: _Ctx) -> Site:
    """A device copy of a tensor read from a checkpoint that the function
    returns or keeps on its object (``tensor = slice_[a:b]`` ...
    ``tensor.to(self.device)``; ``return torch.cat(shards).to(dev)``)
    uploads a weight: T1, unless a per-step function calls it (a weight
    streamed per step). One handed to another call may be load-time scratch
    (a scale a requantisation consumes): unchanged."""
    kept = site.kept
    func = ctx.index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in _FUNCTION_ROLES:
        return site
    reads = _reads(func, ctx, _CHECKPOINT_DEPTH, False)
    if not reads or _per_step(func, ctx):
        return site
    line = site.span.line
    read = next((r for r, callee in reads if _flows(func, callee, lambda c: c.span.line == line, ())), "")
    if not read:
        return site
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"{WEIGHT_UPLOAD}{func.qualname} reads checkpoint tensors ({read}) and uploads what it "
        f"{'returns' if kept == 'return' else 'keeps in ' + kept}; {site.tier_reason}"))


def _reads(func: Func, ctx: _Ctx, depth: int, returned: bool) -> list[tuple[str, str]]:
    """The checkpoint reads of ``func`` (how, and the callee text of the call
    in ``func``), directly or through loaders ``depth`` calls down that
    return what they read; with ``returned``, only reads whose value
    ``func`` returns."""
    key = f"{func.id}#{depth}#{returned}"
    found = ctx.reads.get(key)
    if found is not None:
        return found
    ctx.reads[key] = []  # cycle guard
    checkpoint = ctx.checkpoint
    out = [(c.callee, c.callee) for c in func.calls if checkpoint(c.callee)]
    if depth > 1:
        for call, targets in ctx.index.callees(func):
            inner = next((t for t in targets if _reads(t, ctx, depth - 1, True)), None)
            if inner is not None:
                out.append((f"{call.callee} -> {inner.qualname}", call.callee))
    if returned:
        lines = {r.line for r in func.returns}
        values = tuple(r.value for r in func.returns)
        out = [r for r in out if _flows(func, r[1], lambda c: c.span.line in lines, values)]
    # one per callee (`_flows` follows a callee's every call): three `load_file`s leave room for the others
    firsts: dict[str, tuple[str, str]] = {}
    for read in out:
        firsts.setdefault(read[1], read)
    ctx.reads[key] = list(firsts.values())[:4]
    return ctx.reads[key]


def _flows(func: Func, callee: str, at: Callable[[Call], bool], values: tuple[str, ...]) -> bool:
    """Whether what calls to ``callee`` give flows (through the function's
    locals: assignments and calls that use them) into a call ``at`` selects
    (the site's line, a return's line) or one of the texts ``values``."""
    calls = func.calls
    tainted = {c.target for c in calls if c.callee == callee and c.target}
    tainted.update(t for a in func.assigns if callee in a.value for t in a.targets)
    for _ in range(4):
        grown = set(tainted)
        for a in func.assigns:
            if _mentions(a.value, tainted):
                grown.update(a.targets)
        for c in calls:
            if c.target and (_mentions(c.arglist, tainted) or _mentions(c.callee, tainted)):
                grown.add(c.target)
        if grown == tainted:
            break
        tainted = grown
    if any(at(c) and (c.callee == callee or _mentions(c.arglist, tainted) or _mentions(c.callee, tainted))
           for c in calls):
        return True
    return any(_mentions(v, tainted) for v in values)


def _mentions(text: str, names: set[str]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(n)}\b", text) for n in names)


class CheckpointReader:
    """Which functions read checkpoint tensors, for passes that ask it of a
    function rather than of a copy site (``weight_modules``: a module that
    keeps what a loader reads). Memoised per function."""

    def __init__(self, index: ProjectIndex, globs: CallerGlobs) -> None:
        self._ctx = _Ctx(index, matcher(globs.checkpoint), None) if globs.checkpoint else None

    def call(self, callee: str) -> bool:
        """The call itself reads a checkpoint tensor (``weights.get_tensor(name)``)."""
        return self._ctx is not None and self._ctx.checkpoint(callee)

    def returned(self, func: Func) -> str:
        """The first read (how) whose value ``func`` returns, directly or
        through loaders that return what they read, or ""."""
        if self._ctx is None:
            return ""
        found = _reads(func, self._ctx, _CHECKPOINT_DEPTH, True)
        return found[0][0] if found else ""

    def handed(self, func: Func, call: Call) -> str:
        """The first checkpoint read of ``func`` (itself or through loaders
        that return what they read) whose value flows through its locals into
        the arguments of ``call`` (``w = stc.get_tensor(k)`` ...
        ``Inner(w, b)``), or ""."""
        if self._ctx is None:
            return ""
        span = call.span
        return next((how for how, callee in _reads(func, self._ctx, _CHECKPOINT_DEPTH, False)
                     if callee != call.callee and _flows(func, callee, lambda c: c.span == span, ())), "")
