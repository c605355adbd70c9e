"""Stage 5, before the callers: a factory's ``pin_memory=NAME`` pins only
when ``NAME`` can be true (issue 11, round 23).

    def arange(end, *, device=None, pin_memory=None):   # no caller passes True
        if pin_memory is None:
            pin_memory = False
        out = torch.empty(n, device=device, pin_memory=pin_memory)   # a device output, T4

The extractor reads a ``pin_memory=`` that is no literal ``True`` or
``False`` as "pinned if NAME" (``device`` ``cpu (pinned if NAME)``). Here
the name is followed: a local of the function whose every binding is the
literal ``False`` or ``None``, a module constant bound so, or a parameter
whose default is ``False``/``None``, which the function rebinds only to
those literals, and for which the function's own ``parametrize`` lists
and every call that resolves to it pass only those literals or a
parameter of the caller that cannot be true either (followed up to four
calls). Such a flag never pins: the factory allocates where its
``device=`` says, so the site becomes a device site of that device and is
tiered again (a CPU or ``meta`` device, or none given: no device memory,
no site). A default that is not a literal, a parameter with no default
that nothing binds, a call with ``*args``/``**kwargs``, a literal
``True`` or any other expression anywhere on the way keeps the pinned
site. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..arglists import split_args
from ..catalog import TierPattern
from ..model import FileFacts, Language, Site, SiteKind
from .classify import classify_sites
from .cpu_locals import Parametrize, parametrized_values
from .extract.python_sites import classify_device
from .host_params import calls_of
from .index import Func, ProjectIndex
from .index.values import LITERAL, NONE

_PREFIX = "cpu (pinned if "
_FALSY = frozenset({"False", "None"})
_DEPTH = 4


def unpinned_flags(sites: Sequence[Site], index: ProjectIndex, files: Mapping[str, FileFacts],
                   patterns: Sequence[TierPattern]) -> list[Site]:
    flags = _Flags(index)
    out: list[Site | None] = list(sites)
    moved: dict[int, Site] = {}
    for i, site in enumerate(sites):
        if site.kind is not SiteKind.PINNED_HOST or site.via is not None or site.language is not Language.PYTHON \
                or not (site.device or "").startswith(_PREFIX):
            continue
        name = site.device[len(_PREFIX):-1].strip()  # type: ignore[index]
        found = index.site_call(site) if name.isidentifier() else None
        if found is None:
            continue
        func, call = found
        if func.scope is None or flags.can_be_true(func, name, 0):
            continue
        device = next((a.text for a in split_args(call.arglist) if a.keyword == "device"), None)
        where = classify_device(device) if device is not None else "cpu"
        if where in ("cpu", "meta"):
            out[i] = None  # unpinned host memory: no device allocation
            continue
        moved[i] = dataclasses.replace(site, kind=SiteKind.DEVICE, device=where)
    if moved:
        again = dict(zip(moved, classify_sites(moved.values(), files, patterns)))
        for i, site in again.items():
            out[i] = dataclasses.replace(site, tier_reason=(
                f"{site.tier_reason} (pin_memory={_flag(sites[i])} is never true here: no pinned memory)"))
    return [s for s in out if s is not None]


def _flag(site: Site) -> str:
    return (site.device or "")[len(_PREFIX):-1].strip()


class _Flags:
    """Whether a name a function passes as ``pin_memory`` can be true."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self.parametrize = Parametrize(index)
        self.memo: dict[tuple[str, str], bool] = {}

    def can_be_true(self, func: Func, name: str, depth: int) -> bool:
        key = (func.id, name)
        found = self.memo.get(key)
        if found is None:
            self.memo[key] = True  # a cycle of calls: not known
            found = self.memo[key] = self._can_be_true(func, name, depth)
        return found

    def _can_be_true(self, func: Func, name: str, depth: int) -> bool:
        assert func.scope is not None
        if any((c.target or "").strip() == name for c in func.calls) \
                or any((item.target or "").strip() == name for w in func.withs for item in w.items):
            return True  # bound to what a call returns
        assigns = [a for a in func.assigns if name in a.targets]
        if any(a.op != "=" or a.value.strip() not in _FALSY for a in assigns):
            return True
        if name not in func.scope.params:
            if assigns:
                return False
            constant = self.index.visible_constants(func.path).get(name)
            return not (constant is not None and (constant.kind == NONE or
                                                  constant.kind == LITERAL and constant.literal is False))
        values = self._parametrized(func, name)
        if values is not None:
            return not values or any(v not in _FALSY for v in values)
        params = list(func.scope.params)
        defaults = func.scope.param_defaults
        position = params.index(name)
        default = defaults[position].strip() if position < len(defaults) else ""
        if default not in _FALSY:
            return True  # `pin_memory=True`, a default that is not a literal, or none
        if depth >= _DEPTH:
            return True
        offset = 1 if params and params[0] in ("self", "cls") else 0
        for caller, call in calls_of(func, self.index):
            args = split_args(call.arglist)
            if any(a.text.lstrip().startswith("*") or (a.keyword or "").startswith("*") for a in args):
                return True
            passed = next((a for a in args if a.keyword == name), None)
            positional = [a for a in args if a.keyword is None]
            if passed is None and 0 <= position - offset < len(positional):
                passed = positional[position - offset]
            if passed is None:
                continue  # the default
            text = passed.text.strip()
            if text in _FALSY:
                continue
            if not text.isidentifier() or caller.scope is None or self.can_be_true(caller, text, depth + 1):
                return True
        return False

    def _parametrized(self, func: Func, name: str) -> list[str] | None:
        """The values the function's own ``parametrize`` decorators give
        ``name`` (an empty list: one that cannot be read), or None."""
        if func.scope is None or not any(d.rsplit(".", 1)[-1] == "parametrize" for d in func.scope.decorators):
            return None
        found: list[str] | None = None
        for arglist in self.parametrize.arglists(func):
            values = parametrized_values(arglist, name)
            if values is None:
                continue
            if not values:
                return []
            found = (found or []) + values
        return found
