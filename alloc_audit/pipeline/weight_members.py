"""Stage 5, last of the lifetimes: a device copy an object keeps under a
member named for weights is a weight upload (issue 11, round 19).

A move of existing data to the device (``.cuda()``, ``.to(device)``) kept
in a member that says it holds weights (``self.weights[k] =
self.weights[k].float().cuda()``, ``self.all_weight = all_weight.cuda()``,
``self.weight_list[i]``) uploads the model's weights: model-resident (T1),
not the constructor's or a set-up method's T2. Only set-up work: a move per
step (T4, a weight sync) keeps its tier, and so does a buffer made fresh
(``torch.zeros``: a workspace whatever its member is called). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .retier import Decision, python_device_site, retier

_MOVES = frozenset({"Tensor.cuda", "Tensor.to"})
# `self.weights`, `self.all_weight`, `self.weight_list[i]`, `self._weights[k]`: the member, then entries
_WEIGHT_MEMBER = re.compile(r"self\.(_?(?:\w+_)?weights?(?:_\w+)?)(?:\[[^\]]*\])*")


def weight_members(sites: Sequence[Site]) -> list[Site]:
    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2) and site.api in _MOVES

    def decide(site: Site) -> Decision | None:
        m = _WEIGHT_MEMBER.fullmatch(site.kept.removesuffix("[]")) if site.kept else None
        if m is None or m.group(1).endswith(("_grad", "_grads", "_scratch", "_buffer", "_workspace")):
            return None
        return Tier.T1, (f"weight upload: {site.scope} moves data to the device into self.{m.group(1)}, the "
                         f"object's weights (was: {site.tier_reason})")

    return retier(sites, eligible, decide)
