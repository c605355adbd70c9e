"""Stage 5, after the use-based passes: a tensor stored into an object's
slot that the object keeps as state (issue 11, round 17).

Input: classified sites, the project index and the caller globs. Output:
the same sites, per-call (T4) Python device sites stored to ``self.x`` re-tiered
T2 when another method of the same class builds ``self.x`` lazily (T2).

``check_trigger`` keeps its flag in ``self.flag`` (built lazily: T2 by
``lazy_members``); ``set_trigger`` and the reset in ``check_trigger`` put a
new flag into the same slot. The object holds the slot for its whole life,
whichever method filled it last: the stores are the same state, T2
(DESIGN.md, "Lifetime tiers": made once per process and kept). A store in a
per-step method (``forward``, by the ``[callers] per_step`` globs) stays
per call: the slot there is a scratch the step replaces; so does a store
whose size or data comes from the method's arguments (an upload of the
caller's data, a regrow to the caller's size). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Site, Tier
from .index import ProjectIndex
from .names import IDENTIFIER
from .retier import Decision, python_device_site, retier

_LAZY = "created lazily"  # lazy_members' reason: the class rebuilds the slot only when it is missing


def kept_slots(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    held: dict[tuple[str, str, str], Site] = {}
    for site in sites:
        key = _slot(site)
        if key is not None and python_device_site(site, Tier.T2) and site.tier_reason.startswith(_LAZY):
            held.setdefault(key, site)
    if not held:
        return list(sites)
    per_step = matcher(globs.per_step) if globs.per_step else (lambda _n: False)

    def decide(site: Site) -> Decision | None:
        key = _slot(site)
        other = held.get(key) if key is not None else None
        if other is None or per_step(site.scope.rsplit(".", 1)[-1]) or _from_arguments(site, index):
            return None
        return Tier.T2, (f"replaces {site.target}, which {other.scope} keeps as the object's state "
                         f"(line {other.span.line}, T2): the slot lives with the object; was: {site.tier_reason}")

    # a move (`self.x = self.x.to(d)`) is the module-move passes' question, not a new tensor for the slot
    return retier(sites, lambda s: python_device_site(s, Tier.T4) and not s.api.endswith((".to", ".cuda")), decide)


def _slot(site: Site) -> tuple[str, str, str] | None:
    """(file, class, attribute) of a method's ``self.x = <site>`` store."""
    target = site.target
    if target is None or not target.startswith("self.") or "." in target[5:] or "[" in target:
        return None
    if site.kept != target or site.scope.count(".") != 1:
        return None
    return site.path, site.scope.split(".", 1)[0], target


def _from_arguments(site: Site, index: ProjectIndex) -> bool:
    """The size or data comes from the method's arguments (`torch.tensor(host)`,
    `torch.empty(n)`): a per-call upload or a regrow, not a reset of the state."""
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or site.size is None:
        return True
    params = set(func.scope.params) - {"self"}
    return any(word in params for word in IDENTIFIER.findall(site.size))
