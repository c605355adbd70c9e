"""Stage 5, after ``model_constants``: a tensor wrapped in
``nn.Parameter`` and moved to the device in the same expression is a
weight upload (issue 11, round 23).

``image_newline = torch.nn.Parameter(newline, requires_grad=False).to("cuda:0")``
at module level, in a constructor or a set-up method: a parameter is a
model weight whatever holds it, so its device copy is model-resident (T1),
not the module level's or the constructor's T2. Only set-up work is read
(T2 sites): a move per step keeps its tier, and so does a move of a
tensor that is no parameter. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site, Tier
from .index import ProjectIndex
from .move_apis import TENSOR_MOVES
from .retier import Decision, python_device_site, retier

_PARAMETER = re.compile(r"(?:torch\.)?(?:nn\.)?Parameter")


def parameter_uploads(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2) and site.api in TENSOR_MOVES

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.table is None:
            return None
        table, pos = func.table, func.table.positions
        # the move and the construction it is called on start where the site does
        here = [table.callees[i] for i in func.call_ix
                if pos[4 * i] == site.span.line and pos[4 * i + 1] == site.span.col]
        if not any(_PARAMETER.fullmatch(c) for c in here) or not any(c.endswith((".to", ".cuda")) for c in here):
            return None
        return Tier.T1, (f"weight upload: {site.scope} wraps the tensor in nn.Parameter and moves it to the "
                         f"device: a model weight, model-resident (was: {site.tier_reason})")

    return retier(sites, eligible, decide)
