"""Stage 5, after the keyed caches and run accumulators: state kept on the
object through a factory's return, or accumulated into in place (issue 11,
round 18).

Input: classified sites (direct and derived), the project index and the
caller globs. Output: the same sites, per-call (T4) Python device sites
re-tiered T2 with a reason naming what keeps them.

- A factory's result kept by every caller: the allocation a project
  function returns (``make_empty_stats``: ``return torch.zeros(...)``),
  where every call of the function is a derived site its caller keeps on
  the object once per key (``self._stats[m] = make_empty_stats(m)`` under
  ``if m not in self._counts``: the keyed-cache, lazy-member and
  created-once passes' T2), is the entry those callers keep: T2. A caller
  that binds it to a local and drops it, or stores it per call under a
  fresh key, keeps the factory's site per call. Calls from tests of a
  factory outside the tests are not counted (they exercise it).
- An accumulator kept on the object: a tensor a method stores in
  ``self.x`` (``attach``: ``self._sum = torch.zeros(n)``), where a function
  of the class (a method, or a hook nested in one) adds into that slot in
  place (``self._sum.add_(t)``, ``self._sum += t``), is the object's state,
  summed across calls: T2. So is the slot moved onto itself (``self._sum =
  self._sum.to(x.device)``): the moved copy replaces the state. A store or
  move in a per-step method (``[callers] per_step``) or in a loop is made
  per pass; a slot only rescaled in place (``*=``, ``div_``) is not summed.
- Optimizer state filled by a helper: an entry of the helper's parameter
  (``state["sum"] = torch.zeros(...)``), or of a local dict it hands to
  that parameter's ``update`` (``acc[k] = torch.zeros(...)``; ``state.update(acc)``),
  where every caller passes a state the object holds (``state =
  self.state[p]``) under a test that it is empty (``if len(state) == 0:``,
  ``if not state:``): created once per parameter and kept, like the same
  store made in the caller (``lifetimes``' created-once state).
DESIGN.md ("Lifetime tiers"): kept on the object -> persistent. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Language, Site, SiteKind, Tier
from .bound_values import bound_value
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_KEPT = ("cached in ", "created lazily", "state created once")  # the keyed passes' T2 reasons
_SLOT = re.compile(r"self\.[A-Za-z_]\w*")
# in-place accumulation into a slot: `self.x.add_(t)`, `self.x[i].lerp_(t, w)` (a rescale, `sub_`/`div_`
# of a normalised input, `*=` of a scale factor, accumulates nothing)
_ACCUMULATE = re.compile(r"(self\.[A-Za-z_]\w*)(?:\[[^\]]*\])*\.(?:add|lerp|addcmul|addcdiv|addmm|addmv|addbmm)_")
_MOVES = ("to", "cuda")
_ENTRY = re.compile(r"([A-Za-z_]\w*)\[[^\]]+\]")
# `len(state) == 0`, `not state`, `"k" not in state` (lifetimes' created-once guards)
_EMPTY = re.compile(r"""\(?\s*(?:len\(\s*([\w.\[\]"']+)\s*\)\s*==\s*0|not\s+([\w.\[\]"']+)"""
                    r"""|.+?\s+not\s+in\s+([\w.\[\]"']+))\s*\)?""")


def kept_accumulators(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    kept_calls: dict[tuple[str, str, int], Site] = {}
    kept_vias: set[tuple[str, int]] = set()  # allocations some caller keeps: the only factories worth resolving
    for s in sites:
        if s.via is not None and s.language is Language.PYTHON and s.kind is SiteKind.DEVICE:
            kept_calls[(s.via.path, s.path, s.span.line)] = s
            if s.tier is Tier.T2 and s.tier_reason.startswith(_KEPT):
                kept_vias.add((s.via.path, s.via.line))
    per_step = matcher(globs.per_step) if globs.per_step else (lambda _n: False)
    memo: dict[tuple[str, str, str], int] = {}

    def decide(site: Site) -> Decision | None:
        if site.kept == "return":
            if (site.path, site.span.line) not in kept_vias:
                return None
            return _returned_and_kept(site, index, kept_calls)
        return _accumulator(site, index, per_step, memo) or _filled_by_helper(site, index)

    return retier(sites, lambda s: python_device_site(s, Tier.T4), decide)


def _returned_and_kept(site: Site, index: ProjectIndex, kept_calls: dict[tuple[str, str, int], Site]) \
        -> Decision | None:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in ("function", "method"):
        return None
    callers: list[Site] = []
    own_test = test_path(site.path)
    for caller, _ in index.calls_named(func.name):
        if test_path(caller.path) and not own_test:
            continue  # a test exercising a production factory says nothing of its lifetime in the run
        for call in caller.calls_of(func.name):
            if func not in index.resolve(caller, call):
                continue
            derived = kept_calls.get((site.path, caller.path, call.span.line))
            if derived is None or derived.tier is not Tier.T2 or not derived.tier_reason.startswith(_KEPT):
                return None
            callers.append(derived)
    if not callers:
        return None
    first = callers[0]
    return Tier.T2, (f"kept by its callers: {func.qualname} returns it and each caller keeps it on the object, "
                     f"made once ({first.scope}, line {first.span.line}: {first.target}); "
                     f"was: {site.tier_reason}")


def _accumulator(site: Site, index: ProjectIndex, per_step: Callable[[str], bool],
                 memo: dict[tuple[str, str, str], int]) -> Decision | None:
    target = (site.target or "").strip()
    if _SLOT.fullmatch(target) is None:
        return None
    func = index.func(site.path, site.scope)
    if func is None or func.in_loop(site.span.line):
        return None
    owner = _class_of(site, index)
    if owner is None:
        return None
    if per_step(site.scope.rsplit(".", 1)[-1]):
        return None
    moved = site.api.rsplit(".", 1)[-1] in _MOVES
    if moved and not any(c.span.line == site.span.line and c.callee in (f"{target}.to", f"{target}.cuda")
                         for c in func.calls):
        return None  # a move of another tensor into the slot
    line = _accumulated(target, site.path, owner, index, memo)
    if not line:
        return None
    what = "moves the accumulator onto itself" if moved else f"stores it in {target}"
    return Tier.T2, (f"accumulator kept on the object: {site.scope} {what}, and {owner} adds into "
                     f"{target} in place (line {line}): state summed across calls; was: {site.tier_reason}")


def _class_of(site: Site, index: ProjectIndex) -> str | None:
    """The class whose method (or a function nested in one) the site is in."""
    parts = site.scope.split(".")
    for n in range(len(parts), 0, -1):
        f = index.func(site.path, ".".join(parts[:n]))
        if f is not None and f.owner is not None:
            return f.owner.qualname
    return None


def _accumulated(slot: str, path: str, owner: str, index: ProjectIndex, memo: dict[tuple[str, str, str], int]) -> int:
    """A line where a function of ``owner`` adds into ``slot`` in place, or 0."""
    found = memo.get((path, owner, slot))
    if found is not None:
        return found
    line = 0
    for f in _class_functions(path, owner, index):
        line = next((a.line for a in f.assigns if a.op in ("+=", "-=") and any(
            t == slot or t.startswith(f"{slot}[") for t in a.targets)), 0) or next(
            (c.span.line for c in f.calls if (m := _ACCUMULATE.fullmatch(c.callee)) is not None
             and m.group(1) == slot), 0)
        if line:
            break
    memo[(path, owner, slot)] = line
    return line


def _class_functions(path: str, owner: str, index: ProjectIndex) -> list[Func]:
    prefix = owner + "."
    return [f for f in index.functions_in(path) if f.qualname.startswith(prefix)]



def _filled_by_helper(site: Site, index: ProjectIndex) -> Decision | None:
    m = _ENTRY.fullmatch((site.target or "").strip())
    func = index.func(site.path, site.scope)
    if m is None or func is None or func.scope is None or func.scope.role != "function":
        return None
    params = func.scope.params
    holder = m.group(1)
    if holder not in params:
        holder = next((c.callee[:-len(".update")] for c in func.calls if c.span.line > site.span.line
                       and c.callee.endswith(".update") and c.arglist.strip() == m.group(1)
                       and c.callee[:-len(".update")] in params), "")
    if not holder:
        return None
    at = params.index(holder)
    guards = []
    for caller, _ in index.calls_named(func.name):
        for call in caller.calls_of(func.name):
            if func not in index.resolve(caller, call):
                continue
            args = split_args(call.arglist)
            arg = args[at].text.strip() if at < len(args) and args[at].keyword is None else ""
            guard = _guarded_state(caller, arg, call.span.line) if arg.isidentifier() else ""
            if not guard:
                return None
            guards.append((caller, guard))
    if not guards:
        return None
    caller, guard = guards[0]
    return Tier.T2, (f"state created once: {func.qualname} fills {holder}, which {caller.qualname} holds on the "
                     f"object and fills only under `if {guard}`: kept; was: {site.tier_reason}")


def _guarded_state(caller: Func, arg: str, line: int) -> str:
    """The test of an ``if`` around ``line`` saying ``arg`` (a state the
    object holds) is empty, or ""."""
    if not bound_value(caller, arg, line).startswith("self."):
        return ""
    for block in caller.blocks:
        if block.kind in ("if", "elif") and block.span.contains_line(line):
            test = " ".join(block.test.split())
            g = _EMPTY.fullmatch(test)
            if g is not None and arg in (g.group(1), g.group(2), g.group(3)):
                return test
    return ""

