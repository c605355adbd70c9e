"""Stage 5, classify (after ``native_lazy``, C++): buffers made into a local
and kept outside the call by a holder, a process-lifetime container or a
method's guard clause (issue 11, round 31).

Input: classified sites and the project index. Output: the same sites, the
per-call (T4, pinned T5a) native sites so kept re-tiered, and the derived
sites that call a function keeping its buffer per key re-tiered T2.

Three shapes of storage kept outside the call (``native_lazy`` reads the
allocation's own target; these read where a local goes next).

- A holder the function is handed: the buffer is made into a local that the
  function then stores in a member of what a reference or pointer parameter
  refers to (``weight.extra.push_back((void *)p)``, ``w->extra[0] = p``,
  ``ctx.ws = p``), both under an ``if`` whose test says that member is
  missing (``w.extra.size() == 0``, ``w.extra[0] == nullptr``, ``ctx.ws ==
  nullptr``): made once per holder and kept on it. When the guarded fill
  copies in data the caller hands over (a ``cudaMemcpy`` from what a
  parameter refers to, or from a host array the branch fills from one) the
  kept buffer is a prepared copy of it, a weight cache (DESIGN names weight
  caches in T1): T1, and a device temporary the same fill makes and frees
  (the float copy a bias is converted from) is a load temporary, T1
  (docs/tiers.md section 2). A workspace (nothing copied in) lives as the
  holder: T2, T5b pinned. True: ``if (w.extra.size() == 0) { cudaMalloc(&b,
  n); cudaMemcpy(b, bias.data, ...); w.extra.push_back(b); }`` -> T1.
  False: the same without the test, a test on an argument alone, a local
  container, or a free of the buffer later in the call: per call.
- A process-lifetime container: the buffer is made into a local (or a member
  of a local struct) that the function stores in a file-scope variable, one
  of a namespace, or a function-local static (``g_ws.emplace(dev, holder)``,
  ``g_ph[dev] = ptr``), where a test of the function looks the key up there
  and surrounds the store or returns before the allocation when the key is
  there: made once per key, T2 (T5b pinned); a call of such a function
  (a derived site) sets it up, T2. False: the store without the lookup,
  or a free of the buffer later in the call.
- A method's guard clause: the method stores into a member after an ``if``
  that returns when the object's state is already there (``if
  (!devices.empty()) return;``, ``if (n <= cap && buf != nullptr)
  return;``), where the method makes that state itself (stores into or adds
  to the tested member, records the capacity): once per object or grown,
  kept: T2, T5b pinned. False: a guard on state the method does not make
  (it runs each call while that state is missing), a free of the member
  after the allocation, a constructor, a class built per call.

DESIGN.md ("Lifetime tiers"): kept on a long-lived holder or for the
process -> persistent; weight caches -> T1. Every proof is inside one
function, or a positive proof about a callee (``_sets_up_kept``). Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..arglists import split_top_level
from ..model import Block, Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .native_lazy import (
    SIZE_CALL,
    below,
    constructed_per_call,
    declared,
    derived_candidate,
    file_scope,
    freed_after,
    kept,
    missing,
    outside_candidate,
    short,
)
from .native_pinned import member_root


def native_kept(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    built_per_call = {owner.key for s in sites if (owner := constructed_per_call(s, index)) is not None}
    fills: dict[str, list[Block]] = {}  # function id -> the guarded fills of a kept copy (T1)
    kept_per_key: dict[str, str] = {}  # "path::scope" of a function keeping a buffer per key -> how
    out = []
    for site in sites:
        if _guarded_candidate(site):
            site = _after_guard(site, index, built_per_call)
        if outside_candidate(site):
            site = _lazy_holder(site, index, fills)
        if outside_candidate(site):
            site = _keyed_static(site, index)
            if site.tier_reason.startswith("kept per key: "):
                kept_per_key.setdefault(f"{site.path}::{site.scope}", site.tier_reason.split(",", 1)[0])
        out.append(site)
    if fills:
        out = [_fill_temporary(s, index, fills) if outside_candidate(s) else s for s in out]
    if kept_per_key:
        out = [_sets_up_kept(s, index, kept_per_key) if derived_candidate(s) else s for s in out]
    return out


# a store of a local into what a parameter refers to: `w.extra.push_back((void *)p)`, `w->extra[0] = p`, `ctx.ws = p`
_HOLDER_MEMBER = re.compile(r"\s*([A-Za-z_]\w*)\s*(\.|->)\s*([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*")
_ADD_METHODS = ("push_back", "emplace_back", "push_front", "emplace_front", "insert", "emplace")
_CAST = re.compile(r"^\s*(?:\(\s*[\w:<>\s]+\**\s*\)|(?:static|reinterpret)_cast\s*<[^<>]*>)\s*")
_COPIES = re.compile(r"(?:cuda|hip)Memcpy\w*|cuMemcpy\w*")


def _bare(text: str) -> str:
    """``text`` without a leading C cast or ``static_cast<T>`` and its parentheses."""
    text = _CAST.sub("", text.strip()).strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    return text


def holder_store(func: Func, local: str, line: int) -> tuple[str, str, int] | None:
    """(parameter, member expression, line) of the first store after ``line``
    of the local ``local`` into a member of what a parameter of ``func``
    refers to: an assignment (``w.extra[0] = (void *)p``, ``ctx->ws = p``)
    or an add to a container member (``w.extra.push_back((void *)p)``)."""
    params = func.scope.params if func.scope is not None else ()
    found: list[tuple[int, str, str]] = []
    for a in func.assigns:
        if a.line >= line and a.op == "=" and a.type is None and len(a.targets) == 1 and _bare(a.value) == local:
            m = _HOLDER_MEMBER.fullmatch(a.targets[0])
            if m is not None and m.group(1) in params:
                found.append((a.line, m.group(1), f"{m.group(1)}{m.group(2)}{m.group(3)}"))
    for call in func.calls:
        head, _, method = call.callee.rpartition(".")
        if not head or method not in _ADD_METHODS or call.span.line < line or _bare(call.arglist) != local:
            continue
        m = _HOLDER_MEMBER.fullmatch(head.replace(" ", ""))
        if m is not None and m.group(1) in params:
            found.append((call.span.line, m.group(1), f"{m.group(1)}{m.group(2)}{m.group(3)}"))
    if not found:
        return None
    at, root, member = min(found)
    return root, member, at


def _lazy_holder(site: Site, index: ProjectIndex, fills: dict[str, list[Block]]) -> Site:
    """Round 31: a buffer made into a local that the function then stores in
    a member of what its parameter refers to (``w.extra.push_back((void
    *)p)``), both under an ``if`` whose test says that member is missing
    (``w.extra.size() == 0``, ``w->extra[0] == nullptr``, ``ctx.ws ==
    nullptr``): made once per holder and kept on it. When the fill copies
    data the caller hands in (a ``cudaMemcpy`` from what a parameter
    refers to) the kept buffer is a prepared copy of it, a weight cache:
    T1; otherwise a workspace as long-lived as the holder: T2 (T5b pinned).
    A free of the local or the member later in the function leaves it."""
    func = index.func(site.path, site.scope)
    local = (site.target or "").strip().lstrip("&*").strip()
    if func is None or func.scope is None or not local.isidentifier() or local not in declared(func):
        return site
    line = site.stmt_line or site.span.line
    store = holder_store(func, local, line)
    if store is None:
        return site
    root, member, at = store
    if any(s.kind is SiteKind.RELEASE and s.span.line > line
           and (s.target or "").strip() in (local, member, member.replace("->", ".")) for s in func.sites):
        return site
    guard = next((b for b in func.blocks if b.kind in ("if", "elif") and b.test and b.span.contains_line(line)
                  and b.span.contains_line(at) and (missing(b.test, member) or below(b.test, member))), None)
    if guard is None:
        return site
    copied = _copies_in(func, guard)
    where = f"the member {member} of what the parameter {root} refers to"
    if copied and site.kind is not SiteKind.PINNED_HOST:
        fills.setdefault(func.id, []).append(guard)
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"weight cache: {func.qualname} stores it in {where} only when `{short(guard.test)}`, and fills it "
            f"from data it is handed (`{short(copied)}`): a prepared copy made once per holder and kept on it "
            f"({site.tier_reason})"))
    return kept(site, f"created lazily: {func.qualname} stores it in {where} only when `{short(guard.test)}`, so it "
                      f"is made once per holder and kept on it")


_STORE_METHODS = ("emplace", "try_emplace", "insert", "insert_or_assign", "push_back", "emplace_back")
_LOOKUP = r"\s*(?:\.|->)\s*(?:find|count|contains|end)\s*\("


def _keyed_static(site: Site, index: ProjectIndex) -> Site:
    """Round 31: a buffer made into a local (or a member of a local struct:
    ``cudaMalloc(&holder.barriers, n)``) that the function then stores in a
    process-lifetime container, a file-scope variable or a function-local
    static (``g_ws.emplace(device, holder)``, ``g_ph[device] = ptr``), where
    a test of the function looks the key up in that container and either
    surrounds the store or returns before the allocation when it is there
    (``if (g_ws.find(d) != g_ws.end()) return it->second;``): made once per
    key and kept for the process, T2 (T5b pinned). A free of the local later
    in the function leaves it per call."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None:
        return site
    # the buffer's local: the target, or (a helper's call) a local it fills through `&local`
    texts = [site.target or ""] + ([a for a in site.shape if a.strip().startswith("&")] if site.via else [])
    locals_ = [m.group(1) for t in texts
               if (m := re.match(r"[\s(&*]*(?:\(\s*[\w:\s]+\**\s*\)\s*)?&?\s*([A-Za-z_]\w*)", t)) is not None
               and m.group(1) in declared(func)]
    line = site.stmt_line or site.span.line
    found = next(((local, store) for local in locals_
                  if (store := _container_store(func, local, line, index)) is not None), None)
    if found is None:
        return site
    local, store = found
    if any(s.kind is SiteKind.RELEASE and s.span.line > line and re.match(rf"[\s(&*]*{local}\b", s.target or "")
           for s in func.sites):
        return site
    container, at = store
    lookup = re.compile(rf"(?<![\w.>]){re.escape(container)}(?:{_LOOKUP}|\s*\[)")
    guard = next((b for b in func.blocks if b.kind in ("if", "elif") and lookup.search(b.test) is not None and (
        b.span.contains_line(line) and b.span.contains_line(at) or b.exits and b.span.end_line < line)), None)
    if guard is None:
        return site
    return kept(site, f"kept per key: {func.qualname} stores it in {container}, storage kept for the process, "
                      f"after `{short(guard.test)}` looks the key up there, so it is made once per key")


