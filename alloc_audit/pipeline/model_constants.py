"""Stage 5, after ``weight_members``: data an object's constructor keeps
beside the model it moves to the device lives with that model (issue 11,
round 23).

A wrapper that loads a model in its constructor (``self.model =
build(...).to(device)``, a whole-module move: a weight upload, T1) and
keeps next to it tensors made from data (``self.mean =
torch.tensor(mean, device=device)``: normalisation constants, tables the
model is used with) holds them for as long as it holds the model: model-
resident (T1), not the constructor's T2. Only tensors built from data
(``torch.tensor``, ``torch.as_tensor``) kept in a plain member of the
object count: a buffer made fresh (``torch.zeros``, ``torch.empty``: a
workspace), a move of a tensor made elsewhere (``self.ids =
self.ids.to(device)``: the fixtures' convention keeps it the
constructor's), an entry of a container, or a constructor that keeps no
model on the device keep their tier. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .index import ProjectIndex
from .retier import Decision, python_device_site, retier

_DATA = frozenset({"torch.tensor", "torch.as_tensor"})
_MODULE_MOVES = frozenset({"Module.to", "Module.cuda"})
_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")


def model_constants(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    models: dict[tuple[str, str], Site] = {}
    for site in sites:
        if (python_device_site(site, Tier.T1) and site.api in _MODULE_MOVES
                and _MEMBER.fullmatch((site.target or "").strip()) and site.scope.endswith(".__init__")):
            models.setdefault((site.path, site.scope), site)
    if not models:
        return list(sites)

    def eligible(site: Site) -> bool:
        return (python_device_site(site, Tier.T2) and site.api in _DATA and (site.path, site.scope) in models
                and site.tier_reason.startswith("constructor ")
                and _MEMBER.fullmatch((site.target or "").strip()) is not None)

    def decide(site: Site) -> Decision | None:
        model = models[(site.path, site.scope)]
        return Tier.T1, (f"kept with the model: {site.scope} keeps this data in {(site.target or '').strip()} "
                         f"beside the model it moves to the device ({(model.target or '').strip()}, "
                         f"line {model.span.line}): it lives as long as the model (was: {site.tier_reason})")

    return retier(sites, eligible, decide)
