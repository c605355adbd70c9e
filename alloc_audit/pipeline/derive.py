"""Stage 5a, derive: calls to project factories become *derived sites* in
the caller's scope (found by the index), classified like direct sites; a
derived site whose memory is pooled keeps the pool's tier, and one whose
memory its caller exports (`cudaIpcGetMemHandle`) is an IPC slab."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence

from ..catalog import ApiCatalog, CallerGlobs, TierPattern
from ..model import FileFacts, Language, Site, SiteKind, Tier
from .buffer_classes import buffer_class_sites
from .classify import classify_sites
from .host_moves import drop_host_moves
from .host_vias import drop_host_vias
from .index import ProjectIndex
from .kept_returns import RETURNED_KEPT
from .lifetimes import weight_storage
from .move_apis import MOVES
from .native_modules import native_module_state
from .off_device import drop_off_device
from .own_device_moves import drop_own_device_moves
from .untaken import drop_untaken


def derive_sites(index: ProjectIndex, files: Mapping[str, FileFacts], tiers: tuple[TierPattern, ...],
                 direct: Sequence[Site], apis: ApiCatalog | None = None,
                 callers: CallerGlobs | None = None) -> list[Site]:
    uploads = {(s.path, s.span.line): s for s in direct if _upload(s)}
    # workspaces a function returns to callers that keep them (kept_returns) count like uploads: factories' allocations
    counted = frozenset(uploads) | {(s.path, s.span.line) for s in direct if s.via is None and s.tier is Tier.T2
                                    and s.tier_reason.startswith(RETURNED_KEPT)}
    # a call the catalogue counts is one site, also where a project function of
    # the same name resolves it (a `hipMalloc` shim over the real call)
    # (the same span: `Model(...).cuda()` starts where its inner call does)
    catalogued = {(s.path, s.span) for s in direct if s.via is None}
    calls = [s for s in index.derived_sites(uploads=counted) if (s.path, s.span) not in catalogued]
    kept, branches = drop_untaken(drop_host_moves(calls, index), index)
    contexts, engines = (apis.py_device_contexts, apis.py_loader_engines) if apis is not None else (None, None)
    derived = tuple(drop_host_vias(drop_own_device_moves(drop_off_device(kept, index), index), index, contexts,
                                   engines, callers))
    if apis is not None:
        derived = kinds_from_use(derived, index, apis)
    classified = [_with_branch(s, branches) for s in classify_sites(derived, files, tiers)]
    return _upload_tiers(native_module_state(_module_state(
        _owner_tiers(classified, direct, index), direct), index), uploads)


def _with_branch(site: Site, branches: Mapping[tuple[str, int, int], str]) -> Site:
    """Says which branch of the factory the call takes, where ``untaken`` chose it."""
    note = branches.get((site.path, site.span.line, site.span.col))
    return dataclasses.replace(site, tier_reason=f"{site.tier_reason}; {note}") if note else site




def _upload(site: Site) -> bool:
    """A weight upload: a whole-module move or a copy of checkpoint tensors
    to the device (T1, "weight upload: ..."); not a parameter declared
    in a layer, not a load-time temporary or a copy named by a
    ``load*`` function only (every layer that loads its weights would
    make its construction a derived site)."""
    return (site.tier is Tier.T1 and site.via is None and site.api in MOVES
            and site.tier_reason.startswith("weight upload"))


def _upload_tiers(derived: Iterable[Site], uploads: Mapping[tuple[str, int], Site]) -> list[Site]:
    """A derived site whose allocation is a weight upload builds a model and
    moves it to the device: T1, whoever calls it (DESIGN.md, "Lifetime
    tiers": weight upload)."""
    out = []
    for site in derived:
        via = site.via
        under = uploads.get((via.path, via.line)) if via is not None else None
        if via is not None and under is not None and site.tier is not Tier.T1:
            site = dataclasses.replace(site, tier=Tier.T1, via=dataclasses.replace(via, api=under.api), tier_reason=(
                f"builds a model and moves it to the device: via {under.api} at {under.path}:{under.span.line}"))
        out.append(site)
    return out


def _owner_tiers(derived: Iterable[Site], direct: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """A derived site whose memory is pooled (T3: a KV cache or state pool
    constructed anywhere) keeps that tier: the owner decides the lifetime.
    So does one whose pinned host memory the object keeps (T5b: pinned once
    in its constructor and reused), where the call alone would say T5a (per
    call; a load path's staging stays T5a), unless the class is a buffer
    class (buffer_classes.py): the object is the buffer, as short-lived as its
    owner."""
    tiers = {(s.path, s.span.line): s for s in direct}
    buffers = buffer_class_sites(direct)  # the buffer is the object: its owner's lifetime, not T5b
    out = []
    for site in derived:
        under = tiers.get((site.via.path, site.via.line)) if site.via else None
        if under is not None and under.tier is Tier.T3 and site.tier is not Tier.T3:
            site = dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"constructs {site.api}: pooled memory ({under.api} at {under.path}:{under.span.line} is T3)"))
        elif under is not None and keeps_pinned(site, under, index, buffers):
            site = dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                f"constructs {site.api}, which keeps its pinned host memory ({under.api} at "
                f"{under.path}:{under.span.line} is T5b: pinned once, reused); was: {site.tier_reason}"))
        out.append(site)
    return out


