"""Stage 5, after the tier passes: a module built only to be registered as
a hook that its object removes again is scratch, not model state (issue
11, round 22).

    branch = LowRankBranch(in_features, out_features, rank)
    branch.b.to(device=w.device)                           # T4, not a weight upload
    self._hooks.append(branch.as_hook().register(mod))     # the handle kept ...

    def _recover(self):
        for hook in self._hooks:                           # ... and removed
            hook.remove()

A T1 site of a local ``L`` in a function: a construction of a project
class (a derived site) or a whole-module move of ``L`` or of a member of
it (``L.b.to(...)``), where ``L`` is a construction of a project class in
the function, stored nowhere else (no ``x.y = L``, not handed whole to
another call but a list's ``append``). Either the function, a method of a
class ``K``, appends ``L``'s registration to ``self.H`` (``self.H.append(
L.as_hook().register(m))``), or it returns the lists it appends ``L`` to,
and every caller (at least one, each a method) registers what it iterates
of the result into ``self.H`` in the loop over it; and ``K`` (or a base)
has a method that loops over ``self.H`` calling ``.remove()``. The hook,
and the module it holds, lives until that removal: per call, T4. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site, SiteKind, Tier
from .index import ClassInfo, Func, ProjectIndex
from .names import has_word
from .retier import WEIGHT_UPLOAD, Decision, retier

_BUILT = "builds a model"  # derive's reason for a construction of a module that moves itself


def removed_hooks(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    removable: dict[str, frozenset[str]] = {}

    def lists_removed(owner: ClassInfo) -> frozenset[str]:
        if owner.key not in removable:
            removable[owner.key] = _removed_lists(owner, index)
        return removable[owner.key]

    def eligible(site: Site) -> bool:
        return site.language is Language.PYTHON and site.kind is SiteKind.DEVICE and site.tier is Tier.T1 \
            and site.tier_reason.startswith((_BUILT, WEIGHT_UPLOAD))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role != "method":
            return None
        local = _local(site, func)
        if not local or not _built_here(func, local, index) or _stored(func, local):
            return None
        owner = func.owner
        slot = next((h for h in sorted(lists_removed(owner)) if _registers_into(func, local, h, 0, 10**9)), None) \
            if owner is not None else None
        if owner is not None and slot is not None:
            return Tier.T4, (f"a hook removed again: {local} is registered into self.{slot}, whose hooks a method "
                             f"of {owner.name} removes; was: {site.tier_reason}")
        if not _returned(func, local):
            return None
        callers = _callers(func, index)
        if not callers or not all(c.owner is not None and _caller_registers(c, func.name, lists_removed(c.owner))
                                  for c in callers):
            return None
        return Tier.T4, (f"a hook removed again: {func.qualname} builds {local} for what it returns, which its "
                         f"callers register as hooks their object removes; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _callers(func: Func, index: ProjectIndex) -> list[Func]:
    """The functions that call ``func``: calls by its name resolved to it, or not resolved at all
    (``self.quantizer.quantize_low_rank(...)``: each must then pass the test too)."""
    out = {caller.id: caller for caller, _, _ in index.calls_reaching(func)}
    return list(out.values())


def _local(site: Site, func: Func) -> str:
    """The local the site builds (a derived construction) or moves (``L.b.to(...)``)."""
    if site.via is not None:
        target = (site.target or "").strip()
        return target if target.isidentifier() else ""
    call = next((c for c in func.calls if c.span == site.span), None)
    root = call.callee.split(".", 1)[0] if call is not None and "." in call.callee else ""
    return root if root.isidentifier() and root not in ("self", "cls") else ""


def _built_here(func: Func, local: str, index: ProjectIndex) -> bool:
    return any((c.target or "").strip() == local and index.constructed_class(func, c) is not None
               for c in func.calls)


def _stored(func: Func, local: str) -> bool:
    """``local`` is stored whole somewhere (``self.x = L``, ``d[k] = L``) or handed to a call other than ``append``."""
    if any(a.value.strip() == local and any(not t.strip().isidentifier() for t in a.targets)
           for a in func.assigns):
        return True
    return any(not c.callee.endswith(".append") and any(a.text.strip() == local for a in split_args(c.arglist))
               for c in func.calls)


def _returned(func: Func, local: str) -> bool:
    """What ``func`` returns holds ``local`` at most through lists it appends it to."""
    lists = {c.callee.rsplit(".", 1)[0] for c in func.calls
             if c.callee.endswith(".append") and c.arglist.strip() == local}
    values = [r.value for r in func.returns]
    return bool(values) and all(not has_word(v, local) for v in values) \
        and (not lists or any(has_word(v, name) for v in values for name in lists))


def _registers_into(func: Func, local: str, slot: str, start: int, end: int) -> bool:
    """``func`` has ``self.H.append(L....register(...))`` between lines ``start`` and ``end``."""
    return any(c.callee == f"self.{slot}.append" and start <= c.span.line <= end
               and c.arglist.strip().startswith(local + ".") and ".register(" in c.arglist for c in func.calls)


def _caller_registers(caller: Func, name: str, slots: frozenset[str]) -> bool:
    """Every call of ``name`` in ``caller`` is iterated by a loop whose body
    registers each element into a removable ``self.H``."""
    calls = caller.calls_of(name)
    if not calls or not slots:
        return False
    for call in calls:
        loop = next((b for b in caller.blocks if b.kind == "loop" and b.stmt is not None
                     and b.stmt.contains_line(call.span.line) and f"{name}(" in b.test), None)
        if loop is None:
            return False
        names = [c.arglist.split(".", 1)[0].strip() for c in caller.calls
                 if c.callee.startswith("self.") and c.callee.endswith(".append")
                 and loop.span.contains_line(c.span.line)]
        if not any(n.isidentifier() and _registers_into(caller, n, slot, loop.span.line, loop.span.end_line)
                   for n in names for slot in slots):
            return False
    return True


def _removed_lists(owner: ClassInfo, index: ProjectIndex) -> frozenset[str]:
    """The ``self.H`` lists a method of ``owner`` or of a base loops over calling ``.remove()``."""
    found: set[str] = set()
    for cls in _lineage(owner, index):
        for methods in cls.methods.values():
            for method in methods:
                for block in method.blocks:
                    slot = block.test.strip()
                    if block.kind == "loop" and slot.startswith("self.") and slot[5:].isidentifier() and any(
                            c.callee.endswith(".remove") and not c.arglist.strip()
                            and block.span.contains_line(c.span.line) for c in method.calls):
                        found.add(slot[5:])
    return frozenset(found)


def _lineage(owner: ClassInfo, index: ProjectIndex) -> list[ClassInfo]:
    """``owner`` and the bases the project defines once (``Base[Config, T]`` by its plain name)."""
    out: list[ClassInfo] = []
    todo = [owner]
    while todo and len(out) < 8:
        cls = todo.pop()
        if cls in out:
            continue
        out.append(cls)
        for base in cls.bases:
            classes = index.classes_named(base.split("[", 1)[0].rsplit(".", 1)[-1].strip())
            if len(classes) == 1:
                todo.append(classes[0])
    return out