def _sets_up_kept(site: Site, index: ProjectIndex, kept_per_key: dict[str, str]) -> Site:
    """A call (derived site) of a function that keeps its buffer per key in
    process-lifetime storage (``_keyed_static``): the call makes that buffer
    on the key's first use only, T2."""
    found = index.site_call(site)
    if found is None:
        return site
    caller, call = found
    for callee in index.resolve(caller, call):
        how = kept_per_key.get(f"{callee.path}::{callee.qualname}")
        if how is not None:
            return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                f"sets up a buffer kept per key: {how.removeprefix('kept per key: ')} on the key's first use "
                f"only ({site.tier_reason})"))
    return site


def _container_store(func: Func, local: str, line: int, index: ProjectIndex) -> tuple[str, int] | None:
    """(container, line) of a store of ``local`` after ``line`` into a
    file-scope or function-local static container: ``C[k] = local``,
    ``C.emplace(k, local)``, ``C.push_back(std::move(local))``."""
    statics = {t for a in func.assigns if a.type and a.type.startswith("static ") for t in a.targets}
    kept = file_scope(func.path, index) | statics
    for a in func.assigns:
        if a.line > line and a.op == "=" and a.type is None and len(a.targets) == 1 and _bare(a.value) == local:
            m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*\[[^\]]*\]\s*", a.targets[0])
            if m is not None and m.group(1) in kept and m.group(1) not in func.scope.params:  # type: ignore[union-attr]
                return m.group(1), a.line
    for call in func.calls:
        head, _, method = call.callee.rpartition(".")
        if call.span.line <= line or method not in _STORE_METHODS or head not in kept:
            continue
        args = [re.sub(r"^std::move\s*\((.*)\)$", r"\1", _bare(a)).strip() for a in split_top_level(call.arglist)]
        if local in args:
            return head, call.span.line
    return None


