"""Stage 5, after the keyed caches: the tensors of an object a weight
keeps (a quantized weight's quantization state).

Input: classified sites and the project index. Output: the same sites, a
per-call (T4) Python device site in a method of a class ``S`` re-tiered T1
when a ``torch.nn.Parameter`` subclass of the project keeps an ``S`` on
itself (``self.quant_state = QuantState.from_dict(...)``: the state is
part of the weight) and the site is

- a move of the object's own tensors in its ``to``/``cuda`` method
  (``self.absmax = self.absmax.to(device)``): the state moves with the
  weight;
- an argument of the ``cls(...)`` a class-method factory builds and returns
  (``cls(absmax=d["absmax"].to(device), ...)``), directly or through a local
  it hands there (``offset = t.to(device)`` ... ``cls(..., offset=offset)``):
  the state a loaded weight is built with.

DESIGN.md ("Lifetime tiers"): weights and what belongs to them -> T1. A
class no parameter keeps, and other methods of ``S``, are left as they are.
The parameter classes are found once per scan, only when a candidate site
exists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER

_PARAMETER = re.compile(r"(?:torch\.)?(?:nn\.)?Parameter")
_MOVES = ("to", "cuda")


def weight_state(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    candidates = [i for i, s in enumerate(sites) if _candidate(s)]
    if not candidates:
        return list(sites)
    kept: dict[str, str] | None = None
    out = list(sites)
    for i in candidates:
        site = sites[i]
        func = index.func(site.path, site.scope)
        if func is None or func.owner is None:
            continue
        how = _how(site, func)
        if not how:
            continue
        if kept is None:
            kept = _kept_on_parameters(index)
        holder = kept.get(func.owner.name)
        if holder:
            out[i] = dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                f"state of a weight: {holder} keeps a {func.owner.name} on itself, and {site.scope} {how} "
                f"(was: {site.tier_reason})"))
    return out


def _candidate(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON
            and site.via is None and "." in site.scope)


def _how(site: Site, func: Func) -> str:
    target = (site.target or "").strip()
    if func.name in _MOVES and target.startswith("self."):
        return f"moves its own {target} with it"
    built = [c for c in func.calls if c.callee == "cls" and c.span.end_line >= site.span.line]
    if not built or not any(r.value.strip().startswith("cls(") or r.value.strip() in {c.target for c in built}
                            for r in func.returns):
        return ""
    for call in built:
        if call.span.contains(site.span):
            return "builds the returned object with it"
    if target.isidentifier():
        # through a local, or a local object built from it (`state2 = cls(absmax=...)` ... `cls(state2=state2)`)
        for call in built:
            if target in IDENTIFIER.findall(call.arglist):
                return f"builds the returned object with it ({target})"
    return ""


def _kept_on_parameters(index: ProjectIndex) -> dict[str, str]:
    """Class name -> the parameter class that stores an instance of it on
    itself (``self.x = Name(...)`` or ``self.x = Name.factory(...)``)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for func in index.functions():
        owner = func.owner
        if owner is None or owner.name in seen:
            continue
        seen.add(owner.name)
        if not any(_PARAMETER.fullmatch(b.strip()) for b in owner.bases):
            continue
        for methods in owner.methods.values():
            for method in methods:
                for call in method.calls:
                    if not (call.target or "").strip().startswith("self.") or "(" in call.callee:
                        continue
                    parts = call.callee.split(".")
                    for name in (parts[-1], parts[-2] if len(parts) > 1 else ""):
                        if name[:1].isupper() and index.classes_named(name):
                            out.setdefault(name, owner.name)
    return out

