"""Stage 5, last of the use-based passes: tensors a module takes as its own
parameters and buffers (issue 11, round 17).

Input: classified sites and the project index. Output: the same sites, the
Python device sites a module adopts re-tiered T1 with a reason naming the
call.

``model._apply(lambda t: torch.empty_like(t, device=d) if t.is_meta else
t.to(d))`` (or a local ``def fn(t): ...`` passed by name) replaces every
parameter and buffer of the module with what the function returns; and
``model.load_state_dict({key: param}, assign=True)`` makes the tensors it
is given the module's parameters (not copies). Either way the site makes
the model's weights, kept until the model is unloaded: T1 (DESIGN.md,
"Lifetime tiers"), whatever the code's role (a test materialising its
model holds weights as long as any loader). ``Module.apply(fn)`` passes
sub-modules, not tensors; ``load_state_dict`` without ``assign=True``
copies into the module's own tensors: neither is taken as the weights.

A local state a function builds and hands to a module's loader that copies
it (``load_state_dict(sd)`` without ``assign``, ``set_peft_model_state_dict
(model, sd)``), then drops, is a load-time temporary: T1 by the load-time
convention (round 19). One kept (returned, stored) is not, nor one in test
code (a state made for one check). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..globs import test_path
from ..model import Call, Site, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER
from .retier import Decision, python_device_site, retier

_LAMBDA = "<lambda>"
_ASSIGN = re.compile(r"\bassign\s*=\s*True\b")
_LOADER = re.compile(r"(?:^|\.)(?:_?load_state_dict|load_\w*state_dict|set_\w*state_dict)$")


def adopted_weights(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2, Tier.T3, Tier.T4)

    def decide(site: Site) -> Decision | None:
        return _applied(site, index) or _assigned(site, index) or _loaded(site, index)

    return retier(sites, eligible, decide)


def _applied(site: Site, index: ProjectIndex) -> Decision | None:
    if "." not in site.scope:
        return None
    outer, inner = site.scope.rsplit(".", 1)
    func = index.func(site.path, outer)
    if func is None or not any(c.endswith("._apply") for c in func.callees):
        return None
    call = next((c for c in func.calls if c.callee.endswith("._apply") and _maps(c, inner, site)), None)
    if call is None:
        return None
    owner = call.callee.rsplit(".", 1)[0]
    return Tier.T1, (f"replaces the parameters and buffers of {owner} through {owner}._apply "
                     f"(line {call.span.line}): the model's weights, kept until it is unloaded; "
                     f"was: {site.tier_reason}")


def _maps(call: Call, inner: str, site: Site) -> bool:
    """``call``'s first argument is the function the site is in: a lambda
    written in the call around the site, or a local function passed by name."""
    args = split_args(call.arglist)
    if not args or args[0].keyword not in (None, "fn"):
        return False
    first = args[0].text.strip()
    if inner == _LAMBDA:
        return first.startswith("lambda") and call.span.contains(site.span)
    return first == inner


def _assigned(site: Site, index: ProjectIndex) -> Decision | None:
    """The site's local is handed, later in the function, to a module's
    ``load_state_dict(..., assign=True)`` (in the state dict it passes)."""
    name = site.target
    if name is None or not IDENTIFIER.fullmatch(name):
        return None
    func = index.func(site.path, site.scope)
    if func is None or not any(c.endswith("load_state_dict") for c in func.callees):
        return None
    call = next((c for c in func.calls if _takes(c, name, site, func)), None)
    if call is None:
        return None
    owner = call.callee.rsplit(".", 1)[0]
    return Tier.T1, (f"becomes a parameter of {owner}: {owner}.load_state_dict(..., assign=True) at line "
                     f"{call.span.line} takes {name} itself: the model's weights; was: {site.tier_reason}")


def _takes(call: Call, name: str, site: Site, func: Func) -> bool:
    if not call.callee.endswith("load_state_dict") or call.span.line <= site.span.line:
        return False
    if not _ASSIGN.search(call.arglist):
        return False
    args = split_args(call.arglist)
    state = next((a.text for a in args if a.keyword in (None, "state_dict")), "")
    return name in IDENTIFIER.findall(state)


def _loaded(site: Site, index: ProjectIndex) -> Decision | None:
    """The site's local, dropped (kept nowhere), is handed later in the
    function to a loader that copies it into a module's weights."""
    name = site.target
    if test_path(site.path):
        return None  # a test's state for one check (the judges: its own tier), not a load path
    handed = site.kept.startswith("handed:") and _LOADER.search(site.kept[len("handed:"):]) is not None
    if name is None or not IDENTIFIER.fullmatch(name) or (site.kept != "local" and not handed):
        return None
    func = index.func(site.path, site.scope)
    if func is None or not any(_LOADER.search(c) for c in func.callees):
        return None
    call = next((c for c in func.calls if _LOADER.search(c.callee) and c.span.line > site.span.line
                 and not _ASSIGN.search(c.arglist)
                 and any(a.text.strip() == name for a in split_args(c.arglist))), None)
    if call is None:
        return None
    return Tier.T1, (f"load-time temporary: {name} is copied into a module's weights by {call.callee} (line "
                     f"{call.span.line}) and dropped; was: {site.tier_reason}")
