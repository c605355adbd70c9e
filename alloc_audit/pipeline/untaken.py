"""Stage 5a, after derive: derived sites whose allocations the call never
runs (issue 11, round 8).

A construction or factory call is a derived site because the callee
allocates somewhere within a few calls. Under the values this call passes
(``values.bind_edge``: literals, ``None``, defaults left in place), some of
those allocations sit on branches that never run (`if deterministic:` when
the call leaves ``deterministic=False``; `if self.deterministic:` after the
constructor's `self.deterministic = deterministic`) or make a host tensor
(`torch.zeros(n, device=device)` where the call leaves ``device="cpu"``).
When that holds for every allocation the call reaches, the call allocates
nothing on the device: the derived site is dropped. The branches are
decided by the rules' path-sensitive reach (``rules/_lib/paths.py``): only
what the call states decides a branch, so an unknown value keeps the site.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from ..model import Call, Language, Site, Tier, Via
from .index import Func, ProjectIndex
from .index.values import LITERAL, Env, Value, bind_edge
from .move_apis import MOVES

if TYPE_CHECKING:
    from ..rules._lib.paths import PathReach

_DEPTH = 3  # as the derived sites' own search (``Factories.derived_sites``)
_SELF_STORE = re.compile(r"self\.([A-Za-z_]\w*)")


def drop_untaken(derived: Sequence[Site], index: ProjectIndex) -> tuple[list[Site], dict[tuple[str, int, int], str]]:
    """The derived sites, less those whose every allocation this call skips;
    a native factory call whose first handed-back allocation sits on a branch
    the call does not take stands for the first one it does take
    (`malloc(n)` leaving ``is_host = false``: the device branch, not the
    pinned one). With it, per such site (path, line, column), what to add to
    its tier reason."""
    from ..rules._lib.paths import PathReach  # the rules' analysis; imported here, used by one stage

    reach = PathReach(index)
    stored: dict[str, list[tuple[str, str]]] = {}  # per constructor: its stores of a parameter (issue 11)
    out: list[Site] = []
    notes: dict[tuple[str, int, int], str] = {}
    for site in derived:
        if site.via is None:
            out.append(site)
        elif site.language is Language.PYTHON:
            if not _untaken(site, index, reach, stored):
                out.append(site)
        else:
            taken = _native_branch(site, index, reach)
            if taken is not None:
                site, note = taken
                out.append(site)
                if note:
                    notes[(site.path, site.span.line, site.span.col)] = note
    return out, notes


def _native_branch(site: Site, index: ProjectIndex, paths: PathReach) -> tuple[Site, str] | None:
    """A native derived site under the values its call passes (the defaults
    it leaves in place included): None when the call runs none of the
    callee's allocations; the site standing for the first handed-back
    allocation it does run, with a note, when that is not its via; else the
    site as it is."""
    caller = index.func(site.path, site.scope)
    call = next((c for c in caller.calls if c.span == site.span), None) if caller is not None else None
    if caller is None or call is None:
        return site, ""
    if index.constructed_class(caller, call) is not None:
        return (site, "") if not _untaken(site, index, paths, {}) else None
    via = site.via
    assert via is not None
    skipped = False
    for start in (f for f in index.resolve(caller, call) if f is not caller):
        env = _bind(index, caller, call, start)
        witnesses = {(w.site.path, w.site.span.line, w.site.span.col): w for w in paths.reach(start, env, _DEPTH)}
        if any((w.site.path, w.site.span.line) == (via.path, via.line) for w in witnesses.values()):
            return site, ""
        found = index.factory_allocation(start, _DEPTH, partial(_is_live, frozenset(witnesses)))
        if found is not None:
            under = found.site
            witness = witnesses[(under.path, under.span.line, under.span.col)]
            said = " ".join(r.note for r in witness.assumptions)
            whys = [f"{name} = {_native_shown(v)}: {v.why}" for name, v in sorted(env.items())
                    if v.why and re.search(rf"\b{re.escape(name)}\b", said)]
            note = (f"takes the {under.kind.value} branch of {start.qualname} ({under.api} at {under.path}:"
                    f"{under.span.line}, not {via.api} at {via.path}:{via.line})"
                    + (f": {'; '.join(whys)}" if whys else ""))
            return dataclasses.replace(site, kind=under.kind, device=under.device,
                                       via=Via(under.api, under.path, under.span.line)), note
        if any(w.site.acquires for w in witnesses.values()) or not any(r.site.acquires
                                                                        for r in index.reach(start, _DEPTH)):
            return site, ""  # it runs an allocation, none handed back: as it is
        skipped = True
    return None if skipped else (site, "")


def _is_live(live: frozenset[tuple[str, int, int]], site: Site) -> bool:
    return (site.path, site.span.line, site.span.col) in live


def _native_shown(value: Value) -> str:
    if value.kind != LITERAL:
        return "nullptr"
    return str(value.literal).lower() if isinstance(value.literal, bool) else str(value.literal)


def _untaken(site: Site, index: ProjectIndex, paths: PathReach, stored: dict[str, list[tuple[str, str]]]) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    caller, call = found
    cls = index.constructed_class(caller, call)
    starts = index.constructors(cls) if cls is not None else [f for f in index.resolve(caller, call) if f is not caller]
    skipped = False
    for start in starts:
        live: set[tuple[str, int, int]] | None = None  # bound and walked on the first allocation that counts
        for reached in index.reach(start, _DEPTH):
            candidate = reached.site
            if not candidate.acquires or (candidate.tier is Tier.T1 and candidate.api not in MOVES):
                continue  # a layer's own weights are counted where they are made (a weight upload is not)
            if live is None:
                live = _live(index, caller, call, start, paths, stored)
            if (candidate.path, candidate.span.line, candidate.span.col) in live:
                return False
            skipped = True
    return skipped


def _live(index: ProjectIndex, caller: Func, call: Call, start: Func, paths: PathReach,
          stored: dict[str, list[tuple[str, str]]]) -> set[tuple[str, int, int]]:
    """Where the allocations ``start`` reaches under the call's values are."""
    env = _bind(index, caller, call, start)
    if start.scope is not None and start.scope.role == "constructor":
        stores = stored.get(start.id)
        if stores is None:
            stores = stored[start.id] = _stored_params(index, start)
        env = {**env, **{attr: env[value] for attr, value in stores if value in env}}
    return {(w.site.path, w.site.span.line, w.site.span.col) for w in paths.reach(start, env, _DEPTH)}


