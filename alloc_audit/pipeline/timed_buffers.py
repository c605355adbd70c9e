"""Stage 5, classify (after the run accumulators): buffers a script's entry
point makes once and hands to a timer that runs the timed callable again
and again (issue 11, round 35).

Input: classified sites and the project index. Output: the same sites, the
per-call Python device sites (T4) and pinned staging (T5a) that are such
buffers re-tiered T2 and T5b, with a reason naming the timer.

A benchmark script's ``main`` makes a device buffer or a pinned bounce
buffer once (``bounce = torch.empty(n).pin_memory()``) and hands it to the
callable it times (``timeit.Timer(functools.partial(read, f, bounce))``,
``timeit.timeit(lambda: copy(buf), number=n)``, ``do_bench(lambda:
op(x))``): every timed run reuses that one buffer, and it lives until the
script ends. DESIGN.md ("Lifetime tiers") and docs/tiers.md 5: made before
the loop and used in it, for the run: T2; a pinned buffer kept and reused:
T5b, not the staging re-made per transfer (T5a). The timer is the loop the
entry point does not write out (round 30 read a nested function handed to
a benchmark helper the same way).

- The function is a script's entry point: named ``main`` (``_main``,
  ``*_main``), a plain function, called by nothing or only by module-level
  code outside its loops.
- The site is outside the function's loops, bound to a name that nothing
  binds again in the function, and a later call to a timer (``timeit.Timer``,
  ``timeit.timeit``, ``timeit.repeat``, ``*.do_bench*``, ``benchmark.Timer``)
  names it in its arguments, directly or through a local made from a call
  naming it (``fn = functools.partial(read, bounce)`` ... ``Timer(fn)``).

A buffer made inside the timed function (per run), one only a one-shot
call reads, or one of a helper ``main`` calls (it dies when the helper
returns) stays per call. Pure; reads the calls the index already holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .loop_calls import ENTRY_NAME, script_entry
from .names import IDENTIFIER, has_word
from .retier import Decision, retier

_TIMER = re.compile(r"(?:^|\.)(?:timeit\.(?:Timer|timeit|repeat)|do_bench\w*|benchmark\.Timer)$")
_TIMER_WORDS = ("timeit", "Timer", "do_bench")  # cheap text gate: one of them is in the callee
_NEW = {Tier.T4: Tier.T2, Tier.T5A: Tier.T5B}


def timed_buffers(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    entries: dict[str, bool] = {}

    def eligible(site: Site) -> bool:
        return (site.language is Language.PYTHON and site.via is None and site.target is not None
                and (site.kind is SiteKind.DEVICE and site.tier is Tier.T4
                     or site.kind is SiteKind.PINNED_HOST and site.tier is Tier.T5A)
                and ENTRY_NAME.fullmatch(site.scope) is not None)

    def decide(site: Site) -> Decision | None:
        return _decide(site, index, entries)

    return retier(sites, eligible, decide)


def _decide(site: Site, index: ProjectIndex, entries: dict[str, bool]) -> Decision | None:
    name = (site.target or "").strip()
    func = index.func(site.path, site.scope)
    if func is None or not IDENTIFIER.fullmatch(name) or func.in_loop(site.span.line):
        return None
    timers = [c for c in func.calls if c.span.line > site.span.line and any(w in c.callee for w in _TIMER_WORDS)
              and _TIMER.search(c.callee) is not None]
    if not timers or _rebound(func, name, site):
        return None
    held = {name} | {c.target.strip() for c in func.calls if c.target and c.span.line > site.span.line
                     and IDENTIFIER.fullmatch(c.target.strip()) and has_word(c.arglist, name)}
    timer = next((t for t in timers if any(has_word(t.arglist, n) for n in held)), None)
    if timer is None or not _entry(func, index, entries):
        return None
    new = _NEW[site.tier]
    what = "kept and reused" if new is Tier.T5B else "kept for the run"
    return new, (f"made once in the entry point {func.qualname} and handed to {timer.callee} (line "
                 f"{timer.span.line}), which runs the timed call again and again: {what}; was: {site.tier_reason}")


def _rebound(func: Func, name: str, site: Site) -> bool:
    """``name`` is bound again elsewhere in the function (an assignment or a call's result)."""
    stmt = site.stmt_line or site.span.line
    if any(a.line != stmt and name in (t.strip() for t in a.targets) for a in func.assigns):
        return True
    return any((c.target or "").strip() == name and c.span.line != site.span.line for c in func.calls)


def _entry(func: Func, index: ProjectIndex, memo: dict[str, bool]) -> bool:
    """``func`` is a plain function only module-level code calls, outside its loops (or nothing calls)."""
    found = memo.get(func.id)
    if found is None:
        if func.scope is None or func.scope.role != "function" or "." in func.qualname:
            found = False
        else:
            callers = [index.funcs[fid] for fid, d in index.callers_within([func], 1).items()
                       if d == 1 and fid in index.funcs and fid != func.id]
            found = not callers or script_entry(func, callers)
        memo[func.id] = found
    return found
