"""Stage 5, after the callers: a buffer of an initialiser by name that only
feeds a lookup is per call (issue 11, round 17).

An initialiser by name (T2: ``_init_*``) moves its argument
(``value = value.to(dev)``) and only reads the copy: it stays a local, or
is handed to project functions that read it and keep nothing of it (no
store of a parameter on an object or in a container, no return of one:
``self._index = self.index_for(value)``). When a per-step function
(``[callers] per-step``, ``_DEPTH`` calls up) reaches the initialiser, the
copy is made and dropped on every step: T4. A test on another name naming
None (``if self.begin_index is None:``) guards what the function keeps (the
index), not the dropped copy, so it does not make it run-once. Handed to a
call that cannot be resolved, to a construction, or to a function that
keeps a parameter, it stays the initialiser's.

Round 27: a buffer of an initialiser or a constructor (by name, T2) that
is handed to project functions, each keeping nothing of the parameters it
fills (no store, no return, handed on only to calls that read it: the
catalogue's ``[non-retaining]`` collectives, ``copy_``), and kept nowhere
else, dies when its function returns: a temporary, T4, however often the
function runs (``barrier = torch.zeros(1); _broadcast(group, barrier)``).
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Site, Tier
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_DEPTH = 3  # calls up from the initialiser to a per-step function
_NAMED = ("initialiser ", "constructor ")  # the reasons of the initialiser and constructor name patterns
_FUNCTION_ROLES = frozenset({"function", "method"})
_ROLES = _FUNCTION_ROLES | {"constructor"}


def lookup_temps(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs,
                 non_retaining: frozenset[str] = frozenset()) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None

    def eligible(site: Site) -> bool:
        return (python_device_site(site, Tier.T2) and site.tier_reason.startswith(_NAMED)
                and (site.kept in ("", "local") or site.kept.startswith("handed:")))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        target = (site.target or "").strip()
        if func is None or func.scope is None or func.scope.role not in _ROLES or not target.isidentifier():
            return None
        handed: list[str] = []
        if not _only_read(site, func, target, index, non_retaining, handed):
            return None
        if per_step is not None and site.tier_reason.startswith(_NAMED[0]):
            dist = index.callers_within([func], _DEPTH)
            stepper = next((f for fid in sorted(dist, key=lambda f: (dist[f], f))
                            if dist[fid] > 0 and (f := index.funcs.get(fid)) is not None and per_step(f.name)), None)
            if stepper is not None:
                return Tier.T4, (f"per step: {func.qualname} is reached from {stepper.qualname} ({stepper.path}) on "
                                 f"every step and only reads the copy ({site.kept}); was: {site.tier_reason}")
        if not site.kept.startswith("handed:") or not handed:
            return None
        return Tier.T4, (f"a temporary: {func.qualname} hands {target} only to {', '.join(sorted(set(handed)))}, "
                         f"which keep nothing they are given (no store, no return, handed on only to calls that "
                         f"read it), and keeps it nowhere itself; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _only_read(site: Site, func: Func, target: str, index: ProjectIndex, non_retaining: frozenset[str],
               handed: list[str]) -> bool:
    """Every later call given ``target`` runs project functions that keep
    none of the parameters it fills (their names go to ``handed``) or is a
    call that reads it (the catalogue's ``[non-retaining]``: a collective,
    ``copy_``), and no later line stores it, binds another name to it (or a
    view of it) or returns it (``site.kept`` may be "": not told)."""
    after = site.span.end_line
    for a in func.assigns:
        if a.line > after and target in _names(a.value) and (
                a.value.strip().startswith(target) or any(not t.strip().isidentifier() for t in a.targets)):
            return False
    if any(r.line > after and target in _names(r.value) for r in func.returns):
        return False
    for call in func.calls:
        if call.span.line <= site.span.end_line or target not in _names(call.arglist):
            continue
        callee = call.callee.rsplit(".", 1)[-1]
        if _reads(callee, non_retaining):
            continue
        resolved = index.resolve(func, call)
        if not resolved or any(f.scope is None or f.scope.role not in _FUNCTION_ROLES
                               or _keeps_param(f, non_retaining, _filled(f, call.arglist, target))
                               for f in resolved):
            return False
        handed.extend(f.qualname for f in resolved)
    return True


_READS = frozenset({"isinstance", "len", "int", "float", "bool", "str", "repr", "print", "item", "nonzero", "eq", "ne",
                    "warn", "warning", "info", "debug", "format"})
_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)")
_HANDED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b(?!\s*\.)")
_STORE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[A-Za-z_]\w*\[")


def _keeps_param(func: Func, non_retaining: frozenset[str] = frozenset(),
                 filled: frozenset[str] | None = None) -> bool:
    """Stores a parameter (of ``filled``, else any) on an object or in a
    container, returns one, or hands one on (a call with it in its
    arguments, unless the call only reads it: not followed)."""
    assert func.scope is not None
    params = {p for p in func.scope.params if p not in ("self", "cls")}
    if filled is not None:
        params &= filled
    if not params:
        return False
    if any(params & _names(a.value) and any(_STORE.match(t.strip()) for t in a.targets) for a in func.assigns):
        return True
    if any(r.value.strip() in params for r in func.returns):
        return True
    return any(params & _handed(c.arglist) and not _reads(c.callee.rsplit(".", 1)[-1], non_retaining)
               for c in func.calls)


def _filled(func: Func, arglist: str, target: str) -> frozenset[str] | None:
    """The parameters of ``func`` a call's argument ``target`` fills (by
    position or keyword), or None when not told (``*args``)."""
    assert func.scope is not None
    params = [p for p in func.scope.params if p not in ("self", "cls")]
    out = set()
    for i, arg in enumerate(split_args(arglist)):
        if arg.text.strip() != target:
            continue
        if arg.keyword is not None:
            out.add(arg.keyword)
        elif arg.text.startswith("*") or i >= len(params) or any(p.startswith("*") for p in params[:i + 1]):
            return None
        else:
            out.add(params[i])
    return frozenset(out) if out else None


def _reads(callee: str, non_retaining: frozenset[str] = frozenset()) -> bool:
    """A builtin or tensor read, an exception or a log line, or a call that
    only reads its arguments (``non_retaining``): keeps nothing."""
    return callee in _READS or callee in non_retaining or callee.endswith(("Error", "Exception", "Warning"))


def _handed(text: str) -> set[str]:
    """The bare names in ``text`` not read through an attribute (``x.device``)."""
    return set(_HANDED.findall(text))


def _names(text: str) -> set[str]:
    """The bare names in ``text`` (not attributes: ``self.x`` gives ``self``)."""
    return set(_NAME.findall(text))
