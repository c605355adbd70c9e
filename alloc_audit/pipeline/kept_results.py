"""Stage 5, classify (after the derived sites): results kept by something
that outlives the call.

Input: classified sites (direct and derived), the project index and the
per-step caller globs. Output: the same sites, a few re-tiered T2 with a
reason naming what keeps them. DESIGN.md ("Lifetime tiers"): kept for the
process -> persistent.

- A tensor returned by a function under ``@functools.lru_cache`` /
  ``@functools.cache`` (``get_pad_tensor``) is kept by the cache and handed
  out again on the next call: it lives for the process, not per call. It
  must be what is returned (itself, in a tuple, or handed to an object the
  function returns): an example input only handed to the compiler whose
  kernel is returned (``return cute.compile(k, from_dlpack(t))``) is
  dropped on return, per call (round 23). Round 25: a local handed to the
  object the function returns (``return GraphState(input_ids=input_ids,
  ...)``, the keyword's value) or built inside the returned expression counts
  as returned, whatever flow analysis said of where it goes (a handed
  tensor, not only ``return``); a plain local stays per call.
- An object with persistent buffers (a derived site whose ``via`` is a
  persistent buffer of its constructor) kept on ``self`` by a method
  (``self.state = DecoderState(...)`` in ``_graph_reinitialize``) lives as
  long as the holder, like the buffers its constructor keeps: T2, unless the
  method is a per-step function itself (then the object is re-made on every
  step).
- A native device allocation (``cudart.cudaMalloc``) that its function
  hands to a method of another object (``engine.activate(mem)``), never
  frees and never returns is kept by that object: T2.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Return, Site, Tier
from .index import ProjectIndex, last_name

# native allocations reached from Python (ctypes, cuda-python): freed only by
# an explicit free
_RAW = re.compile(r"(?:[\w.]+\.)?(?:cudaMalloc|cuMemAlloc|hipMalloc|hipMemAlloc|hipExtMalloc)\w*")
# the runtime's own calls (`cudart.cudaMemset(ptr, ...)`, `cudaIpcGetMemHandle`)
# keep nothing
_RUNTIME = re.compile(r"cuda|cu[A-Z]|hip")
_FREE = re.compile(r"(?:[\w.]+\.)?\w*[Ff]ree\w*")
_CONSTRUCTION = re.compile(r"(?:[\w.]+\.)?[A-Z]\w*\((.*)\)", re.S)
_OPENED = re.compile(r"(?:[\w.]+\.)?[A-Z]\w*\((.*)", re.S)  # the start of a construction whose text was cut
_CACHING = frozenset({"functools.lru_cache", "functools.cache", "lru_cache", "cache"})


def kept_results(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None
    persistent = {(s.path, s.span.line) for s in sites if s.via is None and s.tier is Tier.T2}
    out = []
    for site in sites:
        if site.tier is Tier.T4 and site.language is Language.PYTHON:
            if site.via is None and (site.kept == "return" or (site.kept != "local" and _in_cached(site, index))):
                site = _cached(site, index)
            elif site.via is not None and (site.via.path, site.via.line) in persistent:
                site = _kept_on_self(site, index, per_step)
            elif site.via is None and _RAW.fullmatch(site.api):
                site = _raw_handed(site, index)
        out.append(site)
    return out


def _cached(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None:
        return site
    deco = next((d for d in func.scope.decorators if d in _CACHING), None)
    if deco is None or not _returns_itself(site, func.returns):
        return site
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"cached: {func.qualname} is decorated with @{deco}, which keeps the tensor it returns for the "
        f"process; {site.tier_reason}"))


def _in_cached(site: Site, index: ProjectIndex) -> bool:
    """The site's function is cache-decorated: a tensor it hands to the
    object or container it returns (``return State(ids=ids)``) is kept by
    the cache as much as one it returns itself (``_returns_itself`` decides)."""
    func = index.func(site.path, site.scope)
    return func is not None and func.scope is not None and any(d in _CACHING for d in func.scope.decorators)


def _returns_itself(site: Site, returns: Sequence[Return]) -> bool:
    """The tensor itself is what the function returns (``return t``,
    ``return t, scale``, ``return t[:n]``, ``return t.contiguous()``), so
    the cache keeps it. A local
    only handed to the call whose result is returned (``return
    compile(kernel, from_dlpack(t))``: an example input of a compiled
    kernel) is dropped on return: the cache keeps the kernel; one handed
    to a class (``return Holder(t)``) is kept by the object. A site in the
    return statement itself counts as returned."""
    name = (site.target or "").strip()
    if not name.isidentifier():
        return True
    item = re.compile(rf"{re.escape(name)}(?:[.\[].*)?", re.S)  # itself, a view or a method of it
    for ret in returns:
        text = ret.value.strip()
        built = _CONSTRUCTION.fullmatch(text)
        if built is None and text.count("(") > text.count(")"):  # a long return, its text cut short
            built = _OPENED.match(text)
        if built is not None:  # `return Holder(t, n)`: the object keeps what it is given
            text = built.group(1)
        elif text[:1] in "([{" and text[-1:] in ")]}":
            text = text[1:-1]
        if any(item.fullmatch(a.text.strip()) for a in split_args(text)):
            return True
    return False


def _kept_on_self(site: Site, index: ProjectIndex, per_step: Callable[[str], bool] | None) -> Site:
    target = site.target or ""
    if not target.startswith("self.") or "[" in target:
        return site
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in ("function", "method"):
        return site
    if per_step is not None and per_step(func.name):
        return site
    via = site.via
    assert via is not None
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"kept on the object: {func.qualname} stores it in {target}, and {site.api} keeps {via.api} "
        f"({via.path}:{via.line}) for its lifetime"))


def _raw_handed(site: Site, index: ProjectIndex) -> Site:
    target = (site.target or "").strip()
    func = index.func(site.path, site.scope) if target.isidentifier() else None
    if func is None:
        return site
    word = re.compile(r"\b" + re.escape(target) + r"\b")
    uses = [c for c in func.calls if c.span.line > site.span.line and word.search(c.arglist)]
    if any(_FREE.fullmatch(c.callee) for c in uses) or any(word.search(r.value) for r in func.returns):
        return site
    handed = next((c for c in uses if "." in c.callee and not _RUNTIME.match(last_name(c.callee))
                   and any(a.text.strip() == target and a.keyword is None for a in split_args(c.arglist))), None)
    if handed is None:
        return site
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"kept: {func.qualname} hands the native allocation {target} to {handed.callee} and never frees it: "
        f"it lives as long as what holds it ({site.tier_reason})"))
