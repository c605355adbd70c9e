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
  factory outside the tests are not counted (they exercise it). A caller
  that only returns the factory's result (``return Book.construct(maps)``,
  up to three calls up) passes the question to its own callers, and a
  local the factory hands to what it returns (``return Book(codes=codes)``)
  is returned with it (round 22).
- An accumulator kept on the object: a tensor a method stores in
  ``self.x`` (``attach``: ``self._sum = torch.zeros(n)``), where a function
  of the class (a method, or a hook nested in one) adds into that slot in
  place (``self._sum.add_(t)``, ``self._sum += t``), is the object's state,
  summed across calls: T2. So is the slot moved onto itself (``self._sum =
  self._sum.to(x.device)``): the moved copy replaces the state. A store or
  move in a per-step method (``[callers] per_step``), in a method a
  per-step function calls (round 35: the callers' pass said "per step",
  ``self.attention.init_states(x)`` in ``forward``) or in a loop is made
  per pass; a slot only rescaled in place (``*=``, ``div_``) is not summed.
  Nor is a slot re-made unconditionally at the start of each call and
  added into only later in that call (round 23): in the storing method
  after the store (``self.scores = torch.zeros(...)`` then ``self.scores[l]
  += s``), or in a method every caller of which calls the storing one
  first (``self.compute_scores(); self.enhance_scores()``): each call
  restarts the sum, per call (T4).
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
from .names import has_word
from .retier import Decision, python_device_site, retier

_KEPT = ("cached in ", "created lazily", "state created once")  # the keyed passes' T2 reasons
_SLOT = re.compile(r"self\.[A-Za-z_]\w*")
# in-place accumulation into a slot: `self.x.add_(t)`, `self.x[i].lerp_(t, w)` (a rescale, `sub_`/`div_`
# of a normalised input, `*=` of a scale factor, accumulates nothing)
_ACCUMULATE = re.compile(r"(self\.[A-Za-z_]\w*)(?:\[[^\]]*\])*\.(?:add|lerp|addcmul|addcdiv|addmm|addmv|addbmm)_")
_MOVES = ("to", "cuda")
_FORWARDS = 3  # callers up that only return the factory's result
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
            if not _near_kept_via(site, index, kept_vias):
                return None
            return _returned_and_kept(site, index, kept_calls)
        if site.kept.startswith("handed:") and _in_returned(site, index) and _near_kept_via(site, index, kept_vias):
            found = _returned_and_kept(site, index, kept_calls)
            if found is not None:
                return found
        return _accumulator(site, index, per_step, memo) or _filled_by_helper(site, index)

    return retier(sites, lambda s: python_device_site(s, Tier.T4), decide)


def _near_kept_via(site: Site, index: ProjectIndex, kept_vias: set[tuple[str, int]]) -> bool:
    """A caller keeps an allocation of the site's function (the derived
    site's ``via`` names one of its allocations, maybe another one)."""
    if (site.path, site.span.line) in kept_vias:
        return True
    func = index.func(site.path, site.scope)
    span = func.scope.span if func is not None and func.scope is not None else None
    return span is not None and any(p == site.path and span.contains_line(n) for p, n in kept_vias)


def _in_returned(site: Site, index: ProjectIndex) -> bool:
    """The site's local is handed to what its function returns (``return Book(codes=codes)``)."""
    func = index.func(site.path, site.scope)
    target = (site.target or "").strip()
    return func is not None and target.isidentifier() and any(
        r.line > site.span.line and has_word(r.value, target) for r in func.returns)


def _returned_and_kept(site: Site, index: ProjectIndex, kept_calls: dict[tuple[str, str, int], Site]) \
        -> Decision | None:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in ("function", "method"):
        return None
    callers = _kept_callers(func, site.path, index, kept_calls, test_path(site.path), _FORWARDS)
    if not callers:
        return None
    first = callers[0]
    return Tier.T2, (f"kept by its callers: {func.qualname} returns it and each caller keeps it on the object, "
                     f"made once ({first.scope}, line {first.span.line}: {first.target}); "
                     f"was: {site.tier_reason}")