def _bind(index: ProjectIndex, caller: Func, call: Call, target: Func) -> Env:
    """The edge's values, with the constants the caller's module imports."""
    return bind_edge(caller, call, target, {}, index.visible_constants(caller.path))


def _stored_params(index: ProjectIndex, ctor: Func) -> list[tuple[str, str]]:
    """(``self.x``, ``p``) where the constructor stores `self.x = p` (when the call
    binds ``p``, ``self.x`` holds its value: the call's own part, ``_live``;
    this part needs no call, memoised per constructor) and nothing else in
    the class assigns ``self.x`` -- or
    only other methods do, and the constructor calls none after the store
    (no `self.m(...)`, `super()...`, nor `self` handed to a call) -- (a later
    `if self.x:` in the constructor reads the call's value)."""
    owner = ctor.owner
    if owner is None:
        return []
    stores: dict[str, list[tuple[int, str]]] = {}
    prefix = owner.qualname + "."
    for func in index.functions_in(ctor.path):
        if func.qualname != ctor.qualname and not func.qualname.startswith(prefix):
            continue
        for assign in func.assigns:
            for target in assign.targets:
                m = _SELF_STORE.fullmatch(target.strip())
                if m is not None:
                    value = "<elsewhere>" if func is not ctor else assign.value.strip() if assign.op == "=" else "<op>"
                    stores.setdefault(m.group(0), []).append((assign.line, value))
    out: list[tuple[str, str]] = []
    for attr, found in stores.items():
        if len(found) != 1:
            found = [f for f in found if f[1] != "<elsewhere>"]
            if len(found) != 1 or _may_run_methods(ctor, found[0][0]):
                continue  # stored again by a method that may run before the read
        line = found[0][0]
        # read after the store only: a test above it reads something else
        if all(b.span.line > line for b in ctor.blocks if attr in b.test):
            out.append((attr, found[0][1]))
    return out


_HANDS_SELF = re.compile(r"(?:^|[^\w.])self\b(?!\s*\.)")


def _may_run_methods(ctor: Func, line: int) -> bool:
    """The constructor may run another of the object's methods after ``line``:
    a call on `self` or `super()`, or one `self` is handed to."""
    return any(c.span.line > line and (c.callee.startswith(("self.", "super")) or _HANDS_SELF.search(c.arglist))
               for c in ctor.calls)
