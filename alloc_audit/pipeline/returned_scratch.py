"""Stage 5, after the lifetimes: buffers an initialiser-named helper
(``build_*_buffers``, ``make_*``) returns to callers that use them and drop
them are per call (issue 11, round 7).

A device buffer T2 only by its function's name ("initialiser ...") that the
function returns is kept only if a caller keeps it. When every call of the
function binds the result to locals that the caller neither stores on an
object or in a container, returns, registers (``register_buffer``,
``Parameter``) nor hands to a construction (``Layer(pairs)``), and the
caller is no constructor or initialiser itself, the buffer lives for one
use of the caller: T4. A call that cannot run the
allocation (a move whose device the call leaves None or sets to the CPU,
``host_moves``) does not count. A helper nobody calls keeps its tier. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Call, Site, Tier
from .host_moves import edge_stays_on_host
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_KEEPS = re.compile(r"register|Parameter|setattr")


def returned_scratch(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def decide(site: Site) -> Decision | None:
        dropped = _dropped_by_callers(site, index)
        return (Tier.T4, f"per call: {site.scope} returns it to callers that use it and drop it ({dropped}); "
                         f"was: {site.tier_reason}") if dropped else None

    return retier(sites, lambda s: python_device_site(s, Tier.T2) and s.tier_reason.startswith("initialiser "),
                  decide)


def _dropped_by_callers(site: Site, index: ProjectIndex) -> str:
    func = index.func(site.path, site.scope)
    if func is None or not _returned(site, func):
        return ""
    dropped = []
    for fid, depth in index.callers_within([func], 1).items():
        caller = index.funcs.get(fid)
        if depth != 1 or caller is None:
            continue
        for call in caller.calls:
            if func not in index.resolve(caller, call):
                continue
            if edge_stays_on_host(site, caller, call, func, index):
                continue  # this call never puts it on the device
            if not _drops(caller, call):
                return ""
            dropped.append(caller.qualname)
    return ", ".join(sorted(set(dropped))[:3])


def _returned(site: Site, func: Func) -> bool:
    if site.kept == "return":
        return True
    target = (site.target or "").strip()
    names = {p.strip() for r in func.returns for p in r.value.strip().strip("()").split(",")}
    return target.isidentifier() and target in names


def _drops(caller: Func, call: Call) -> bool:
    scope = caller.scope
    if scope is None or scope.kind != "function" or scope.role == "constructor" \
            or caller.name.startswith(("init", "_init", "setup", "_setup")) or caller.name.endswith("_init"):
        return False
    names = [t.strip() for t in (call.target or "").split(",")]
    if not names or not all(n.isidentifier() for n in names):
        return False
    line = call.span.line
    for name in names:
        word = re.compile(r"\b" + re.escape(name) + r"\b")
        returned = (p.strip() for r in caller.returns if r.line > line for p in r.value.strip().strip("()").split(","))
        if any(p == name or p.startswith((name + ".", name + "[")) for p in returned):
            return False  # returned, or a view of it
        if any(word.search(a.value) and any(not t.isidentifier() for t in a.targets)
               for a in caller.assigns if a.line > line):
            return False
        if any(c.span.line > line and word.search(c.arglist) and
               (_KEEPS.search(c.callee) or c.callee.rsplit(".", 1)[-1][:1].isupper()
                or (c.target or "").strip().startswith(("self.", "cls.")))
               for c in caller.calls):
            return False
    return True
