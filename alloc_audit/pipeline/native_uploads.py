"""Stage 5, after derive (C++): a copy of data a constructor is handed into a
device buffer it keeps is the model's weights (issue 11, round 19).

A native class built from weights (a TensorRT plugin given ``nvinfer1::
Weights``, a layer given host arrays) copies each one to the device when it
is built and keeps the copy for its life: ``kernel_ = mallocAndCopy(
weights_, w[i])``, where the factory allocates and fills its buffer from
its parameter (``cudaMalloc(&dp, n); cudaMemcpy(dp, w.values, n, ...)``),
or the constructor's own ``cudaMalloc(&bias_, n); cudaMemcpy(bias_,
bias.values, n, ...)``. Model-resident (T1), not the constructor's T2:
what is copied comes from the caller, as a checkpoint's tensors do. What the
constructor allocates without a copy (a workspace), or fills from data it
makes itself (a table computed into a local), stays T2. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import has_word
from .retier import Decision, retier

# a copy into device memory (leaf name): `cudaMemcpy`, `cudaMemcpyAsync`, `hipMemcpy`, `cudaH2Dcpy`
_COPY = re.compile(r"(?:cuda|hip)\w*[Cc]py\w*")
_LEAF = re.compile(r"::|\.|->")
_NAME = re.compile(r"[A-Za-z_]\w*")


def native_uploads(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """C++ T2 sites whose buffer is filled from what the function is handed: T1."""
    memo: dict[tuple[str, str], frozenset[int]] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.language is not Language.PYTHON

    def decide(site: Site) -> Decision | None:
        found = _derived_upload(site, index, memo) if site.via is not None else _direct_upload(site, index, memo)
        if not found:
            return None
        return Tier.T1, (f"weight upload: {site.scope} copies {found}, which it is handed, into a device buffer it "
                         f"keeps (was: {site.tier_reason})")

    return retier(sites, eligible, decide)


def _copied_params(func: Func, target: str, memo: dict[tuple[str, str], frozenset[int]]) -> frozenset[int]:
    """The positions of ``func``'s parameters that a copy call writes into
    ``target`` (``cudaMemcpy(target, param.values, ...)``), not back to the host."""
    key = (func.id, target)
    found = memo.get(key)
    if found is None:
        params = func.scope.params if func.scope is not None else ()
        hits: set[int] = set()
        for call in func.calls:
            if _COPY.fullmatch(_LEAF.split(call.callee)[-1]) is None or "ToHost" in call.arglist:
                continue
            args = split_args(call.arglist, cpp=True)
            if len(args) >= 2 and has_word(args[0].text, target):
                hits.update(i for i, p in enumerate(params) if p and has_word(args[1].text, p))
        found = memo[key] = frozenset(hits)
    return found


def _target(site: Site) -> str:
    names = _NAME.findall(site.target or "")
    return names[-1] if names else ""


def _direct_upload(site: Site, index: ProjectIndex, memo: dict[tuple[str, str], frozenset[int]]) -> str:
    """``cudaMalloc(&bias_, n); cudaMemcpy(bias_, bias.values, ...)``: the
    parameter copied in, or ""."""
    func = index.func(site.path, site.scope)
    target = _target(site)
    if func is None or func.scope is None or not target:
        return ""
    copied = _copied_params(func, target, memo)
    return ", ".join(func.scope.params[i] for i in sorted(copied))


def _derived_upload(site: Site, index: ProjectIndex, memo: dict[tuple[str, str], frozenset[int]]) -> str:
    """``kernel_ = mallocAndCopy(weights_, w[i])`` in a function with the
    parameter ``w``, the factory copying its second parameter into what it
    allocates: the argument copied in, or ""."""
    found = index.site_call(site)
    if found is None or found[0].scope is None:
        return ""
    func, call = found
    params = found[0].scope.params
    args = split_args(call.arglist, cpp=True)
    factories = [f for f in index.resolve(func, call) if f.scope is not None]
    fitting = [f for f in factories if f.scope is not None and len(f.scope.params) == len(args)] or factories
    for factory in fitting:
        for inner in factory.sites:
            target = _target(inner)
            for at in sorted(_copied_params(factory, target, memo)) if target else ():
                if at < len(args) and any(p and has_word(args[at].text, p) for p in params):
                    return args[at].text
    return ""
