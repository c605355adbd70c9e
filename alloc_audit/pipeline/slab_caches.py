"""Stage 5, once the direct tiers are final: a cache class whose kept buffer
is a slab its methods fill in place is pooled (T3) (issue 11, round 23).

The class patterns (``rules/tiers.toml``) know a KV pool by its name
(``*KVCache*``, ``*CachePool*``); a plain ``WindowedCache`` or ``CudaCache``
is named a cache, not a pool, and its constructor's buffers read as the
constructor's T2. What the class does with the buffer says more: a method
writes a range of it in place (``self.k[:b, start:start + n] = keys``,
``self.data[i:j].copy_(x)``) or an allocating method hands out its entries
(``def alloc(self): return self.data[idx], idx``). Such a member is a slab
the steps fill: what the constructor keeps in it is T3, and so is what a
method of the class stores back into it (``self.k = self.k.to(device)``,
``self.v = torch.zeros(to_bsz, ...)`` to grow it). A derived site whose
``via`` is such a slab and that keeps the object (T2: built in a
constructor or an initialiser) is the slab's allocation: T3.

A class not named a cache keeps a slab too when the code says so (round 23,
tiers-r23e): an attention module's constructor keeps ``self.cache_k =
torch.zeros(...).cuda()``, its forward writes the step's keys at their
positions (``self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk``, a
start plus a length) and reads the member back (``keys =
self.cache_k[:, : start_pos + seqlen]``, or hands it to the attention
kernel). Every request writes the same fixed slab by position: what the
constructor keeps there is T3 -- when the object lives across requests (its
site still T2); one an object built per call keeps (a generation's own
decode state, T4 by then) lives one request and stays T4. And a cache class that keeps its per-layer
slabs in a list (``p = torch.zeros(...)`` then ``self.key_states.append(p)``
or ``self.key_states[i] = p``) keeps them as much as one stored directly:
when another method hands the entries out (``return self.key_states[i]``) or
passes them to a call (a kernel filling them), the stores are the slab, T3.

A construction of such a class (or of one that builds it) that
``weight_modules`` made T1 because its constructors build torch layers is
the slab's allocation too when none of those layers is given a device
(``nn.Linear(d, d)``: the weights are made on the host, moved or loaded by
another site); a layer given ``device=`` keeps it T1.

Round 30 (docs/tiers.md §1): the entries of such a list are the slab too
when any function of the project writes an entry of that member on another
object in place (``new = cache.key_states[i].narrow(2, p, n)`` then
``new.copy_(k)``; ``cache.k[i][:, a:b] = x``; ``index_copy_``) or hands an
entry to a call outside torch (``ext.q4_attn(..., cache.key_states[i])``):
the constructor's per-layer tensors are T3 (``ExLlamaCache``), unless
another class (outside the cache's family) keeps a member of that name, so
the text may name another object's. Entries only read (``stats.means[i] *
2``) are no evidence.

Round 31 (docs/tiers.md §1), one notion for any class, registered or not:
a member the constructor (or a set-up method) keeps (``self.k = ...``, a
per-layer list comprehension, ``self.register_buffer("k_cache", ...)``,
which module_state made T1) is a slab requests fill when a method writes it
in place at positions (a slice that starts elsewhere than 0, an index that is
no literal: ``self.kv_cache[:bsz, start_pos:end_pos] = kv``, ``k_out =
self.k_cache; k_out[:, :, input_pos] = k``, ``self.pages[layer][req].copy_(k)``),
some method reads it back, and either the position comes from the writing
method's parameters (the caller says where a request's tokens go) or a
method resets it in place (``zero_``) between requests: T3, and so is the
moved copy a method stores back into it (``self.key_cache =
self.key_cache.to(x.device)``). False: a CUDA graph's static input written by
a prefix (``self.ids[: n].copy_(ids)``) or whole, a queue placed by a counter
the object keeps and never reset (``self.queue[:, ptr:ptr + n] = k``), a
list whose entries are replaced whole (``self.k[i] = torch.cat(...)``), a
member never read back (``tests/fixtures/python/tiers-request-slabs.py``).
A vector (one length per request, ``torch.zeros(self.batch).int()``) is a
descriptor of the pool, not the pool. A construction (T2) whose allocation
is such a slab and whose constructors also upload weights (a direct weight
upload reached from them: ``LLM()`` calling ``init_parameters``) is a model
load, the weights dominating: T1; with no weight, the slab: T3.

Left alone: a class whose name says no cache and that writes no position
range (the graph runner's static inputs, written by a prefix slice copy every
step, are T2 set-up buffers); a member only read, or written whole (a rope
table computed once); a derived construction made per call (T4); in a class
not named a cache, anything but its constructor's buffers. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ClassInfo, Func, ProjectIndex
from .names import IDENTIFIER, SELF_MEMBER
from .retier import WEIGHT_UPLOAD, Decision, retier
from .slab_requests import (
    DEPTH,
    HANDED,
    MOVED_BACK,
    entries_list,
    planar,
    registered_slab,
    request_slab,
    uploads_weights,
)
from .weight_modules import LAYER, PARAMETER

_CACHE = re.compile(r"Cache(?![a-z])")  # `WindowedCache`, `CudaCache`, `KVCacheLayer`; not `Cached`
_ALLOC = re.compile(r"_?(?:alloc|allocate|get_block|take)\w*")
_WEIGHTS = "whose constructor makes weights"  # weight_modules' reason: its torch layers are the weights
_RANGE = re.compile(r"\b([A-Za-z_]\w*)\s*:\s*\1\s*\+")  # `start_pos : start_pos + seqlen`


def slab_caches(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, str], str] = {}

    def filled(owner: ClassInfo, member: str) -> str:
        """How a method of ``owner`` fills ``self.member`` in place ("" when none does)."""
        key = (owner.key, member)
        if key not in memo:
            memo[key] = _filled(owner, member)
        return memo[key]

    def direct(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is None
                and (site.tier in (Tier.T2, Tier.T4)
                     or site.tier is Tier.T1 and site.tier_reason.startswith((HANDED, MOVED_BACK))))

    requests: dict[tuple[str, str, bool], str] = {}

    def per_request(owner: ClassInfo, member: str, entries: bool) -> str:
        key = (owner.key, member, entries)
        if key not in requests:
            requests[key] = request_slab(owner, member, entries)
        return requests[key]

    written: dict[tuple[str, str], str] = {}

    def outside(owner: ClassInfo, member: str) -> str:
        key = (owner.key, member)
        if key not in written:
            written[key] = _written_outside(owner, member, index)
        return written[key]

    def decide(site: Site) -> Decision | None:
        if site.tier is Tier.T1:
            return registered_slab(site, index, per_request)
        found = _member(site, index)
        if found is None:
            return None
        owner, member, role, named, listed = found
        if role == "constructor" and not listed and site.tier is Tier.T2 and planar(site, index):
            how = per_request(owner, member, entries_list(site, index))
            if how:
                return Tier.T3, (f"pooled: {owner.name} keeps a slab in self.{member} (kept by {site.scope}): {how}; "
                                 f"was: {site.tier_reason}")
        if named:
            how = filled(owner, member) or (_handed(owner, member, site.scope, index) if listed else "")
            if not how and listed and role == "constructor" and site.tier is Tier.T2:
                how = outside(owner, member)
        else:
            # a kept member of a long-lived object (T2); a buffer of an object built per call (T4 by then:
            # a generation's own decode state) lives one request and is no slab requests share
            how = _positional(owner, member) if role == "constructor" and not listed and site.tier is Tier.T2 else ""
        if not how or (role != "constructor" and site.tier is not Tier.T4):
            return None
        made = ("kept" if role == "constructor" else "stored back") if not listed else "stored into its list"
        return Tier.T3, (f"pooled: {owner.name} keeps a slab in self.{member} ({made} by {site.scope}): {how}; "
                         f"was: {site.tier_reason}")

    sites = retier(sites, direct, decide)
    slabs = {(s.path, s.span.line, s.api): s for s in sites
             if s.via is None and s.tier is Tier.T3 and s.tier_reason.startswith("pooled: ") and " keeps a slab " in
             s.tier_reason}
    if not slabs:
        return sites

    def derived(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is not None
                and (site.tier is Tier.T2 or site.tier is Tier.T1 and _WEIGHTS in site.tier_reason))

    uploads = {(s.path, s.span.line, s.span.col) for s in sites if s.via is None and s.tier is Tier.T1
               and s.tier_reason.startswith(WEIGHT_UPLOAD)}

    def decide_derived(site: Site) -> Decision | None:
        via = site.via
        under = slabs.get((via.path, via.line, via.api)) if via is not None else None
        if under is None or (site.tier is Tier.T1 and not _host_weights(site, index)):
            return None
        if uploads and site.tier is Tier.T2:
            weights = uploads_weights(site, index, uploads)
            if weights:  # a model load: its weights dominate the slab (round 31)
                return Tier.T1, (f"weights: constructs {site.api}, which uploads weights ({weights}) besides its "
                                 f"slab ({under.path}:{under.span.line}); was: {site.tier_reason}")
        slab = under.tier_reason.split("; was: ")[0].removeprefix("pooled: ")
        host = "; the torch layers it builds are given no device, so its weights are made on the host" \
            if site.tier is Tier.T1 else ""
        return Tier.T3, (f"pooled: constructs {site.api}, whose allocation is a slab ({under.path}:{under.span.line}: "
                         f"{slab}){host}; was: {site.tier_reason}")

    return retier(sites, derived, decide_derived)


def _host_weights(site: Site, index: ProjectIndex) -> bool:
    """The torch layers the construction's constructors make (``nn.Linear(a, b)``) are all given no
    device: its weights are made on the host, so the slab is what building it allocates on the device."""
    found = index.site_call(site)
    if found is None:
        return False
    func, call = found
    seen: set[str] = set()

    def device_layers(f: Func, depth: int) -> bool:
        if f.id in seen:
            return False
        seen.add(f.id)
        for c in f.calls:
            if LAYER.fullmatch(c.callee) or PARAMETER.fullmatch(c.callee):
                if "device" in c.arglist or ".cuda" in c.arglist or ".to(" in c.arglist:
                    return True
                continue
            if depth < DEPTH and any(g.owner is not None and (g.owner is f.owner or g.name == "__init__")
                                      and device_layers(g, depth + 1) for g in index.resolve(f, c)):
                return True
        return False

    ctors = [g for g in index.resolve(func, call) if g.name == "__init__"]
    return bool(ctors) and not any(device_layers(g, 0) for g in ctors)


def _member(site: Site, index: ProjectIndex) -> tuple[ClassInfo, str, str, bool, bool] | None:
    """The class, the member the site is kept in, the role of its function,
    whether the class is named a cache and whether the site is kept as an
    entry of the member (a local appended to it or stored at an index)."""
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None or func.scope is None:
        return None
    named = bool(_CACHE.search(func.owner.name))
    target = (site.target or "").strip()
    found = SELF_MEMBER.fullmatch(target)
    if found is not None:
        return func.owner, found.group(1), func.scope.role, named, False
    if not named or not IDENTIFIER.fullmatch(target):
        return None
    for c in func.calls:
        if c.callee.startswith("self.") and c.callee.endswith(".append") and c.arglist.strip() == target:
            member = c.callee[5:-7]
            if IDENTIFIER.fullmatch(member):
                return func.owner, member, func.scope.role, named, True
    for a in func.assigns:
        if a.op == "=" and a.value.strip() == target:
            for t in a.targets:
                head = t.strip().split("[", 1)[0]
                if "[" in t and head.startswith("self.") and IDENTIFIER.fullmatch(head[5:]):
                    return func.owner, head[5:], func.scope.role, named, True
    return None


def _handed(owner: ClassInfo, member: str, scope: str, index: ProjectIndex) -> str:
    """How another method of ``owner`` or of a class derived from it hands out
    the entries of ``self.member`` or passes them to a kernel ("" when none does).
    A torch function or a builtin given an entry reads it (``torch.roll``,
    ``str(x.device)``): no evidence."""
    entry = f"self.{member}["
    item = re.compile(rf"self\.{member}\[[^\[\]]*\]")  # `self.keys[i]`, handed out whole
    family = [owner] + [c for n in index.subclass_names(owner.name) for c in index.classes_named(n)]
    for cls in family:
        for name, methods in sorted(cls.methods.items()):
            for method in methods:
                if method.scope is None or method.scope.role == "constructor" or method.qualname == scope:
                    continue
                for r in method.returns:
                    if any(item.fullmatch(v.strip()) for v in r.value.strip("()").split(",")):
                        return f"{cls.name}.{name} hands out its entries (line {r.line})"
                for c in method.calls:
                    if "." in c.callee and not c.callee.startswith(("self.", "torch.")) and any(
                            a.strip().startswith(entry) for a in c.arglist.split(",")):
                        return f"{cls.name}.{name} passes its entries to {c.callee} (line {c.span.line})"
    return ""


_INPLACE = ("copy_", "index_copy_", "index_put_", "scatter_", "masked_scatter_")


def _written_outside(owner: ClassInfo, member: str, index: ProjectIndex) -> str:
    """Where a function writes the entries of ``member`` of another object in
    place ("" when none does, or when a class outside ``owner``'s family keeps
    a member of that name too, so the text may mean another object): a view
    of an entry bound to a local that is then filled (``k =
    cache.key_states[i].narrow(2, p, n)`` ... ``k.copy_(keys)``), an entry
    filled or assigned a range directly (``cache.k[i][:, a:b] = x``), or an
    entry handed to a call outside torch (a kernel writing it:
    ``ext.attn(q, cache.key_states[i], ...)``). Round 30, docs/tiers.md §1."""
    entry = re.compile(rf"(?<![\w.])(?!self\.)[A-Za-z_][\w.]*\.{re.escape(member)}\[")
    kept = re.compile(rf"^self\.{re.escape(member)}\b")
    family = {owner.key} | {c.key for n in index.subclass_names(owner.name) for c in index.classes_named(n)}
    found = ""
    for func in index.functions():
        if func.language is not Language.PYTHON:
            continue
        if func.owner is not None and func.owner.key not in family and any(
                kept.match(t.strip()) for a in func.assigns for t in a.targets):
            return ""  # another class keeps a member of that name
        if found:
            continue
        views: set[str] = set()
        for c in func.calls:
            if entry.match(c.callee):
                if c.target and IDENTIFIER.fullmatch(c.target):
                    views.add(c.target)
                if c.callee.endswith(_INPLACE):
                    found = f"{func.qualname} fills an entry in place (line {c.span.line})"
                    break
            elif "." in c.callee and not c.callee.startswith(("self.", "torch.")) and any(
                    entry.match(a.strip()) and a.strip().endswith("]") for a in c.arglist.split(",")):
                found = f"{func.qualname} passes an entry to {c.callee} (line {c.span.line})"
                break
        if found:
            continue
        for c in func.calls:
            head, _, method = c.callee.rpartition(".")
            if head in views and method in _INPLACE:
                found = f"{func.qualname} fills a view of an entry in place (line {c.span.line})"
                break
        for a in func.assigns:
            if not found and a.op != "del" and any(entry.match(t.strip()) and ":" in t for t in a.targets):
                found = f"{func.qualname} writes a range of an entry (line {a.line})"
    return found


def _positional(owner: ClassInfo, member: str) -> str:
    """How a method of ``owner`` writes ``self.member`` by position range and reads it back ("" when none does)."""
    entry = f"self.{member}["
    wrote = read = ""
    for name, methods in sorted(owner.methods.items()):
        for method in methods:
            if method.scope is None or method.scope.role == "constructor":
                continue
            for a in method.assigns:
                if a.op == "del":
                    continue
                if not wrote and any(t.strip().startswith(entry) and _RANGE.search(t) for t in a.targets):
                    wrote = f"{name} writes positions of it in place (line {a.line})"
                if not read and entry in a.value:
                    read = f"{name} reads it back (line {a.line})"
            if not read:
                for r in method.returns:
                    if re.search(rf"\bself\.{member}\b(?!\s*\.)", r.value):
                        read = f"{name} returns it (line {r.line})"
                        break
            if not read:
                for c in method.calls:
                    if any(x.strip() == f"self.{member}" or x.strip().startswith(entry)
                           for x in c.arglist.split(",")):
                        read = f"{name} hands it to {c.callee} (line {c.span.line})"
                        break
    return f"{wrote} and {read}" if wrote and read else ""


def _filled(owner: ClassInfo, member: str) -> str:
    entry = f"self.{member}["
    for name, methods in sorted(owner.methods.items()):
        for method in methods:
            if method.scope is None or method.scope.role == "constructor":
                continue
            for a in method.assigns:
                if a.op != "del" and any(t.strip().startswith(entry) and ":" in t for t in a.targets):
                    return f"{name} writes a range of it in place (line {a.line})"
            for c in method.calls:
                if c.callee.startswith(entry) and c.callee.endswith("].copy_"):
                    return f"{name} copies into a range of it (line {c.span.line})"
            if _ALLOC.fullmatch(name) and any(r.value.strip().startswith(entry) for r in method.returns):
                return f"{name} hands out its entries"
    return ""
