"""Stage 5, beside weight_holders: native weights kept as plain members
(issue 11, round 34).

Input: the sites and the index; output: the sites, some moved to T1.
A C++ model class need not register its weights (``register_parameter``
gives T1 already): a quantised linear layer makes ``qweight_ =
torch::empty({k, n}, options.dtype(torch::kInt32))``, ``scales_``,
``bias_`` in its constructor and fills them from the checkpoint in its
loader (``load_state_dict(const StateDict& state_dict)``). The allocation
is the storage of a weight: model-resident (T1), not the constructor's T2.

A member is filled from a checkpoint when a method of the same class that
reads one (a parameter typed or named as a state dict or checkpoint)

- copies into it (``qweight_.copy_(state_dict.get_tensor("qweight"))``,
  ``set_data``), or
- hands it to a call together with that parameter
  (``WeightUtils::load_weight(state_dict, "qweight", qweight_, loaded_)``), or
- names it to a macro by its stem (``LOAD_WEIGHT(qweight)``,
  ``LOAD_SHARDED_WEIGHT(scales, 1)``: the macro pastes ``name##_``; an
  upper-case callee whose first argument is the member without its
  trailing ``_``, and whose call names the parameter or is such a macro).

Left alone: a member the loader does not fill (a kernel workspace
``workspace_ = torch::zeros(...)`` beside the weights stays T2), a member
filled from anything but the checkpoint parameter, a class with no loader,
allocations outside the constructor. Pure: sites in, sites out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import ProjectIndex
from .index.symbols import Func
from .retier import Decision, retier

# a parameter that holds a checkpoint: its type or its name says so
_CHECKPOINT = re.compile(r"state_?dict|checkpoint|safetensors?", re.I)
_COPY_INTO = frozenset({"copy_", "set_data"})
_MACRO = re.compile(r"[A-Z][A-Z0-9_]*")
_IDENT = re.compile(r"[A-Za-z_]\w*")


def native_weight_members(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """Constructor allocations of members a loader of the class fills from a checkpoint: T1."""
    memo: dict[int, dict[str, str]] = {}

    def eligible(site: Site) -> bool:
        return (site.language is not Language.PYTHON and site.kind is SiteKind.DEVICE and site.via is None
                and site.tier is Tier.T2 and bool(site.target))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.owner is None or func.scope is None or func.scope.role != "constructor":
            return None
        cls = func.owner
        filled = memo.get(id(cls))
        if filled is None:
            filled = memo[id(cls)] = _filled_members(m for ms in cls.methods.values() for m in ms)
        member = _member(site.target or "")
        how = filled.get(member) if member else None
        if how is None:
            return None
        return Tier.T1, (f"weight kept as a member: {member} is filled from the checkpoint by {how} "
                         f"(was: {site.tier_reason})")

    return retier(sites, eligible, decide)


def _member(target: str) -> str | None:
    t = target.replace(" ", "")
    t = t[6:] if t.startswith("this->") else t
    return t if _IDENT.fullmatch(t) else None


def _filled_members(methods: Iterable[Func]) -> dict[str, str]:
    """Members each loader method (one with a checkpoint parameter) fills from it: member -> the loader's name."""
    out: dict[str, str] = {}
    for m in methods:
        scope = m.scope
        if scope is None or scope.role == "constructor":
            continue
        params = [p for p, t in zip(scope.params, scope.param_types + ("",) * len(scope.params))
                  if _CHECKPOINT.search(p) or _CHECKPOINT.search(t)]
        if not params:
            continue
        for call in m.calls:
            parts = re.split(r"::|\.|->", call.callee.replace(" ", ""))
            leaf = parts[-1]
            args = _IDENT.findall(call.arglist)
            names_param = any(p in args for p in params)
            if leaf in _COPY_INTO and len(parts) >= 2:
                receiver = _member(parts[-2])
                if receiver and names_param:
                    out.setdefault(receiver, m.name)
            elif _MACRO.fullmatch(leaf) and args and "LOAD" in leaf:
                out.setdefault(args[0] + "_", m.name)
                out.setdefault(args[0], m.name)
            elif names_param:
                for a in args:
                    if a not in params:
                        out.setdefault(a, m.name)
    return out
