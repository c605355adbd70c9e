"""Stage 5, after the passes that keep a store (``state_once``,
``keyed_caches``): a member or entry stored and then rebound by the same
call (issue 11, round 35).

Input: the sites with their tiers so far and the project index. Output:
the same sites, some of them re-tiered.

A Python device buffer kept (T2) in a member or an entry (``self.ipt[n] =
torch.zeros_like(p)``) that a later statement of the same function binds
again to new memory on every path that passes the store (``self.ipt[n] =
(p * p.grad).abs().detach()`` after the ``if n not in self.ipt:`` block
that made it, in the same loop body) is dropped at that statement: the
object keeps the second value, not the buffer. It lives one call: T4
(DESIGN.md, "Lifetime tiers": a temporary dropped at once is per-call
scratch).

"On every path": every ``if``/loop/``try`` block around the rebind is
around the store as well, no block that leaves the function ends between
them, and no ``return`` lies between. The buffer must not be used in
between (a use may keep it: ``self.y = self.x``; ``register_buffer("x",
self.x)``), the key's names are not bound again in between, and the new
value is new memory: it does not name the buffer, or names it only as an
operand of arithmetic (``self.beta * self.ema[n] + ...``); ``self.x =
self.x.to(dev)``, ``self.x = nn.Parameter(self.x)`` and an augmented
``self.x += y`` keep it. A rebind under its own test (``if stale:``) or in
a loop the store is not in may not run: the tier stands. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .retier import Decision, retier

_KEPT = re.compile(r"[A-Za-z_][\w.]*(?:\.\w+|\[[^\]]+\])")  # `self.x`, `self.ipt[n]`, `cache[key]`
_ARITH = "*+-/@%"


def rebound_stores(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    stores: dict[str, dict[str, list[int]]] = {}

    def eligible(site: Site) -> bool:
        return (site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.via is None
                and site.language is Language.PYTHON and site.target is not None
                and _KEPT.fullmatch(site.target.strip()) is not None)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        target = (site.target or "").strip()
        lines = _stores(func, stores).get(target, ())
        after = site.span.end_line
        line = next((n for n in lines if n > after), 0)
        if not line or not _rebinds(func, site, target, line):
            return None
        return Tier.T4, (f"stored in {target} and bound again to new memory at line {line} of the same call "
                         f"(on every path past the store): dropped there, lives one call; was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _stores(func: Func, memo: dict[str, dict[str, list[int]]]) -> dict[str, list[int]]:
    """The lines where ``func`` binds each member or entry text (plain ``=``
    assignments and calls whose value it stores), ascending."""
    found = memo.get(func.id)
    if found is None:
        found = {}
        for a in func.assigns:
            if a.op == "=":
                for t in a.targets:
                    if "." in t or "[" in t:
                        found.setdefault(t.strip(), []).append(a.line)
        for c in func.calls:
            t = (c.target or "").strip()
            if "." in t or "[" in t:
                found.setdefault(t, []).append(c.span.line)
        for held in found.values():
            held.sort()
        memo[func.id] = found
    return found


def _rebinds(func: Func, site: Site, target: str, line: int) -> bool:
    """The store of ``site`` is bound again, to new memory, at ``line`` on
    every path past the store, with no use of the buffer in between."""
    start = site.span.line
    for b in func.blocks:
        if b.span.contains_line(line) and not b.span.contains_line(start):
            return False  # the rebind is under a test or in a loop the store is not in
        if b.exits and start <= b.span.end_line < line:
            return False  # a block between them may leave the function
    if any(start < r.line < line for r in func.returns):
        return False
    key = target.partition("[")[2]
    key_names = set(re.findall(r"[A-Za-z_]\w*", key))
    mentioned = re.compile(rf"(?<![\w.]){re.escape(target)}(?!\w)")
    for a in func.assigns:
        if start < a.line < line and (mentioned.search(a.value) or target in a.targets
                                      or key_names & {t.strip() for t in a.targets}):
            return False
        if a.line == line and target in a.targets and not _new_memory(a.value, mentioned):
            return False
    for c in func.calls:
        n = c.span.line
        if not start <= n <= line or c.span == site.span:
            continue
        if mentioned.search(c.callee) or mentioned.search(c.arglist):
            return False  # a use, or a rebind that may return the buffer (`self.x = self.x.to(d)`)
        if n < line and n > site.span.end_line and (c.target or "").strip() in key_names:
            return False
    return True


def _new_memory(value: str, mentioned: re.Pattern[str]) -> bool:
    """The rebind's value is not the buffer: it does not name it, or names it
    only as an operand of arithmetic (``self.beta * self.ema[n] + g``)."""
    for m in mentioned.finditer(value):
        before = value[:m.start()].rstrip()
        after = value[m.end():].lstrip()
        if not ((before and before[-1] in _ARITH) or (after and after[0] in _ARITH)):
            return False
    return True
