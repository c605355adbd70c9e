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

Round 27: a set-up method of the class (a T2 site already) copying a member
the constructor bound to what it was handed (``: _enc_wei(tw.get_enc_wei())``,
a parameter or a getter called on one; ``to_gpu(_enc_wei[i + 1], n)``) uploads
the constructor's data as the constructor itself would: T1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER, has_word
from .retier import Decision, retier

# a copy into device memory (leaf name): `cudaMemcpy`, `cudaMemcpyAsync`, `hipMemcpy`, `cudaH2Dcpy`
_COPY = re.compile(r"(?:cuda|hip)\w*[Cc]py\w*")
_LEAF = re.compile(r"::|\.|->")
_ROOTED = re.compile(r"(?:this\s*->\s*)?([A-Za-z_]\w*)\s*(?:\[|$)")  # a member or one of its entries: `_w[i + 1]`
_FROM = re.compile(r"[A-Za-z_][\w.>-]*(?:\(\s*\))?$")  # a parameter, or a getter called on one: `tw`, `tw.get_w()`


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
    names = IDENTIFIER.findall(site.target or "")
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
    handed: tuple[str, ...] | None = None
    for factory in fitting:
        for inner in factory.sites:
            target = _target(inner)
            for at in sorted(_copied_params(factory, target, memo)) if target else ():
                if at >= len(args):
                    continue
                if any(p and has_word(args[at].text, p) for p in params):
                    return args[at].text
                if handed is None:
                    handed = _handed_members(func)
                rooted = _ROOTED.match(args[at].text.strip())
                if rooted is not None and rooted.group(1) in handed:
                    return (f"{args[at].text.strip()} (the member {rooted.group(1)}, bound by the constructor "
                            f"to what it is handed)")
    return ""


def _handed_members(func: Func) -> tuple[str, ...]:
    """The members of ``func``'s class that a constructor binds to what it
    is handed: a parameter, or a call on one (``: _w(tw.get_w())``,
    ``_w = w;``). A method copying such a member to the device uploads the
    constructor's data as the constructor itself would."""
    owner = func.owner
    if owner is None or func.scope is None or func.scope.role != "method":
        return ()
    out: list[str] = []
    for ctor in owner.methods.get(owner.name, []):
        if ctor.scope is None or ctor.scope.role != "constructor":
            continue
        params = [p for p in ctor.scope.params if p]
        for a in ctor.assigns:
            if a.op == "=" and a.type is None and len(a.targets) == 1 and a.targets[0].isidentifier() \
                    and _FROM.match(a.value.strip()) and any(has_word(a.value, p) for p in params):
                out.append(a.targets[0])
    return tuple(out)