def _guarded_candidate(site: Site) -> bool:
    return (site.language is not Language.PYTHON and bool(site.target)
            and (site.tier is Tier.T4 and site.kind is SiteKind.DEVICE
                 or site.tier is Tier.T5A and site.kind is SiteKind.PINNED_HOST)
            and (site.tier_reason.startswith("per call in ")
                 or site.tier_reason.startswith("pinned host memory allocated per call in ")))


def _after_guard(site: Site, index: ProjectIndex, built_per_call: set[str]) -> Site:
    """Round 31: a method's store into a member after a guard clause that
    returns when the object's state is already there (``if (!devices.empty())
    return;``, ``if (n <= capacity && buf != nullptr) return;``), where the
    method itself makes that state (stores into or adds to the tested
    member, or records the capacity): what follows the guard runs once per
    object, or again only to grow: kept on the object, T2 (T5b pinned). A
    free of the member after the allocation, a constructor, and a class
    built per call leave it."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.owner is None or func.scope.role != "method" \
            or func.owner.key in built_per_call:
        return site
    member = member_root(site.target or "", func)
    line = site.stmt_line or site.span.line
    if not member or freed_after(func, line, member):
        return site
    made = _members_made(func, line)
    guard = next((b for b in func.blocks if b.kind == "if" and b.exits and b.test and b.span.end_line < line
                  and not func.in_loop(b.span.line) and any(_present(b.test, m) for m in made)), None)
    if guard is None:
        return site
    return kept(site, f"created lazily: {func.qualname} returns early when `{short(guard.test)}` (state it makes "
                      f"itself), and stores it in the member {member}, so it is made once per object (or grown) "
                      f"and kept")


def _members_made(func: Func, line: int) -> set[str]:
    """The members ``func`` stores into, or adds to, at or after ``line``."""
    made = {root for a in func.assigns if a.line >= line and a.op == "=" and a.type is None
            for t in a.targets if (root := member_root(t, func))}
    for call in func.calls:
        head, _, method = call.callee.rpartition(".")
        if call.span.line >= line and head and method in _STORE_METHODS + _ADD_METHODS:
            root = member_root(head, func)
            if root:
                made.add(root)
    return made


def _present(test: str, member: str) -> bool:
    """``test`` says ``member`` is there: not null, not empty, or at least a size asked for."""
    m = rf"(?:this\s*->\s*)?{re.escape(member)}"
    return re.search(rf"(?<![\w.>]){m}\s*!=\s*(?:nullptr|NULL)\b|\b(?:nullptr|NULL)\s*!=\s*{m}\b"
                     rf"|!\s*{m}\s*(?:\.|->)\s*empty\s*\(\s*\)"
                     rf"|(?<![\w.>]){m}\s*(?:\.|->)\s*{SIZE_CALL}\s*(?:>|!=)\s*0\b"
                     rf"|<=\s*{m}\b(?!\s*(?:\.|->|\())|(?<![\w.>]){m}\s*>=",
                     test) is not None


def _copies_in(func: Func, block: Block) -> str:
    """A copy inside ``block`` whose source is what a parameter of ``func``
    refers to (``cudaMemcpy(p, bias.cudaData, ...)``, ``w->scales.data()``); "" if none."""
    params = func.scope.params if func.scope is not None else ()
    for call in func.calls:
        if not block.span.contains_line(call.span.line) or _COPIES.fullmatch(call.callee) is None:
            continue
        args = split_top_level(call.arglist)
        if len(args) < 2:
            continue
        m = re.match(r"[\s(&*]*([A-Za-z_]\w*)", _bare(args[1]))
        if m is not None and (m.group(1) in params or _filled_from(func, block, m.group(1), params)):
            return f"{call.callee}({call.arglist})"
    return ""


def _filled_from(func: Func, block: Block, local: str, params: Sequence[str]) -> bool:
    """``local`` (a host staging array) is written inside ``block`` with
    values read from what a parameter refers to (``scales[i] = (half)w.scales[i]``)."""
    reads = re.compile(r"\b(?:" + "|".join(re.escape(p) for p in params) + r")\s*(?:\.|->|\[)") if params else None
    return reads is not None and any(
        block.span.contains_line(a.line) and a.op == "=" and len(a.targets) == 1
        and re.match(rf"\s*{re.escape(local)}\s*\[", a.targets[0]) is not None and reads.search(a.value) is not None
        for a in func.assigns)


def _fill_temporary(site: Site, index: ProjectIndex, fills: dict[str, list[Block]]) -> Site:
    """A device temporary of a weight-cache fill (``_lazy_holder``'s T1):
    made into a local inside the guarded fill and freed in it (the float copy
    a bias is converted from): the load tier, T1."""
    func = index.func(site.path, site.scope) if site.kind is SiteKind.DEVICE else None
    if func is None or func.id not in fills:
        return site
    local = (site.target or "").strip().lstrip("&*").strip()
    line = site.stmt_line or site.span.line
    for block in fills[func.id]:
        if block.span.contains_line(line) and any(
                s.kind is SiteKind.RELEASE and s.span.line > line and block.span.contains_line(s.span.line)
                and (s.target or "").strip() == local for s in func.sites):
            return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                f"weight-cache fill temporary: made and freed inside the fill `{short(block.test)}` of "
                f"{func.qualname}, which keeps a prepared copy on the holder: load tier ({site.tier_reason})"))
    return site
