"""Stage 5a, after derive: a construction whose only allocation is the new
object moving itself to the device of its own weight, where nothing in the
construction names a device, moves nothing (issue 11, round 35).

    class Linear(nn.Linear, LoraLayer):
        def __init__(self, name, n_in, n_out, r=0, **kwargs):
            nn.Linear.__init__(self, n_in, n_out, **kwargs)
            self.update_layer(name, r)

    class LoraLayer:
        def update_layer(self, name, r):
            self.lora_A[name] = nn.Linear(self.in_features, r, bias=False)
            self.to(self.weight.device)         # to where the weight is

    new_module = Linear(name, n_in, n_out, bias=bias, **kwargs)   # no site

``self.to(self.W.device)`` puts the module's tensors where its member
``W`` is. During the construction every tensor of the object is made
without a device, so all sit on one device, the default one, ``W`` among
them: the move copies nothing, and the construction makes no device
memory (judged "not-a-site": the layers are built on the host, moved later
by the caller). The derived site goes when every allocation that counts
(as ``off_device`` counts them) reached from the class's constructors is
such a move, reached through calls on the object being built (``self.m()``,
``Base.__init__(self, ...)``, ``super()``); no call in the constructors or
on the way spells a device (``device=``, ``.to(``, ``.cuda(``) but the
move itself; the construction's own arguments name no device and any
``**spread`` it passes is a dict the caller writes out without one, never
updated; and the caller is under no default-device context. The same
method called on a module already on the GPU (``target.update_layer(...)``)
moves its new layers there: that move stays a site. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site, Tier
from .index import Func, ProjectIndex, Reach
from .move_apis import MOVES

_DEPTH = 3  # as the derived sites' own search
_OWN_MOVE = re.compile(r"self\.to\(\s*(?:device\s*=\s*)?self\.[A-Za-z_]\w*\.device\s*\)")
_PLACES = re.compile(r"\bdevice\s*=|\.to\(|\.cuda\(|\.to_empty\(")


def drop_own_device_moves(derived: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The derived sites, less constructions whose only allocation is the object's move to its own weight's device."""
    return [s for s in derived if s.via is None or s.language is not Language.PYTHON or not _own_move_only(s, index)]


def _own_move_only(site: Site, index: ProjectIndex) -> bool:
    via = site.via
    if via is None or via.api not in MOVES:
        return False  # the cheap test: a derived site stands for a move
    found = index.site_call(site)
    if found is None:
        return False
    caller, call = found
    cls = index.constructed_class(caller, call)
    starts = index.constructors(cls) if cls is not None else []
    forwards = any("**" in c.arglist for f in starts for c in f.calls)  # `Base.__init__(self, **kwargs)`
    if not starts or not _plain_arguments(caller, call, forwards):
        return False
    counted = False
    for start in starts:
        for reached in index.reach(start, _DEPTH):
            candidate = reached.site
            if not candidate.acquires or (candidate.tier is Tier.T1 and candidate.api not in MOVES):
                continue  # a layer's own weights are counted where they are made (as `off_device` counts)
            if not _own_move(reached, start, index):
                return False
            counted = True
    return counted


def _own_move(reached: Reach, start: Func, index: ProjectIndex) -> bool:
    """``reached`` is ``self.to(self.W.device)`` on the object ``start`` builds, and no function on the way
    places a tensor anywhere else."""
    funcs = [start]
    for i, hop in enumerate(reached.hops):
        if not hop.call.callee.startswith(("self.", "super")) and not _base_call(hop.call):
            return False  # another object's method: not the object being built
        nxt = reached.hops[i + 1] if i + 1 < len(reached.hops) else None
        func = index.func(nxt.path, nxt.caller) if nxt is not None else index.func(reached.site.path,
                                                                                reached.site.scope)
        if func is None:
            return False
        funcs.append(func)
    found = index.site_call(reached.site)
    if found is None or _OWN_MOVE.fullmatch(f"{found[1].callee}({found[1].arglist})") is None:
        return False
    move = found[1]
    return not any(c is not move and c.span != move.span and _PLACES.search(f"{c.callee}({c.arglist})")
                   for f in funcs for c in f.calls)


def _base_call(call: Call) -> bool:
    """``Base.__init__(self, ...)``: the base's constructor on the object being built."""
    args = split_args(call.arglist)
    return call.callee.endswith(".__init__") and bool(args) and args[0].text.strip() == "self"


def _plain_arguments(caller: Func, call: Call, forwards: bool) -> bool:
    """The construction names no device, under no default-device context, and (where a constructor
    ``forwards`` its keywords) each ``**name`` it spreads is a dict the caller writes out once without a device
    and updates with none."""
    if re.search(r"\bdevice\b|cuda|\.to\(", call.arglist):
        return False
    line = call.span.line
    if any(w.body.line <= line <= w.body.end_line and any("device" in i.callee for i in w.items)
           for w in caller.withs) or any(c.callee.endswith("set_default_device") for c in caller.calls):
        return False
    for arg in split_args(call.arglist) if forwards else ():
        text = arg.text.strip()
        if not text.startswith("**"):
            continue
        name = text[2:].strip()
        bound = [a for a in caller.assigns if name in a.targets]
        value = bound[0].value.lstrip() if len(bound) == 1 else ""
        written = value.startswith(("{", "dict(")) and "device" not in value
        updated = any(c.callee == f"{name}.update" and "device" in c.arglist or (c.target or "").strip() == name
                      for c in caller.calls)
        keyed = any(a.targets and a.targets[0].startswith(f"{name}[") and "device" in a.targets[0]
                    for a in caller.assigns)
        if not name.isidentifier() or not written or updated or keyed:
            return False
    return True
