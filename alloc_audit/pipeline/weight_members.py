"""Stage 5, last of the lifetimes: a device copy an object keeps under a
member named for weights is a weight upload (issue 11, round 19).

A move of existing data to the device (``.cuda()``, ``.to(device)``) kept
in a member that says it holds weights (``self.weights[k] =
self.weights[k].float().cuda()``, ``self.all_weight = all_weight.cuda()``,
``self.weight_list[i]``) uploads the model's weights: model-resident (T1),
not the constructor's or a set-up method's T2. Only set-up work: a move per
step (T4, a weight sync), state a method adds into or rebuilds when stale
(an accumulator, a lazy member: T2) keep their tier, and so does a buffer
made fresh (``torch.zeros``, ``torch.ones(1).to(device)``: state whatever
its member is called).

Round 31: what is moved says so too, whatever the member is called: a
module's ``.weight`` or ``.bias`` (``self.wk =
layer.self_attn.k_proj.weight.detach().to(device)``, ``self.embed =
model.embed_tokens.weight.to(d)``), or a member the class binds to one and
moves in place in a set-up method (``self.wk = hf_layer.k_proj.weight.detach()``
in ``init_parameters``, then ``self.wk = self.wk.to(device)`` in
``init_gpu``). A weight is a weight wherever it is copied to (docs/tiers.md
section 2). A member bound to anything else (``self.wk = torch.randn(n)``,
``self.scale = cfg.scale``) and a move per step (a forward's ``w =
self.proj.weight.to(x.dtype)``, T4) keep their tier.
Round 32: the two weights of round 31 kept on the object are T1 also where
the tool read the method as per call (T4: ``to_gpu``'s ``self.wq =
self.wq.to(device)``, a layer swapped in for an offloaded forward): a weight
is T1 however often it is loaded (docs/tiers.md 2), and kept on the object
it is no per-call scratch. A move into a local (``w =
self.proj.weight.to(x.dtype)``) keeps T4. A host copy of a weight
(``.weight.detach().pin_memory()``, ``.cpu()``) is that weight.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .index import ProjectIndex
from .move_apis import TENSOR_MOVES
from .names import SELF_MEMBER
from .retier import Decision, python_device_site, retier

# set-up work by its reason: a constructor, an initialiser, a method run once; not state a method
# adds into (an accumulator) or rebuilds when stale (a lazy member)
_FACTORY = re.compile(r"torch\.(?:empty|zeros|ones|full|tensor|as_tensor|arange|linspace|eye|rand\w*)")
_SET_UP = ("constructor ", "initialiser ", "set up once", "returned to constructor")
# `self.weights`, `self.all_weight`, `self.weight_list[i]`, `self._weights[k]`: the member, then entries
# a module's weight or bias, viewed or detached: `layer.self_attn.k_proj.weight.detach()`, `lin.bias.data`
WEIGHT_VALUE = re.compile(r"[A-Za-z_]\w*(?:\.\w+|\[[^\[\]]*\])*\.(?:weight|bias)"
                           r"(?:\.(?:data|T)|\.(?:detach|t|contiguous|float|half|bfloat16|clone|pin_memory|cpu)\(\))*")
_WEIGHT_MEMBER = re.compile(r"self\.(_?(?:\w+_)?weights?(?:_\w+)?)(?:\[[^\]]*\])*")


def weight_members(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        if python_device_site(site, Tier.T4) and site.api in TENSOR_MOVES and site.tier_reason.startswith("per call"):
            return bool(site.kept) and SELF_MEMBER.fullmatch(site.kept) is not None  # round 32: decided below
        return python_device_site(site, Tier.T2) and site.api in TENSOR_MOVES and site.tier_reason.startswith(_SET_UP)

    def decide(site: Site) -> Decision | None:
        if site.tier is Tier.T4:  # round 32: a weight kept on the object, however often it is moved there
            moved = _moved_weight(site, index)
            return (Tier.T1, f"weight upload: {site.scope} moves {moved} to the device into {site.kept}, kept on "
                             f"the object (was: {site.tier_reason})") if moved else None
        m = _WEIGHT_MEMBER.fullmatch(site.kept.removesuffix("[]")) if site.kept else None
        if m is None and site.kept and SELF_MEMBER.fullmatch(site.kept):
            moved = _moved_weight(site, index)
            if moved:
                return Tier.T1, (f"weight upload: {site.scope} moves {moved} to the device into {site.kept} "
                                 f"(was: {site.tier_reason})")
        if m is None or m.group(1).endswith(("_grad", "_grads", "_scratch", "_buffer", "_workspace")) \
                or _moves_fresh(site, index):
            return None
        return Tier.T1, (f"weight upload: {site.scope} moves data to the device into self.{m.group(1)}, the "
                         f"object's weights (was: {site.tier_reason})")

    return retier(sites, eligible, decide)


def _moved_weight(site: Site, index: ProjectIndex) -> str:
    """The weight the site moves: a module's ``.weight``/``.bias`` (viewed or detached), or a member the
    class binds only to such values ("" when it is neither). Round 31."""
    func = index.func(site.path, site.scope)
    if func is None:
        return ""
    span = site.span
    moves = [c for c in func.calls if c.span.line == span.line and c.span.col == span.col
             and c.callee.endswith((".to", ".cuda"))]
    if len(moves) != 1:
        return ""
    moved = moves[0].callee.rsplit(".", 1)[0]
    if WEIGHT_VALUE.fullmatch(moved) and not moved.startswith("self."):
        return f"another module's weight ({moved})"
    member = SELF_MEMBER.fullmatch(moved)
    owner = func.owner
    if member is None or owner is None or moved != (site.kept or ""):
        return ""
    bound: list[str] = []
    for methods in owner.methods.values():
        for method in methods:
            bound += [a.value.strip() for a in method.assigns
                      if a.op == "=" and moved in (t.strip() for t in a.targets)]
            # a call on a call's result (`(...).pin_memory`) is read whole from its statement's assignment
            bound += [f"{c.callee}({c.arglist})" for c in method.calls
                      if (c.target or "").strip() == moved and not c.callee.startswith("(")]
    values = [v for v in bound if not v.startswith(moved + ".") and v not in ("None", "")]
    if values and all(WEIGHT_VALUE.fullmatch(v) and not v.startswith("self.") for v in values):
        return f"{moved}, bound to another module's weight ({values[0]})"
    return ""


def _moves_fresh(site: Site, index: ProjectIndex) -> bool:
    """The moved value is made by a torch factory in the same expression
    (``torch.ones(1).to(device)``): a fresh buffer, not data handed in."""
    func = index.func(site.path, site.scope)
    span = site.span
    return func is not None and any(
        c.span.line == span.line and c.span.col >= span.col and c.span.end_line <= span.end_line
        and _FACTORY.fullmatch(c.callee) is not None for c in func.calls)
