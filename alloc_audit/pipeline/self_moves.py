"""Stage 5, classify (after ``lazy_members``): a move whose copy replaces
a member that is module state (``self.inv_freq = self.inv_freq.to(x.device)``
in a module whose library base registers ``inv_freq``).

Input: classified sites and the project index. Output: the same sites, such
a move tiered T4 (per call) re-tiered T1 when the member is module state:
the class registers it as a buffer or makes it a parameter, or the class is
a torch module whose project code never sets the member but by this move
(state of a library base class: a registered buffer). The move is a no-op
while the member is already there; when it copies, the copy replaces the
module's state (DESIGN.md "Lifetime tiers": registered buffers are T1).
A plain member moved in place stays per call (the fixtures' convention:
``if self.bias is not None: self.bias = self.bias.to(d)``), and so does a
move inside the object's own ``to``/``cuda`` method, a move stored in
another member or in a local.

Round 31: a torch module's member that its constructor binds to a value it
makes (``self.freqs_cis = precompute_freqs_cis(d, n)``) and no method binds
otherwise than by moving it in place is state the module keeps for every
forward, like a buffer it registers: the moved copy replaces it, T1
(``self.freqs_cis = self.freqs_cis.to(h.device)`` in ``forward``). A member
some method binds to something else (a step's output, ``None``) or one the
constructor leaves ``None`` stays per call. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .default_device import is_module
from .index import Func, ProjectIndex
from .lazy_members import weight_member
from .module_classes import external_module_base
from .move_apis import TENSOR_MOVES
from .names import SELF_MEMBER


def self_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return [_replaced(site, index) if _candidate(site) else site for site in sites]


def _candidate(site: Site) -> bool:
    target = (site.target or "").strip()
    return (site.api in TENSOR_MOVES and site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.via is None
            and site.language is Language.PYTHON and SELF_MEMBER.fullmatch(target) is not None)


def _replaced(site: Site, index: ProjectIndex) -> Site:
    member = (site.target or "").strip()
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None or func.table is None or func.name in ("to", "cuda"):
        return site
    table, pos = func.table, func.table.positions
    moves = [table.callees[i] for i in func.call_ix
             if pos[4 * i] == site.span.line and pos[4 * i + 1] == site.span.col]
    if not any(c.rsplit(".", 1)[0] == member and c.endswith((".to", ".cuda")) for c in moves):
        return site
    state = _module_state(func, member, index)
    if not state:
        return site
    return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
        f"module state moved in place: {func.qualname} replaces {member} with its moved copy ({state}); "
        f"was: {site.tier_reason}"))


def _module_state(func: Func, member: str, index: ProjectIndex) -> str:
    """Why ``member`` is module state: registered as a buffer, made a
    parameter, or set by no project code of a module class (inherited)."""
    weight = weight_member(func, member)
    if weight:
        return weight
    owner = func.owner
    assert owner is not None
    sets = []
    for methods in owner.methods.values():
        for method in methods:
            sets += [a.value for a in method.assigns if member in a.targets]
            table = method.table
            if table is not None:
                sets += [table.callees[i] for i in method.call_ix if table.targets[i] == member]
    module = is_module(index, owner.qualname, owner.bases, {}) or external_module_base(index, owner.bases)
    if all(v.startswith(member + ".") for v in sets) and module:
        return "set by no method of its module class: state of a library base"
    made = _made_by_constructor(owner.methods.get("__init__", []), member)
    if module and made and all(v.startswith(member + ".") or v in made for v in sets):
        return f"made by its module's constructor ({made[0][:60]}) and only moved in place since"
    return ""


def _made_by_constructor(ctors: list[Func], member: str) -> list[str]:
    """The values the constructor binds ``member`` to, when each is a call's result (none is ``None``
    or a plain name handed in)."""
    values: list[str] = []
    for ctor in ctors:
        bound = [a.value for a in ctor.assigns if member in a.targets]
        if any("(" not in v for v in bound):
            return []  # `None`, a name handed in: not made here
        values += bound
        table = ctor.table
        if table is not None:
            values += [table.callees[i] for i in ctor.call_ix if table.targets[i] == member]
    return values
