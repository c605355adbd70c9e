"""Stage 5, after ``native_pinned`` (C++): a set-up method that fills its
object's members keeps them with the object (issue 11, rounds 20 and 27).

A C++ method (not a constructor or destructor) that allocates device memory
straight into a member of its object (``cudaMalloc(&prefill_update.indptr,
n)``, ``cudaMalloc(&this->ws_, n)``: the target is neither a local nor a
parameter), or stores what a project allocation function returns there
(``_qkv_ptr = cuda_malloc<T>(n)``: a derived site, round 27), and frees
nothing in the method, not under a test naming the member (a lazy or
grow-on-demand buffer is decided elsewhere) nor after a guard clause (an
early return before it: grown on demand; an error check after it, ``if
(!buf_[i]) return -1;``, is no guard), is set-up work when a run-once
function reaches it (``main``, a ``configure`` name, a constructor or an
initialiser, by name, three calls up: ``Layer::Layer`` ->
``allocate_buffer`` -> ``allocate_layer_memory``) and nothing runs it per
step: its name is not per step and no caller (two calls up) calls it in a
loop or is per step (``repinned_members``' walk). The buffers live with the
object: T2, as an initialiser's do, not the building function's "per call"
T4. Pure; only C++ T4 device sites with a member target are looked at.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import has_word
from .native_pinned import member_root
from .repinned_members import callers_by_name, step_reason
from .retier import Decision, retier

_PER_CALL = "per call in "
_INIT = re.compile(r"_*(?:init|setup|set_up)")
_UP = 3


def setup_members(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else (lambda name: False)
    once = matcher(globs.once) if globs.once else (lambda name: False)
    memo: dict[str, str | None] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T4 and site.kind is SiteKind.DEVICE \
            and site.language is not Language.PYTHON and site.tier_reason.startswith(_PER_CALL) \
            and bool(site.target)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.owner is None \
                or func.scope.role in ("constructor", "destructor"):
            return None
        root = member_root(site.target or "", func)
        if not root:
            return None
        line = site.stmt_line or site.span.line
        if any(b.test and has_word(b.test, root) for b in func.blocks if b.span.contains_line(line)):
            return None
        if any(b.exits and b.span.line < line for b in func.blocks):
            return None  # a guard clause before it (`if (need <= cap_) return;`): grown on demand
        if func.id not in memo:
            memo[func.id] = _set_up(func, index, per_step, once)
        how = memo[func.id]
        if how is None:
            return None
        what = f"what {site.api} returns" if site.via is not None else "it"
        return Tier.T2, (f"set-up method {func.qualname} keeps {what} in the member {(site.target or '').strip()} "
                         f"({how}); was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _set_up(func: Func, index: ProjectIndex, per_step: object, once: object) -> str | None:
    assert callable(per_step)
    if any(s.kind is SiteKind.RELEASE for s in func.sites) or per_step(func.name):
        return None
    if step_reason(func, index, per_step):
        return None
    root = _run_once_root(func, index, once)
    return f"reached once from {root}, frees nothing there, not run per step" if root else None


def _run_once_root(func: Func, index: ProjectIndex, once: object) -> str:
    """A caller within ``_UP`` calls up (by name) that runs once: a ``once``
    name (``main``, ``configure``), a constructor or an initialiser; "" if none."""
    assert callable(once)
    frontier, seen = [func], {func.id}
    for _ in range(_UP):
        ups: list[Func] = []
        for callee in frontier:
            for caller, _call in callers_by_name(callee, index):
                if once(caller.name) or (caller.scope is not None and caller.scope.role == "constructor") \
                        or _INIT.match(caller.name):
                    return caller.qualname
                if caller.id not in seen:
                    seen.add(caller.id)
                    ups.append(caller)
        frontier = ups
    return ""
