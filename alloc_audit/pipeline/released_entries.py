"""Stage 5, after ``lifetimes``: a pinned host buffer stored into an entry of
a container the object holds, where another function of the class deletes
entries of that container, is staging for one use (issue 11, round 22).

``self.tracker[tensor_id] = (cpu_copy, ...)`` in an activation offloader's
pack hook, with ``del self.tracker[tensor_id]`` (or
``self.tracker.pop(tensor_id)``) in its unpack hook: every entry is made
for one saved tensor, read back once and dropped. The buffer does not live
on the object (T5b, the pattern for a store into ``self.*``); it is
re-made per use: T5a. "The class": the methods of the store's class and
the functions nested in them (hooks defined in ``__init__``). Left alone:
a store in a function that looks the key up first (``if key not in
self.cache:``, ``cached = self.cache.get(key)``: a cache kept per key and
reused, whatever evicts it), a removal in a method run once at the end
(``close``, ``__del__``, ``shutdown``, ``__exit__``), and a container the
object never removes entries from. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex

_ENTRY = re.compile(r"(self\.[A-Za-z_]\w*)\[[^\]]*\]")
_KEPT = "persistent pinned host buffer kept in "  # the reason of the `self.*` target pattern (rules/tiers.toml)
_FINAL = frozenset({"close", "__del__", "shutdown", "__exit__", "cleanup", "teardown"})


def released_entries(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = []
    memo: dict[tuple[str, str, str], str] = {}
    for site in sites:
        if site.language is Language.PYTHON and site.kind is SiteKind.PINNED_HOST and site.via is None \
                and site.tier is Tier.T5B and site.tier_reason.startswith(_KEPT):
            site = _decide(site, index, memo)
        out.append(site)
    return out


def _decide(site: Site, index: ProjectIndex, memo: dict[tuple[str, str, str], str]) -> Site:
    m = next((m for place in (site.kept, (site.target or "").strip()) if (m := _ENTRY.fullmatch(place))), None)
    func = index.func(site.path, site.scope)
    if m is None or func is None or "." not in site.scope:
        return site
    member = m.group(1)
    if any(c.callee in (member + ".get", member + ".setdefault") for c in func.calls) or any(
            b.kind in ("if", "elif") and re.search(r"\bin\s+" + re.escape(member) + r"\b", b.test)
            for b in func.blocks):
        return site  # looked up by its key first (`self.cache.get(key)`, `if key not in self.cache:`): a cache
    owner = site.scope.split(".", 1)[0]
    key = (site.path, owner, member)
    if key not in memo:
        memo[key] = _remover(index, site.path, owner, member, func)
    remover = memo[key]
    if not remover:
        return site
    return dataclasses.replace(site, tier=Tier.T5A, tier_reason=(
        f"pinned staging for one use: stored in an entry of {member} by {site.scope}, and {remover} deletes "
        f"the entry after its use; was: {site.tier_reason}"))


def _remover(index: ProjectIndex, path: str, owner: str, member: str, storing: Func) -> str:
    """A function of the class ``owner`` (a method, or a function nested in
    one) other than ``storing`` that deletes entries of ``member``, or ""."""
    prefix = owner + "."
    for func in index.functions_in(path):
        if func is storing or not func.qualname.startswith(prefix) or func.name in _FINAL:
            continue
        if any(a.op == "del" and any(t.startswith(member + "[") for t in a.targets) for a in func.assigns) \
                or any(c.callee == member + ".pop" for c in func.calls):
            return func.qualname
    return ""
