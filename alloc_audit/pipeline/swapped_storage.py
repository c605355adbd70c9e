"""Stage 5, after the tier passes: a parameter's storage swapped in for a
while and restored in the same function is a temporary (issue 11, round 22).

    saved = [(p, p.data) for p in params]
    for p, w in originals:
        p.data = w.to(device=p.data.device)      # swapped in: T4, not model state
    reference = model(x)
    for p, s in saved:
        p.data = s                               # the saved storage restored

A T1 site that ``lifetimes`` made the storage of a parameter (stored to
``P.data``) where the same function read ``P.data`` into a saved value
before the store (an assignment whose value mentions it) and stores a plain
name into ``P.data`` again after it: the swapped-in copy is dropped when
the original comes back, T4. A store with no saved copy before it, or not
restored after it, stays the parameter's storage. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import Site, Tier
from .index import ProjectIndex
from .names import has_word
from .retier import Decision, python_device_site, retier

_STORAGE = "model-resident: becomes the storage of parameters"  # lifetimes' reason


def swapped_storage(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        target = (site.target or "").replace(" ", "")
        return python_device_site(site, Tier.T1) and site.tier_reason.startswith(_STORAGE) \
            and target.endswith(".data") and target[:-5].isidentifier()

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        target = (site.target or "").replace(" ", "")
        line = site.span.line
        saved = max((a for a in func.assigns if a.line < line and a.op == "=" and target not in a.targets
                     and has_word(a.value.replace(" ", ""), target)), key=lambda a: a.line, default=None)
        restored = next((a for a in func.assigns if a.line > line and a.op == "=" and a.targets == (target,)
                         and a.value.strip().isidentifier()), None)
        if saved is None or restored is None:
            return None
        return Tier.T4, (f"swapped in: {target} is saved at line {saved.line} and restored at line "
                         f"{restored.line} in {site.scope}; was: {site.tier_reason}")

    return retier(sites, eligible, decide)
