"""Stage 5, after ``setup_members`` (C++): memory a method keeps in a member
of an object that only ever lives as a local of the function declaring it
(issue 11, round 29).

A native class whose method allocates into a member of its object
(``cudaMalloc(&workspace, n)`` in ``CublasLtGemm::init``) and frees that
member in its destructor or in another method (``destroy``) keeps the
memory as long as the object lives. When every object of the class is a
plain local of the function that declares it (``CublasLtGemm gemm;``: not
made with ``new`` or a ``make_*`` helper, not ``static``, not a member of
another class, never returned nor assigned elsewhere), and each such
function frees the member itself (it calls the freeing method on its
object, or the destructor does at its return), the memory lives for one
call of that function: per call, T4, whatever the allocating method's name
says (``init``: an initialiser, T2). Where one of those functions runs once
in all (``run_once.single_run``: ``main``, or one call from a function so)
the object lives for the run and the tier stays. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ClassInfo, Func, ProjectIndex
from .native_pinned import member_root
from .retier import Decision, retier
from .run_once import single_run

_MADE_ELSEWHERE = re.compile(r"\bnew\b|make_(?:shared|unique)|\bstatic\b")


def local_objects(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    held: set[str] | None = None  # class names some class holds as a member (read once, when first needed)
    memo: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.via is None \
            and site.language is not Language.PYTHON and bool(site.target)

    def decide(site: Site) -> Decision | None:
        nonlocal held
        func = index.func(site.path, site.scope)
        if func is None or func.owner is None or func.scope is None or func.scope.role != "method":
            return None
        owner = func.owner
        member = member_root(site.target or "", func)
        if not member or member not in owner.fields:
            return None
        freeing = _freeing(owner, member, index)
        if not freeing:
            return None
        if held is None:
            held = {f.type.rsplit("::", 1)[-1] for facts in index.files.values() for f in facts.fields}
        if owner.name in held:
            return None  # also a member of another object: it lives as that one does
        builders = _local_builders(owner, freeing, index)
        if not builders or any(single_run(b, index, memo) for b in builders):
            return None
        shown = ", ".join(sorted({b.qualname for b in builders})[:2])
        return Tier.T4, (f"kept on a local object: every {owner.name} is a plain local of the function that "
                         f"declares it ({shown}), which frees its member {member} before it returns "
                         f"({', '.join(sorted(freeing))}) and runs more than once: per call ({site.tier_reason})")

    return retier(sites, eligible, decide)


def _freeing(owner: ClassInfo, member: str, index: ProjectIndex) -> set[str]:
    """The methods of ``owner`` (its destructor included) that free ``member``."""
    word = re.compile(rf"(?<![\w.>]){re.escape(member)}\b")
    out = set()
    for name, methods in owner.methods.items():
        for method in methods:
            if any(s.kind is SiteKind.RELEASE and word.search(s.target or s.size or "") for s in method.sites):
                out.add(name)
    return out


def _local_builders(owner: ClassInfo, freeing: set[str], index: ProjectIndex) -> list[Func] | None:
    """The functions declaring the objects of ``owner``, when each object is a plain local that the
    function frees (a freeing method called on it, or the destructor at its return); None if one is not."""
    builders: list[Func] = []
    destructor = f"~{owner.name}" in freeing
    for caller, i in index.calls_named(owner.name):
        call = caller.call_at(i) if caller.table is not None else None
        if call is None or index.constructed_class(caller, call) is not owner:
            continue
        if caller.scope is None or caller.scope.role not in ("function", "method") or caller.owner is owner:
            return None
        name = (call.target or "").strip()
        declared = [a for a in caller.assigns if a.line == call.span.line and a.type and name in a.targets]
        if not name.isidentifier() or not declared or any(_MADE_ELSEWHERE.search(f"{a.type} {a.value}")
                                                          for a in declared):
            return None
        if _handed_out(caller, name):
            return None
        if not destructor and not any(c.callee in (f"{name}.{m}", f"{name}->{m}") for c in caller.calls
                                      for m in freeing):
            return None
        builders.append(caller)
    return builders or None


def _handed_out(func: Func, name: str) -> bool:
    """The function returns its object, or stores it (or its address) somewhere."""
    word = re.compile(rf"(?<![\w.>]){re.escape(name)}\b(?!\s*(?:\.|->))")
    return any(word.search(r.value) for r in func.returns) or \
        any(word.search(a.value) for a in func.assigns if a.op == "=" and name not in a.targets)