def _kept_callers(func: Func, path: str, index: ProjectIndex, kept_calls: dict[tuple[str, str, int], Site],
                  own_test: bool, depth: int) -> list[Site]:
    """The derived sites by which every caller of ``func`` keeps what it
    returns once per key, through callers that only return its result
    (``return Book.construct(maps)``, ``depth`` calls up); [] when one does not."""
    callers: list[Site] = []
    for caller, _ in index.calls_named(func.name):
        if test_path(caller.path) and not own_test:
            continue  # a test exercising a production factory says nothing of its lifetime in the run
        for call in caller.calls_of(func.name):
            if func not in index.resolve(caller, call):
                continue
            derived = kept_calls.get((path, caller.path, call.span.line))
            if derived is not None and derived.tier is Tier.T2 and derived.tier_reason.startswith(_KEPT):
                callers.append(derived)
                continue
            up = _kept_callers(caller, path, index, kept_calls, own_test, depth - 1) \
                if depth > 0 and _forwards(caller, call.span.line, func.name) else []
            if not up:
                return []
            callers += up
    return callers


def _forwards(caller: Func, line: int, name: str) -> bool:
    """``caller`` (a plain function or method) returns the call of ``name`` on ``line`` as it is."""
    return caller.scope is not None and caller.scope.role in ("function", "method") and any(
        r.line == line and r.value.strip().split("(", 1)[0].rsplit(".", 1)[-1] == name for r in caller.returns)


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
    if per_step(site.scope.rsplit(".", 1)[-1]) or site.tier_reason.startswith("per step: "):
        return None  # stored per step (round 35: or the callers' pass found a per-step caller)
    moved = site.api.rsplit(".", 1)[-1] in _MOVES
    if moved and not any(c.span.line == site.span.line and c.callee in (f"{target}.to", f"{target}.cuda")
                         for c in func.calls):
        return None  # a move of another tensor into the slot
    line = _accumulated(target, site.path, owner, index, memo)
    if not line or (not moved and _restarted(target, func, site.span.line, site.path, owner, index)):
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


def _adds(f: Func, slot: str) -> list[int]:
    """The lines where ``f`` adds into ``slot`` in place."""
    return [a.line for a in f.assigns if a.op in ("+=", "-=") and any(
        t == slot or t.startswith(f"{slot}[") for t in a.targets)] + [
        c.span.line for c in f.calls if (m := _ACCUMULATE.fullmatch(c.callee)) is not None and m.group(1) == slot]


def _restarted(slot: str, store: Func, line: int, path: str, owner: str, index: ProjectIndex) -> bool:
    """Every in-place add into ``slot`` follows its unconditional store on
    ``line`` in ``store`` within one call: later in ``store`` itself
    (``self.scores = torch.zeros(...)`` then ``self.scores[l] += s``), or in
    a method whose every caller calls ``store`` first (``self.compute_scores()``
    then ``self.enhance_scores()``). Each call starts the sum anew: nothing
    is summed across calls (round 23)."""
    if store.scope is None or any(b.kind != "loop" and b.span.contains_line(line) for b in store.blocks):
        return False
    for f in _class_functions(path, owner, index):
        lines = _adds(f, slot)
        if not lines:
            continue
        if f is store:
            if any(n <= line for n in lines):
                return False
            continue
        if f.owner is None or not _called_after(f, store, index):
            return False
    return True


def _called_after(f: Func, store: Func, index: ProjectIndex) -> bool:
    """Every caller of the method ``f`` (one at least) calls ``store`` on ``self`` before it."""
    callers = [index.funcs.get(fid) for fid, d in index.callers_within([f], 1).items() if d == 1]
    if not callers:
        return False
    for caller in callers:
        if caller is None or caller.owner is not f.owner:
            return False
        at = [c.span.line for c in caller.calls if c.callee == f"self.{f.name}"]
        first = [c.span.line for c in caller.calls if c.callee == f"self.{store.name}"]
        if not at or not first or min(first) >= min(at):
            return False
    return True


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

