"""Stage 5, part of ``lifetimes``: optimizer state created once.

A buffer stored into an entry of a state dict the object holds (``state =
self.state[p]``, ``state["exp_avg"] = torch.zeros_like(p)``) under a guard
that it is not there yet (``if len(state) == 0:``, ``if "exp_avg" not in
state:``, ``if not state:``) is created on the first call and kept:
persistent, T2, not the step's per-call T4. A pinned host buffer stored so
(an offloading optimizer's host copy of a parameter, ``state["_param_fp32"]
= torch.empty(..., pin_memory=True)``) is pinned once and reused by every
step: T5b, not the step's per-call staging T5a (round 23). Pure.
"""

from __future__ import annotations

import dataclasses
import re

from ..model import Site, SiteKind, Tier
from .bound_values import bound_value
from .index import ProjectIndex

_ABSENT = re.compile(r"""len\(\s*([\w.\[\]"']+)\s*\)\s*==\s*0|not\s+([\w.\[\]"']+)\s*$|\s+not\s+in\s+([\w.\[\]"']+)""")


def state_created_once(site: Site, index: ProjectIndex) -> Site:
    target = (site.target or "").strip()
    m = re.fullmatch(r"([A-Za-z_][\w.]*(?:\[[^\]]+\])*)\[[^\]]+\]", target)
    if m is None:
        return site
    holder = m.group(1)
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    if _kept_holder(holder, index):
        holder_of = holder
    else:
        holder_of = bound_value(func, holder, site.span.line)
        if not holder_of or not _kept_holder(holder_of, index):
            return site
    for block in func.blocks:
        if not block.kind.startswith("if") or not block.span.contains_line(site.span.line):
            continue
        for g in _ABSENT.finditer(block.test):
            if (g.group(1) or g.group(2) or g.group(3) or "").strip() == holder:
                pinned = site.kind is SiteKind.PINNED_HOST
                return dataclasses.replace(site, tier=Tier.T5B if pinned else Tier.T2, tier_reason=(
                    f"{'pinned ' * pinned}state created once: stored in {target} ({holder_of}) under `if "
                    f"{block.test.strip()}` in {site.scope} and kept by the object{', reused by every step' * pinned}"))
    return site


def _kept_holder(holder: str, index: ProjectIndex) -> bool:
    """A container that outlives the call: on the object (``self.state``), or
    a class attribute (``Loader.static_buffers[stage]``, the class defined in
    the project)."""
    root, dot, _ = holder.partition(".")
    return holder.startswith("self.") or bool(dot and root[:1].isupper() and index.classes_named(root))
