"""Stage 4, derive (C++): constructing a native model class is a weight
upload.

A C++ class whose constructor registers what it allocates as the model's
parameters or children (``registerParams(qweight, "qweight")``,
``registerChildren(attn, "attn")``: the engine's ``Module`` convention, as
``register_buffer``/``register_parameter`` are torch's) holds weights. A
derived site that constructs one (``net = std::make_unique<GEMM_W8A8>(...)``
in a binding's ``init``; a block built in its parent model's constructor) is
model-resident (T1), whoever builds it: the initialiser and constructor
names say only when it runs. So is a derived buffer that its own function
registers (``weight_ = std::make_shared<Buffer>(n); registerParams(weight_,
"weight")``). Pure: sites in, sites out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..model import Language, Site, SiteKind, Tier
from .index import ProjectIndex
from .retier import Decision, retier

# a call that registers a member on the model being built (leaf name)
_REGISTERS = re.compile(r"register_?(?:params?|parameters?|buffers?|children|child|modules?|submodules?)", re.I)


def native_module_state(derived: Iterable[Site], index: ProjectIndex) -> list[Site]:
    """Derived C++ sites that construct a class registering its members: T1."""
    memo: dict[str, str | None] = {}

    def eligible(site: Site) -> bool:
        return site.tier is not Tier.T1 and site.kind is SiteKind.DEVICE and site.language is not Language.PYTHON

    def decide(site: Site) -> Decision | None:
        call = _registers_target(index, site) or _registering_call(index, site.api, memo)
        if call is None:
            return None
        return Tier.T1, (f"constructs {site.api}: its constructor registers its buffers on the model ({call}): "
                         f"model weights, whoever builds it (was: {site.tier_reason})")

    return retier(list(derived), eligible, decide)


def _registers_target(index: ProjectIndex, site: Site) -> str | None:
    """The call of the site's own function that registers its target
    (``weight_ = make_shared<Buffer>(n); registerParams(weight_, "weight")``)."""
    func = index.func(site.path, site.scope)
    target = site.target.strip() if site.target else ""
    if func is None or not target:
        return None
    for call in func.calls:
        leaf = re.split(r"::|\.|->", call.callee)[-1]
        if _REGISTERS.fullmatch(leaf) is not None and target in re.findall(r"[A-Za-z_][\w.>-]*", call.arglist):
            return leaf
    return None


def _registering_call(index: ProjectIndex, api: str, memo: dict[str, str | None]) -> str | None:
    """The registering call of a constructor of the class ``api`` names, or None."""
    name = re.split(r"::|\.", api)[-1]
    if name in memo:
        return memo[name]
    found = None
    for cls in index.classes_named(name):
        for ctor in index.constructors(cls):
            for call in ctor.calls:
                leaf = re.split(r"::|\.|->", call.callee)[-1]
                if _REGISTERS.fullmatch(leaf) is not None:
                    found = leaf
                    break
            if found:
                break
        if found:
            break
    memo[name] = found
    return found
