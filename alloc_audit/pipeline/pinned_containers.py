"""Stage 5, after ``lifetimes``: a pinned buffer stored into a local
container (``sd[name] = torch.empty(..., pin_memory=True)``) that the
function then keeps on its object (``self.pinned_sd = sd``) lives as long
as the object: T5b, like one held in a plain local first (issue 11,
round 22).

    def _prepare_pinned(self, model):
        if self.pinned_sd is None:
            sd = {}
            for n, p in model.named_parameters():
                sd[n] = torch.empty(p.shape, pin_memory=True)   # T5b: kept in self.pinned_sd
            self.pinned_sd = sd

``lifetimes`` follows a pinned local to the member it is stored in; an
entry of a local dict or list is no local it follows. The container must be
a name the function binds to an empty literal (``{}``, ``[]``, ``dict()``,
``defaultdict(dict)``), fills by key (``sd[n]``, ``state[p]["buf"]``) or
``append``, and stores whole in ``self.x`` after the site, or installs whole
on the object (``self.__setstate__({"state": state, ...})``, as torch's
``Optimizer.load_state_dict`` does; ``self.x.update(sd)``): the pinned state
an offloading optimizer loads is its state for the run, not load-phase
staging. A container handed elsewhere or returned is left to the other
rules. A
method that rebinds the member unguarded per step is ``repinned_members``'
question (later). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .retier import Decision, retier

_ENTRY = re.compile(r"([A-Za-z_]\w*)(?:\[[^\]]+\])+")
_EMPTY = frozenset({"{}", "[]", "dict()", "list()", "OrderedDict()", "collections.OrderedDict()"})
# a dict of dicts made empty: `state = defaultdict(dict)`
_DEFAULT = re.compile(r"(?:collections\.)?defaultdict\(\s*(?:dict|list)?\s*\)")
_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")
# the object installs a state dict handed to it whole: `self.__setstate__({"state": state, ...})`
# (torch's `Optimizer.load_state_dict`), `self.state.update(state)`
_INSTALL = re.compile(r"self\.__setstate__|self\.[A-Za-z_]\w*\.update")


def pinned_containers(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.kind is SiteKind.PINNED_HOST and site.via is None
                and site.tier is Tier.T5A)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        line = site.stmt_line or site.span.line
        container = _container(func, (site.target or "").strip(), line)
        if not container:
            return None
        member = _kept_in(func, container, line)
        if not member:
            return None
        if member.endswith("(...)"):
            return Tier.T5B, (f"persistent pinned host buffer kept by the object: an entry of {container}, which "
                              f"{site.scope} installs whole as its state ({member}); was: {site.tier_reason}")
        return Tier.T5B, (f"persistent pinned host buffer kept in {member} by {site.scope} (an entry of "
                          f"{container} first, stored whole in {member}); was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _container(func: Func, target: str, line: int) -> str:
    """The local container whose entry the buffer becomes: ``sd[n] = alloc``,
    or ``t = alloc`` then ``sd[n] = t``; bound once to an empty literal."""
    found = _ENTRY.fullmatch(target)
    name = found.group(1) if found is not None else ""
    if not name and target.isidentifier():
        entries = [m.group(1) for a in func.assigns if a.line > line and a.value.strip() == target
                   for t in a.targets if (m := _ENTRY.fullmatch(t.strip())) is not None]
        name = entries[0] if len(set(entries)) == 1 else ""
    if not name or name == "self":
        return ""
    bound = [a for a in func.assigns if name in a.targets]
    # a call bound whole to the name is no assignment the index lists: `state = defaultdict(dict)`
    made = [c for c in func.calls if (c.target or "").strip() == name]
    if not bound and len(made) == 1 and made[0].span.line < line and _DEFAULT.fullmatch(
            f"{made[0].callee}({made[0].arglist.strip()})"):
        return name
    if len(bound) != 1 or made or bound[0].line >= line or len(bound[0].targets) != 1 \
            or bound[0].value.strip() not in _EMPTY:
        return ""
    return name


def _kept_in(func: Func, container: str, line: int) -> str:
    """The ``self.x`` the function stores the whole container in after
    ``line``, or the call that installs it whole on the object
    (``self.__setstate__({"state": container, ...})``)."""
    kept = [t for a in func.assigns if a.line > line and a.value.strip() == container
            for t in a.targets if _MEMBER.fullmatch(t.strip())]
    if len(kept) == 1:
        return kept[0].strip()
    word = re.compile(rf"(?<![\w.\[\"']){re.escape(container)}(?![\w\[(\"'])")
    installs = [c.callee for c in func.calls if c.span.line > line and _INSTALL.fullmatch(c.callee)
                and word.search(c.arglist)]
    return f"{installs[0]}(...)" if not kept and len(set(installs)) == 1 else ""