def keeps_pinned(site: Site, under: Site, index: ProjectIndex, buffers: Collection[tuple[str, int]]) -> bool:
    """``site`` (T5a, per call) builds an object that keeps ``under`` (T5b)
    for its life: not under a test on a parameter, not one per loop pass,
    not a buffer class (``buffers``: their (path, line))."""
    return under.tier is Tier.T5B and site.tier is Tier.T5A and _per_call(site) \
        and not _caller_decides(under, index) and not _in_loop(site, index) \
        and (under.path, under.span.line) not in buffers and not _freed_by_owner(under, index)


_FREES = frozenset({"free", "release", "deallocate", "dealloc"})
_WORDS = re.compile(r"\w+")


def _freed_by_owner(site: Site, index: ProjectIndex) -> bool:
    """Another method of the class hands the member the pinned buffer is kept
    in to a `free`/`release` call (`_pinned_tensor_mgr->free(_cpu_buffer)`
    when the operation finishes): the object gives it back after each use,
    so each construction is per-use staging, not memory it keeps."""
    func = index.func(site.path, site.scope)
    target = (site.target or "").strip().removeprefix("self.").removeprefix("this->")
    if func is None or func.owner is None or not target.isidentifier():
        return False
    return any(re.split(r"\.|::|->", c.callee)[-1] in _FREES and target in _WORDS.findall(c.arglist)
               for f in index.functions_in(site.path) if f.owner is func.owner and f is not func for c in f.calls)


def _per_call(site: Site) -> bool:
    """T5a only because the call runs per call (not staging of a load path)."""
    return site.tier_reason.startswith("pinned host memory allocated per call")


def _in_loop(site: Site, index: ProjectIndex) -> bool:
    """Built in a loop (`chunks.append(Chunk(x))` per chunk): one object per
    pass, not one kept for the run."""
    func = index.func(site.path, site.scope)
    return func is None or func.in_loop(site.span.line)


def _caller_decides(site: Site, index: ProjectIndex) -> bool:
    """The allocation sits under a test on one of its function's parameters
    (``if tensor_cpu is None:`` in ``__init__``): the caller decides whether
    it pins at all, so the class's tier does not carry over."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None:
        return True
    params = [p for p in func.scope.params if p not in ("self", "cls")]
    tests: dict[object, str] = {}
    for b in func.blocks:
        if b.kind in ("if", "elif") and b.stmt is not None:
            tests[b.stmt] = tests.get(b.stmt, "") + " " + b.test
    for b in func.blocks:
        if b.kind in ("if", "elif", "else") and b.span.contains_line(site.span.line):
            test = tests.get(b.stmt, "") if b.kind == "else" else b.test
            if any(re.search(rf"(?<![\w.]){re.escape(p)}\b", test) for p in params):
                return True
    return False


def _module_state(derived: Iterable[Site], direct: Sequence[Site]) -> list[Site]:
    """A derived site that builds module state is model-resident (T1, the
    judges' convention for registered buffers and parameters): the object
    becomes a module's weight (`linear.weight = FP8Parameter(...)`,
    `linear.weight.data = FP8Tensor(...)`), or the allocation it stands
    for is registered on a module (`RotaryEmbedding(...)`, whose `scale`
    is a `register_buffer`)."""
    state = {(s.path, s.span.line): s for s in direct if s.tier is Tier.T1 and _registered(s)}
    out = []
    for site in derived:
        if site.tier is not Tier.T1 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON:
            under = state.get((site.via.path, site.via.line)) if site.via else None
            if site.target and weight_storage(site.target.strip()):
                site = dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                    f"module state: {site.api} becomes {site.target.strip()} in {site.scope}"))
            elif under is not None:
                site = dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                    f"constructs {site.api}: module state (its {under.api} at {under.path}:{under.span.line} "
                    f"is registered on a module as a parameter or buffer)"))
        out.append(site)
    return out


def _registered(site: Site) -> bool:
    """T1 because it is registered on a module (a buffer, a parameter, or
    handed to a module that registers it), not because of a name."""
    return site.tier_reason.startswith(("model parameter or buffer", "module state"))


def kinds_from_use(derived: tuple[Site, ...], index: ProjectIndex, apis: ApiCatalog) -> tuple[Site, ...]:
    """Kind from use for derived sites, as extraction does for direct ones: a
    factory's device memory whose result the caller passes to an export call
    (`cudaIpcGetMemHandle(self.buf)`) in the same scope is an IPC slab."""
    out = []
    for site in derived:
        if site.kind is SiteKind.DEVICE and site.target:
            func = index.func(site.path, site.scope)
            exports = apis.py_exports if site.language is Language.PYTHON else apis.cpp_exports
            target = site.target.lstrip("*&")
            for call in func.calls if func is not None else ():
                leaf = re.split(r"\.|::|->", call.callee)[-1]
                if leaf in exports and target in re.findall(r"[A-Za-z_][\w.>-]*", call.arglist.replace("&", " ")):
                    site = dataclasses.replace(site, kind=SiteKind.IPC)
                    break
        out.append(site)
    return tuple(out)
