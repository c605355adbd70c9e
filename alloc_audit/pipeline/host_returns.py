"""Stage 5, before the tier passes: a ``*_like`` of what a project function
returns, when every return of that function builds a host tensor (issue 11,
round 18).

``perms = get_perms()`` then ``torch.empty_like(perms)`` (or
``torch.empty_like(get_perms())``), where every ``return`` of ``get_perms``
is ``torch.tensor(values, ...)`` / ``torch.as_tensor(...)`` /
``torch.from_numpy(...)`` without a device, or ends in ``.cpu()``: the copy
is a host tensor, as the extractor already decides for a local made so in
the same function (``extract/python_host.py``); here the producer is in
another function, so the index resolves it. A local bound any other way
too, a function with a return that moves or names a device, or a call
that does not resolve keeps the site. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site, SiteKind
from .index import Func, ProjectIndex

_HOST_RETURN = re.compile(r"torch\.(?:tensor|as_tensor|from_numpy)\(.*\)|.*\.cpu\(\)", re.S)
_DEVICE_WORDS = re.compile(r"device|\.to\(|\.cuda\(")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(.*\)", re.S)


def drop_host_returns(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The sites, less the ``*_like`` copies of host tensors a project function returns."""
    return [s for s in sites if not (s.api.endswith("_like") and s.via is None and s.kind is SiteKind.DEVICE
                                     and s.language is Language.PYTHON and s.device in (None, "unknown")
                                     and _of_host_return(s, index))]


def _of_host_return(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, call = found
    args = split_args(call.arglist)
    if not args or args[0].keyword is not None or any(a.keyword == "device" for a in args):
        return False
    source = args[0].text.strip()
    if source.isidentifier():
        if func.scope is not None and source in func.scope.params or any(source in a.targets for a in func.assigns):
            return False  # a parameter, or bound by something other than a call
        producers = [c for c in func.calls if (c.target or "").strip() == source]
    else:
        name = _callee(source).rsplit(".", 1)[-1]  # the facts keep the callee as imported (`pkg.mod.f`)
        producers = [c for c in func.calls if c.span.line == site.span.line and site.span.col < c.span.col
                     and c.callee.rsplit(".", 1)[-1] == name] if name else []
    if not producers:
        return False
    return all(host_producer(func, c.callee, index) for c in producers)


def _callee(text: str) -> str:
    m = _CALL.fullmatch(text)
    return m.group(1) if m is not None else ""


def host_producer(func: Func, callee: str, index: ProjectIndex) -> bool:
    """Every function ``callee`` resolves to returns a host tensor on every ``return``."""
    targets = index.resolve(func, callee) if callee else ()
    if not targets:
        return False
    for target in targets:
        values = [r.value.strip() for r in target.returns]
        if not values or not all(_HOST_RETURN.fullmatch(v) and not _DEVICE_WORDS.search(v.removesuffix(".cpu()"))
                                 for v in values):
            return False
    return True
